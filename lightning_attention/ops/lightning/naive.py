"""Executable specification of Lightning Attention, in plain PyTorch.

One definition (docs/design.md, "Semantics"), per head h with decay λ = exp(-slope_h) and initial state S_{-1} = h0:

    S_t = λ · S_{t-1} + k_tᵀ v_t              S is [K, V]
    o_t = scale · q_t · S_t                    causal and inclusive: token t attends to itself
    final_state = S_{T-1}

Three forms of it live here and agree to float64 rounding:

- :func:`quadratic_lightning_attn` — the left product of the paper (eq. 3 with decay):
  ``o = scale · [(Q Kᵀ) ⊙ M] V + scale · λ^(t+1) q_t h0`` with ``M_ts = λ^(t-s)`` for t ≥ s, else 0. O(T²) memory.
- :func:`recurrent_lightning_attn` — the recurrence above, one token at a time (paper eq. 4).
- :func:`chunk_lightning_attn` — Lightning Attention itself (Algorithms 3/5 of the Lightning Attention-2 paper):
  blocks of C tokens; inside a block the left product ``[(Q_i K_iᵀ) ⊙ D] V_i``, across blocks the right product
  ``Λ Q_i · S`` with a running fp32 K×V state. No T×T tensor, any T (ragged last block), differentiable: autograd
  through it is the library's CPU training path.

All tensors use the library layout: q, k ``[B, T, H, K]``; v ``[B, T, H, V]``; states ``[N, H, K, V]``.
Arithmetic runs in float64 for float64 inputs and in float32 otherwise; outputs are cast back to ``q.dtype``
and states are float32 (float64 for float64 inputs).
"""

import torch

from lightning_attention.ops.lightning.packed import packed_chunk_lightning_attn


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The arithmetic (and state) dtype for inputs of ``dtype``: float64 stays float64, all else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _slope_or_zeros(slope: torch.Tensor | None, num_heads: int, device, dtype) -> torch.Tensor:
    """[H] slopes in the arithmetic dtype; ``None`` (Lightning-1, no decay) is slope 0, i.e. λ = 1."""
    if slope is None:
        return torch.zeros(num_heads, device=device, dtype=dtype)
    return slope.reshape(num_heads).to(device=device, dtype=dtype)


def _zero_state(n, h, k, v, device, dtype) -> torch.Tensor:
    return torch.zeros(n, h, k, v, device=device, dtype=dtype)


def _in_compute_dtype(q, k, v, slope, initial_state):
    """What every form starts from, in the arithmetic dtype: (dtype, q, k, v, slopes [H] (0: no decay), the initial
    state [B, H, K, V] (zeros if None))."""
    B, _, H, K = q.shape
    ct = compute_dtype(q.dtype)
    s = _slope_or_zeros(slope, H, q.device, ct)
    h0 = _zero_state(B, H, K, v.shape[-1], q.device, ct) if initial_state is None else initial_state.to(ct)
    return ct, q.to(ct), k.to(ct), v.to(ct), s, h0


def _per_sequence(fn, q, k, v, slope, scale, initial_state, cu_seqlens):
    """Run ``fn`` on each packed sequence of a varlen batch (B == 1) and concatenate.

    Returns ``o [1, T, H, V]`` and ``final_state [N, H, K, V]``; a zero-length sequence returns its h0.
    """
    offsets = [int(x) for x in cu_seqlens.tolist()]
    outs, states = [], []
    for n, (bos, eos) in enumerate(zip(offsets[:-1], offsets[1:])):
        h0 = None if initial_state is None else initial_state[n : n + 1]
        o_n, s_n = fn(q[:, bos:eos], k[:, bos:eos], v[:, bos:eos], slope, scale=scale, initial_state=h0)
        outs.append(o_n)
        states.append(s_n)
    o = torch.cat(outs, dim=1) if outs else v.new_zeros(1, 0, *v.shape[2:]).to(q.dtype)
    if states:
        final = torch.cat(states, dim=0)
    else:
        final = _zero_state(0, q.shape[2], q.shape[3], v.shape[3], q.device, compute_dtype(q.dtype))
    return o, final


