"""The decode step's kernel: one token per sequence, the fp32 state pool read-modify-written in place.

Per sequence b (pool row r = state_indices[b], or b) and head h, with λ = exp(-slope_h) (λ = 1 without slope)::

    S[r, h] = λ · S[r, h] + k[b, h]ᵀ v[b, h]          S is [K, V] float32, updated in place
    o[b, h] = scale · q[b, h] · S[r, h]                 inclusive: the new token is in the state it reads

A padding slot (r = -1) leaves every state row alone and writes a zero output; so does an index r >= P, which an
unchecked call can pass (CUDA tensors outside debug mode), so no index addresses memory outside the pool.

Cost model. A step moves B·H·K·V·4 bytes of state in and the same out; q, k, v and o are ~1/K of that. So the
kernel is a streaming pass over the state: every state element is loaded once, updated in registers (one FMA for
the decay and the outer product kᵀv, one FMA for q·S) and stored once. The grid is B·H × V-tiles: each program owns
a [K, BV] slab of one head's state, loads the whole K extent in one go when it fits in registers (all loads of a
program in flight together; a K-loop would serialise load→store rounds) and reduces q·S over K itself, so no
cross-program reduction or atomics are needed. The launcher (``ops/lightning/decode.py``) shrinks BV at small batch
so that batch 1 × 16 heads still spreads over the GPU; at batch 64/256 BV = 64 gives 256-byte contiguous rows.

There is no tl.dot: the update is an outer product and the readout a matrix-vector product, both done on fp32
registers; bf16/fp16 products are exact in fp32, so the only rounding is fp32 accumulation and the final cast of o.
"""

import triton
import triton.language as tl


@triton.jit
def decode_step_kernel(
    # Pointers
    q,  # [B, H, K] input dtype
    k,  # [B, H, K] input dtype
    v,  # [B, H, V] input dtype
    state,  # [P, H, K, V] float32 (float64 for references), read and written in place
    slope,  # [H] float32, read only if HAS_DECAY
    state_indices,  # [B] int32/int64, read only if HAS_INDICES
    out,  # [B, H, V] input dtype
    # Strides (elements)
    stride_qb,
    stride_qh,
    stride_qk,
    stride_kb,
    stride_kh,
    stride_kk,
    stride_vb,
    stride_vh,
    stride_vv,
    stride_sp,
    stride_sh,
    stride_sk,
    stride_sv,
    stride_ob,
    stride_oh,
    stride_ov,
    scale,
    P,  # rows of the pool: an index outside [-1, P) (an unchecked call) is a padding slot, never an address
    # Meta-parameters
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,  # K rows per step of the K loop (a power of two >= 16; usually >= K: one step)
    BV: tl.constexpr,  # state columns per program (a power of two >= 16)
    HAS_DECAY: tl.constexpr,
    HAS_INDICES: tl.constexpr,
):
    # One grid axis (up to 2^31 - 1 programs; the others stop at 65535), V tiles fastest: programs that run side by
    # side stream one head's contiguous [K, V] state and share its q and k.
    NV = (V + BV - 1) // BV  # constexpr arithmetic: a compile-time constant
    pid = tl.program_id(0).to(tl.int64)
    i_bh = pid // NV
    i_v = pid % NV
    i_b = i_bh // H
    i_h = i_bh % H
    ACC = state.dtype.element_ty  # float32 (float64 only for references)

    if HAS_INDICES:
        row = tl.load(state_indices + i_b).to(tl.int64)
    else:
        row = i_b
    # A padding slot (-1) masks every state access; so does an index past the pool, which only a call whose values
    # were not checked (CUDA outside debug mode) can pass. The clamp keeps the (never used) addresses in the pool.
    active = (row >= 0) & (row < P)
    row = tl.minimum(tl.maximum(row, 0), P - 1)

    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    b_v = tl.load(v + i_b * stride_vb + i_h * stride_vh + o_v * stride_vv, mask=m_v, other=0).to(ACC)
    if HAS_DECAY:
        lam = tl.exp(-tl.load(slope + i_h).to(ACC))

    p_state = state + row * stride_sp + i_h * stride_sh
    b_o = tl.zeros([BV], dtype=ACC)
    # K is a constexpr: for K <= BK this is a single, fully unrolled step.
    for i_k in range(0, tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        b_k = tl.load(k + i_b * stride_kb + i_h * stride_kh + o_k * stride_kk, mask=m_k, other=0).to(ACC)
        b_q = tl.load(q + i_b * stride_qb + i_h * stride_qh + o_k * stride_qk, mask=m_k, other=0).to(ACC)
        p_s = p_state + o_k[:, None] * stride_sk + o_v[None, :] * stride_sv
        m_s = (m_k[:, None] & m_v[None, :]) & active
        b_s = tl.load(p_s, mask=m_s, other=0)
        if HAS_DECAY:
            b_s = b_s * lam
        b_s += b_k[:, None] * b_v[None, :]
        tl.store(p_s, b_s, mask=m_s)
        # Rows past K and a padding slot's slab are zero (masked loads, zero k), so they add nothing.
        b_o += tl.sum(b_q[:, None] * b_s, axis=0)

    b_o = tl.where(active, b_o * scale, 0.0)
    tl.store(out + i_b * stride_ob + i_h * stride_oh + o_v * stride_ov, b_o.to(out.dtype.element_ty), mask=m_v)
