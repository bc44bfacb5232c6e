"""Times float32 calls with each way of running their products (``plan.FP32_PRECISION``): three tf32 products per
product (``tf32x3``, the default) against exact FMA loops (``ieee``), on the same inputs in one process, with the
first call's time (compile included) and each output's relative L2 error against float64 (docs/kernels.md,
"Float32 products").

    python benchmarks/fp32_products.py --shapes 8x8192x64,8x8192x128 --out fp32_products.json
"""

import argparse
import sys
import time

import torch
from timed_calls import device_ms, float64_reference, make_problem, parse_shape, write_json

from lightning_attention.utils.testing import relative_error

PRECISIONS = ("tf32x3", "ieee")


def measure(B: int, T: int, D: int, precisions=PRECISIONS) -> list[dict]:
    """One row per precision: first-call seconds, fwd / fwd+bwd median ms and the error of o, dq, dk, dv (the first
    sequence) against float64, for float32 q, k, v ``[B, T, 16, D]``."""
    from lightning_attention.ops.lightning import plan, run

    p = make_problem(B, T, D=D, dtype=torch.float32)
    ref = float64_reference(p.q, p.k, p.v, p.do, p.slope, rows=1)
    rows = []
    default = plan.FP32_PRECISION
    for precision in precisions:
        plan.FP32_PRECISION = precision  # read by every plan made from here on
        run.clear_programs()
        try:
            t0 = time.perf_counter()
            o, _ = p.fwd()
            grads = p.fwd_bwd()
            torch.cuda.synchronize()
            first_s = time.perf_counter() - t0
            errors = [relative_error(x[:1], r) for x, r in zip((o, *grads), ref, strict=True)]
            rows.append({
                "shape": f"{B}x{T}x{D}", "precision": precision, "first_call_s": round(first_s, 2),
                "fwd_ms": device_ms(p.fwd), "fwd_bwd_ms": device_ms(p.fwd_bwd),
                "rel_l2": dict(zip(("o", "dq", "dk", "dv"), errors, strict=True)),
            })  # fmt: skip
            print(rows[-1], flush=True)
        finally:
            plan.FP32_PRECISION = default
            run.clear_programs()
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="8x8192x64,8x8192x128", help="comma-separated BxTxD (H = 16)")
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument("--out", default=None, help="JSON file for the rows")
    args = parser.parse_args(argv)
    precisions = tuple(args.precisions.split(","))
    from lightning_attention.bench.machine import machine_info

    info = machine_info("cuda")
    rows = [row for s in args.shapes.split(",") for row in measure(*parse_shape(s), precisions=precisions)]
    write_json(args.out, {"machine": info, "argv": sys.argv[1:] if argv is None else argv, "rows": rows})


if __name__ == "__main__":
    main()
