"""The recompute (SRAM-bounded) backward against the chunk backward: time and workspace on grid (a).

Grid (a) as docs/design.md defines it: bf16, H = 16, K = V = 128, 65,536 tokens per call (batch = 65536 / T),
T = 1K … 64K, TNL decay (``tnl_slopes(16, 0, 24)``; ``--no-decay`` for λ = 1). For each T and each backward
(``chunk``, ``recompute``) it measures, through the public API ``lightning_attn(..., backward=mode)``:

- ``bwd_ms``: ``torch.autograd.grad(o, (q, k, v), do)`` (median of ``triton.testing.do_bench``), i.e. the backward
  alone (the forward's graph is kept and reused);
- ``fwdbwd_ms``: forward + backward;
- ``workspace_mb``: peak memory allocated during the backward minus what was allocated before it and minus the
  returned gradients, and ``workspace_frac`` = that over the size of one input tensor (the target: <= 0.25);
- with ``--check``: relative L2 errors of dq, dk, dv against the float64 chunked PyTorch path (the bf16 tolerance
  of ``lightning_attention/utils/testing.py``: 5e-3).

Prints one JSON line per measurement and a markdown table; ``--out FILE.json`` also writes all rows.

    python benchmarks/recompute_timing.py                           # the whole grid (a)
    python benchmarks/recompute_timing.py --seqlens 2048,32768 --check --out recompute_timing.json
"""

import argparse
import json
import platform
import sys

import torch
from timed_calls import float64_reference

from lightning_attention.utils.dtypes import dtype_name

GRID_A_SEQLENS = (1024, 2048, 4096, 8192, 16384, 32768, 65536)
TOKENS_PER_CALL = 65536
MODES = ("chunk", "recompute")


def _inputs(batch: int, seqlen: int, heads: int, dim: int, dtype: torch.dtype, decay: bool, seed: int = 0):
    import lightning_attention as la

    gen = torch.Generator(device="cuda").manual_seed(seed)
    shape = (batch, seqlen, heads, dim)
    q, k, v, do = (torch.randn(shape, device="cuda", dtype=dtype, generator=gen) for _ in range(4))
    # keep |o| O(1) at 64K tokens without decay: unit-variance k would make the state grow like sqrt(T)
    k = k * dim**-0.5
    slope = la.tnl_slopes(heads, 0, 24).cuda() if decay else None
    return q, k, v, do, slope


def measure(seqlen: int, mode: str, *, heads=16, dim=128, dtype=torch.bfloat16, decay=True, check=False) -> dict:
    """Backward time and workspace of ``backward=mode`` at one T of grid (a)."""
    import triton

    import lightning_attention as la
    from lightning_attention.utils.testing import relative_error

    batch = TOKENS_PER_CALL // seqlen
    q, k, v, do, slope = _inputs(batch, seqlen, heads, dim, dtype, decay)
    leaves = [x.requires_grad_() for x in (q, k, v)]

    def forward():
        return la.lightning_attn(*leaves, slope, backward=mode)[0]

    def fwdbwd():
        return torch.autograd.grad(forward(), leaves, do)

    o = forward()
    grads = torch.autograd.grad(o, leaves, do, retain_graph=True)  # warm-up: compiles the kernels
    del grads
    torch.cuda.synchronize()
    bwd_ms = triton.testing.do_bench(
        lambda: torch.autograd.grad(o, leaves, do, retain_graph=True), return_mode="median"
    )
    fwdbwd_ms = triton.testing.do_bench(fwdbwd, return_mode="median")

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    grads = torch.autograd.grad(o, leaves, do, retain_graph=True)
    torch.cuda.synchronize()
    grad_bytes = sum(g.numel() * g.element_size() for g in grads)
    workspace = torch.cuda.max_memory_allocated() - before - grad_bytes
    input_bytes = q.numel() * q.element_size()
    row = {
        "mode": mode,
        "T": seqlen,
        "B": batch,
        "H": heads,
        "K": dim,
        "V": dim,
        "dtype": dtype_name(dtype),
        "decay": decay,
        "bwd_ms": round(bwd_ms, 4),
        "fwdbwd_ms": round(fwdbwd_ms, 4),
        "workspace_mb": round(workspace / 2**20, 2),
        "workspace_frac": round(workspace / input_bytes, 4),
    }
    if check:
        ref = float64_reference(q, k, v, do, slope)[1:]
        for name, g, r in zip(("dq", "dk", "dv"), grads, ref, strict=True):
            row[f"err_{name}"] = float(f"{relative_error(g, r):.3e}")
    return row


def markdown(rows: list[dict]) -> str:
    by = {(r["T"], r["mode"]): r for r in rows}
    lines = [
        (
            "| T | B | chunk bwd ms | recompute bwd ms | ratio | chunk fwd+bwd ms | recompute fwd+bwd ms | "
            "chunk workspace MB (frac) | recompute workspace MB (frac) |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for T in sorted({r["T"] for r in rows}):
        c, r = by.get((T, "chunk")), by.get((T, "recompute"))
        if c is None or r is None:
            continue
        lines.append(
            f"| {T} | {c['B']} | {c['bwd_ms']:.3f} | {r['bwd_ms']:.3f} | {r['bwd_ms'] / c['bwd_ms']:.2f}x | "
            f"{c['fwdbwd_ms']:.3f} | {r['fwdbwd_ms']:.3f} | {c['workspace_mb']:.1f} ({c['workspace_frac']:.2f}) | "
            f"{r['workspace_mb']:.1f} ({r['workspace_frac']:.2f}) |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seqlens", default=",".join(str(t) for t in GRID_A_SEQLENS))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--no-decay", action="store_true")
    parser.add_argument("--check", action="store_true", help="also report errors vs a float64 reference (slow)")
    parser.add_argument("--out", default=None, help="write the rows as JSON to this file")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("recompute_timing: needs a CUDA GPU", file=sys.stderr)
        return 2

    import triton

    machine = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
    }
    print(json.dumps(machine))
    rows = []
    for seqlen in (int(t) for t in args.seqlens.split(",")):
        for mode in args.modes.split(","):
            row = measure(seqlen, mode, decay=not args.no_decay, check=args.check)
            rows.append(row)
            print(json.dumps(row), flush=True)
            torch.cuda.empty_cache()
    print()
    print(markdown(rows))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"machine": machine, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
