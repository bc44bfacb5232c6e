"""The fused reverse walk: dk and dv of the backward from one reverse-time state G, in one pass over q, k, v, do.

The chunk walk (:mod:`.walk`) computes dv and dk as two reverse walks, (k, q, do) with state G [K, V] and
(v, do, q) with Gᵀ [V, K]: each reads three tensors and rebuilds the same G. Here one program owns one (segment,
head) with the *whole* G [K, V] in registers and produces both, per chunk of L <= BT tokens (walk position
r = L-1-i, the distance from the chunk's last token; derivation in docs/kernels.md, "Backward as three more walks")::

    dv = scale·[(K Qᵀ) ⊙ D] dO + Λ K G          D_ij = λ^(r_i - r_j) for r_i >= r_j, else 0
    dk = scale·[(V dOᵀ) ⊙ D] Q + Λ V Gᵀ         Λ = diag(λ^(r_i + d0))
    G  = λ^(L-1+d0) G + scale·(Λ' Q)ᵀ dO        Λ' = diag(λ^(L-1-r_i))

Bytes: reads q, k, v, do once and writes dk, dv (6 tensor passes instead of 8), and G is updated once per chunk
instead of twice. The price is registers: G is [BK, BV] with BV covering the whole value dim (dk_t sums over all
of V), so the fused walk runs only when both padded head dims are <= 128 (G <= 64 KB, 64 fp32 registers per thread
at 8 warps); larger heads use the two walks. Each program also covers all V columns, so it has the parallelism of
N·H (half that of the two-tile walks): the segment plan of the call supplies the rest.

Incoming state, exponent offset d0 and the final dh0 = λ^(d0)·G follow the reverse walk of :mod:`.walk` exactly
(``SEG_IN`` reads the scan's incoming G of the segment, ``USE_H0`` reads dht, not decayed before the first token).
"""

import functools

import triton
import triton.language as tl

from lightning_attention.ops.lightning.kernels.walk import (
    AUTOTUNE_CACHE,
    _segment,
    chunk_rows,
    head_rows_descriptor,
    inter_decay,
    inter_product,
    intra_product,
    load_rows,
    load_state,
    log2_decay,
    row_tile,
    state_tile,
    tail_decay,
    tile_ranges,
    weighted_rows,
)


@triton.jit
def _role_rows(b_a, b_b, b_c, b_x, inter_dec, p_walk, c, scale,
               TRANS_X: tl.constexpr, HAS_DECAY: tl.constexpr, INTER_ONLY: tl.constexpr,
               ACC: tl.constexpr, DOT_PREC: tl.constexpr, INTER_PREC: tl.constexpr):  # fmt: skip
    """One output tile [BT, BC] of the reverse walk in the role (a, b, c) with state X [BA, BC]::

        out = λ^(r+d0) a X + scale · [(a bᵀ) ⊙ D] c        D_ij = λ^(r_i - r_j) for r_i >= r_j, else 0

    dv: (a, b, c, X) = (k, q, do, G); dk: (v, do, q, Gᵀ), passed as G with TRANS_X. ``inter_dec`` [BT, 1] is
    λ^(r+d0) (unused without HAS_DECAY); the factor goes on the product's rows, not the operands (a goes to the
    tensor cores as loaded, and no [BT, K] fp32 copy is live)."""
    b_out = inter_product(b_a, b_x, ACC, INTER_PREC, TRANS_X)
    if HAS_DECAY:
        b_out = b_out * inter_dec
    if not INTER_ONLY:
        b_out = intra_product(b_out, b_a, b_b, b_c, p_walk, c, scale, HAS_DECAY, False, ACC, DOT_PREC)
    return b_out


