"""Triton kernels of the SRAM-bounded, recompute-heavy backward ("Lightning-3", with decay).

Three sequential sweeps, run side by side by one launch (:func:`recompute_bwd_kernel`), one program per (tile of
the output's head dim, sequence, head). Each walks its
sequence in micro-chunks of ``BT`` (CBLOCK, 16 or 32) tokens and carries one d×d state slice in registers; the
only token×token tiles are the ``[BT, BT]`` diagonal blocks ``Q Kᵀ`` / ``dO Vᵀ``, recomputed on the fly. Nothing
but the inputs is read and nothing but dq, dk, dv, dh0 is written: no per-chunk state ever reaches HBM.

Notation for one micro-chunk of ``L <= BT`` tokens at local positions i (query) and j (key), λ = exp(-slope):

    forward state   S  (S₋₁ = h0):      S ← λ^L S + Σ_j λ^(L-1-j) k_jᵀ v_j
    reverse state   R  (R = dht first): R ← λ^L R + scale Σ_i λ^(i+1) q_iᵀ do_i      (dh0 = R at the end)
    dq_i = scale · [ Σ_{j≤i} λ^(i-j) (do_i·v_j) k_j + λ^(i+1) do_i S_prevᵀ ]
    dk_j = scale · Σ_{i≥j} λ^(i-j) (v_j·do_i) q_i  + λ^(L-1-j) v_j R_nextᵀ
    dv_j = scale · Σ_{i≥j} λ^(i-j) (k_j·q_i) do_i  + λ^(L-1-j) k_j R_next

(S_prev: state before the chunk; R_next: reverse state entering from the right, dht for the last chunk.) These
follow from S_t = λ S_{t-1} + k_tᵀ v_t, o_t = scale q_t S_t with the reverse state G_t = λ G_{t+1} + scale q_tᵀ do_t
(G_{T-1} = scale q_{T-1}ᵀ do_{T-1} + dht): dq_t = scale do_t S_tᵀ, dk_t = v_t G_tᵀ, dv_t = k_t G_t, dh0 = λ G_0.
The derivation is in the docstring of :mod:`lightning_attention.ops.lightning.recompute`.

Tiling: dq and dk produce a K-slice and contract over the whole V, so they tile K (``BK``) and hold a transposed
state slice ``[BV = V padded, BK]``; dv produces a V-slice and contracts over the whole K, so it tiles V (``BV``)
and holds ``[BK = K padded, BV]``. All three are one sweep (:func:`_sweep`): dq forward, dk and dv reverse with the
roles of the inputs swapped. Every output element is written by exactly one program, in sequence order: no atomics,
no partial sums.

Numerics: fp32 (fp64 for fp64 inputs, interpreter only) state and accumulators; intra-chunk dots take operands
in the input dtype; the state operand of the inter-chunk dots is cast to ``STATE_OP`` = bf16 for bf16 inputs and
kept fp32 otherwise (fp16 would overflow on long sequences without decay), with ``DOT_PRECISION`` "tf32" for
fp16 inputs and "tf32x3" (three tf32 products, float32's accuracy) for fp32 inputs. The decayed operands are never
transposed dot results (the state is carried already transposed where a kernel needs Sᵀ), which avoids the Hopper
``tl.trans`` miscompile.
"""

import triton
import triton.language as tl

from lightning_attention.ops.lightning.kernels.walk import load_rows, log2_decay, tail_decay, weighted_rows


@triton.jit
def _sequence_bounds(cu_seqlens, i_n, T, IS_VARLEN: tl.constexpr):
    """(batch row, first token, one past the last token) of sequence ``i_n``, all int64. Offsets are clamped to
    0 <= bos <= eos <= T: values that were not checked (CUDA outside debug mode) never address outside the row."""
    if IS_VARLEN:
        i_b = tl.full([], 0, tl.int64)
        bos = tl.minimum(tl.maximum(tl.load(cu_seqlens + i_n).to(tl.int64), 0), T)
        eos = tl.minimum(tl.maximum(tl.load(cu_seqlens + i_n + 1).to(tl.int64), bos), T)
    else:
        i_b = tl.cast(i_n, tl.int64)
        bos = tl.full([], 0, tl.int64)
        eos = tl.cast(T, tl.int64)
    return i_b, bos, eos


