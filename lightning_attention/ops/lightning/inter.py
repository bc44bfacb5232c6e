"""The inter-chunk term of Lightning Attention alone: ``lightning_attn`` without its intra-chunk part.

Chunks of C = ``chunk_size`` tokens start at token 0 of every sequence (of every packed sequence with
``cu_seqlens``). For token t of a chunk starting at c0, per head with λ = exp(-slope)::

    o_t = scale · λ^(t-c0+1) · q_t · S_{c0-1}        S_{c0-1}: the state after every token before c0
                                                      (S_{-1} = h0), i.e. the current chunk is excluded
    final_state = S_{T-1}                             (the full state, current chunk included)

Adding the intra-chunk part ``scale · Σ_{c0≤s≤t} λ^(t-s) (q_t·k_s) v_s`` gives back ``lightning_attn``. The hybrid
attention (:mod:`lightning_attention.ops.hybrid`) replaces that intra part with softmax attention.

Backends (the ``backend`` setting, :mod:`lightning_attention.backend`): the Triton kernels'
``lightning_attention.ops.lightning.ops.lightning_attn_inter_triton`` when the backend resolves to Triton and
``chunk_size`` is a multiple of 16 up to 256 (the kernel's chunk tile) whose tiles fit the GPU; the PyTorch path
:func:`inter_lightning_attn_torch` otherwise (CPU, backend ``torch``, other chunk sizes).
"""

import torch

from lightning_attention.backend import triton_ops, use_triton
from lightning_attention.ops.lightning.device import device_info
from lightning_attention.ops.lightning.naive import chunk_lightning_attn
from lightning_attention.ops.lightning.numerics import debug_checks_enabled, guarded, host_offsets
from lightning_attention.ops.lightning.validation import check_lightning_attn_inputs, require_int


def check_chunk_size(chunk_size) -> int:
    """chunk_size must be an int >= 1."""
    return require_int("chunk_size", chunk_size, minimum=1)


def inter_lightning_attn_torch(q, k, v, slope=None, *, chunk_size, scale=1.0, initial_state=None, cu_seqlens=None):
    """PyTorch inter-chunk term (differentiable; the CPU path and a reference): the chunked reference with its
    intra-block term dropped (:func:`~lightning_attention.ops.lightning.naive.chunk_lightning_attn` with
    ``intra=False``, blocks of ``chunk_size`` tokens). Every chunk's decayed local state comes from one batched matmul
    and a scan over the T / C chunks reads the boundary states S_{c0-1}; no T×T tensor.

    Args:
        q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``; slope ``[H]`` or None; initial_state ``[N, H, K, V]`` or None;
        cu_seqlens ``[N + 1]`` (host tensor preferred: it is read with ``.tolist()``) or None.

    Returns:
        ``(o_inter [B, T, H, V] in q.dtype, final_state [N, H, K, V])`` (float32; float64 for float64 inputs).
    """
    return chunk_lightning_attn(
        q, k, v, slope, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens, chunk_size=chunk_size,
        intra=False,
    )


def triton_supports_chunk_size(chunk_size: int, q: torch.Tensor | None = None, v: torch.Tensor | None = None) -> bool:
    """The Triton inter-only mode walks chunks of exactly ``chunk_size`` tokens: a multiple of 16 up to 256
    (tensor-core tiles) whose tiles fit the GPU's shared memory (checked when ``q`` [.., K] and ``v`` [.., V] CUDA
    tensors are given). Other sizes take the PyTorch path."""
    if not (chunk_size % 16 == 0 and 16 <= chunk_size <= 256):
        return False
    if q is None or v is None or not q.is_cuda:
        return True
    from lightning_attention.ops.lightning.kernels.configs import inter_only_fits

    limit = device_info(q.device).shared_per_block
    return inter_only_fits(chunk_size, q.shape[-1], v.shape[-1], q.element_size(), limit)


def lightning_attn_inter(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slope: torch.Tensor | None = None,
    *,
    chunk_size: int,
    scale: float = 1.0,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Inter-chunk term only: ``o_t = scale · λ^(t-c0+1) · q_t · S_{c0-1}`` (module docstring).

    Args:
        q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``; one dtype (float16 / bfloat16 / float32; float64 on the
            PyTorch path).
        slope: ``[H]`` float32 >= 0 or None (no decay).
        chunk_size: C >= 1, the chunk length; chunks restart at every sequence start.
        scale: multiplies every output.
        initial_state: ``[N, H, K, V]`` float32 or None; N = B or len(cu_seqlens) - 1.
        output_final_state: return S_{T-1} ``[N, H, K, V]`` float32 (else None).
        cu_seqlens: ``[N + 1]`` offsets of packed sequences (B == 1) or None.

    Returns:
        ``(o_inter [B, T, H, V] in q.dtype, final_state or None)``. Differentiable in q, k, v, initial_state.

    Inputs are checked as :func:`lightning_attention.lightning_attn` checks them (and ``chunk_size``: an int >= 1);
    debug mode adds the same checks of non-finite values and overflow.
    """
    check_lightning_attn_inputs(
        q, k, v, slope, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
        cu_seqlens=cu_seqlens, cu_seqlens_cpu=None, backward="auto",
    )
    chunk_size = check_chunk_size(chunk_size)

    def run():
        return _dispatch(q, k, v, slope, chunk_size, float(scale), initial_state, output_final_state, cu_seqlens)

    if debug_checks_enabled():
        offsets = host_offsets(cu_seqlens, None)
        return guarded("lightning_attn_inter", run, dict(q=q, k=k, v=v), offsets, initial_state)
    return run()


def _dispatch(q, k, v, slope, chunk_size, scale, initial_state, output_final_state, cu_seqlens):
    """The validated call on the backend the settings pick: ``(o_inter, final_state or None)``."""
    if use_triton(q) and triton_supports_chunk_size(chunk_size, q, v):
        return triton_ops().lightning_attn_inter_triton(
            q, k, v, slope, chunk_size=chunk_size, scale=scale, initial_state=initial_state,
            output_final_state=output_final_state, cu_seqlens=cu_seqlens,
        )
    # The PyTorch path computes in float32 on purpose: keep autocast from lowering its einsums to bf16.
    with torch.autocast(device_type=q.device.type, enabled=False):
        o, final_state = inter_lightning_attn_torch(
            q, k, v, slope, chunk_size=chunk_size, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
        )
    if not output_final_state:
        return o, None
    if final_state is initial_state:  # T == 0 returns h0: never hand the caller's tensor back aliased
        final_state = final_state.clone()
    return o, final_state