@triton.jit(do_not_specialize=["T", "NS", "SEG", "CS"])
def _dkdv_walk_kernel(
    q,  # [B, T, H, DK] (strided, last dim contiguous)
    k,  # [B, T, H, DK]
    v,  # [B, T, H, DV]
    do,  # [B, T, H, DV]
    dk,  # [B, T, H, DK] output
    dv,  # [B, T, H, DV] output
    slope,  # [H] float32, λ = exp(-slope) (unused without HAS_DECAY)
    dht,  # [N, H, DK, DV] gradient of the final state (USE_H0)
    dh0,  # [N, H, DK, DV] gradient of the initial state (STORE_HT)
    states,  # [NSEG, H, DK, DV] incoming G of every segment (SEG_IN)
    cu_seqlens,  # [N + 1] (VARLEN 1)
    seg_table,  # [NSEG, 4] int32 (VARLEN 2)
    sq, sk, sv, sdo, sdk, sdv,  # strides (batch, token, head) of q, k, v, do, dk, dv
    sht, sh0, sst,  # strides (slot, head, row, column) of dht, dh0, states
    scale,
    T, H, NS, SEG,
    CS,  # tokens per chunk when > 0 (the inter-only mode), else BT
    DK: tl.constexpr, DV: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,  # BK >= DK and BV >= DV: one tile covers the state
    VARLEN: tl.constexpr,
    HAS_DECAY: tl.constexpr,
    USE_H0: tl.constexpr,
    STORE_HT: tl.constexpr,
    SEG_IN: tl.constexpr,
    INTER_ONLY: tl.constexpr,
    ACC: tl.constexpr,
    DOT_PREC: tl.constexpr,
    INTER_PREC: tl.constexpr,
    USE_TMA: tl.constexpr,  # tiles moved by tensor descriptors (sm_90 TMA), as in the walk; the host checks alignment
):
    # grid: one program per (head, segment), heads fastest (programs side by side share nothing but run in step)
    pid = tl.program_id(0)
    i_h = pid % H
    i_s = pid // H
    i_n, i_b, bos, eos, first, last = _segment(i_s, cu_seqlens, seg_table, T, NS, SEG, VARLEN)
    c = log2_decay(slope, i_h, HAS_DECAY, ACC)

    o_t, o_k, o_v, m_k, m_v, m_kv = tile_ranges(0, BT, BK, BV, DK, DV)

    if USE_TMA:
        # descriptors over the rows [0, eos) of this (batch row, head), as in the walk: rows >= eos and columns past
        # the head dims read as zeros and are not written; chunks end at eos or at C == BT tokens
        d_q = head_rows_descriptor(q, sq, i_b, i_h, eos, DK, BT, BK)
        d_k = head_rows_descriptor(k, sk, i_b, i_h, eos, DK, BT, BK)
        d_v = head_rows_descriptor(v, sv, i_b, i_h, eos, DV, BT, BV)
        d_do = head_rows_descriptor(do, sdo, i_b, i_h, eos, DV, BT, BV)
        d_dk = head_rows_descriptor(dk, sdk, i_b, i_h, eos, DK, BT, BK)
        d_dv = head_rows_descriptor(dv, sdv, i_b, i_h, eos, DV, BT, BV)

    # incoming G [BK, BV]: the segment's state from the scan, dht, or zeros
    b_g = tl.zeros([BK, BV], dtype=ACC)
    if SEG_IN:
        b_g = load_state(states, i_s, sst, i_h, o_k, o_v, m_kv, ACC)
    elif USE_H0:
        b_g = load_state(dht, i_n, sht, i_h, o_k, o_v, m_kv, ACC)
    # exponent offset: 0 while the walk starts from dht (G_{T-1} = dht + ..., not decayed), else 1
    d0 = tl.where(last, 0, 1)

    C = tl.where(CS > 0, CS, BT)
    n_chunks = (eos - bos + C - 1) // C
    p_walk = -o_t  # walk positions up to the chunk's shift (r = L - 1 - o_t): the decay matrix is built once
    for i_c in range(0, n_chunks):
        lo, L, m_t, r, rows = chunk_rows(i_c, n_chunks, bos, eos, C, o_t, True)
        if USE_TMA:
            b_q, b_k = d_q.load([lo, 0]), d_k.load([lo, 0])
            b_v, b_do = d_v.load([lo, 0]), d_do.load([lo, 0])
        else:
            b_q = load_rows(q, sq, i_b, i_h, rows, o_k, m_t, m_k)
            b_k = load_rows(k, sk, i_b, i_h, rows, o_k, m_t, m_k)
            b_v = load_rows(v, sv, i_b, i_h, rows, o_v, m_t, m_v)
            b_do = load_rows(do, sdo, i_b, i_h, rows, o_v, m_t, m_v)
        inter_dec = inter_decay(c, r, d0, m_t, ACC)[:, None]  # λ^(r+d0) per row (unused, so not built, without decay)
        # G as the inter products' operand: fp32, or rounded once to bf16 for bf16 inputs (the carried G stays fp32)
        if INTER_PREC == "input":
            b_gi = b_g.to(b_k.dtype)
        else:
            b_gi = b_g
        # dv (finished and stored before dk starts: one [BT, BV] accumulator live at a time), then dk
        b_dv = _role_rows(b_k, b_q, b_do, b_gi, inter_dec, p_walk, c, scale, False, HAS_DECAY, INTER_ONLY, ACC,
                          DOT_PREC, INTER_PREC)  # fmt: skip
        if USE_TMA:
            d_dv.store([lo, 0], b_dv.to(dv.dtype.element_ty))
        else:
            tl.store(
                row_tile(dv, sdv, i_b, i_h, rows, o_v), b_dv.to(dv.dtype.element_ty), mask=m_t[:, None] & m_v[None, :]
            )
        b_dk = _role_rows(b_v, b_do, b_q, b_gi, inter_dec, p_walk, c, scale, True, HAS_DECAY, INTER_ONLY, ACC,
                          DOT_PREC, INTER_PREC)  # fmt: skip
        if USE_TMA:
            d_dk.store([lo, 0], b_dk.to(dk.dtype.element_ty))
        else:
            tl.store(
                row_tile(dk, sdk, i_b, i_h, rows, o_k), b_dk.to(dk.dtype.element_ty), mask=m_t[:, None] & m_k[None, :]
            )

        # G = λ^(L-1+d0) G + scale·(λ^(L-1-r) q)ᵀ do, operands in the input dtype
        if HAS_DECAY:
            b_qd = weighted_rows(b_q, tail_decay(c, r, L, m_t, ACC), ACC)
            blk_dec = tl.exp2(-c * (L - 1 + d0).to(ACC))
            b_g = b_g * blk_dec + scale * tl.dot(tl.trans(b_qd), b_do, out_dtype=ACC, input_precision=DOT_PREC)
        else:
            b_g = b_g + scale * tl.dot(tl.trans(b_q), b_do, out_dtype=ACC, input_precision=DOT_PREC)
        d0 = d0 * 0 + 1

    if STORE_HT:
        if HAS_DECAY:
            b_g = b_g * tl.exp2(-c * d0.to(ACC))  # dh0 = λ G_0 (= dht when the sequence is empty)
        p_g = state_tile(dh0, i_n, sh0, i_h, o_k, o_v)
        tl.store(p_g, b_g.to(dh0.dtype.element_ty), mask=m_kv)


AUTOTUNE_KEY = ["DK", "DV", "VARLEN", "HAS_DECAY", "SEG_IN", "USE_H0", "INTER_ONLY", "USE_TMA"]

dkdv_kernel = _dkdv_walk_kernel


def autotune_key(configs) -> list[str]:
    """The autotuning key over ``configs`` (the plan's candidates, ``configs.dkdv_candidates``): where they leave BT
    to the caller (the inter-only mode fixes it), BT joins the key."""
    return AUTOTUNE_KEY if "BT" in configs[0].kwargs else [*AUTOTUNE_KEY, "BT"]


@functools.lru_cache(maxsize=None)
def tuned_dkdv_kernel(configs: tuple[triton.Config, ...]):
    """The fused dk/dv walk autotuned over ``configs`` on :func:`autotune_key`."""
    return triton.autotune(configs=list(configs), key=autotune_key(configs), **AUTOTUNE_CACHE)(_dkdv_walk_kernel)