def quadratic_lightning_attn(q, k, v, slope=None, *, scale=1.0, initial_state=None, cu_seqlens=None):
    """Quadratic (masked left product) reference.

    Args:
        q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``.
        slope: ``[H]`` (λ = exp(-slope)) or ``None`` for no decay.
        initial_state: ``[N, H, K, V]`` or ``None`` (zeros).
        cu_seqlens: ``[N + 1]`` offsets of packed sequences (B == 1) or ``None``.

    Returns:
        ``(o [B, T, H, V] in q.dtype, final_state [N, H, K, V])``.
    """
    if cu_seqlens is not None:
        return _per_sequence(quadratic_lightning_attn, q, k, v, slope, scale, initial_state, cu_seqlens)
    T = q.shape[1]
    ct, qf, kf, vf, s, h0 = _in_compute_dtype(q, k, v, slope, initial_state)

    t = torch.arange(T, device=q.device, dtype=ct)
    dist = t[:, None] - t[None, :]  # [T, T], t - s
    causal = dist >= 0
    # M[h, t, s] = λ_h^(t-s) for t >= s, else 0 (exp(-inf) = 0, never inf * 0)
    log_m = torch.where(causal, -s[:, None, None] * dist, torch.full_like(dist, float("-inf")))
    mask = torch.exp(log_m)  # [H, T, T]
    # selected, not multiplied by the mask's zeros: 0 · NaN would carry a non-finite later k back to earlier tokens
    scores = torch.where(causal, torch.einsum("bthk,bshk->bhts", qf, kf) * mask, 0.0)
    o = torch.einsum("bhts,bshv->bthv", scores, vf)
    # initial-state term λ^(t+1) q_t h0
    q_decay = torch.exp(-s[None, :] * (t[:, None] + 1))  # [T, H]
    o = o + torch.einsum("bthk,bhkv->bthv", qf * q_decay[None, :, :, None], h0)

    # final state λ^T h0 + Σ_s λ^(T-1-s) k_sᵀ v_s
    k_decay = torch.exp(-s[None, :] * (T - 1 - t[:, None]))  # [T, H]
    final = torch.exp(-s * T)[None, :, None, None] * h0
    final = final + torch.einsum("bshk,bshv->bhkv", kf * k_decay[None, :, :, None], vf)
    return (scale * o).to(q.dtype), final


def recurrent_lightning_attn(q, k, v, slope=None, *, scale=1.0, initial_state=None, cu_seqlens=None):
    """Token-by-token recurrent reference (the definition, paper eq. 4). Same arguments as the quadratic form."""
    if cu_seqlens is not None:
        return _per_sequence(recurrent_lightning_attn, q, k, v, slope, scale, initial_state, cu_seqlens)
    B, T, H, K = q.shape
    V = v.shape[-1]
    ct, qf, kf, vf, s, state = _in_compute_dtype(q, k, v, slope, initial_state)
    lam = torch.exp(-s)[None, :, None, None]  # [1, H, 1, 1]
    outs = []
    for t in range(T):
        state = lam * state + torch.einsum("bhk,bhv->bhkv", kf[:, t], vf[:, t])
        outs.append(torch.einsum("bhk,bhkv->bhv", qf[:, t], state))
    o = torch.stack(outs, dim=1) if outs else vf.new_zeros(B, 0, H, V)
    return (scale * o).to(q.dtype), state


