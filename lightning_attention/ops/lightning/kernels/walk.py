"""The chunk walk: the one Triton kernel that the forward and all three backward passes of ``lightning_attn`` run.

A program owns one segment of one sequence, one head and one tile of ``BV`` columns of the value dimension, and walks
the segment's chunks of ``BT`` tokens with its ``[DK, BV]`` state in registers (fp32; fp64 for fp64 inputs under the
interpreter). With a generic (q, k, v) -> o, the walk computes, per token t of the walk (R = reversed time)::

    S_t = λ · S_{t-1} + scale_upd · k_tᵀ v_t                       S_{-1} = incoming state
    o_t = scale_intra · Σ_{s in chunk, s <= t} λ^(t-s) (q_t·k_s) v_s + scale_inter · λ^(t-c0+1) q_t S_{c0-1}

(the intra part with the chunk's own tokens, the inter part with the state before the chunk, which starts at c0).
Which tensors play q, k, v decides what is computed (derivation in docs/kernels.md, "The chunk walk"):

======================  =========================  =========  ============================================
pass                     (q, k, v)                  direction  state
======================  =========================  =========  ============================================
forward o                (q, k, v)                  forward    S    [K, V], incoming h0
backward dq              (do, v, k)                 forward    Sᵀ   [V, K], incoming h0ᵀ
backward dv              (k, q, do), upd·scale      reverse    G    [K, V], incoming dht (not decayed)
backward dk              (v, do, q), upd·scale      reverse    Gᵀ   [V, K], incoming dhtᵀ
======================  =========================  =========  ============================================

Reverse walks go from the end of the segment to its start; "position" ``r`` is then the distance from the walk's start
and every formula above holds with t replaced by r. The one asymmetry: the backward state is G_t = λ G_{t+1} +
scale q_tᵀ do_t with G_{T-1} = dht + scale q_{T-1}ᵀ do_{T-1}, i.e. the incoming dht is *not* decayed before the first
token. The kernel carries an exponent offset ``d0`` (0 until the first chunk of a reverse walk that starts from dht,
then 1) instead of dividing anything by λ.

REV_STATES (a forward walk over segments) also writes, per segment, the local state of a reverse walk whose k is
``x`` [B, T, H, DV] and whose v is q: R = scale_rev · Σ_{t in segment} λ^(t - bos) q_tᵀ x_t [DK, DV] into ``rstates``,
through strides. The backward's dq walk, whose q is do, gets with x = q the transposed local states Gᵀ of the dk/dv
walks, so their scan needs no pre-pass reading q and do a second time (docs/kernels.md, "The dq walk's reverse
states"). Without REV_ALL each sequence's first segment stores zeros and reads no x: its reverse local state only
feeds dh0.

STATE_ONLY turns the walk into the segment pre-pass: no q, no o, the segment-local state (from zeros) is written to
the segment-state buffer. :func:`.scan.lightning_scan_kernel` turns those local states into incoming states. With
SKIP_FINAL (no final state wanted) the last segment of each sequence in walk order writes zeros without reading
anything: its local state only feeds the final state, so the pre-pass reads (ns - 1)/ns of (k, v).

Decay lives in log2 space: c = slope · log2(e), λ^x = exp2(-c·x), every exponent x >= 0 on the entries that are used
(padding rows are selected away with ``tl.where``, never multiplied by a 0/1 mask).

Tiles move in one of two ways, the same values either way: with USE_TMA through tensor descriptors made in the
kernel (Hopper's copy engine: rows past the segment's end and columns past the head dim read as zeros and are not
written; ``ops/lightning/tma.py`` says when), else through pointers with masks.
"""

import functools
import inspect

import triton
import triton.language as tl


RCP_LN2: tl.constexpr = tl.constexpr(1.4426950408889634)  # log2(e): exp(-s·x) == exp2(-s·log2(e)·x)


