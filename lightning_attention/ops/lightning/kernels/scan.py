"""The segment scan: the incoming state of every segment from the segments' local states (the long-sequence path).

The segment pre-pass (the walk with STATE_ONLY, :mod:`.walk`) writes each segment's local state, computed from zeros;
this kernel composes them in walk order into the state each segment's walk starts from, and the final state
(docs/kernels.md, "Pre-pass pieces and the scan").
"""

import triton
import triton.language as tl

from lightning_attention.ops.lightning.kernels.walk import load_state, log2_decay, state_tile


@triton.jit(do_not_specialize=["T", "NS", "SEG", "FNS", "FSEG", "F0", "SPLIT"])
def lightning_scan_kernel(
    states,  # [NSEG, H, DK, DV] out: incoming state of each segment
    pieces,  # [NP, H, DK, DV] in: local states from the pre-pass (may be ``states`` itself when SPLIT == 1)
    h0,  # [N, H, DK, DV] initial state (forward) or dht (reverse), strided
    ht,  # [N, H, DK, DV] final state (forward) or dh0 (reverse)
    slope,  # [H]
    seq_segs,  # [N + 1] int32: the segments of sequence n are seq_segs[n] .. seq_segs[n+1]-1 (VARLEN 2)
    seg_table,  # [NSEG, 4] int32 (VARLEN 2)
    sst, sp, sh0, sht,  # strides (slot, head, row, column) of states, pieces, h0, ht
    T, H, NS, SEG,
    FNS,  # VARLEN 0: pieces per sequence in ``pieces``
    FSEG,  # VARLEN 0: tokens per piece (SEG = SPLIT · FSEG)
    F0,  # VARLEN 0: index within its sequence of the piece at pieces[n·FNS] (earlier pieces were not computed)
    SPLIT,  # VARLEN 0: pieces per walk segment
    DK: tl.constexpr, DV: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr,
    VARLEN: tl.constexpr,
    REVERSE: tl.constexpr,
    HAS_DECAY: tl.constexpr,
    USE_H0: tl.constexpr,
    STORE_HT: tl.constexpr,
    ACC: tl.constexpr,
):
    """Decayed scan over segments, in walk order: in(0) = h0, in(j+1) = λ^(len_j - 1 + d0) in(j) + local(j).

    The pre-pass may cut each walk segment into SPLIT pieces (more programs for a pre-pass that would otherwise be
    bound by latency; fixed-length batches only): local(j) is then the scan of its pieces, and only the walk
    segments' incoming states are stored. Pieces the pre-pass did not compute (those of a segment whose local state
    only feeds an unwanted final state) lie outside ``pieces`` and add nothing. With SPLIT == 1 ``pieces`` may alias
    ``states``: each slot is read before it is rewritten. One program per (sequence, head, [BK, BV] state tile).
    """
    i_nh = tl.program_id(0)
    i_k = tl.program_id(1)
    i_v = tl.program_id(2)
    i_n = i_nh // H
    i_h = i_nh % H
    c = log2_decay(slope, i_h, HAS_DECAY, ACC)
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_kv = (o_k < DK)[:, None] & (o_v < DV)[None, :]
    i_n64 = tl.cast(i_n, tl.int64)
    i_h64 = tl.cast(i_h, tl.int64)
    tile_s = i_h64 * sst[1] + o_k[:, None] * sst[2] + o_v[None, :] * sst[3]
    tile_p = i_h64 * sp[1] + o_k[:, None] * sp[2] + o_v[None, :] * sp[3]

    b_s = tl.zeros([BK, BV], dtype=ACC)
    if USE_H0:
        b_s = load_state(h0, i_n64, sh0, i_h, o_k, o_v, m_kv, ACC)
    if VARLEN == 0:
        s_lo = i_n * NS
        n_segs = NS
    else:
        s_lo = tl.load(seq_segs + i_n)
        n_segs = tl.load(seq_segs + i_n + 1) - s_lo
    # exponent offset, as in the walk (:mod:`.walk`): a reverse scan starts from dht, not decayed before its first token
    if REVERSE:
        d0 = i_n * 0
    else:
        d0 = i_n * 0 + 1

    # one flat loop over the pieces in walk order (no nested loop: the loads do not depend on the carried state,
    # so the compiler can issue them ahead); a piece that enters its segment first stores the segment's incoming
    # state. SPLIT == 1 or VARLEN 2: every piece is a segment, read before its slot is rewritten.
    if VARLEN == 0:
        n_pieces = FNS
    else:
        n_pieces = n_segs
    for u in tl.range(0, n_pieces, num_stages=3):
        if REVERSE:
            f = n_pieces - 1 - u
        else:
            f = u
        if VARLEN == 0:
            i_p = i_n * FNS + f
            g = f + F0  # the piece's index in its sequence
            piece_len = tl.minimum(FSEG, T - g * FSEG)
            j = g // SPLIT
            if REVERSE:  # a reverse walk enters a segment at its last piece (the sequence's last for the last one)
                enters = ((g + 1) % SPLIT == 0) | ((g + 1) * FSEG >= T)
            else:
                enters = g % SPLIT == 0
        else:
            i_p = s_lo + f
            piece_len = tl.load(seg_table + i_p * 4 + 2) - tl.load(seg_table + i_p * 4 + 1)
            j = f
            enters = u >= 0
        b_local = tl.load(pieces + tl.cast(i_p, tl.int64) * sp[0] + tile_p, mask=m_kv, other=0.0).to(ACC)
        if enters:
            tl.store(states + tl.cast(s_lo + j, tl.int64) * sst[0] + tile_s, b_s.to(states.dtype.element_ty), mask=m_kv)
        if HAS_DECAY:
            # an empty segment (a zero-length sequence) leaves the state as it is
            dec = tl.where(piece_len > 0, tl.exp2(-c * tl.maximum(piece_len - 1 + d0, 0).to(ACC)), 1.0)
            b_s = b_s * dec + b_local
        else:
            b_s = b_s + b_local
        d0 = tl.where(piece_len > 0, 1, d0)
    if VARLEN == 0:
        # the one segment without pieces (its local state only feeds an unwanted final state): the last one in walk
        # order, whose incoming state is the state after every piece
        if REVERSE:
            if F0 > 0:
                tl.store(states + tl.cast(s_lo, tl.int64) * sst[0] + tile_s, b_s.to(states.dtype.element_ty), mask=m_kv)
        else:
            if F0 + FNS <= (NS - 1) * SPLIT:
                tl.store(
                    states + tl.cast(s_lo + NS - 1, tl.int64) * sst[0] + tile_s, b_s.to(states.dtype.element_ty),
                    mask=m_kv,
                )

    if STORE_HT:
        if REVERSE:
            if HAS_DECAY:
                b_s = b_s * tl.exp2(-c * d0.to(ACC))
        p_ht = state_tile(ht, i_n64, sht, i_h, o_k, o_v)
        tl.store(p_ht, b_s.to(ht.dtype.element_ty), mask=m_kv)
