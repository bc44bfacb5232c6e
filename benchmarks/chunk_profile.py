"""One ``lightning_attn`` fwd+bwd, kernel by kernel: the segment plan, every launch of the forward and backward
programs in launch order with its configuration, and each kernel's CUDA time (torch.profiler).

Per shape (bf16, H = 16, TNL slopes): the plan (segmented or not, segments, tokens per segment), then one line per
launch — the launcher, the grid, the configuration it ran with (the autotuner's choice included), the compiled
kernel's registers, spills and shared memory — beside the kernel's time in the last profiled call, and the call's
``do_bench`` time (kernels adding up to less: the GPU waited, e.g. for the host). The programs are the ones the
calls ran (``ops/lightning/run.py`` caches one per problem), so this is what a training step of that shape does.

    python benchmarks/chunk_profile.py --shapes 32x2048,2x32768,1x131072 --out chunk_profile.json
    python benchmarks/chunk_profile.py --shapes 4x16384x64 --set segment_len=0      # the same without segments
    python benchmarks/chunk_profile.py --shapes 1x524288 --graph                     # also as CUDA-graph replays

With ``--graph`` the fwd+bwd is also captured in a CUDA graph and its replays are profiled the same way, each kernel's
replayed time beside its plain one.
"""

import argparse
import json

import torch
from timed_calls import (
    add_settings_option,
    capture,
    device_ms,
    make_problem,
    parse_shape,
    profiled_kernels,
    settings_changes,
    write_json,
)

from lightning_attention import settings
from lightning_attention.ops.lightning import plan, run

# the configuration keys a line shows (the rest is in the JSON); flags are shown when set
_SHOWN = ("BT", "BV", "num_warps", "num_stages", "STAGES")
_FLAGS = ("REVERSE", "SEG_IN", "STATE_ONLY", "SKIP_FINAL", "USE_TMA", "INTER_APART", "VARLEN", "SPLIT")


def call_programs(problem) -> dict:
    """The forward and backward programs a fwd+bwd of ``problem`` (``timed_calls.Problem``) runs, and their plan."""
    q, k, v, do, slope = problem.q.detach(), problem.k.detach(), problem.v.detach(), problem.do, problem.slope
    fwd_problem = run.problem_of(q, k, v, slope, None, None, None, 1.0, False, 0)
    _, _, states = run.chunk_forward(q, k, v, slope, None, None, None, 1.0, False)
    bwd_problem = run.problem_of(q, k, v, slope, None, None, None, 1.0, False, 0, do, None, states)
    segments = plan.plan_segments(fwd_problem)
    shown = {"segmented": segments.segmented, "segments": segments.total, "per_seq": segments.per_seq}
    return {
        "plan": {**shown, "seg_len": segments.seg_len},
        "fwd": run.forward_program(fwd_problem),
        "bwd": run.backward_program(bwd_problem),
    }


def launch_rows(program) -> list[dict]:
    """One row per launch of ``program`` in order: launcher, grid, configuration and the compiled kernel's resources
    (known once the launch has run on the GPU and been verified by the direct launcher)."""
    rows = []
    for launch in program.launches:
        bound = launch.bound
        config = dict(bound.entry.config if bound is not None else launch.constexprs)
        row = {"launcher": launch.launcher.name, "grid": list(bound.grid) if bound is not None else None}
        compiled = bound.entry.compiled if bound is not None else None
        if compiled is not None:
            meta = compiled.metadata
            config.setdefault("num_warps", getattr(meta, "num_warps", None))
            if "STAGES" not in config:  # a Gluon kernel's ring has its own STAGES; its num_stages option is unused
                config.setdefault("num_stages", getattr(meta, "num_stages", None))
            # the same attributes on Triton and Gluon kernels of the Triton versions this library supports
            row.update(n_regs=getattr(compiled, "n_regs", None), n_spills=getattr(compiled, "n_spills", None),
                       shared=getattr(meta, "shared", None))  # fmt: skip
        row["config"] = {key: value if isinstance(value, (bool, int, float)) else str(value)
                         for key, value in config.items()}  # fmt: skip
        rows.append(row)
    return rows


