"""One ``lightning_attn`` call per shape inside a CUDA profiler range, for Nsight Compute (``ncu``).

Compilation, autotuning and the direct launcher's verification run first, outside the range, so that
``--profile-from-start off`` sees only the profiled call's kernels (pre-pass, scan, walks). The ``ncu`` stage of
``benchmarks/gpu_suite.sh`` runs it as::

    ncu --profile-from-start off --clock-control none --set full -o walk python3 benchmarks/ncu_profile.py \\
        --shapes 2x32768:fwd,16x4096x256:fwd_bwd

A shape is ``BxT`` or ``BxTxD`` (bf16, H = 16, TNL slopes) and ``:fwd`` or ``:fwd_bwd`` says which call is profiled;
``--set NAME=VALUE`` profiles it under another setting (e.g. ``tma=0``).
"""

import argparse

import torch
from timed_calls import add_settings_option, make_problem, parse_shape, settings_changes

from lightning_attention import settings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="2x32768:fwd", help="BxT[xD]:fwd|fwd_bwd, comma-separated")
    add_settings_option(parser)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    with settings.override(**settings_changes(args.set)):
        for item in args.shapes.split(","):
            shape, call = item.split(":")
            B, T, D = parse_shape(shape)
            problem = make_problem(B, T, D=D)
            run = {"fwd": problem.fwd, "fwd_bwd": problem.fwd_bwd}[call]
            for _ in range(3):  # compile, autotune, verify the direct launches
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
