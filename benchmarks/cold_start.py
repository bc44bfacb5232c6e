"""First-call wall time of ``lightning_attn`` from an empty Triton cache, per dtype × head dim × call class.

A cell is (dtype, head dim K = V, class): ``forward`` (``lightning_attn(q, k, v, slope)`` on inputs that need no
gradient: what a user of inference pays) or ``fwd+bwd`` (the forward on inputs that require grad, then
``(o.float() * do).sum().backward()``). Each cell runs in its own process with its own new, empty
``TRITON_CACHE_DIR``, so no cell reuses a kernel another one compiled. The process times, by ``time.perf_counter``:

- ``torch_import_s`` / ``import_s``: ``import torch``, then ``import lightning_attention`` on top of it;
- ``cold_s``: the first call, synchronised before and after (``lightning_attention.bench.timing.wall_seconds``):
  importing Triton and the kernel modules (the package imports them on first use), compiling and autotuning every
  kernel variant the call needs, and running it;
- ``warm_s``: the second call, the same way;
- ``compiled_kernels``: the kernel binaries the first call left in the cache (``*.cubin``, one per kernel variant
  and configuration compiled, autotuner candidates included), and ``cache_entries``: the cache's folders (the
  kernels, plus the launcher modules Triton builds for them); ``compiled_kernels_after_warm``: the binaries after
  the second call (more than after the first: the second call compiled too).

Inputs: q, k, v, do ``[B, T, H, D]`` from ``torch.randn`` in the cell's dtype (B x T x H = 4 x 2048 x 16 unless
``--shape`` says otherwise), decay ``tnl_slopes(H, 0, 2)``. A first call compiles its kernels (a fwd+bwd: the
backward's with the forward's) at once in threads of its process (``ops/lightning/compile_ahead.py``);
``--compile-ahead off`` sets ``LIGHTNING_ATTENTION_COMPILE_AHEAD=0`` in every cell, so each kernel compiles at its
first launch, one after another (the A/B of that). ``--parallel N`` runs N cells at once: compiles are CPU-bound, so
on a machine with a few times N cores the numbers move little (the autotuner's timings and the warm calls then share
the GPU); the JSON and the table record N and the compile-ahead setting. A cell past ``--timeout-s`` is recorded as
timed out (its process group killed), a failed one with its exit status and the tail of its stderr. The slowest
cells (float32, then fwd+bwd) start first, so that with ``--parallel`` the run ends soonest. ``cold_start.json``
and ``cold_start.md`` (rows dtype × class, columns head dims, first-call seconds against the 15 s target) are
rewritten after every cell, so a run stopped by an outer time limit keeps what finished.

``--device cpu`` runs the Triton backend under Triton's interpreter (``TRITON_INTERPRET=1``), which compiles
nothing: there ``compiled_kernels`` is 0 and the numbers only show that the script works. The interpreter runs
float32 and float16; bfloat16 fails there (``lightning_attention/ops/lightning/interpreter.py``).

    python benchmarks/cold_start.py --parallel 4 --out cold_start
    python benchmarks/cold_start.py --dtypes bfloat16 --head-dims 128 --classes forward --out cold_bf16
    python benchmarks/cold_start.py --device cpu --shape 1x64x2 --dtypes float32 --head-dims 16 --out cold_cpu
"""

# Only the standard library at the top: a cell's process runs this file too, and times its own imports of torch
# and of the package.
import argparse
import concurrent.futures
import contextlib
import json
import math
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time

DTYPES = ("float32", "float16", "bfloat16")
HEAD_DIMS = (64, 128, 256)
CLASSES = ("forward", "fwd+bwd")
TARGET_S = 15.0
STDERR_TAIL = 2000  # characters of a failed cell's stderr kept in the JSON


def cache_contents(cache_dir: pathlib.Path) -> dict:
    """``compiled_kernels``: the ``*.cubin`` files under ``cache_dir`` (Triton writes one per compiled kernel, in a
    folder of its own beside its IR and metadata); ``cache_entries``: the folders directly under it."""
    return {
        "compiled_kernels": sum(1 for _ in cache_dir.rglob("*.cubin")),
        "cache_entries": sum(1 for p in cache_dir.iterdir() if p.is_dir()),
    }