@triton.jit
def _segment(i_s, cu_seqlens, seg_table, T, NS, SEG, VARLEN: tl.constexpr):
    """Segment ``i_s`` -> (sequence i_n, batch row i_b, token range [bos, eos) in that row, first, last).

    VARLEN 0: fixed-length batch, NS segments of SEG tokens per sequence (the last one ragged);
    VARLEN 1: packed sequences, one segment each (cu_seqlens [N + 1]; its values are clamped to 0 <= bos <= eos <= T,
    so offsets that were not checked (CUDA outside debug mode) never address a token outside the row);
    VARLEN 2: packed sequences cut into segments on the host: seg_table [NSEG, 4] int32 = (n, bos, eos, flags),
    flags bit 0 = first segment of its sequence, bit 1 = last.
    """
    if VARLEN == 0:
        i_n = i_s // NS
        j = i_s % NS
        i_b = i_n
        bos = j * SEG
        eos = tl.minimum(bos + SEG, T)
        first = j == 0
        last = j == NS - 1
    elif VARLEN == 1:
        i_n = i_s
        i_b = i_s * 0
        bos = tl.minimum(tl.maximum(tl.load(cu_seqlens + i_s).to(tl.int32), 0), T)
        eos = tl.minimum(tl.maximum(tl.load(cu_seqlens + i_s + 1).to(tl.int32), bos), T)
        first = i_s >= 0
        last = i_s >= 0
    else:
        i_n = tl.load(seg_table + i_s * 4)
        i_b = i_s * 0
        bos = tl.load(seg_table + i_s * 4 + 1)
        eos = tl.load(seg_table + i_s * 4 + 2)
        flags = tl.load(seg_table + i_s * 4 + 3)
        first = (flags & 1) != 0
        last = (flags & 2) != 0
    return i_n, i_b, bos, eos, first, last


@triton.jit
def decayed_scores(b_a, p, c, scale, HAS_DECAY: tl.constexpr, ACC: tl.constexpr):
    """scale · (A ⊙ D) for a [BT, BT] score tile A: D_ij = λ^(p_i - p_j) where p_i >= p_j, else 0, for walk
    positions p [BT] up to a shift common to the chunk (only differences are used: callers pass ``o_t`` or ``-o_t``,
    the same for every chunk, so the compiler builds D once, outside the chunk loop). Built directly from the
    distance (every exponent >= 0: no overflow, no inf·0); λ^x = exp2(-c·x)."""
    causal = p[:, None] >= p[None, :]
    if HAS_DECAY:
        dist = tl.maximum(p[:, None] - p[None, :], 0).to(ACC)
        return tl.where(causal, b_a * (tl.exp2(-c * dist) * scale), 0.0)
    else:
        return tl.where(causal, b_a * scale, 0.0)


@triton.jit
def log2_decay(slope, i_h, HAS_DECAY: tl.constexpr, ACC: tl.constexpr):
    """c = slope · log2(e) of head ``i_h`` (λ^x = exp2(-c·x)), in the accumulator dtype; 0 without decay."""
    if HAS_DECAY:
        return tl.load(slope + i_h).to(ACC) * RCP_LN2
    else:
        return tl.zeros([], dtype=ACC)


@triton.jit
def tile_ranges(i_v, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr):
    """A walk program's index ranges: tokens of a chunk ``o_t`` [BT], state rows ``o_k`` [BK] (all of DK) and
    columns ``o_v`` [BV] (value tile ``i_v``), with the row, column and [BK, BV] tile masks."""
    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < DK
    m_v = o_v < DV
    return o_t, o_k, o_v, m_k, m_v, m_k[:, None] & m_v[None, :]


@triton.jit
def head_start(x, s, i_b, i_h):
    """Pointer to token 0 of batch row ``i_b``, head ``i_h`` of a [B, T, H, D] tensor with strides ``s`` = (batch,
    token, head); int64 offsets."""
    return x + tl.cast(i_b, tl.int64) * s[0] + tl.cast(i_h, tl.int64) * s[2]


@triton.jit
def head_rows_descriptor(x, s, i_b, i_h, eos, D: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr):
    """A tensor descriptor over the rows [0, eos) of :func:`head_start`'s head (D columns, token stride s[1]) in
    [BR, BC] tiles: rows >= eos and columns >= D read as zeros and are not written."""
    return tl.make_tensor_descriptor(head_start(x, s, i_b, i_h), shape=[eos, D], strides=[s[1], 1],
                                     block_shape=[BR, BC])  # fmt: skip


@triton.jit
def row_tile(x, s, i_b, i_h, rows, o_d):
    """Pointers [R, D] to tokens ``rows`` [R] (int64) and columns ``o_d`` [D] of :func:`head_start`'s head."""
    return head_start(x, s, i_b, i_h) + rows[:, None] * s[1] + o_d[None, :]


