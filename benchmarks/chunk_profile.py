"""Where the time of one ``lightning_attn`` fwd+bwd goes, kernel by kernel (torch.profiler, CUDA time).

Prints, per shape, each kernel's total CUDA time over ``--iters`` fwd+bwd calls divided by the number of calls, and
writes the table as JSON. Use it to attribute a change measured by ``chunk_timing.py`` to the passes it touched.

    python benchmarks/chunk_profile.py --shapes 32x2048,2x32768,1x131072 --out benchmarks/results/chunk_profile.json
"""

import argparse

import torch
import triton
from kernel_problem import make_problem, parse_shape, write_json
from torch.profiler import ProfilerActivity, profile


def profile_shape(B: int, T: int, H: int = 16, D: int = 128, iters: int = 10, dtype=torch.bfloat16):
    """([{kernel, calls_per_iter, us_per_iter}], do_bench ms, [{kernel, us}] of the last call in launch order) for
    ``iters`` fwd+bwd calls at [B, T, H, D] (bf16, TNL slopes): the kernels' own time per call next to the call's
    wall time (the difference: idle GPU, e.g. waiting for the host)."""
    step = make_problem(B, T, H, D, dtype).fwd_bwd
    for _ in range(3):  # compile, autotune, warm
        step()
    torch.cuda.synchronize()
    wall_ms = triton.testing.do_bench(step, warmup=10, rep=100)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            step()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        cuda_us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if cuda_us <= 0:
            continue
        rows.append({"kernel": e.key[:80], "calls_per_iter": e.count / iters, "us_per_iter": cuda_us / iters})
    rows.sort(key=lambda r: -r["us_per_iter"])
    # the last call's kernels in launch order (the passes share a kernel name: the order tells them apart)
    kernels = sorted(
        (e for e in prof.events() if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA),
        key=lambda e: e.time_range.start,
    )
    per_call = len(kernels) // iters
    sequence = [{"kernel": e.name[:60], "us": e.time_range.elapsed_us()} for e in kernels[-per_call:]]
    return rows, wall_ms, sequence


def plan_and_configs(B: int, T: int, H: int = 16, D: int = 128) -> dict:
    """The segment plan of a [B, T, H, D] call and the configuration every compiled walk, pre-pass and scan launch
    took (BT, BV, warps, stages, descriptors; one line per launch key seen so far in this process)."""
    from lightning_attention.ops.lightning import chunk

    q = torch.empty(B, T, H, D, device="cuda", dtype=torch.bfloat16)
    plan = chunk.plan_segments(q, q, None, None)
    launches = []
    for name in ("_WALK", "_STATE", "_SCAN"):
        for entry in getattr(chunk, name).cache.entries.values():
            if entry.compiled is None:
                continue
            meta = entry.compiled.metadata
            cfg = {k: entry.config.get(k) for k in ("BT", "BV", "USE_TMA", "REVERSE", "SEG_IN") if k in entry.config}
            launches.append({"kernel": name, **cfg, "num_warps": meta.num_warps, "num_stages": meta.num_stages})
    return {"segmented": plan.segmented, "segments": plan.total, "seg_len": plan.seg_len, "launch_keys": launches}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="32x2048,8x8192,2x32768,1x131072", help="BxT or BxTxD, comma-separated")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "shapes": {}}
    for shape in args.shapes.split(","):
        B, T, D = parse_shape(shape)
        rows, wall_ms, sequence = profile_shape(B, T, D=D, iters=args.iters)
        plan = plan_and_configs(B, T, D=D)
        result["shapes"][shape] = {"kernels": rows, "do_bench_ms": wall_ms, "plan": plan, "sequence": sequence}
        print(f"plan of {shape}: {plan}", flush=True)
        print("one call, in launch order: " + ", ".join(f"{k['kernel']} {k['us']:.0f} us" for k in sequence))
        total = sum(r["us_per_iter"] for r in rows)
        print(f"== B={B} T={T} D={D}: {total / 1e3:.3f} ms of kernels per fwd+bwd, do_bench {wall_ms:.3f} ms", flush=True)
        for r in rows[:12]:
            print(f"  {r['us_per_iter']:9.1f} us  x{r['calls_per_iter']:.0f}  {r['kernel']}", flush=True)
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