@triton.jit
def _chunk_tokens(i, NT, bos, eos, o_t, BT: tl.constexpr, REVERSE: tl.constexpr):
    """Micro-chunk ``i`` of NT over [bos, eos), the last one first when REVERSE: (first token t0, token indices
    [BT], token mask [BT]), int64."""
    if REVERSE:
        t0 = bos + (NT - 1 - tl.cast(i, tl.int64)) * BT
    else:
        t0 = bos + tl.cast(i, tl.int64) * BT
    o_tt = t0 + o_t
    return t0, o_tt, o_tt < eos


@triton.jit
def _masked_product(b_x, b_y, b_z, mask, b_w, WEIGHTED: tl.constexpr, ACC: tl.constexpr,
                    DOT_PRECISION: tl.constexpr):  # fmt: skip
    """[(X Yᵀ) ⊙ W, masked] Z for [BT, *] tiles: the token×token tile recomputed, weighted by ``b_w`` (a [BT, BT]
    tile or a scalar; not with WEIGHTED off), selected by ``mask`` (not multiplied by zeros: 0 · NaN from a
    non-finite token on the masked side would be NaN), in Z's dtype for the second dot."""
    b_s = tl.dot(b_x, tl.trans(b_y), input_precision=DOT_PRECISION, out_dtype=ACC)
    if WEIGHTED:
        b_s = tl.where(mask, b_s * b_w, 0.0)
    else:
        b_s = tl.where(mask, b_s, 0.0)
    return tl.dot(b_s.to(b_z.dtype), b_z, input_precision=DOT_PRECISION, out_dtype=ACC)