@triton.jit
def load_rows(x, s, i_b, i_h, rows, o_d, m_t, m_d):
    """The [R, D] tile of :func:`row_tile`, zeros outside the row mask ``m_t`` and column mask ``m_d``."""
    return tl.load(row_tile(x, s, i_b, i_h, rows, o_d), mask=m_t[:, None] & m_d[None, :], other=0.0)


@triton.jit
def state_tile(base, i_x, s, i_h, o_k, o_v):
    """Pointers [BK, BV] to rows ``o_k`` and columns ``o_v`` of head ``i_h`` in slot ``i_x`` (sequence or segment)
    of a [N, H, DK, DV] state buffer with strides ``s`` = (slot, head, row, column); int64 offsets."""
    return (
        base + tl.cast(i_x, tl.int64) * s[0] + tl.cast(i_h, tl.int64) * s[1] + o_k[:, None] * s[2]
        + o_v[None, :] * s[3]
    )  # fmt: skip


@triton.jit
def load_state(base, i_x, s, i_h, o_k, o_v, m_kv, ACC: tl.constexpr):
    """The state tile [BK, BV] of :func:`state_tile`, masked to the head dims and read as ``ACC``."""
    return tl.load(state_tile(base, i_x, s, i_h, o_k, o_v), mask=m_kv, other=0.0).to(ACC)


@triton.jit
def chunk_rows(i_c, n_chunks, bos, eos, C, o_t, REVERSE: tl.constexpr):
    """Chunk ``i_c`` of a walk over [bos, eos) in chunks of C tokens aligned to ``bos``, from the last chunk first when
    REVERSE: (first token lo, length L, row mask [BT], walk positions r [BT], token rows [BT] int64). r is the
    distance from the chunk's first token in walk order (reverse: from its last token; < 0 on padding rows)."""
    if REVERSE:
        lo = bos + (n_chunks - 1 - i_c) * C
    else:
        lo = bos + i_c * C
    L = tl.minimum(lo + C, eos) - lo
    m_t = o_t < L
    if REVERSE:
        r = L - 1 - o_t
    else:
        r = o_t
    rows = tl.cast(lo, tl.int64) + o_t
    return lo, L, m_t, r, rows


@triton.jit
def inter_decay(c, r, d0, m_t, ACC: tl.constexpr):
    """λ^(r+d0) [BT]: the incoming state's decay at walk position r; padding rows selected to 0."""
    return tl.where(m_t, tl.exp2(-c * (tl.maximum(r, 0) + d0).to(ACC)), 0.0)


@triton.jit
def tail_decay(c, r, L, m_t, ACC: tl.constexpr):
    """λ^(L-1-r) [BT]: decay from walk position r to the chunk's last position; padding rows selected to 0."""
    return tl.where(m_t, tl.exp2(-c * tl.maximum(L - 1 - r, 0).to(ACC)), 0.0)


@triton.jit
def weighted_rows(b_x, w, ACC: tl.constexpr):
    """diag(w) X for a [BT, D] tile, multiplied in fp32 and rounded back to X's dtype (a dot operand)."""
    return (b_x.to(ACC) * w[:, None]).to(b_x.dtype)


@triton.jit
def decayed_outer(b_a, b_b, w, HAS_DECAY: tl.constexpr, SPLIT: tl.constexpr, ACC: tl.constexpr,
                  DOT_PREC: tl.constexpr):  # fmt: skip
    """Aᵀ · diag(w) B [DA, DB] for [BT, DA] and [BT, DB] tiles and row weights w [BT] (fp32): the state update's
    product, the weights on B's rows; with SPLIT the weighted B enters as two halves (:func:`split_halves`), else
    rounded to B's dtype. Without HAS_DECAY, w is not used."""
    if HAS_DECAY and SPLIT:  # the decayed rows as two halves (b itself is exact in its dtype)
        b_hi, b_lo = split_halves(b_b.to(ACC) * w[:, None], b_b.dtype)
        return tl.dot(tl.trans(b_a), b_lo, tl.dot(tl.trans(b_a), b_hi, out_dtype=ACC), out_dtype=ACC)
    elif HAS_DECAY:
        return tl.dot(tl.trans(b_a), weighted_rows(b_b, w, ACC), out_dtype=ACC, input_precision=DOT_PREC)
    else:
        return tl.dot(tl.trans(b_a), b_b, out_dtype=ACC, input_precision=DOT_PREC)


