"""Shared memory per block of every recompute-backward kernel configuration, for sm_80/86/89/90/120.

Compiles the kernel (one launch: dq, dk and dv sweeps) ahead of time (no GPU needed) for each target and reads
``.metadata.shared``; the configurations are exactly those the launcher picks (``recompute_config``). Prints one
JSON line per configuration, then a markdown table; exits 1 if any configuration exceeds its target's per-block
limit.

    python benchmarks/recompute_smem_table.py                       # default shape set, all targets
    python benchmarks/recompute_smem_table.py --dims all --jobs 16      # all 25 shape classes
    python benchmarks/recompute_smem_table.py --dims 128x128 --ccs 80,90 --dtypes bfloat16
    python benchmarks/recompute_smem_table.py --markdown-out benchmarks/results/recompute_smem_triton-3.6.0.md

Checked here with torch 2.13 (CPU) + triton 3.8.0, through the public ``triton.compile(ASTSource(...),
target=GPUTarget(...))`` API; the GPU machine has torch 2.11 + triton 3.6 (not checked here).
"""

import os

# Ahead-of-time compilation needs real @triton.jit functions: under TRITON_INTERPRET=1 they are interpreter objects.
os.environ.pop("TRITON_INTERPRET", None)

import argparse
import concurrent.futures
import itertools
import json
import platform
import sys
import time

import torch
import triton

from lightning_attention.ops.lightning.recompute_smem import SMEM_LIMITS, markdown_table, measure

# Head-dim pairs (K, V); the launcher pads each to a power of two in 16..256, so 25 shape classes exist
# (``--dims all``). Shared memory is not monotone in the head dims (the compiler's layouts change with the tiles:
# bf16 dv needs 32 KB at 128x128 but 18 KB at 256x256), so the default set samples squares and K != V extremes.
DEFAULT_DIMS = ["16x16", "64x64", "128x128", "256x256", "64x256", "256x64"]
PADDED_DIMS = (16, 32, 64, 128, 256)
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def _measure(item):
    dtype, K, V, cc, decay, fast = item
    return measure(dtype, K, V, cc, decay=decay, fast=fast)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--dims",
        default=",".join(DEFAULT_DIMS),
        help="comma-separated KxV pairs, or 'all' (the 25 padded shape classes)",
    )
    parser.add_argument("--dtypes", default=",".join(DTYPES), help="comma-separated: float16,bfloat16,float32")
    parser.add_argument("--ccs", default=",".join(str(c) for c in SMEM_LIMITS), help="compute capabilities")
    parser.add_argument("--no-decay", action="store_true", help="also compile the slope=None variants")
    parser.add_argument(
        "--fast",
        action="store_true",
        help="stop after LLVM IR, where shared memory is fixed (no PTX/ptxas; ~3x faster)",
    )
    parser.add_argument("--jobs", type=int, default=1, help="parallel compiler processes")
    parser.add_argument("--markdown-out", default=None, help="also write the markdown table to this file")
    args = parser.parse_args(argv)

    if args.dims == "all":
        dims = [(K, V) for K in PADDED_DIMS for V in PADDED_DIMS]
    else:
        dims = [tuple(int(x) for x in d.lower().split("x")) for d in args.dims.split(",")]
    ccs = [int(c) for c in args.ccs.split(",")]
    decays = (True, False) if args.no_decay else (True,)
    work = [
        (DTYPES[dtype_name], K, V, cc, decay, args.fast)
        for (K, V), dtype_name, decay, cc in itertools.product(dims, args.dtypes.split(","), decays, ccs)
    ]
    rows = []
    start = time.perf_counter()
    with concurrent.futures.ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for row in pool.map(_measure, work):
            rows.append(row)
            print(json.dumps(row.as_dict()), flush=True)
    elapsed = time.perf_counter() - start
    machine = (
        f"triton {triton.__version__}, torch {torch.__version__}, python {platform.python_version()}, "
        f"compiled ahead of time on {platform.machine()} ({len(rows)} compilations, {elapsed:.0f} s)"
    )
    table = f"Shared memory per block (bytes) of the recompute backward kernel — {machine}\n\n" + markdown_table(rows)
    print()
    print(table)
    if args.markdown_out:
        with open(args.markdown_out, "w") as f:
            f.write("# Recompute backward: shared memory per block\n\n" + table + "\n")
    over = [r for r in rows if not r.fits]
    summary = {"triton": triton.__version__, "configs": len(rows), "over_limit": [r.as_dict() for r in over],
               "max_shared": max((r.shared for r in rows), default=0)}  # fmt: skip
    print(json.dumps(summary))
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
