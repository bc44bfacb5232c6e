"""Timing of the hybrid chunk attention against SDPA causal attention over the full sequence, at one T.

``time_hybrid(T)`` returns median milliseconds (forward, and forward + backward) of

- ``hybrid``: :func:`lightning_attention.ops.hybrid.hybrid_chunk_attn` (softmax in chunks of C through SDPA, plus
  the inter-chunk linear part through ``lightning_attn_inter``), feature map elu+1, TNL decay;
- ``sdpa``: ``F.scaled_dot_product_attention(is_causal=True)`` over all T tokens (FlashAttention-2 on an H100),

on the same bf16 q, k, v of shape ``[B, T, H, D]``. Called by ``lightning-attention bench hybrid`` for each T of
4K..64K; usable alone on a GPU machine::

    python -c "from lightning_attention.bench.hybrid_timing import time_hybrid; print(time_hybrid(16384))"
"""

import torch
import torch.nn.functional as F

from lightning_attention.bench.timing import bench
from lightning_attention.ops.decay import tnl_slopes
from lightning_attention.ops.hybrid import hybrid_chunk_attn
from lightning_attention.utils.dtypes import dtype_name


def time_hybrid(
    T: int,
    *,
    batch: int = 1,
    num_heads: int = 16,
    head_dim: int = 128,
    chunk_size: int = 256,
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device | None = None,
    quick: bool = False,
    warmup_ms: float = 25.0,
    rep_ms: float = 100.0,
) -> dict:
    """Median ms of hybrid and SDPA causal, forward and forward + backward, at sequence length ``T``.

    Args:
        T: sequence length (any; need not be a multiple of ``chunk_size``).
        batch, num_heads, head_dim: B, H and K = V.
        chunk_size: C of the hybrid attention.
        dtype: input dtype (bf16 by default).
        device: default CUDA when available, else CPU (a smoke run only: CPU times are not measurements).
        quick: shorter warm-up / repetition windows (the benchmark CLI's smoke mode).

    Returns:
        dict with the shape, ``hybrid_fwd_ms``, ``hybrid_fwdbwd_ms``, ``sdpa_fwd_ms``, ``sdpa_fwdbwd_ms`` and the
        ratios ``speedup_fwd`` / ``speedup_fwdbwd`` (SDPA time / hybrid time; > 1 means the hybrid is faster).
    """
    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    if quick:
        warmup_ms, rep_ms = 5.0, 20.0
    g = torch.Generator(device=device).manual_seed(0)
    shape = (batch, T, num_heads, head_dim)
    q, k, v = (torch.randn(shape, generator=g, device=device, dtype=dtype).requires_grad_() for _ in range(3))
    do = torch.randn(shape, generator=g, device=device, dtype=dtype)
    slope = tnl_slopes(num_heads, 0, 2).to(device)
    leaves = [q, k, v]

    def hybrid():
        return hybrid_chunk_attn(q, k, v, slope, chunk_size=chunk_size, feature_map="elu+1")

    def sdpa():
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)

    result = {
        "T": T, "batch": batch, "num_heads": num_heads, "head_dim": head_dim, "chunk_size": chunk_size,
        "dtype": dtype_name(dtype), "device": str(device),
    }
    for name, fn in (("hybrid", hybrid), ("sdpa", sdpa)):
        with torch.no_grad():
            fwd = bench(fn, device, warmup_ms=warmup_ms, rep_ms=rep_ms)

        def fwd_bwd(fn=fn, name=name):
            out = fn()
            (out if name == "hybrid" else out.transpose(1, 2)).backward(do)

        both = bench(fwd_bwd, device, warmup_ms=warmup_ms, rep_ms=rep_ms, grad_to_none=leaves)
        result[f"{name}_fwd_ms"] = fwd.median_ms
        result[f"{name}_fwdbwd_ms"] = both.median_ms
    result["speedup_fwd"] = result["sdpa_fwd_ms"] / result["hybrid_fwd_ms"]
    result["speedup_fwdbwd"] = result["sdpa_fwdbwd_ms"] / result["hybrid_fwdbwd_ms"]
    return result