@triton.jit
def split_halves(x, DT: tl.constexpr):
    """An fp32 tile as two dot operands of dtype DT, hi = DT(x) and lo = DT(x - hi): hi + lo carries twice DT's
    significand bits, so a product with an exact DT operand (the inputs) loses no more than fp32 operands would
    (docs/kernels.md, "Split operands")."""
    hi = x.to(DT)
    return hi, (x - hi.to(x.dtype)).to(DT)


@triton.jit
def split_dot(a, b, acc, ACC: tl.constexpr):
    """acc + a · b for an fp32 ``a`` and a ``b`` in the input dtype, ``a`` as :func:`split_halves`."""
    a_hi, a_lo = split_halves(a, b.dtype)
    return tl.dot(a_lo, b, tl.dot(a_hi, b, acc, out_dtype=ACC), out_dtype=ACC)


@triton.jit
def inter_product(b_q, b_s, ACC: tl.constexpr, INTER_PREC: tl.constexpr, TRANS_S: tl.constexpr = False):
    """q · S [BT, BV] (q · Sᵀ with TRANS_S) against the carried fp32 state: S rounded to q's dtype for INTER_PREC
    "input" (bf16 inputs: 8 exponent bits), S as two halves in q's dtype for "split" (:func:`split_halves`), q and S
    as bf16 halves for "bf16x3" (fp16 inputs), else fp32 operands at INTER_PREC. The transpose is taken here, after
    q's conversion, so the instructions are issued in the order of the kernels that spell the product out."""
    if INTER_PREC == "input":
        if TRANS_S:
            return tl.dot(b_q, tl.trans(b_s).to(b_q.dtype), out_dtype=ACC)
        else:
            return tl.dot(b_q, b_s.to(b_q.dtype), out_dtype=ACC)
    elif INTER_PREC == "split":
        s_hi, s_lo = split_halves(b_s, b_q.dtype)
        if TRANS_S:
            s_hi, s_lo = tl.trans(s_hi), tl.trans(s_lo)
        return tl.dot(b_q, s_lo, tl.dot(b_q, s_hi, out_dtype=ACC), out_dtype=ACC)
    elif INTER_PREC == "bf16x3":
        # fp16 q: the state cannot be an fp16 operand (range), so q (exact as two bf16 halves) and S go to bf16 tensor
        # cores as halves; q_lo · S_lo is below the output's rounding and left out
        q_hi, q_lo = split_halves(b_q.to(ACC), tl.bfloat16)
        s_hi, s_lo = split_halves(b_s, tl.bfloat16)
        if TRANS_S:
            s_hi, s_lo = tl.trans(s_hi), tl.trans(s_lo)
        b_o = tl.dot(q_lo, s_hi, tl.dot(q_hi, s_lo, out_dtype=ACC), out_dtype=ACC)
        return tl.dot(q_hi, s_hi, b_o, out_dtype=ACC)
    else:
        b_qa = b_q.to(ACC)
        if TRANS_S:
            return tl.dot(b_qa, tl.trans(b_s), out_dtype=ACC, input_precision=INTER_PREC)
        else:
            return tl.dot(b_qa, b_s, out_dtype=ACC, input_precision=INTER_PREC)


@triton.jit
def intra_product(b_o, b_q, b_k, b_v, p, c, scale, HAS_DECAY: tl.constexpr, APART: tl.constexpr, ACC: tl.constexpr,
                  DOT_PREC: tl.constexpr, SPLIT: tl.constexpr = False):  # fmt: skip
    """b_o + scale · [(Q Kᵀ) ⊙ D] V [BT, BV], D from walk positions p (:func:`decayed_scores`). APART scales the
    product and adds it after the dot (``b_o + tl.dot(...)`` alone is folded back into the accumulator form), else
    the scores are scaled and b_o is the dot's accumulator. SPLIT: the fp32 scores enter the product as two halves
    (:func:`split_halves`) instead of rounded to v's dtype."""
    b_a = tl.dot(b_q, tl.trans(b_k), out_dtype=ACC, input_precision=DOT_PREC)  # [BT, BT]
    if SPLIT:
        if APART:
            b_a = decayed_scores(b_a, p, c, 1.0, HAS_DECAY, ACC)
            return b_o + scale * split_dot(b_a, b_v, tl.zeros(b_o.shape, dtype=ACC), ACC)
        else:
            return split_dot(decayed_scores(b_a, p, c, scale, HAS_DECAY, ACC), b_v, b_o, ACC)
    elif APART:
        b_a = decayed_scores(b_a, p, c, 1.0, HAS_DECAY, ACC).to(b_v.dtype)
        return b_o + scale * tl.dot(b_a, b_v, out_dtype=ACC, input_precision=DOT_PREC)
    else:
        b_a = decayed_scores(b_a, p, c, scale, HAS_DECAY, ACC).to(b_v.dtype)
        return tl.dot(b_a, b_v, b_o, out_dtype=ACC, input_precision=DOT_PREC)


