"""Hybrid chunk attention (ChunkedLightningAttention): softmax inside chunks, linear attention across.

The sequence is cut into chunks of C = ``chunk_size`` tokens (the last one may be shorter; with ``cu_seqlens`` the
chunks restart at every sequence start). For token t of the chunk starting at c0, per head::

    intra_t = Σ_{c0≤s≤t} softmax_s(softmax_scale · q_t·k_s) v_s                        causal softmax in the chunk
    inter_t = λ^(t-c0+1) (scale·φ(q_t))ᵀ S_{c0-1} / (λ^(t-c0+1) (scale·φ(q_t))ᵀ z_{c0-1} + eps)
    o_t     = intra_t + inter_t                                                         (combine="add")

with S, z the normalised linear-attention state (:mod:`lightning_attention.ops.normalized`) over all tokens of the
*previous* chunks only, decayed with λ = exp(-slope) (``slope=None``: λ = 1, no decay). The first chunk has no
previous tokens: its inter term is 0 / eps = 0.

How the two parts combine: they are **added** (``combine="add"``, the only rule offered). Each
part is a normalised average of values (its weights sum to 1), so the sum weighs local and distant context equally
whatever their numbers of tokens; a model learns the balance through its projections (or an output gate).

How it runs:
- softmax part: the full chunks are reshaped to ``[B·T//C, H, C, K]`` and go through
  ``F.scaled_dot_product_attention(is_causal=True)`` (the flash backend on GPU), the ragged tail chunk through one
  more call of its own length — no padding, so no token can attend to padding, and no T×T mask exists anywhere;
- linear part: :func:`lightning_attention.ops.lightning.inter.lightning_attn_inter` (the inter-only mode of our
  kernels) on v' = [v, 1], so the numerator and the normaliser come from one call (V = 256: see normalized.py).

Decoding (:class:`HybridDecodeState`, :func:`hybrid_chunk_attn_decode`) runs the same arithmetic token by token:
a cache of the current chunk's keys and values for the softmax part and the packed boundary state [S | z] for the
linear part, folded in when a chunk completes.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lightning_attention.ops.feature_maps import FeatureMapLike, require_positive
from lightning_attention.ops.lightning.inter import check_chunk_size, lightning_attn_inter
from lightning_attention.ops.lightning.naive import compute_dtype
from lightning_attention.ops.lightning.validation import (
    check_lightning_attn_inputs,
    check_offsets,
    check_qkv,
    check_slope,
    require_device,
    require_float,
    require_int,
    require_tensor,
)
from lightning_attention.ops.normalized import attend_with_normaliser, check_eps

COMBINE_MODES = ("add",)


def _check_combine(combine: str) -> None:
    if combine not in COMBINE_MODES:
        raise ValueError(f"combine must be one of {COMBINE_MODES}, got {combine!r}")


def chunked_causal_softmax(q, k, v, *, chunk_size: int, softmax_scale: float) -> torch.Tensor:
    """Causal softmax attention restricted to chunks of ``chunk_size`` tokens, through SDPA.

    Args:
        q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``.

    Returns:
        ``[B, T, H, V]`` in q.dtype. The ``T // C`` full chunks run as one SDPA call with batch ``B·T//C``; the
        tail of ``T % C`` tokens as a second call of that length.
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    C = chunk_size
    NF = T // C
    parts = []
    if NF > 0:
        # [B, NF·C, H, D] -> [B·NF, C, H, D] -> [B·NF, H, C, D]: a view when T % C == 0 (else one copy of the prefix)
        qf, kf, vf = (x[:, : NF * C].reshape(B * NF, C, H, -1).transpose(1, 2) for x in (q, k, v))
        o = F.scaled_dot_product_attention(qf, kf, vf, is_causal=True, scale=softmax_scale)
        parts.append(o.transpose(1, 2).reshape(B, NF * C, H, V))
    if T > NF * C:
        qt, kt, vt = (x[:, NF * C :].transpose(1, 2) for x in (q, k, v))
        o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, scale=softmax_scale)
        parts.append(o.transpose(1, 2))
    if not parts:
        return v.new_zeros(B, 0, H, V)
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


