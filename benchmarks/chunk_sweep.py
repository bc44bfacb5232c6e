"""Pinned launch configurations of the chunk walks, timed side by side at one shape (and, with ``--check``, their
values against float64).

For each configuration (BT, BV, num_warps, num_stages) a child process runs under
``settings.override(kernel_config=...)`` (a pin applies to every walk of the call, the pre-pass included; a
configuration that faults poisons only its own process): ``triton.testing.do_bench`` medians of the forward and the
forward + backward (``timed_calls.py``), and per launch the configuration it ran with and the compiled kernel's
registers, spills and shared memory (``chunk_profile.py``). The first row is the unpinned call (the plan's and the
autotuner's own choice). Without ``--configs`` the pins are the candidates the autotuner would time for this
shape's main walk, so a sweep says which of them wins when each is pinned. (K = 256 in bf16 on an sm_90 GPU runs
the two-warpgroup walk, which has one configuration: pins change only its pre-pass and the other head dims.)

A configuration that times fastest may compute wrong values: ``--check`` also compares o, dq, dk, dv of the first
sequence with the float64 PyTorch path (relative L2, against the dtype's tolerance) before a rule may pick it.

    python benchmarks/chunk_sweep.py --shape 4x16384x64 --check
    python benchmarks/chunk_sweep.py --shape 8x8192 \\
        --configs "BT=64,BV=64,num_warps=4,num_stages=3;BT=64,BV=64,num_warps=4,num_stages=4"
"""

import argparse
import json
import subprocess
import sys

import torch
from chunk_profile import call_programs, launch_rows
from timed_calls import (
    add_settings_option,
    device_ms,
    float64_reference,
    make_problem,
    parse_shape,
    settings_changes,
    write_json,
)

import lightning_attention as la
from lightning_attention import settings
from lightning_attention.ops.lightning import plan, run
from lightning_attention.ops.lightning.kernels.configs import state_operand_bytes, walk_candidates
from lightning_attention.utils.testing import relative_error, tolerance


def tuner_candidates(B: int, T: int, H: int, D: int, device: str = "cuda") -> list[str]:
    """The main walk's configurations the autotuner would time at this shape on ``device``, as pins."""
    q = torch.empty(B, T, H, D, device=device, dtype=torch.bfloat16)
    problem = run.problem_of(q, q, q, None, None, None, None, 1.0, False, 0)
    configs = walk_candidates(
        D, D, q.element_size(), problem.device.shared_per_block, state_only=False,
        tma=plan.tma_enabled(problem.device, problem.settings),
        state_bytes=state_operand_bytes(plan.inter_precision(problem)),
    )  # fmt: skip
    return [f"BT={c.kwargs['BT']},BV={c.kwargs['BV']},num_warps={c.num_warps},num_stages={c.num_stages}"
            for c in configs]  # fmt: skip


def check_values(problem, rows: int = 1) -> dict:
    """Relative L2 errors of o, dq, dk, dv of the first ``rows`` sequences against the float64 PyTorch path, and
    whether each is within the dtype's tolerance."""
    o, _ = la.lightning_attn(problem.q, problem.k, problem.v, problem.slope)
    ours = (o, *torch.autograd.grad(o, (problem.q, problem.k, problem.v), problem.do))
    ref = float64_reference(problem.q, problem.k, problem.v, problem.do, problem.slope, rows)
    errors = {name: relative_error(a[:rows], b) for name, a, b in zip(("o", "dq", "dk", "dv"), ours, ref, strict=True)}
    return {"errors": errors, "ok": all(e <= tolerance(problem.q.dtype) for e in errors.values())}


def child(B: int, T: int, H: int, D: int, config: str | None, check: bool) -> dict:
    with settings.override(kernel_config=config):
        problem = make_problem(B, T, H, D)
        problem.fwd_bwd()
        res = {"fwd_ms": device_ms(problem.fwd), "fwd_bwd_ms": device_ms(problem.fwd_bwd)}
        programs = call_programs(problem)
        res["launches"] = [{"pass": name, **row} for name in ("fwd", "bwd") for row in launch_rows(programs[name])]
        if check:
            res["check"] = check_values(problem)
    return res


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="8x8192x128", help="BxT or BxTxD (bf16)")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--configs", default=None, help="pins 'BT=..,BV=..,num_warps=..,num_stages=..', ';'-separated "
                        "(default: the autotuner's candidates at this shape)")  # fmt: skip
    parser.add_argument("--check", action="store_true", help="also check each configuration's values vs float64")
    add_settings_option(parser, "another setting for every configuration, repeatable")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per configuration (compiles included)")
    parser.add_argument("--out", default=None, help="write the rows as JSON to this file")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)  # one configuration, in its own process
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    B, T, D = parse_shape(args.shape)
    changes = settings_changes(args.set)
    if args.child is not None:
        with settings.override(**changes):
            row = child(B, T, args.heads, D, args.child or None, args.check)
        print("RESULT " + json.dumps(row))
        return 0
    with settings.override(**changes):
        configs = args.configs.split(";") if args.configs else tuner_candidates(B, T, args.heads, D)
    rows = []
    for config in ["", *configs]:  # "": unpinned
        cmd = [sys.executable, __file__, "--shape", args.shape, "--heads", str(args.heads), "--child", config]
        cmd += [f"--set={item}" for item in args.set] + (["--check"] if args.check else [])
        row = {"config": config or "tuned"}
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, check=False)
            found = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
            row.update(json.loads(found[0][7:]) if found else {"error": proc.stderr[-800:]})
        except subprocess.TimeoutExpired:
            row["error"] = f"timed out after {args.timeout} s"
        rows.append(row)
        summary = {k: row[k] for k in ("fwd_ms", "fwd_bwd_ms", "error") if k in row}
        if "check" in row:
            summary["values_ok"] = row["check"]["ok"]
        print(f"{row['config']}: {json.dumps(summary)}", flush=True)
    write_json(args.out, {"shape": args.shape, "H": args.heads, "settings": args.set, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