# batch strides stay specialisable (divisibility by 16 gives the compiler aligned, vectorised loads; T·H·K is a
# multiple of 16 for any K that is): only lengths and counts are runtime values
@triton.jit(do_not_specialize=["T", "NS", "SEG", "CS", "WAVES"])
def _walk_kernel(
    q,  # [B, T, H, DK] (strided, last dim contiguous)
    k,  # [B, T, H, DK]
    v,  # [B, T, H, DV]
    o,  # [B, T, H, DV] output (unused with STATE_ONLY)
    slope,  # [H] float32, λ = exp(-slope) (unused without HAS_DECAY)
    h0,  # [N, H, DK, DV] incoming state through strides (may be a transposed view)
    ht,  # [N, H, DK, DV] final state (forward) or dh0 (reverse)
    states,  # [NSEG, H, DK, DV] segment-state buffer (SEG_IN: incoming, read; STATE_ONLY: local, written)
    cu_seqlens,  # [N + 1] (VARLEN 1)
    seg_table,  # [NSEG, 4] int32 (VARLEN 2)
    x,  # [B, T, H, DV] the reverse walk's k (REV_STATES)
    rstates,  # [NSEG, H, DK, DV] through strides: the reverse walk's local states, written (REV_STATES)
    sq, sk, sv, so, sx,  # strides (batch, token, head) of q, k, v, o, x
    sh0, sht, sst, srs,  # strides (slot, head, row, column) of h0, ht, states, rstates
    scale_intra,  # multiplies the intra-chunk term
    scale_inter,  # multiplies the term read from the incoming state
    scale_upd,  # multiplies k_tᵀ v_t in the state update
    scale_rev,  # multiplies the reverse local states (REV_STATES)
    T, H, NS, SEG,
    CS,  # tokens per chunk when > 0 (the inter-only mode, any multiple of 16 <= BT), else BT
    WAVES,  # 1: the grid fits the GPU at one program per SM, else 2; unused here: a key of the autotuner
    DK: tl.constexpr, DV: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    VARLEN: tl.constexpr,
    REVERSE: tl.constexpr,
    HAS_DECAY: tl.constexpr,
    USE_H0: tl.constexpr,
    STORE_HT: tl.constexpr,
    SEG_IN: tl.constexpr,
    STATE_ONLY: tl.constexpr,
    SKIP_FINAL: tl.constexpr,  # STATE_ONLY without a final state: the walk's last segment is not walked
    INTER_ONLY: tl.constexpr,  # o without its intra-chunk term (the linear half of hybrid attention)
    INTER_APART: tl.constexpr,  # q·S added after the intra product, not its accumulator (configs.walk_config)
    USE_TMA: tl.constexpr,  # tiles moved by tensor descriptors (sm_90 TMA); the host checks alignment, C == BT
    ACC: tl.constexpr,  # tl.float32 (tl.float64 for fp64 inputs under the interpreter)
    DOT_PREC: tl.constexpr,  # "tf32x3" for fp32 operands, "ieee" for fp64, else the tensor-core default
    INTER_PREC: tl.constexpr,  # (q·λ)·S: "tf32x3" (fp32 inputs), "ieee" (fp64), "tf32" (fp32 operands), "input" (bf16),
    # "split" (S as two bf16 halves), "bf16x3" (fp16 q and S as bf16 halves)
    SPLIT_OPERANDS: tl.constexpr,  # the fp32 scores and decayed values enter their products as two halves
    REV_STATES: tl.constexpr,  # also the reverse walk's segment-local states (a forward walk, not STATE_ONLY)
    REV_ALL: tl.constexpr,  # REV_STATES for every segment (else each sequence's first stores zeros)
):
    # grid: one program per (V tile, head, segment), V tile fastest so the programs that share a (segment, head)
    # run side by side and read its q/k tiles through L2 once
    pid = tl.program_id(0)
    NV: tl.constexpr = (DV + BV - 1) // BV
    i_v = pid % NV
    i_h = (pid // NV) % H
    i_s = pid // (NV * H)
    i_n, i_b, bos, eos, first, last = _segment(i_s, cu_seqlens, seg_table, T, NS, SEG, VARLEN)
    c = log2_decay(slope, i_h, HAS_DECAY, ACC)

    o_t, o_k, o_v, m_k, m_v, m_kv = tile_ranges(i_v, BT, BK, BV, DK, DV)

    if USE_TMA:
        # one descriptor per tensor over the rows [0, eos) of this (batch row, head): rows >= eos and columns >= DK
        # / DV read as zeros and are not written, as the masks below do, with no per-element address or mask in
        # registers (the copy engine computes them). Chunks end at eos or at C == BT tokens (no inter-only mode).
        d_k = head_rows_descriptor(k, sk, i_b, i_h, eos, DK, BT, BK)
        d_v = head_rows_descriptor(v, sv, i_b, i_h, eos, DV, BT, BV)
        if not STATE_ONLY:
            d_q = head_rows_descriptor(q, sq, i_b, i_h, eos, DK, BT, BK)
            d_o = head_rows_descriptor(o, so, i_b, i_h, eos, DV, BT, BV)

    # incoming state [BK, BV]: a segment boundary state from the scan, the initial state, or zeros
    b_s = tl.zeros([BK, BV], dtype=ACC)
    if SEG_IN:
        b_s = load_state(states, i_s, sst, i_h, o_k, o_v, m_kv, ACC)
    elif USE_H0:
        b_s = load_state(h0, i_n, sh0, i_h, o_k, o_v, m_kv, ACC)

    if REV_STATES:
        b_r = tl.zeros([BK, BV], dtype=ACC)
        # each sequence's first segment: no x read (the masks) and zeros stored, unless dh0 is wanted
        x_wanted = REV_ALL or not first

    # exponent offset of the incoming state: 1 (S_{-1} is decayed before token 0), except a reverse walk starting
    # from dht, where G_{T-1} = dht + ... (no decay); it becomes 1 after the first chunk
    if REVERSE and not STATE_ONLY:
        d0 = tl.where(last, 0, 1)
    else:
        d0 = tl.where(first, 1, 1)

    # chunks of C <= BT tokens (C = BT, or the inter-only mode's chunk size), aligned to the segment's start
    # (segments start at multiples of C) in both directions
    C = tl.where(CS > 0, CS, BT)
    n_chunks = (eos - bos + C - 1) // C
    # walk positions up to the chunk's shift, for the intra decay: r_i - r_j = p_i - p_j (reverse: r = L - 1 - o_t),
    # and p does not depend on the chunk (the decay matrix is built once; padding rows compare the same way)
    if REVERSE:
        p_walk = -o_t
    else:
        p_walk = o_t
    if SKIP_FINAL:  # the walk's last segment (the first one of a reverse walk): zeros stored, nothing read
        if REVERSE:
            n_chunks = tl.where(first, 0, n_chunks)
        else:
            n_chunks = tl.where(last, 0, n_chunks)
    for i_c in tl.range(0, n_chunks):
        lo, L, m_t, r, rows = chunk_rows(i_c, n_chunks, bos, eos, C, o_t, REVERSE)

        if USE_TMA:
            b_k = d_k.load([lo, 0])
            b_v = d_v.load([lo, i_v * BV])
        else:
            b_k = load_rows(k, sk, i_b, i_h, rows, o_k, m_t, m_k)
            b_v = load_rows(v, sv, i_b, i_h, rows, o_v, m_t, m_v)
        if HAS_DECAY:
            # λ^(L-1-r): decay from the token to the chunk's last walk position; padding rows selected to 0
            k_dec = tail_decay(c, r, L, m_t, ACC)
            blk_dec = tl.exp2(-c * (L - 1 + d0).to(ACC))

        if not STATE_ONLY:
            if USE_TMA:
                b_q = d_q.load([lo, 0])
            else:
                b_q = load_rows(q, sq, i_b, i_h, rows, o_k, m_t, m_k)
            # inter: λ^(r+d0) q · S with the factor applied to the product's rows (q goes to the tensor cores as
            # loaded; no [BT, K] fp32 copy live); the carried state stays fp32, only the product's operands may be
            # rounded
            b_o = inter_product(b_q, b_s, ACC, INTER_PREC)
            if HAS_DECAY:
                b_o = b_o * (inter_decay(c, r, d0, m_t, ACC) * scale_inter)[:, None]
            else:
                b_o = b_o * scale_inter
            if not INTER_ONLY:
                # intra: [(Q Kᵀ) ⊙ D] V, D_ij = λ^(r_i - r_j) for r_i >= r_j
                b_o = intra_product(
                    b_o, b_q, b_k, b_v, p_walk, c, scale_intra, HAS_DECAY, INTER_APART, ACC, DOT_PREC,
                    SPLIT_OPERANDS,
                )
            if USE_TMA:
                d_o.store([lo, i_v * BV], b_o.to(o.dtype.element_ty))
            else:
                tl.store(
                    row_tile(o, so, i_b, i_h, rows, o_v), b_o.to(o.dtype.element_ty), mask=m_t[:, None] & m_v[None, :]
                )

            if REV_STATES:
                # R += λ^(lo-bos) · qᵀ (λ^r x): the chunk's terms decayed to its first token, then to the segment's
                # (every exponent >= 0); x through pointers and masks, so the skipped segments read nothing
                b_x = load_rows(x, sx, i_b, i_h, rows, o_v, m_t & x_wanted, m_v)
                if HAS_DECAY:
                    b_rc = decayed_outer(b_q, b_x, inter_decay(c, r, 0, m_t, ACC), True, SPLIT_OPERANDS, ACC, DOT_PREC)
                    b_r = b_r + tl.exp2(-c * (lo - bos).to(ACC)) * b_rc
                else:
                    b_r = b_r + decayed_outer(b_q, b_x, None, False, SPLIT_OPERANDS, ACC, DOT_PREC)

        # state update: S = λ^(L-1+d0) S + scale_upd · Kᵀ (λ^(L-1-r) V), operands in the input dtype (the row factor
        # on the [BT, BV] v tile, the smaller operand)
        if HAS_DECAY:
            b_s = b_s * blk_dec + scale_upd * decayed_outer(b_k, b_v, k_dec, True, SPLIT_OPERANDS, ACC, DOT_PREC)
        else:
            b_s = b_s + scale_upd * decayed_outer(b_k, b_v, None, False, SPLIT_OPERANDS, ACC, DOT_PREC)
        if REVERSE:
            d0 = d0 * 0 + 1

    if REV_STATES:
        b_r = tl.where(x_wanted, b_r * scale_rev, 0.0)
        tl.store(state_tile(rstates, i_s, srs, i_h, o_k, o_v), b_r.to(rstates.dtype.element_ty), mask=m_kv)
    if STATE_ONLY:
        p_seg = state_tile(states, i_s, sst, i_h, o_k, o_v)
        tl.store(p_seg, b_s.to(states.dtype.element_ty), mask=m_kv)
    elif STORE_HT:
        if REVERSE:
            if HAS_DECAY:
                b_s = b_s * tl.exp2(-c * d0.to(ACC))  # dh0 = λ G_0 (= dht when the sequence is empty)
        p_ht = state_tile(ht, i_n, sht, i_h, o_k, o_v)
        tl.store(p_ht, b_s.to(ht.dtype.element_ty), mask=m_kv)


# tuning results cached on disk where this Triton has the option (3.3+): a new process skips the tuning runs
AUTOTUNE_CACHE = {"cache_results": True} if "cache_results" in inspect.signature(triton.autotune).parameters else {}
# WAVES: whether the grid fits the GPU in one round decides the best pipeline depth (two walks of one shape class
# may want different stages), so the two are tuned apart; the rest of the shape (T, batch) is left out of the key
AUTOTUNE_KEY = [
    "DK", "DV", "VARLEN", "REVERSE", "HAS_DECAY", "STATE_ONLY", "SEG_IN", "USE_H0", "INTER_ONLY", "USE_TMA", "WAVES",
    "SPLIT_OPERANDS", "REV_STATES",
]  # fmt: skip

# the plain kernel: launched with one configuration passed explicitly (a pin, float32, the inter-only mode)
walk_kernel = _walk_kernel


@functools.lru_cache(maxsize=None)
def tuned_walk_kernel(configs: tuple[triton.Config, ...]):
    """The walk autotuned over ``configs`` (the plan's candidates, ``configs.walk_candidates``): one autotuner per
    candidate list, so the plan's selector is the only one."""
    return triton.autotune(configs=list(configs), key=AUTOTUNE_KEY, **AUTOTUNE_CACHE)(_walk_kernel)