def run_cell(spec: dict) -> dict:
    """One cell, in this process (whose ``TRITON_CACHE_DIR`` is the cell's own, empty). ``spec``: dtype, head_dim,
    class, B, T, H, device. Returns the timings and the cache counts."""
    t0 = time.perf_counter()
    import torch

    t1 = time.perf_counter()
    import lightning_attention as la

    t2 = time.perf_counter()
    # imports neither Triton nor the kernels: the first call below still pays for them
    from lightning_attention.bench.timing import wall_seconds

    device = torch.device(spec["device"])
    dtype = getattr(torch, spec["dtype"])
    B, T, H, D = spec["B"], spec["T"], spec["H"], spec["head_dim"]
    backward = spec["class"] == "fwd+bwd"
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v, do = (torch.randn(B, T, H, D, device=device, dtype=dtype, generator=gen) for _ in range(4))
    slope = la.tnl_slopes(H, 0, 2).to(device)
    leaves = [x.requires_grad_() for x in (q, k, v)] if backward else []

    def call():
        o, _ = la.lightning_attn(q, k, v, slope)
        if backward:
            (o.float() * do).sum().backward()

    def clear():  # the second backward writes fresh gradients instead of accumulating into the first ones
        for x in leaves:
            x.grad = None

    cache_dir = pathlib.Path(os.environ["TRITON_CACHE_DIR"])
    cold_s = wall_seconds(call, device)
    after_cold = cache_contents(cache_dir)
    clear()
    warm_s = wall_seconds(call, device)
    return {
        "cold_s": cold_s,
        "warm_s": warm_s,
        "torch_import_s": t1 - t0,
        "import_s": t2 - t1,
        **after_cold,
        "compiled_kernels_after_warm": cache_contents(cache_dir)["compiled_kernels"],
    }


def cell_environment(device: str, cache_dir: str, compile_ahead: bool = True) -> dict:
    """The environment of a cell's process: this one's, with the cell's own Triton cache and the compile-ahead
    setting, and on CPU the Triton backend under the interpreter (on CUDA the interpreter stays off even when this
    process has it on)."""
    env = dict(os.environ, TRITON_CACHE_DIR=cache_dir, LIGHTNING_ATTENTION_COMPILE_AHEAD=str(int(compile_ahead)))
    if device == "cpu":
        env.update(TRITON_INTERPRET="1", LIGHTNING_ATTENTION_BACKEND="triton")
    else:
        env.pop("TRITON_INTERPRET", None)
    return env


def measure_cell(spec: dict, timeout_s: float) -> dict:
    """Runs one cell in a child process with a new, empty Triton cache (removed afterwards) and returns its record:
    dtype, head_dim, class, ``status`` (ok / failed / timeout), ``rc``, ``process_s`` (the child's whole life, seen
    from here), the child's numbers when it finished, and the tail of its stderr when it did not."""
    record = {"dtype": spec["dtype"], "head_dim": spec["head_dim"], "class": spec["class"]}
    cache_dir = tempfile.mkdtemp(prefix="cold_start_triton_")
    cmd = [sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)]
    t0 = time.perf_counter()
    # a process group of its own (start_new_session): a timeout kills the whole group, Triton's compiler processes
    # included
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=cell_environment(spec["device"], cache_dir, spec["compile_ahead"]),
                            start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout_s)
        record.update(status="ok" if proc.returncode == 0 else "failed", rc=proc.returncode)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):  # the group may have ended since the timeout
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        record.update(status="timeout", rc=None, error=f"timed out after {timeout_s:g} s")
    record["process_s"] = time.perf_counter() - t0
    shutil.rmtree(cache_dir, ignore_errors=True)
    found = [line for line in out.splitlines() if line.startswith("RESULT ")]
    if record["status"] == "ok" and found:
        record.update(json.loads(found[-1][len("RESULT ") :]))
    else:
        if record["status"] == "ok":  # exited 0 without its result line
            record["status"] = "failed"
        record["stderr_tail"] = err[-STDERR_TAIL:]
    return record


