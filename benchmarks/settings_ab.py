"""Variants of the library's settings or code side by side: the same calls under each, one fresh process per variant.

A variant is ``NAME`` (the settings as they are) or ``NAME:SETTING=VALUE[+SETTING=VALUE…]``, each setting as
``--set`` takes it (``timed_calls.settings_changes``), and either may end in ``@TREE``: a folder holding another
``lightning_attention`` package (e.g. ``git archive <commit> lightning_attention | tar x -C TREE``, or a copy with
one change), put first on the variant's ``PYTHONPATH``; each variant records the digest of the package it ran
(``bench.machine.source_digest``). ``--rounds 2`` runs the variants again in the opposite order, so that a drift of
the GPU's clock over the call does not favour one side. Per variant and shape (bf16, or ``--dtype float16``; H = 16,
TNL slopes, ``timed_calls.make_problem``): the forward and the forward + backward as CUDA-graph replays
(``timed_calls.graph_ms``) and the fwd+bwd's kernels in launch order with their CUDA time; once per variant, at
``--check-shape``, the relative L2 error of o, dq, dk and dv against float64 and that error over the float64 result's
own rounding to the inputs' dtype (1.0: the rounding floor). ``ratios`` divides every variant's times by the first
variant's of the same round. It makes kernel A/B comparisons (docs/kernels.md) reproducible where ``chunk_profile.py
--set`` shows one variant at a time.

    python benchmarks/settings_ab.py --shapes 64x1024,8x8192,2x32768,1x65536 --variant default \\
        --variant split:precision=split --variant split-triton-walk:precision=split+gluon=0 --out ab.json
    python benchmarks/settings_ab.py --variant before@/tmp/before --variant after --rounds 2 --out ab.json
"""

import argparse
import json
import os
import sys

import torch
from timed_calls import (
    child_runs,
    float64_reference,
    graph_ms,
    make_problem,
    parse_shape,
    profiled_kernels,
    settings_changes,
    write_json,
)

from lightning_attention import lightning_attn, settings


def parse_variant(text: str) -> tuple[str, list[str], str | None]:
    """``"split:precision=split+gluon=0"`` -> ("split", ["precision=split", "gluon=0"], None); ``"default"`` ->
    ("default", [], None); ``"before@/tmp/before"`` -> ("before", [], "/tmp/before")."""
    text, at, tree = text.partition("@")
    if at and not tree:
        raise ValueError(f"--variant {text}@: a folder after @")
    name, _, items = text.partition(":")
    if not name:
        raise ValueError(f"--variant {text!r}: a variant needs a name")
    return name, [item for item in items.split("+") if item], tree or None


def tree_env(tree: str | None) -> dict | None:
    """The environment of a variant's process: this one's, with ``tree`` first on ``PYTHONPATH`` (None: unchanged)."""
    if tree is None:
        return None
    if not os.path.isfile(os.path.join(tree, "lightning_attention", "__init__.py")):
        raise ValueError(f"--variant …@{tree}: no lightning_attention package in that folder")
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": os.path.abspath(tree) + (os.pathsep + path if path else "")}


def rounds_order(count: int, rounds: int) -> list[tuple[int, int]]:
    """(round, variant index) in running order: the variants in order, then reversed, alternately."""
    order = []
    for r in range(rounds):
        indices = range(count) if r % 2 == 0 else reversed(range(count))
        order += [(r + 1, i) for i in indices]
    return order


def check(shape: str, dtype: torch.dtype) -> dict:
    """Relative L2 errors of o, dq, dk, dv against float64 at ``shape``, and each over the rounding floor."""
    from lightning_attention.utils.testing import error_over_rounding_floor, relative_error

    B, T, D = parse_shape(shape)
    p = make_problem(B, T, D=D, dtype=dtype, seed=1)
    o, _ = lightning_attn(p.q, p.k, p.v, p.slope)
    got = (o, *torch.autograd.grad(o, (p.q, p.k, p.v), p.do))
    ref = float64_reference(p.q, p.k, p.v, p.do, p.slope)
    return {
        "shape": shape,
        "rel_l2": [relative_error(x, r) for x, r in zip(got, ref)],
        "over_floor": [error_over_rounding_floor(x, r, p.q.dtype) for x, r in zip(got, ref)],
    }