def chunk_lightning_attn(
    q, k, v, slope=None, *, scale=1.0, initial_state=None, cu_seqlens=None, chunk_size=64, intra=True
):
    """Lightning Attention forward, in blocks of ``chunk_size`` tokens (the CPU training path).

    For block n with tokens at local positions i, j = 0..L-1 (L = chunk_size, or less for the last block):

        intra:  O_n  = [(Q_n K_nᵀ) ⊙ D] V_n,        D_ij = λ^(i-j) for i ≥ j, else 0
        inter:  O_n += (λ^(i+1) Q_n) S_{n-1}          S_{-1} = h0
        state:  S_n  = λ^L S_{n-1} + (λ^(L-1-j) K_n)ᵀ V_n

    Block-local states are computed for all blocks at once; the scan over blocks is a loop of T / chunk_size
    small [K, V] updates. Every decay factor is λ to a non-negative power, so nothing overflows and nothing is
    ever divided by a decayed quantity (strong decay simply underflows to 0).

    ``intra=False`` drops the intra-block term: each token then sees only the state before its block, i.e. the
    inter-chunk term alone for blocks of ``chunk_size`` tokens (what the hybrid chunk attention needs).

    Same arguments and returns as :func:`quadratic_lightning_attn`.
    """
    if cu_seqlens is not None:  # packed sequences: one computation over the row, no per-sequence loop
        N = cu_seqlens.shape[0] - 1
        B, T, H, K = q.shape
        ct = compute_dtype(q.dtype)
        s = _slope_or_zeros(slope, H, q.device, ct)
        h0 = _zero_state(N, H, K, v.shape[-1], q.device, ct) if initial_state is None else initial_state.to(ct)
        o, final = packed_chunk_lightning_attn(
            q[0].to(ct), k[0].to(ct), v[0].to(ct), s, h0, cu_seqlens, scale=scale, chunk_size=chunk_size, intra=intra
        )
        return o[None].to(q.dtype), final
    B, T, H, K = q.shape
    V = v.shape[-1]
    C = chunk_size
    ct, qf, kf, vf, s, h0 = _in_compute_dtype(q, k, v, slope, initial_state)
    if T == 0:
        return v.new_zeros(B, 0, H, V).to(q.dtype), h0

    NT = (T + C - 1) // C
    pad = NT * C - T
    # [B, NT, C, H, D]: zero-padded tokens contribute nothing to scores or states (sizes spelled out: B or H may be 0)
    qc, kc, vc = (
        torch.nn.functional.pad(x, (0, 0, 0, 0, 0, pad)).reshape(B, NT, C, H, x.shape[-1]) for x in (qf, kf, vf)
    )

    pos = torch.arange(C, device=q.device, dtype=ct)
    lengths = torch.full((NT,), C, device=q.device, dtype=ct)
    lengths[-1] = T - (NT - 1) * C
    q_decay = torch.exp(-s[None, :] * (pos[:, None] + 1))  # [C, H]: λ^(i+1)
    # [NT, C, H]: λ^(L_n-1-j); padded positions get λ^(negative) but multiply zero k rows, clamp keeps them finite
    k_decay = torch.exp(-s[None, None, :] * (lengths[:, None, None] - 1 - pos[None, :, None]).clamp_min(0))
    block_decay = torch.exp(-s[None, :] * lengths[:, None])  # [NT, H]: λ^L

    if intra:
        dist = pos[:, None] - pos[None, :]
        # D[h, i, j] = λ_h^(i-j) on and below the diagonal
        intra_decay = torch.exp(torch.where(dist >= 0, -s[:, None, None] * dist, torch.full_like(dist, float("-inf"))))
        # [B, NT, H, C, C], selected rather than multiplied by D's zeros: 0 · NaN would carry a non-finite later k
        # back to the earlier tokens of its block
        scores = torch.where(dist >= 0, torch.einsum("bnihk,bnjhk->bnhij", qc, kc) * intra_decay, 0.0)
        o = torch.einsum("bnhij,bnjhv->bnihv", scores, vc)
    local_states = torch.einsum("bnjhk,bnjhv->bnhkv", kc * k_decay[None, :, :, :, None], vc)  # [B, NT, H, K, V]

    state = h0
    inter_terms = []
    for n in range(NT):
        inter_terms.append(torch.einsum("bihk,bhkv->bihv", qc[:, n] * q_decay[None, :, :, None], state))
        state = block_decay[n][None, :, None, None] * state + local_states[:, n]
    inter = torch.stack(inter_terms, dim=1)
    o = o + inter if intra else inter
    o = o.reshape(B, NT * C, H, V)[:, :T]
    return (scale * o).to(q.dtype), state