def cells(dtypes: list[str], head_dims: list[int], classes: list[str]) -> list[tuple[str, int, str]]:
    """Every (dtype, head dim, class), the slowest to compile first (float32, then fwd+bwd, then the larger head
    dim): with several cells at once the last ones to start are the short ones."""
    grid = [(d, k, c) for d in dtypes for c in classes for k in head_dims]
    return sorted(grid, key=lambda cell: (cell[0] != "float32", cell[2] != "fwd+bwd", -cell[1]))


def cold_cell(record: dict | None, target_s: float, timeout_s: float) -> str:
    """A cell of the markdown table: ``5.21 ✓`` / ``72.4 ✗`` against the target, or what happened instead."""
    if record is None:
        return "not run"
    if record["status"] == "timeout":
        return f"timed out ✗ (> {timeout_s:g} s)"
    if record["status"] != "ok":
        return f"failed ✗ (rc {record['rc']})"
    seconds = record["cold_s"]
    return f"{seconds:.3g} {'✓' if seconds <= target_s else '✗'}"


def markdown(doc: dict) -> str:
    """``cold_start.md``: the machine line, the first-call table (rows dtype × class, columns head dims), the
    per-cell details (second call, imports, kernels compiled) and why any cell did not finish."""
    from lightning_attention.bench.results import md_table, num

    config, shape = doc["config"], doc["config"]["shape"]
    dims, dtypes, classes = config["head_dims"], config["dtypes"], config["classes"]
    by_cell = {(r["dtype"], r["head_dim"], r["class"]): r for r in doc["cells"]}
    cold = md_table(
        ["dtype", "class", *(f"K = {k}" for k in dims)],
        [[d, c, *(cold_cell(by_cell.get((d, k, c)), config["target_s"], config["timeout_s"]) for k in dims)]
         for d in dtypes for c in classes],
    )  # fmt: skip
    ordered = sorted(doc["cells"], key=lambda r: (dtypes.index(r["dtype"]), classes.index(r["class"]), r["head_dim"]))
    details = md_table(
        ["dtype", "class", "K", "status", "first s", "second s", "import s", "torch import s", "kernels", "process s"],
        [[r["dtype"], r["class"], str(r["head_dim"]), r["status"], num(r.get("cold_s")), num(r.get("warm_s")),
          num(r.get("import_s")), num(r.get("torch_import_s")), str(r.get("compiled_kernels", "-")),
          num(r.get("process_s"))] for r in ordered],
    )  # fmt: skip
    setup = (
        f"B = {shape['B']}, T = {shape['T']}, H = {shape['H']}, K = V = head dim, on {config['device']}; every cell "
        f"in its own process with its own empty Triton cache, {config['parallel']} at once; "
        f"{ahead_text(config.get('compile_ahead', False))}. Seconds of the first call (compile, autotune and run), "
        f"✓ within the {config['target_s']:g} s target:"
    )
    legend = (
        "Per cell: seconds of the first and the second call, of importing the package (after torch) and torch, "
        "the kernels compiled by the first call (`*.cubin` in the cache), and the cell's whole process:"
    )
    lines = ["# Cold start from an empty Triton cache", "", doc["machine_line"], "", f"`{' '.join(config['argv'])}`",
             "", setup, "", cold, "", legend, "", details, ""]  # fmt: skip
    failures = [r for r in ordered if r["status"] != "ok"]
    if failures:
        lines += ["Cells that did not finish (the JSON keeps the tail of their stderr):", ""]
        lines += [f"- {r['dtype']} K = {r['head_dim']} {r['class']}: {last_line(r)}" for r in failures] + [""]
    return "\n".join(lines)


def ahead_text(compile_ahead: bool) -> str:
    """How the cells' first calls compiled (runs from before the setting existed compiled one by one)."""
    if compile_ahead:
        return "a first call compiles its kernels (a fwd+bwd: the backward's too) at once, in threads"
    return "each kernel compiled at its first launch, one after another"


