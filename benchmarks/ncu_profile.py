"""One ``lightning_attn`` call per shape inside a CUDA profiler range, for Nsight Compute (``ncu``).

Compilation and autotuning run first, outside the range (``--profile-from-start off`` then sees only the timed
call's kernels: pre-pass, scan, walks). Stage ``ncu`` of ``benchmarks/gpu_suite.sh`` runs it as::

    ncu --profile-from-start off --clock-control none --set full -o walk python3 benchmarks/ncu_profile.py \\
        --shapes 2x32768:fwd,16x4096x256:fwd_bwd

A shape is ``BxT`` or ``BxTxD`` (bf16, H = 16, TNL slopes) and ``:fwd`` or ``:fwd_bwd`` says which call is profiled.
"""

import argparse

import torch
from kernel_problem import make_problem, parse_shape


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="2x32768:fwd", help="BxT[xD]:fwd|fwd_bwd, comma-separated")
    args = parser.parse_args()
    for item in args.shapes.split(","):
        shape, call = item.split(":")
        B, T, D = parse_shape(shape)
        problem = make_problem(B, T, D=D)
        run = {"fwd": problem.fwd, "fwd_bwd": problem.fwd_bwd}[call]
        for _ in range(2):  # compile, autotune, and one plain call
            run()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        run()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
        print(f"profiled {shape} {call}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