@triton.jit
def _decayed_update(b_x, b_y, y_dec, b_z, b_c, n_valid, ACC: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """X ← λ^n_valid X + (diag(y_dec) Y)ᵀ Z: the carried state decayed over the chunk's ``n_valid`` tokens plus the
    chunk's rows, each weighted by its own decay (operands in the input dtype); λ^x = exp2(-b_c·x)."""
    b_yd = weighted_rows(b_y, y_dec, ACC)
    x_dec = tl.exp2(-b_c * n_valid.to(ACC))
    return b_x * x_dec + tl.dot(tl.trans(b_yd), b_z, input_precision=DOT_PRECISION, out_dtype=ACC)


@triton.jit
def _sweep(
    i_c, i_nh, a, b, c, x_in, slope, cu_seqlens, out, x_out, T, H, sa, sb, sc, scale,
    A: tl.constexpr, C: tl.constexpr, STATE_SA: tl.constexpr, STATE_SC: tl.constexpr,
    BT: tl.constexpr, BA: tl.constexpr, BC: tl.constexpr,
    LOAD_X: tl.constexpr, STORE_X: tl.constexpr, HAS_DECAY: tl.constexpr, IS_VARLEN: tl.constexpr,
    REVERSE: tl.constexpr, ACC: tl.constexpr, STATE_OP: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """One sweep over a sequence in micro-chunks, carrying X, fp32 ``[BA, BC]``, and writing ``out`` (and X at the
    end), in one of three roles of (a, b, c). Forward (first chunk first), rows i::

        out_i = scale · [Σ_{j≤i} λ^(i-j) (a_i·b_j) c_j + λ^(i+1) a_i X_prev]      X ← λ^L X + Σ_j λ^(L-1-j) b_jᵀ c_j

    reverse (last chunk first), rows j::

        out_j = scale · Σ_{i≥j} λ^(i-j) (a_j·b_i) c_i + λ^(L-1-j) a_j X_next      X ← λ^L X + scale Σ_i λ^(i+1) b_iᵀ c_i

    dq: forward, (a, b, c) = (do, v, k), X = Sᵀ ``[V, K]`` from h0; dk: reverse, (v, do, q), X = Rᵀ ``[V, K]`` from
    dht; dv and dh0: reverse, (k, q, do), X = R ``[K, V]`` from dht, stored as dh0. The untiled dim A (BA covers all
    of it) is contracted, the output tiles C (tile ``i_c`` of ``BC``).

    Program (C tile ``i_c``, sequence·head ``i_nh``). a, b ``[B, T, H, A]``, c ``[B, T, H, C]`` (strides ``sa``,
    ``sb``, ``sc`` = (batch, token, head); last dim contiguous); x_in, x_out ``[N, H, K, V]`` contiguous, X[x, y] at
    ``x·STATE_SA + y·STATE_SC`` within a head (R: (V, 1); Sᵀ, Rᵀ: (1, V)); out ``[B, T, H, C]`` contiguous.
    """
    i_n, i_h = i_nh // H, i_nh % H
    i_b, bos, eos = _sequence_bounds(cu_seqlens, i_n, T, IS_VARLEN)

    o_t = tl.arange(0, BT)
    o_a = tl.arange(0, BA)
    o_c = i_c * BC + tl.arange(0, BC)
    m_a = o_a < A
    m_c = o_c < C
    # [BT, BT] distance i - j of the pairs a row sums over: forward rows i, columns j; reverse rows j, columns i
    if REVERSE:
        dist = o_t[None, :] - o_t[:, None]
    else:
        dist = o_t[:, None] - o_t[None, :]
    pairs = dist >= 0

    p_out0 = out + i_b * T * H * C + tl.cast(i_h, tl.int64) * C
    o_state = tl.cast(i_nh, tl.int64) * A * C + o_a[:, None] * STATE_SA + o_c[None, :] * STATE_SC  # [BA, BC]
    m_state = m_a[:, None] & m_c[None, :]

    b_x = tl.zeros([BA, BC], dtype=ACC)
    if LOAD_X:
        b_x = tl.load(x_in + o_state, mask=m_state, other=0.0).to(ACC)
    if HAS_DECAY:
        b_c = log2_decay(slope, i_h, True, ACC)
        # λ^(i-j) on the pairs (the where keeps exp2 of positive powers out) and λ^(i+1) per token; reverse: with
        # scale, which the forward applies to the sum
        b_w = tl.where(pairs, tl.exp2(-b_c * tl.maximum(dist, 0).to(ACC)), 0.0)
        head_dec = tl.exp2(-b_c * (o_t + 1).to(ACC))
        if REVERSE:
            b_w = b_w * scale
            head_dec = head_dec * scale
    else:
        b_w = scale  # reverse: the pairs' weight; forward: not read (the selection alone, scale on the sum)

    NT = tl.cdiv(eos - bos, BT)
    for i_t in range(NT):
        t0, o_tt, m_t = _chunk_tokens(i_t, NT, bos, eos, o_t, BT, REVERSE)
        b_a = load_rows(a, sa, i_b, i_h, o_tt, o_a, m_t, m_a)
        b_b = load_rows(b, sb, i_b, i_h, o_tt, o_a, m_t, m_a)
        b_cc = load_rows(c, sc, i_b, i_h, o_tt, o_c, m_t, m_c)

        # intra: the pairs' scores a·b recomputed [BT, BT], weighted and selected, then @ c [BT, BC]
        b_out = _masked_product(b_a, b_b, b_cc, pairs, b_w, HAS_DECAY or REVERSE, ACC, DOT_PRECISION)
        # inter: a X with X as it was before this chunk (adding the chunk first would count it twice)
        b_inter = tl.dot(b_a.to(STATE_OP), b_x.to(STATE_OP), input_precision=DOT_PRECISION, out_dtype=ACC)
        if HAS_DECAY:
            n_valid = tl.minimum(eos - t0, BT)
            tail_dec = tail_decay(b_c, o_t, n_valid, o_t < n_valid, ACC)  # [BT] λ^(L-1-j)
            if REVERSE:
                b_inter = b_inter * tail_dec[:, None]
            else:
                b_inter = b_inter * head_dec[:, None]
        if REVERSE:
            b_out = b_out + b_inter
        else:
            b_out = (b_out + b_inter) * scale
        tl.store(
            p_out0 + o_tt[:, None] * H * C + o_c[None, :],
            b_out.to(out.dtype.element_ty),
            mask=m_t[:, None] & m_c[None, :],
        )

        # X ← λ^L X + (w b)ᵀ c, w: forward λ^(L-1-j), reverse scale·λ^(i+1)
        if HAS_DECAY:
            if REVERSE:
                b_x = _decayed_update(b_x, b_b, head_dec, b_cc, b_c, n_valid, ACC, DOT_PRECISION)
            else:
                b_x = _decayed_update(b_x, b_b, tail_dec, b_cc, b_c, n_valid, ACC, DOT_PRECISION)
        elif REVERSE:
            b_bd = (b_b.to(ACC) * scale).to(b_b.dtype)
            b_x += tl.dot(tl.trans(b_bd), b_cc, input_precision=DOT_PRECISION, out_dtype=ACC)
        else:
            b_x += tl.dot(tl.trans(b_b), b_cc, input_precision=DOT_PRECISION, out_dtype=ACC)

    if STORE_X:
        # after chunk 0, R = λ G_0 = dh0 (for an empty sequence: dht, since final_state = h0)
        tl.store(x_out + o_state, b_x.to(x_out.dtype.element_ty), mask=m_state)


@triton.jit(do_not_specialize=["T"])
def recompute_bwd_kernel(
    q,
    k,
    v,
    do,
    h0,
    dht,
    slope,
    cu_seqlens,
    dq,
    dk,
    dv,
    dh0,
    T,
    H,
    sq,
    sk,
    sv,
    sdo,
    scale,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    K_PAD: tl.constexpr,
    V_PAD: tl.constexpr,
    USE_INITIAL_STATE: tl.constexpr,
    USE_FINAL_STATE_GRADIENT: tl.constexpr,
    HAS_DECAY: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    ACC: tl.constexpr,
    STATE_OP: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """The three sweeps in one launch: grid ``(N * H, 2 * cdiv(K, BK) + cdiv(V, BV))``.

    Axis 0 is the sequence·head (axis 0 allows 2^31 - 1 programs, axis 1 only 65,535); axis 1 picks the role:
    ``[0, NK)`` dq (K tile), ``[NK, 2 NK)`` dk (K tile), ``[2 NK, 2 NK + NV)`` dv and dh0 (V tile). The sweeps
    share no data, so running them side by side triples the programs in flight where this backward is
    latency-bound (few sequences × heads, long T).

    q, k ``[B, T, H, K]``, v, do ``[B, T, H, V]`` (strides ``sq``, ``sk``, ``sv``, ``sdo`` = (batch, token, head);
    last dim contiguous); h0, dht, dh0 ``[N, H, K, V]``
    contiguous (h0/dht may be None); dq, dk ``[B, T, H, K]``, dv ``[B, T, H, V]`` contiguous. ``BK``/``BV``: the
    tiles of the dq/dk and dv sweeps; ``K_PAD``/``V_PAD``: K, V padded to powers of two (the untiled dim).
    """
    i_nh, i_p = tl.program_id(0), tl.program_id(1)
    NK: tl.constexpr = (K + BK - 1) // BK
    if i_p < NK:  # dq: (a, b, c) = (do, v, k), X = Sᵀ [V, K]
        _sweep(
            i_p, i_nh, do, v, k, h0, slope, cu_seqlens, dq, dh0, T, H, sdo, sv, sk, scale,
            V, K, 1, V, BT, V_PAD, BK, USE_INITIAL_STATE, False, HAS_DECAY, IS_VARLEN, False, ACC, STATE_OP,
            DOT_PRECISION,
        )  # fmt: skip
    elif i_p < 2 * NK:  # dk: (a, b, c) = (v, do, q), X = Rᵀ [V, K]
        _sweep(
            i_p - NK, i_nh, v, do, q, dht, slope, cu_seqlens, dk, dh0, T, H, sv, sdo, sq, scale,
            V, K, 1, V, BT, V_PAD, BK, USE_FINAL_STATE_GRADIENT, False, HAS_DECAY, IS_VARLEN, True, ACC, STATE_OP,
            DOT_PRECISION,
        )  # fmt: skip
    else:  # dv and dh0: (a, b, c) = (k, q, do), X = R [K, V]
        _sweep(
            i_p - 2 * NK, i_nh, k, q, do, dht, slope, cu_seqlens, dv, dh0, T, H, sk, sq, sdo, scale,
            K, V, V, 1, BT, K_PAD, BV, USE_FINAL_STATE_GRADIENT, USE_INITIAL_STATE, HAS_DECAY, IS_VARLEN, True, ACC,
            STATE_OP, DOT_PRECISION,
        )  # fmt: skip