def hybrid_chunk_attn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slope: torch.Tensor | None = None,
    *,
    chunk_size: int = 256,
    feature_map: FeatureMapLike = "elu+1",
    eps: float = 1e-6,
    softmax_scale: float | None = None,
    scale: float = 1.0,
    combine: str = "add",
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Softmax attention inside chunks + normalised linear attention over previous chunks (module docstring).

    Args:
        q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``; one dtype (float16 / bfloat16 / float32; float64 for references).
        slope: ``[H]`` float32 >= 0 (decay of the linear state, λ = exp(-slope)) or None (no decay).
        chunk_size: C >= 1 tokens per chunk; any T works (the last chunk may be shorter).
        feature_map: a positive feature map for the linear part (``"elu+1"``, ``"relu2"``, a LearnedFeatureMap, ...);
            ``"identity"`` / ``"silu"`` raise ValueError.
        eps: finite float > 0 added to the linear part's denominator.
        softmax_scale: scale of the softmax logits; default ``K ** -0.5``.
        scale: multiplies φ(q) in the linear part (cancels except against eps).
        combine: ``"add"`` (o = intra + inter).
        cu_seqlens: ``[N + 1]`` offsets of packed sequences (B == 1) or None; chunks restart at each sequence.
            The softmax part cuts the sequences on the host: the offsets are read (a sync on CUDA) and checked on
            every device.

    Returns:
        o ``[B, T, H, V]`` in q.dtype. Differentiable in q, k, v and the feature map's parameters.

    Inputs are checked as :func:`lightning_attention.lightning_attn` checks them, plus the options above.
    """
    phi = require_positive(feature_map)
    eps = check_eps(eps)
    chunk_size = check_chunk_size(chunk_size)
    _check_combine(combine)
    check_lightning_attn_inputs(
        q, k, v, slope, scale=scale, initial_state=None, output_final_state=False,
        cu_seqlens=cu_seqlens, cu_seqlens_cpu=None, backward="auto",
    )
    softmax_scale = _check_softmax_scale(softmax_scale, q)

    if cu_seqlens is None:
        intra = chunked_causal_softmax(q, k, v, chunk_size=chunk_size, softmax_scale=softmax_scale)
    else:
        # the softmax part cuts the sequences on the host: the values are read anyway, so they are checked here on
        # every device (a device->host copy on CUDA)
        offsets = [int(x) for x in cu_seqlens.tolist()]
        check_offsets("cu_seqlens", offsets, q.shape[1])
        pieces = [
            chunked_causal_softmax(q[:, a:b], k[:, a:b], v[:, a:b], chunk_size=chunk_size, softmax_scale=softmax_scale)
            for a, b in zip(offsets[:-1], offsets[1:])
        ]
        intra = torch.cat(pieces, dim=1) if pieces else v.new_zeros(1, 0, *v.shape[2:])

    def attn(a, b, c, h0, want_final):
        return lightning_attn_inter(
            a, b, c, slope, chunk_size=chunk_size, scale=scale, initial_state=h0, output_final_state=want_final,
            cu_seqlens=cu_seqlens,
        )

    phi_q, phi_k = phi(q).to(q.dtype), phi(k).to(q.dtype)
    inter, _ = attend_with_normaliser(attn, phi_q, phi_k, v, None, False, eps)
    return (intra.to(inter.dtype) + inter).to(q.dtype)  # one rounding, after the sum


@dataclass
class HybridDecodeState:
    """Decoding state of :func:`hybrid_chunk_attn_decode` for a batch of B sequences at the same position.

    Attributes:
        keys: ``[B, H, C, K]`` keys of the current chunk (slots ``>= pos`` unused), input dtype.
        values: ``[B, H, C, V]`` values of the current chunk, input dtype.
        phi_keys: ``[B, H, C, K']`` their features, kept so that folding a finished chunk needs no φ recompute.
        state: ``[B, H, K', V + 1]`` float32 packed boundary state [S_{c0-1} | z_{c0-1}] of the previous chunks.
        pos: number of tokens already in the current chunk (0 ≤ pos < C).
    """

    keys: torch.Tensor
    values: torch.Tensor
    phi_keys: torch.Tensor
    state: torch.Tensor
    pos: int = 0

    @classmethod
    def empty(cls, batch, num_heads, head_dim, v_dim, feature_dim, *, chunk_size, device=None, dtype=torch.float32):
        """A fresh state (no tokens seen) for sequences of ``[B, ·, H, K]`` queries and ``[B, ·, H, V]`` values."""
        C = check_chunk_size(chunk_size)
        return cls(
            keys=torch.zeros(batch, num_heads, C, head_dim, device=device, dtype=dtype),
            values=torch.zeros(batch, num_heads, C, v_dim, device=device, dtype=dtype),
            phi_keys=torch.zeros(batch, num_heads, C, feature_dim, device=device, dtype=dtype),
            state=torch.zeros(batch, num_heads, feature_dim, v_dim + 1, device=device, dtype=compute_dtype(dtype)),
        )

    @property
    def chunk_size(self) -> int:
        return self.keys.shape[2]


def _check_softmax_scale(softmax_scale, q: torch.Tensor) -> float:
    """softmax_scale: None (``K ** -0.5``) or a finite Python float."""
    if softmax_scale is None:
        return q.shape[-1] ** -0.5
    return require_float("softmax_scale", softmax_scale)


def _check_cache(cache, q: torch.Tensor, v: torch.Tensor) -> None:
    """``cache`` is a :class:`HybridDecodeState` for these q ``[B, H, K]`` and v ``[B, H, V]``: its buffers on q's
    device with q's batch, heads and dims (keys and values in q's dtype) and a position inside its chunk."""
    if not isinstance(cache, HybridDecodeState):
        raise TypeError(f"cache must be a HybridDecodeState (HybridDecodeState.empty), got {type(cache).__name__}")
    B, H, K = q.shape
    V = v.shape[-1]
    C = cache.keys.shape[2] if cache.keys.ndim == 4 else -1
    for name, x, shape in (
        ("cache.keys", cache.keys, (B, H, C, K)),
        ("cache.values", cache.values, (B, H, C, V)),
        ("cache.phi_keys", cache.phi_keys, (B, H, C, cache.state.shape[2] if cache.state.ndim == 4 else -1)),
        ("cache.state", cache.state, (B, H, cache.phi_keys.shape[-1], V + 1)),
    ):
        require_tensor(name, x)
        if tuple(x.shape) != shape:
            raise ValueError(f"{name} must have shape {shape} for q {tuple(q.shape)} and v {tuple(v.shape)}, "
                             f"got {tuple(x.shape)}")  # fmt: skip
        require_device(name, x, q.device)
    for name, x in (("cache.keys", cache.keys), ("cache.values", cache.values)):
        if x.dtype != q.dtype:
            raise TypeError(f"{name} must have the dtype of q ({q.dtype}), got {x.dtype}")
    if cache.state.dtype != compute_dtype(q.dtype):
        raise TypeError(f"cache.state must be {compute_dtype(q.dtype)}, got {cache.state.dtype}")
    pos = require_int("cache.pos", cache.pos, minimum=0)
    if pos >= C:
        raise ValueError(f"cache.pos must be < the chunk size {C}, got {pos}")


def hybrid_chunk_attn_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache: HybridDecodeState,
    slope: torch.Tensor | None = None,
    *,
    feature_map: FeatureMapLike = "elu+1",
    eps: float = 1e-6,
    softmax_scale: float | None = None,
    scale: float = 1.0,
) -> torch.Tensor:
    """One token of :func:`hybrid_chunk_attn` per sequence; updates ``cache`` in place.

    Token t at position p = ``cache.pos`` of its chunk: the softmax part attends to the cached keys 0..p of the
    chunk (itself included), the linear part reads the boundary state with λ^(p+1); when the chunk is full
    (p = C - 1) it is folded into the state, ``[S|z] ← λ^C [S|z] + Σ_j λ^(C-1-j) φ(k_j) [v_j, 1]``, and the cache
    restarts. Fed the tokens of a sequence one by one from :meth:`HybridDecodeState.empty`, it returns the outputs of
    the parallel :func:`hybrid_chunk_attn` (within rounding).

    Args:
        q, k: ``[B, H, K]``; v: ``[B, H, V]``; dtype of the cache's keys.
        cache: the :class:`HybridDecodeState` (same ``chunk_size`` as the parallel call it continues).
        slope, feature_map, eps, softmax_scale, scale: as in :func:`hybrid_chunk_attn`.

    Returns:
        o ``[B, H, V]`` in q.dtype.

    Input checks, before the cache is touched: q, k, v's structure, the cache's buffers against them (shapes, dtypes,
    device, ``0 <= pos < chunk_size``), slope as :func:`lightning_attention.lightning_attn` checks it, scale,
    softmax_scale and eps.
    """
    phi = require_positive(feature_map)
    eps = check_eps(eps)
    check_qkv(q, k, v, 3, "[B, H, K]", "[B, H, V]")
    B, H, K = q.shape
    V = v.shape[-1]
    _check_cache(cache, q, v)
    check_slope(slope, H, q.device)
    require_float("scale", scale)
    softmax_scale = _check_softmax_scale(softmax_scale, q)
    C, p = cache.chunk_size, cache.pos
    ct = cache.state.dtype
    with torch.no_grad():
        phi_q, phi_k = phi(q).to(q.dtype), phi(k).to(q.dtype)
        cache.keys[:, :, p] = k
        cache.values[:, :, p] = v
        cache.phi_keys[:, :, p] = phi_k
        intra = F.scaled_dot_product_attention(
            q[:, :, None], cache.keys[:, :, : p + 1], cache.values[:, :, : p + 1], scale=softmax_scale
        )[:, :, 0]  # [B, H, V]: the query sees the chunk's tokens 0..p, itself included
        s = torch.zeros(H, device=q.device, dtype=ct) if slope is None else slope.to(ct)
        read = scale * torch.einsum("bhk,bhkv->bhv", phi_q.to(ct), cache.state) * torch.exp(-s * (p + 1))[:, None]
        o = intra.to(ct) + read[..., :V] / (read[..., V:] + eps)
        if p + 1 == C:
            j = torch.arange(C, device=q.device, dtype=ct)
            k_decay = torch.exp(-s[:, None] * (C - 1 - j))  # [H, C]: λ^(C-1-j)
            v_aug = torch.cat([cache.values.to(ct), torch.ones_like(cache.values[..., :1], dtype=ct)], dim=-1)
            cache.state.mul_(torch.exp(-s * C)[:, None, None]).add_(
                torch.einsum("bhjk,bhjv->bhkv", cache.phi_keys.to(ct) * k_decay[..., None], v_aug)
            )
            cache.pos = 0
        else:
            cache.pos = p + 1
    return o.to(q.dtype)
