"""First timing of the Triton ``lightning_attn`` kernels on a GPU (the full benchmark is ``lightning-attention bench``).

Grid (a) of DESIGN §4 — bf16, H = 16, K = V = 128, 65,536 tokens per call, T = 1K..64K (batch = 65536 / T) — plus
batch 1 at T = 128K: median ms of the forward and of forward + backward (``triton.testing.do_bench``), the HBM floor
(q, k, v read and o written; the backward also reads do and writes dq, dk, dv, at the measured 3.02 TB/s copy
ceiling of an H100), the workspace (peak memory during fwd+bwd minus inputs, outputs and gradients) as a fraction of
one input tensor, and the cold start (first fwd+bwd call of the first shape, compile and autotune included: run with
an empty ``TRITON_CACHE_DIR`` to measure it).

    python benchmarks/chunk_timing.py --out benchmarks/results/chunk_timing_h100.json
"""

import argparse
import os
import time

import torch
import triton
from kernel_problem import make_problem, write_json

HBM_BYTES_PER_S = 3.02e12


def measure(B, T, H=16, D=128, dtype=torch.bfloat16):
    problem = make_problem(B, T, H, D, dtype)
    q, fwd, fwd_bwd = problem.q, problem.fwd, problem.fwd_bwd

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fwd_bwd()
    torch.cuda.synchronize()
    first_call_s = time.perf_counter() - t0

    ms_fwd = triton.testing.do_bench(fwd, warmup=25, rep=200)
    ms_fb = triton.testing.do_bench(fwd_bwd, warmup=25, rep=200)

    # workspace: peak during fwd+bwd minus inputs, do, o and the three gradients
    tensor_bytes = q.numel() * q.element_size()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    grads = fwd_bwd()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    workspace = peak - 4 * tensor_bytes  # o (freed after backward, but alive at the peak) + dq, dk, dv
    del grads

    floor_fwd = 4 * tensor_bytes / HBM_BYTES_PER_S * 1e3
    floor_fb = 11 * tensor_bytes / HBM_BYTES_PER_S * 1e3
    return {
        "B": B, "T": T, "H": H, "K": D, "V": D, "dtype": str(dtype).replace("torch.", ""),
        "fwd_ms": ms_fwd, "fwd_bwd_ms": ms_fb, "floor_fwd_ms": floor_fwd, "floor_fwd_bwd_ms": floor_fb,
        "fwd_x_floor": ms_fwd / floor_fwd, "fwd_bwd_x_floor": ms_fb / floor_fb,
        "tokens_per_s_fwd_bwd": B * T / (ms_fb * 1e-3),
        "workspace_bytes": workspace, "workspace_frac_of_input": workspace / tensor_bytes,
        "first_call_s": first_call_s,
    }  # fmt: skip


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="JSON file to write")
    parser.add_argument("--tokens", type=int, default=65536)
    parser.add_argument("--lengths", default="1024,2048,4096,8192,16384,32768,65536")
    parser.add_argument("--long", default="131072", help="batch-1 lengths (grid (b) excerpt)")
    args = parser.parse_args()
    props = torch.cuda.get_device_properties(0)
    rows = []
    shapes = [(args.tokens // int(t), int(t)) for t in args.lengths.split(",") if t]
    shapes += [(1, int(t)) for t in args.long.split(",") if t]
    for B, T in shapes:
        r = measure(B, T)
        rows.append(r)
        print(
            f"B={B:3d} T={T:7d}  fwd {r['fwd_ms']:.3f} ms ({r['fwd_x_floor']:.2f}x floor)  "
            f"fwd+bwd {r['fwd_bwd_ms']:.3f} ms ({r['fwd_bwd_x_floor']:.2f}x floor)  "
            f"workspace {100 * r['workspace_frac_of_input']:.1f}% of an input  first call {r['first_call_s']:.1f} s",
            flush=True,
        )
    result = {
        "device": props.name,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "kernel_config": os.environ.get("LIGHTNING_ATTENTION_KERNEL_CONFIG", "autotune"),
        "cold_start_s": rows[0]["first_call_s"] if rows else None,
        "rows": rows,
    }
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