def measure(shapes: list[str], check_shape: str, dtype: torch.dtype) -> dict:
    """One variant (the settings in force, the package imported): the package's digest, its check, then per shape the
    replayed times and the fwd+bwd's kernels, on inputs of ``dtype``."""
    from lightning_attention.bench.machine import source_digest

    result = {"source": source_digest(), "check": check(check_shape, dtype), "points": []}
    for shape in shapes:
        B, T, D = parse_shape(shape)
        p = make_problem(B, T, D=D, dtype=dtype)
        result["points"].append({
            "shape": shape, "fwd_graph_ms": graph_ms(p.fwd), "fwdbwd_graph_ms": graph_ms(p.fwd_bwd),
            "kernels": profiled_kernels(p.fwd_bwd, 3)[-1],
        })  # fmt: skip
    return result


def ratios(variants: list[dict]) -> list[dict]:
    """Per variant other than the first and shape: its replayed fwd and fwd+bwd over the first variant's in the same
    round (``round``, 1 where absent)."""
    first_name = variants[0]["name"]
    firsts = {v.get("round", 1): {p["shape"]: p for p in v["points"]} for v in variants if v["name"] == first_name}
    rows = []
    for variant in variants:
        if variant["name"] == first_name:
            continue
        for point in variant["points"]:
            base = firsts[variant.get("round", 1)][point["shape"]]
            rows.append({
                "variant": variant["name"], "round": variant.get("round", 1), "shape": point["shape"],
                **{key: point[key] / base[key] if point[key] and base[key] else None
                   for key in ("fwd_graph_ms", "fwdbwd_graph_ms")},
            })  # fmt: skip
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="64x1024,8x8192,2x32768,1x65536", help="BxT or BxTxD, comma-separated")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME[:SETTING=VALUE+…][@TREE]",
                        help="repeatable; the first is the one the others are divided by")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=1, help="runs of every variant, in alternating order")
    parser.add_argument("--check-shape", default="8x2048", help="BxT[xD] of the float64 check")
    parser.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16", help="the inputs' dtype")
    parser.add_argument("--out", default=None, help="write the JSON here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # one variant's measurement
    args = parser.parse_args()
    texts = args.variant or ["default"]
    try:
        variants = [parse_variant(v) for v in texts]
        changes = [settings_changes(items) for _, items, _ in variants]
        envs = [tree_env(tree) for _, _, tree in variants]
    except ValueError as error:
        parser.error(str(error))
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    if args.child:
        with settings.override(**changes[0]):
            print(json.dumps(measure(args.shapes.split(","), args.check_shape, getattr(torch, args.dtype))))
        return 0
    results = []
    for round_, i in rounds_order(len(variants), args.rounds):
        (name, items, tree), variant = variants[i], texts[i]
        argv = ["--shapes", args.shapes, "--check-shape", args.check_shape, "--dtype", args.dtype, "--variant", variant]
        (run,) = child_runs(__file__, argv, 1, envs[i])
        results.append({"name": name, "settings": items, "tree": tree, "round": round_, **run})
        floor = ", ".join(f"{x:.3f}" for x in run["check"]["over_floor"])
        print(f"{name} (round {round_}, source {run['source']}): o / dq / dk / dv over the rounding floor {floor}",
              flush=True)  # fmt: skip
        for point in run["points"]:
            times = ", ".join(f"{call} {point[key]:.3f} ms" if point[key] is not None else f"{call} not captured"
                              for call, key in (("fwd", "fwd_graph_ms"), ("fwd+bwd", "fwdbwd_graph_ms")))  # fmt: skip
            print(f"  {point['shape']}: {times}", flush=True)

    from lightning_attention.bench.machine import machine_info, machine_line, source_digest

    write_json(args.out, {
        "machine_line": machine_line(machine_info(torch.device("cuda"))), "command": "python " + " ".join(sys.argv),
        "source": source_digest(), "shapes": args.shapes.split(","), "variants": results, "ratios": ratios(results),
    })  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
