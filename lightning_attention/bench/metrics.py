"""FLOP, byte and floor formulas, workspace accounting and speedups (pure arithmetic, unit-tested).

Conventions (docs/design.md, "Benchmark grids"):

- **HBM floor**: the bytes that must cross HBM at least once over the copy bandwidth measured in the same run.
  Forward reads q, k, v and writes o; the backward reads q, k, v, do and writes dq, dk, dv. With K = V = 128, bf16,
  65,536 tokens and 16 heads that is 1.07 GB (0.36 ms at 3.02 TB/s) and 2.95 GB for fwd+bwd (0.98 ms).
- **Workspace**: peak memory during fwd+bwd minus what was allocated before the call (inputs, grad_output) minus
  the outputs and the gradients, i.e. the memory an implementation needs beyond its unavoidable tensors.
- **FLOPs** of the chunked algorithm with chunk C, per token and head: forward ``2C(K + V)`` (intra ``Q Kᵀ`` and
  ``A V``) + ``4KV`` (``Q·S`` and the state update ``KᵀV``); backward ``C(6K + 4V)`` (``A`` recomputed, ``dA``,
  dq, dk, dv intra) + ``10KV`` (state recompute, dS, dq, dk, dv inter). Softmax causal attention: forward
  ``B·H·T²·(K + V)`` (half of the dense ``2T²(K + V)``), backward 2.5x forward (the FlashAttention convention).
"""

import torch

from lightning_attention.bench.registry import Shape

FLOP_CHUNK = 64  # chunk length C of the FLOP model (the paper's block size); the kernels may tile differently


def element_size(dtype: torch.dtype) -> int:
    return dtype.itemsize


def attention_io_bytes(shape: Shape) -> tuple[int, int]:
    """Minimum HBM bytes ``(fwd, fwd+bwd)``: fwd reads q, k, v, writes o; bwd reads q, k, v, do, writes dq, dk, dv."""
    per_head_token = shape.tokens * shape.heads * element_size(shape.dtype)
    fwd = per_head_token * (2 * shape.k_dim + 2 * shape.v_dim)
    bwd = per_head_token * (4 * shape.k_dim + 3 * shape.v_dim)
    return fwd, fwd + bwd


def input_bytes(shape: Shape) -> int:
    """Bytes of one input tensor (q), the unit of the workspace target (≤ 25% of it)."""
    return shape.tokens * shape.heads * shape.k_dim * element_size(shape.dtype)


def output_bytes(shape: Shape) -> int:
    """Bytes of o ``[B, T, H, V]``."""
    return shape.tokens * shape.heads * shape.v_dim * element_size(shape.dtype)


def gradient_bytes(shape: Shape) -> int:
    """Bytes of dq, dk ``[B, T, H, K]`` and dv ``[B, T, H, V]`` (same dtype as the inputs)."""
    return shape.tokens * shape.heads * (2 * shape.k_dim + shape.v_dim) * element_size(shape.dtype)


def lightning_flops(shape: Shape, chunk: int = FLOP_CHUNK) -> tuple[float, float]:
    """FLOPs ``(fwd, fwd+bwd)`` of chunked linear attention (module docstring)."""
    n = shape.tokens * shape.heads
    k, v = shape.k_dim, shape.v_dim
    fwd = n * (2 * chunk * (k + v) + 4 * k * v)
    bwd = n * (chunk * (6 * k + 4 * v) + 10 * k * v)
    return float(fwd), float(fwd + bwd)


def softmax_attention_flops(shape: Shape) -> tuple[float, float]:
    """FLOPs ``(fwd, fwd+bwd)`` of causal softmax attention (module docstring)."""
    fwd = shape.batch * shape.heads * shape.seqlen**2 * (shape.k_dim + shape.v_dim)
    return float(fwd), float(fwd * 3.5)


def floor_ms(nbytes: int, bandwidth_bytes_per_s: float) -> float:
    """Time to move ``nbytes`` once at the measured copy bandwidth, in milliseconds."""
    if bandwidth_bytes_per_s <= 0:
        raise ValueError(f"bandwidth must be positive, got {bandwidth_bytes_per_s}")
    return 1e3 * nbytes / bandwidth_bytes_per_s


def copy_bandwidth(nbytes: int, copy_ms: float) -> float:
    """Bytes/s of a device-to-device copy of ``nbytes``: it reads and writes every byte once."""
    return 2 * nbytes / (copy_ms * 1e-3)


def workspace_bytes(peak: int, baseline: int, outputs: int, gradients: int) -> int:
    """Peak during fwd+bwd minus what existed before (inputs, grad_output), the outputs and the gradients."""
    return peak - baseline - outputs - gradients


def tokens_per_s(tokens: int, ms: float) -> float:
    return tokens / (ms * 1e-3)


def tflops(flops: float, ms: float) -> float:
    return flops / (ms * 1e-3) / 1e12


def speedup(baseline_ms: float | None, ours_ms: float | None) -> float | None:
    """How many times faster ours is (baseline / ours); None when either side did not run."""
    if baseline_ms is None or ours_ms is None or ours_ms <= 0:
        return None
    return baseline_ms / ours_ms


def decode_step_bytes(batch: int, heads: int, k_dim: int, v_dim: int, dtype: torch.dtype) -> int:
    """Minimum HBM bytes of one decode step: the fp32 state read and written once, q, k, v read, o written."""
    state = batch * heads * k_dim * v_dim * 4
    vectors = batch * heads * (2 * k_dim + 2 * v_dim) * element_size(dtype)
    return 2 * state + vectors


def flatness(values: list[float]) -> float | None:
    """Largest relative deviation from the mean (0.1 = within ±10%), the 'constant speed' measure."""
    values = [x for x in values if x is not None]
    if not values:
        return None
    mean = sum(values) / len(values)
    return max(abs(x - mean) for x in values) / mean