def describe(row: dict) -> str:
    """A launch row as one line."""
    config = row["config"]
    shown = " ".join(f"{k}={config[k]}" for k in _SHOWN if k in config)
    flags = " ".join(k for k in _FLAGS if config.get(k))
    grid = "x".join(str(g) for g in row["grid"]) if row.get("grid") else "?"
    resources = f" regs {row['n_regs']} spills {row['n_spills']} smem {row['shared']}" if "n_regs" in row else ""
    return f"{row['launcher']} grid {grid}: {shown} {flags}{resources}"


def profile_shape(B: int, T: int, H: int, D: int, iters: int, graph: bool = False) -> dict:
    problem = make_problem(B, T, H, D)
    for _ in range(3):  # compile, verify the direct launches, warm
        problem.fwd_bwd()
    torch.cuda.synchronize()
    wall_ms = device_ms(problem.fwd_bwd, warmup=10, rep=100)
    kernels = profiled_kernels(problem.fwd_bwd, iters)[-1]  # the last profiled call's kernels, in launch order
    programs = call_programs(problem)
    launches = [{"pass": name, **row} for name in ("fwd", "bwd") for row in launch_rows(programs[name])]
    result = {"plan": programs["plan"], "do_bench_ms": wall_ms, "launches": launches, "kernels": kernels}
    if graph:
        replay = capture(problem.fwd_bwd).replay
        result["graph_ms"] = device_ms(replay, warmup=10, rep=100)
        result["graph_kernels"] = profiled_kernels(replay, iters)[-1]
    if len(kernels) == len(launches):  # pair them: the kernels of one call are its programs' launches, in order
        for launch, kernel in zip(launches, kernels, strict=True):
            launch.update(kernel)
        if len(result.get("graph_kernels", ())) == len(launches):
            for launch, kernel in zip(launches, result["graph_kernels"], strict=True):
                launch["graph_us"] = kernel["us"]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="32x2048,8x8192,2x32768,1x131072", help="BxT or BxTxD, comma-separated")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--iters", type=int, default=5, help="profiled fwd+bwd calls (the last one is reported)")
    parser.add_argument("--graph", action="store_true", help="also profile the fwd+bwd as CUDA-graph replays")
    add_settings_option(parser)
    parser.add_argument("--out", default=None, help="write the result as JSON to this file")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "settings": args.set, "shapes": {}}
    with settings.override(**settings_changes(args.set)):
        for shape in args.shapes.split(","):
            B, T, D = parse_shape(shape)
            res = result["shapes"][shape] = profile_shape(B, T, args.heads, D, args.iters, args.graph)
            total = sum(k["us"] for k in res["kernels"]) / 1e3
            print(f"== {shape} (H = {args.heads}): plan {json.dumps(res['plan'])}; {total:.3f} ms of kernels per "
                  f"fwd+bwd, do_bench {res['do_bench_ms']:.3f} ms", flush=True)  # fmt: skip
            if "graph_ms" in res:
                replayed = sum(k["us"] for k in res["graph_kernels"]) / 1e3
                print(f"  replayed: {replayed:.3f} ms of kernels, do_bench {res['graph_ms']:.3f} ms", flush=True)
            for launch in res["launches"]:
                us = f"{launch['us']:9.1f} us  " if "us" in launch else ""
                us += f"(replayed {launch['graph_us']:9.1f})  " if "graph_us" in launch else ""
                print(f"  {launch['pass']}  {us}{describe(launch)}", flush=True)
            if len(res["kernels"]) != len(res["launches"]):
                print(f"  ({len(res['kernels'])} kernels ran, {len(res['launches'])} launches planned: not paired)")
                for k in res["kernels"]:
                    print(f"  {k['us']:9.1f} us  {k['kernel']}")
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
