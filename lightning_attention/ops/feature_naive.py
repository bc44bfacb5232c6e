"""Executable specifications in plain PyTorch of normalised linear attention and hybrid chunk attention.

Readable next to the seed (its ``LightningFeatureMap`` / ``ChunkedLightningAttention``), with the seed's mistakes
fixed: decoding is inclusive (token t is added to the state before it is read) and there is one eps form,
``den + eps``, everywhere. Each form comes twice — a token-by-token recurrence and a quadratic (masked T×T) form —
and the two agree to float64 rounding; the fast paths are tested against them.

Normalised linear attention (per head, λ = exp(-slope), (S₋₁, z₋₁) = initial state)::

    S_t = λ S_{t-1} + φ(k_t) v_tᵀ,   z_t = λ z_{t-1} + φ(k_t)
    o_t = (scale φ(q_t))ᵀ S_t / ((scale φ(q_t))ᵀ z_t + eps)

Hybrid chunk attention (chunks of C tokens; c(t) = index of t's chunk, c0 = its first token)::

    o_t = Σ_{c0≤s≤t} softmax_s(softmax_scale q_t·k_s) v_s
        + Σ_{c(s)<c(t)} λ^(t-s) w_ts v_s / (Σ_{c(s)<c(t)} λ^(t-s) w_ts + eps),     w_ts = scale φ(q_t)·φ(k_s)

Layouts as everywhere: q, k ``[B, T, H, K]``, v ``[B, T, H, V]``; features ``[B, T, H, K']``; states
(S ``[N, H, K', V]``, z ``[N, H, K']``). Arithmetic in float64 for float64 inputs, float32 otherwise; o in q.dtype.
"""

import torch

from lightning_attention.ops.feature_maps import FeatureMapLike, get_feature_map
from lightning_attention.ops.lightning.naive import _slope_or_zeros, compute_dtype


def _features(feature_map, q, k, ct):
    phi = get_feature_map(feature_map)
    return phi(q).to(ct), phi(k).to(ct)


def _zero_pair(B, H, Kf, V, device, ct):
    return torch.zeros(B, H, Kf, V, device=device, dtype=ct), torch.zeros(B, H, Kf, device=device, dtype=ct)


def _prepared(feature_map, q, k, v, initial_state):
    """Both references' inputs in the arithmetic dtype ct: (ct, φ(q), φ(k) [B, T, H, K'], v [B, T, H, V], and the
    incoming pair S0 [B, H, K', V], z0 [B, H, K'] — zeros without ``initial_state``)."""
    B, _, H, _ = q.shape
    ct = compute_dtype(q.dtype)
    fq, fk = _features(feature_map, q, k, ct)
    if initial_state is None:
        S0, z0 = _zero_pair(B, H, fq.shape[-1], v.shape[-1], q.device, ct)
    else:
        S0, z0 = initial_state[0].to(ct), initial_state[1].to(ct)
    return ct, fq, fk, v.to(ct), S0, z0


def _per_sequence_pair(fn, q, k, v, slope, initial_state, cu_seqlens, **kw):
    """Runs ``fn`` on each packed sequence (B == 1) and concatenates; state pairs are stacked along N."""
    offsets = [int(x) for x in cu_seqlens.tolist()]
    outs, s_list, z_list = [], [], []
    for n, (a, b) in enumerate(zip(offsets[:-1], offsets[1:])):
        h0 = None if initial_state is None else (initial_state[0][n : n + 1], initial_state[1][n : n + 1])
        o, (s, z) = fn(q[:, a:b], k[:, a:b], v[:, a:b], slope, initial_state=h0, **kw)
        outs.append(o)
        s_list.append(s)
        z_list.append(z)
    return torch.cat(outs, dim=1), (torch.cat(s_list, dim=0), torch.cat(z_list, dim=0))