def last_line(record: dict) -> str:
    """Why a cell did not finish, in one line: its timeout, or the last line of its stderr (the exception)."""
    if record["status"] == "timeout":
        return record["error"]
    tail = record.get("stderr_tail", "").strip().splitlines()
    return f"rc {record['rc']}: " + (tail[-1][:200] if tail else "no stderr")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="4x2048x16", help="BxTxH of q, k, v (K = V = each head dim)")
    parser.add_argument("--dtypes", default=",".join(DTYPES), help="comma-separated, of " + ", ".join(DTYPES))
    parser.add_argument("--head-dims", default=",".join(map(str, HEAD_DIMS)), help="K = V, comma-separated")
    parser.add_argument("--classes", default=",".join(CLASSES), help="comma-separated, of " + ", ".join(CLASSES))
    parser.add_argument("--parallel", type=int, default=1, help="cells run at once")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="seconds per cell, its process included")
    parser.add_argument("--target-s", type=float, default=TARGET_S, help="the first call's target (the table's ✓)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: the Triton backend under the interpreter (compiles nothing)")  # fmt: skip
    parser.add_argument("--compile-ahead", choices=("on", "off"), default="on",
                        help="off: every kernel compiles at its first launch, one by one")  # fmt: skip
    parser.add_argument("--out", default=None, help="folder for cold_start.json and cold_start.md")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)  # one cell, in its own process
    args = parser.parse_args()
    if args.child is not None:
        print("RESULT " + json.dumps(run_cell(json.loads(args.child))), flush=True)
        return 0

    dtypes, classes = args.dtypes.split(","), args.classes.split(",")
    head_dims = [int(k) for k in args.head_dims.split(",")]
    for name, chosen, allowed in (("--dtypes", dtypes, DTYPES), ("--classes", classes, CLASSES)):
        if not set(chosen) <= set(allowed):
            parser.error(f"{name}: {sorted(set(chosen) - set(allowed))} not among {', '.join(allowed)}")
    if args.parallel < 1:
        parser.error("--parallel: at least 1")
    if args.device == "cpu":  # the machine line then says how the cells ran
        os.environ.update(TRITON_INTERPRET="1", LIGHTNING_ATTENTION_BACKEND="triton")
    import torch
    from timed_calls import parse_shape, write_json

    from lightning_attention.bench.machine import machine_info, machine_line

    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("needs a CUDA GPU (--device cpu: the interpreter)")
    B, T, H = parse_shape(args.shape, D=16)  # the scripts' BxT[xN] form; the third number here is H
    info = machine_info(args.device)
    config = {"argv": sys.argv, "device": args.device, "shape": {"B": B, "T": T, "H": H}, "dtypes": dtypes,
              "head_dims": head_dims, "classes": classes, "parallel": args.parallel, "timeout_s": args.timeout_s,
              "target_s": args.target_s, "slopes": f"tnl_slopes({H}, 0, 2)",
              "compile_ahead": args.compile_ahead == "on"}  # fmt: skip
    doc = {"bench": "cold_start", "machine_line": machine_line(info), "machine": info, "config": config, "cells": []}
    out = pathlib.Path(args.out) if args.out else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    print(doc["machine_line"], flush=True)

    def save():
        if out is not None:
            write_json(str(out / "cold_start.json"), doc)
            (out / "cold_start.md").write_text(markdown(doc))

    t0 = time.perf_counter()
    specs = [{"dtype": d, "head_dim": k, "class": c, "B": B, "T": T, "H": H, "device": args.device,
              "compile_ahead": config["compile_ahead"]} for d, k, c in cells(dtypes, head_dims, classes)]  # fmt: skip
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.parallel) as pool:
        futures = [pool.submit(measure_cell, spec, args.timeout_s) for spec in specs]
        for future in concurrent.futures.as_completed(futures):
            record = future.result()
            doc["cells"].append(record)
            doc["elapsed_s"] = time.perf_counter() - t0
            save()
            shown = {k: record.get(k) for k in ("status", "cold_s", "warm_s", "import_s", "compiled_kernels", "error")}
            shown = {k: round(v, 3) if isinstance(v, float) else v for k, v in shown.items() if v is not None}
            print(f"{record['dtype']} K={record['head_dim']} {record['class']}: {json.dumps(shown)}", flush=True)
    doc["elapsed_s"] = time.perf_counter() - t0
    save()
    print(markdown(doc), flush=True)
    ok = all(r["status"] == "ok" and math.isfinite(r["cold_s"]) for r in doc["cells"])
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
