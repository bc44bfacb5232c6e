"""The inter-chunk term of Lightning Attention alone: ``lightning_attn`` without its intra-chunk part.

Chunks of C = ``chunk_size`` tokens start at token 0 of every sequence (of every packed sequence with
``cu_seqlens``). For token t of a chunk starting at c0, per head with λ = exp(-slope)::

    o_t = scale · λ^(t-c0+1) · q_t · S_{c0-1}        S_{c0-1}: the DESIGN §1 state after every token before c0
                                                      (S_{-1} = h0), i.e. the current chunk is excluded
    final_state = S_{T-1}                             (the full state, current chunk included)

Adding the intra-chunk part ``scale · Σ_{c0≤s≤t} λ^(t-s) (q_t·k_s) v_s`` gives back ``lightning_attn``. The hybrid
attention of seed 004 (:mod:`lightning_attention.ops.hybrid`) replaces that intra part with softmax attention.

Backends (``LIGHTNING_ATTENTION_BACKEND``, :mod:`lightning_attention.backend`): the Triton kernels'
``lightning_attention.ops.lightning.chunk.lightning_attn_inter_triton`` when the backend resolves to Triton and that
function exists; the PyTorch path :func:`inter_lightning_attn_torch` otherwise (CPU, backend ``torch``).
"""

import torch

from lightning_attention.backend import use_triton
from lightning_attention.ops.lightning.naive import _per_sequence, _slope_or_zeros, _zero_state, compute_dtype
from lightning_attention.ops.lightning.validation import check_lightning_attn_inputs


def check_chunk_size(chunk_size) -> int:
    """chunk_size must be a Python int >= 1."""
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int):
        raise TypeError(f"chunk_size must be a Python int, got {type(chunk_size).__name__}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    return chunk_size


def inter_lightning_attn_torch(q, k, v, slope=None, *, chunk_size, scale=1.0, initial_state=None, cu_seqlens=None):
    """PyTorch inter-chunk term from chunk-boundary states (differentiable; the CPU path and a reference).

    Every chunk's own decayed state ``(λ^(L-1-j) K_n)ᵀ V_n`` comes from one batched matmul; a scan over the
    T / C chunks (a loop of [K, V] updates) turns them into the boundary states S_{c0-1}; one more batched matmul
    reads them with ``λ^(i+1) Q_n``. No T×T tensor; memory O(T / C · K · V) for the boundary states.

    Args:
        q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``; slope ``[H]`` or None; initial_state ``[N, H, K, V]`` or None;
        cu_seqlens ``[N + 1]`` (host tensor preferred: it is read with ``.tolist()``) or None.

    Returns:
        ``(o_inter [B, T, H, V] in q.dtype, final_state [N, H, K, V])`` (float32; float64 for float64 inputs).
    """
    if cu_seqlens is not None:
        fn = lambda *a, **kw: inter_lightning_attn_torch(*a, **kw, chunk_size=chunk_size)  # noqa: E731
        return _per_sequence(fn, q, k, v, slope, scale, initial_state, cu_seqlens)
    B, T, H, K = q.shape
    V = v.shape[-1]
    C = chunk_size
    ct = compute_dtype(q.dtype)
    s = _slope_or_zeros(slope, H, q.device, ct)
    h0 = _zero_state(B, H, K, V, q.device, ct) if initial_state is None else initial_state.to(ct)
    if T == 0:
        return v.new_zeros(B, 0, H, V).to(q.dtype), h0

    NT = (T + C - 1) // C
    pad = NT * C - T
    # [B, NT, C, H, D]: zero-padded tokens of the last chunk add nothing to its state and their outputs are cut off
    qc, kc, vc = (torch.nn.functional.pad(x.to(ct), (0, 0, 0, 0, 0, pad)).reshape(B, NT, C, H, -1) for x in (q, k, v))
    pos = torch.arange(C, device=q.device, dtype=ct)
    lengths = torch.full((NT,), C, device=q.device, dtype=ct)
    lengths[-1] = T - (NT - 1) * C
    q_decay = torch.exp(-s[None, :] * (pos[:, None] + 1))  # [C, H]: λ^(i+1)
    # [NT, C, H]: λ^(L_n-1-j); clamp: padded rows (j ≥ L_n) multiply zero keys, keep their factor finite
    k_decay = torch.exp(-s[None, None, :] * (lengths[:, None, None] - 1 - pos[None, :, None]).clamp_min(0))
    block_decay = torch.exp(-s[None, :] * lengths[:, None])  # [NT, H]: λ^L_n

    local = torch.einsum("bnjhk,bnjhv->bnhkv", kc * k_decay[None, :, :, :, None], vc)  # [B, NT, H, K, V]
    boundary = []  # S_{c0-1} of every chunk
    state = h0
    for n in range(NT):
        boundary.append(state)
        state = block_decay[n][None, :, None, None] * state + local[:, n]
    boundary = torch.stack(boundary, dim=1)  # [B, NT, H, K, V]
    o = torch.einsum("bnihk,bnhkv->bnihv", qc * q_decay[None, None, :, :, None], boundary)
    o = o.reshape(B, NT * C, H, V)[:, :T]
    return (scale * o).to(q.dtype), state


def _triton_inter():
    """The Triton inter-only function, or None while the kernels do not provide it (or triton is missing)."""
    try:
        from lightning_attention.ops.lightning.chunk import lightning_attn_inter_triton
    except ImportError:
        return None
    return lightning_attn_inter_triton


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
    """
    check_lightning_attn_inputs(
        q, k, v, slope, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
        cu_seqlens=cu_seqlens, cu_seqlens_cpu=None, backward="auto",
    )
    chunk_size = check_chunk_size(chunk_size)
    if use_triton(q):
        fn = _triton_inter()
        if fn is not None:
            return fn(
                q, k, v, slope, chunk_size=chunk_size, scale=float(scale), initial_state=initial_state,
                output_final_state=output_final_state, cu_seqlens=cu_seqlens,
            )
    # The PyTorch path computes in float32 on purpose: keep autocast from lowering its einsums to bf16.
    with torch.autocast(device_type=q.device.type, enabled=False):
        o, final_state = inter_lightning_attn_torch(
            q, k, v, slope, chunk_size=chunk_size, scale=float(scale), initial_state=initial_state,
            cu_seqlens=cu_seqlens,
        )
    if not output_final_state:
        return o, None
    if final_state is initial_state:  # T == 0 returns h0: never hand the caller's tensor back aliased
        final_state = final_state.clone()
    return o, final_state