def recurrent_normalized_linear_attn(
    q, k, v, slope=None, *, feature_map: FeatureMapLike = "elu+1", eps=1e-6, scale=1.0, initial_state=None,
    cu_seqlens=None,
):
    """Token-by-token normalised linear attention (the definition).

    Returns ``(o [B, T, H, V] in q.dtype, (S [N, H, K', V], z [N, H, K']))``.
    """
    if cu_seqlens is not None:
        return _per_sequence_pair(
            recurrent_normalized_linear_attn, q, k, v, slope, initial_state, cu_seqlens,
            feature_map=feature_map, eps=eps, scale=scale,
        )
    B, T, H, _ = q.shape
    V = v.shape[-1]
    ct, fq, fk, vf, S, z = _prepared(feature_map, q, k, v, initial_state)
    lam = torch.exp(-_slope_or_zeros(slope, H, q.device, ct))[None, :, None]  # [1, H, 1]
    outs = []
    for t in range(T):
        S = lam[..., None] * S + torch.einsum("bhk,bhv->bhkv", fk[:, t], vf[:, t])  # write first (inclusive) ...
        z = lam * z + fk[:, t]
        sq = scale * fq[:, t]
        num = torch.einsum("bhk,bhkv->bhv", sq, S)  # ... then read
        den = torch.einsum("bhk,bhk->bh", sq, z)[..., None]
        outs.append(num / (den + eps))
    o = torch.stack(outs, dim=1) if outs else vf.new_zeros(B, 0, H, V)
    return o.to(q.dtype), (S, z)


def quadratic_normalized_linear_attn(
    q, k, v, slope=None, *, feature_map: FeatureMapLike = "elu+1", eps=1e-6, scale=1.0, initial_state=None,
    cu_seqlens=None,
):
    """Quadratic form: ``A = (scale φ(Q) φ(K)ᵀ) ⊙ M``, ``M_ts = λ^(t-s)`` (t ≥ s), ``o = (A V + h0 term) / (A 1 + z0
    term + eps)``. O(T²) memory. Same arguments and returns as :func:`recurrent_normalized_linear_attn`."""
    if cu_seqlens is not None:
        return _per_sequence_pair(
            quadratic_normalized_linear_attn, q, k, v, slope, initial_state, cu_seqlens,
            feature_map=feature_map, eps=eps, scale=scale,
        )
    B, T, H, _ = q.shape
    ct, fq, fk, vf, S0, z0 = _prepared(feature_map, q, k, v, initial_state)
    s = _slope_or_zeros(slope, H, q.device, ct)
    t = torch.arange(T, device=q.device, dtype=ct)
    dist = t[:, None] - t[None, :]
    mask = torch.exp(torch.where(dist >= 0, -s[:, None, None] * dist, torch.full_like(dist, float("-inf"))))  # [H,T,T]
    sq = scale * fq
    A = torch.einsum("bthk,bshk->bhts", sq, fk) * mask
    q0 = sq * torch.exp(-s[None, :] * (t[:, None] + 1))[None, :, :, None]  # λ^(t+1) scale φ(q_t): reads h0
    num = torch.einsum("bhts,bshv->bthv", A, vf) + torch.einsum("bthk,bhkv->bthv", q0, S0)
    den = A.sum(-1).transpose(1, 2)[..., None] + torch.einsum("bthk,bhk->bth", q0, z0)[..., None]
    o = num / (den + eps)
    decay_to_end = torch.exp(-s[None, :] * (T - 1 - t[:, None]))[None, :, :, None]  # λ^(T-1-s)
    lam_T = torch.exp(-s * T)
    S = lam_T[None, :, None, None] * S0 + torch.einsum("bshk,bshv->bhkv", fk * decay_to_end, vf)
    z = lam_T[None, :, None] * z0 + (fk * decay_to_end).sum(1)
    return o.to(q.dtype), (S, z)


def _softmax_scale(q, softmax_scale):
    return q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale


def quadratic_hybrid_chunk_attn(
    q, k, v, slope=None, *, chunk_size, feature_map: FeatureMapLike = "elu+1", eps=1e-6, softmax_scale=None,
    scale=1.0,
):
    """Hybrid chunk attention with dense T×T masks (reference only): a block-diagonal causal softmax plus the
    normalised linear attention restricted to earlier chunks. Returns o ``[B, T, H, V]`` in q.dtype."""
    B, T, H, K = q.shape
    ct = compute_dtype(q.dtype)
    qf, kf, vf = q.to(ct), k.to(ct), v.to(ct)
    fq, fk = _features(feature_map, q, k, ct)
    s = _slope_or_zeros(slope, H, q.device, ct)
    t = torch.arange(T, device=q.device)
    chunk = t // chunk_size
    same_chunk_causal = (chunk[:, None] == chunk[None, :]) & (t[:, None] >= t[None, :])
    earlier_chunk = chunk[:, None] > chunk[None, :]

    logits = _softmax_scale(q, softmax_scale) * torch.einsum("bthk,bshk->bhts", qf, kf)
    logits = logits.masked_fill(~same_chunk_causal, float("-inf"))  # the diagonal is always allowed: no NaN rows
    intra = torch.einsum("bhts,bshv->bthv", torch.softmax(logits, dim=-1), vf)

    dist = (t[:, None] - t[None, :]).to(ct)
    decay = torch.exp(torch.where(earlier_chunk, -s[:, None, None] * dist, torch.full_like(dist, float("-inf"))))
    W = scale * torch.einsum("bthk,bshk->bhts", fq, fk) * decay
    inter = torch.einsum("bhts,bshv->bthv", W, vf) / (W.sum(-1).transpose(1, 2)[..., None] + eps)
    return (intra + inter).to(q.dtype)


def recurrent_hybrid_chunk_attn(
    q, k, v, slope=None, *, chunk_size, feature_map: FeatureMapLike = "elu+1", eps=1e-6, softmax_scale=None,
    scale=1.0,
):
    """Hybrid chunk attention token by token, as the seed's loop reads when fixed: softmax over the tokens of the
    current chunk seen so far, plus a read of the state (S, z) frozen at the chunk start and decayed to t; the
    chunk is folded into (S, z) only once it is complete. Returns o ``[B, T, H, V]`` in q.dtype."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    ct = compute_dtype(q.dtype)
    qf, kf, vf = q.to(ct), k.to(ct), v.to(ct)
    fq, fk = _features(feature_map, q, k, ct)
    lam = torch.exp(-_slope_or_zeros(slope, H, q.device, ct))
    sm = _softmax_scale(q, softmax_scale)
    S_start, z_start = _zero_pair(B, H, fq.shape[-1], V, q.device, ct)  # state at the start of the chunk
    S_run, z_run = S_start.clone(), z_start.clone()  # state including the current chunk so far
    outs = []
    for i in range(T):
        c0 = (i // chunk_size) * chunk_size
        if i == c0:
            S_start, z_start = S_run.clone(), z_run.clone()
        w = torch.softmax(sm * torch.einsum("bhk,bshk->bhs", qf[:, i], kf[:, c0 : i + 1]), dim=-1)
        intra = torch.einsum("bhs,bshv->bhv", w, vf[:, c0 : i + 1])
        d = lam ** (i - c0 + 1)  # [H]: decay from the chunk start to token i
        sq = scale * fq[:, i] * d[None, :, None]
        inter = torch.einsum("bhk,bhkv->bhv", sq, S_start) / (torch.einsum("bhk,bhk->bh", sq, z_start)[..., None] + eps)
        outs.append(intra + inter)
        S_run = lam[None, :, None, None] * S_run + torch.einsum("bhk,bhv->bhkv", fk[:, i], vf[:, i])
        z_run = lam[None, :, None] * z_run + fk[:, i]
    o = torch.stack(outs, dim=1) if outs else vf.new_zeros(B, 0, H, V)
    return o.to(q.dtype)


__all__ = [
    "quadratic_hybrid_chunk_attn",
    "quadratic_normalized_linear_attn",
    "recurrent_hybrid_chunk_attn",
    "recurrent_normalized_linear_attn",
]
