"""The chunk walk with two consumer warpgroups per program (Gluon, sm_90): the K = 128 and K = 256 form of
``kernels/walk.py``.

A Triton walk program is one warpgroup that waits on each of its own products in turn: at K = V = 256 one 4-warp block
fits per SM and the SM runs one dependency chain, its tensor pipe 36% busy; at K = 128 two blocks fit, and the four
walks of a fwd+bwd still take 1.2-1.3× the time they take here (docs/kernels.md, "The two-warpgroup walk"). Here one
program owns two neighbouring value tiles of one (segment, head) (:data:`WS_VALUE_TILES`: 32 columns each at K = 256,
64 at K = 128, so one program covers a head's 128 value columns), and the SM runs two chains:

- a one-warp producer streams each chunk's q and k tiles (shared by both consumers) and the two v tiles through a ring
  of ``STAGES`` shared buffers (TMA, one mbarrier per stage for "full" and one for "released by both");
- each consumer warpgroup walks its own [K, BV] fp32 state in registers with the Triton walk's arithmetic (same
  roles, directions and exponent rules: see ``kernels/walk.py``), issuing q·kᵀ together with q·S and the intra
  product together with the state update, so its products overlap each other and the other consumer's.

The segment pre-pass (the Triton walk's STATE_ONLY mode) has the same structure without q and o
(:func:`lightning_state_ws_kernel`). Only the shapes the plan gives them (``plan.use_walk_ws``): bf16,
K = 128 or 256 (the state's rows), V a multiple of two value tiles, fixed-length batches, whole sequences or
host-planned segments (``SEG_IN``), tensor descriptors; the scan, the inter-only mode and every other shape stay with
the Triton kernels. Values match the Triton walk's up to the order of the fp32 sums (the same roundings: scores and
λ-weighted values to bf16 as mma operands, S to bf16 for q·S); the state-update scale is folded into the λ-weighted
value tile before its rounding. With ``SPLIT`` (the split precision, at the key dims of :data:`WS_SPLIT_KEY_DIMS`) each
of those three fp32 operands enters its product as two bf16 halves, as in the Triton walk (``walk.split_halves``).

Gluon has no interpreter: on a machine without an sm_90 GPU the kernel is only compiled (tests/ops/test_aot.py).
"""

import triton

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
except ImportError:  # a Triton without Gluon (< 3.5): the Triton walk everywhere
    gluon = None

# one configuration per key dim: 64-token chunks, two value tiles of WS_VALUE_TILES[K] columns per program (one per
# consumer), two stages, 4 warps per consumer and one producer warp. Shared memory: 197 KB at K = 256 (three stages
# would need 269 KB), 164 KB at K = 128 (three stages, 213 KB, made the reverse walks 4-10% slower at 1K-8K)
WS_BT = 64
WS_VALUE_TILES = {128: 64, 256: 32}
WS_STAGES = 2
WS_STATE_STAGES = 4  # the pre-pass keeps no q, o or state operand tiles: four stages in 172 KB (K = 256), 148 KB (128)
WS_WARPS = 4
# the split precision adds per consumer a low half of the state operand and of the decayed values: 213 KB at K = 128;
# at K = 256 they would need 237 KB, over the 227 KB a block may take, and the Triton walk keeps that case
WS_SPLIT_KEY_DIMS = (128,)

# the Triton versions it is run or built with: 3.6 on the H100 / H200 runs, 3.8 in CI's sm_90 builds (Gluon is an
# experimental API that may change); with another version the dispatcher keeps the Triton walk
WS_TRITON_VERSIONS = ((3, 6), (3, 8))


def triton_version_supported(version: str = triton.__version__) -> bool:
    """Whether ``version`` lies in :data:`WS_TRITON_VERSIONS` (inclusive; pre-release tags ignored)."""
    major_minor = tuple(int(part) for part in version.split(".")[:2])
    return WS_TRITON_VERSIONS[0] <= major_minor <= WS_TRITON_VERSIONS[1]


def value_tile(DK: int, DV: int) -> int | None:
    """Columns per consumer for key dim ``DK`` and value dim ``DV`` (a multiple of two such tiles), or None where the
    kernel is not built for them."""
    BV = WS_VALUE_TILES.get(DK)
    return BV if BV is not None and DV % (2 * BV) == 0 else None

if gluon is not None:
    RCP_LN2 = gl.constexpr(1.4426950408889634)  # log2(e): exp(-s·x) == exp2(-s·log2(e)·x)

    @gluon.jit
    def _store_operand(x, hi_s, lo_s, SPLIT: gl.constexpr):
        """Stores the fp32 tile ``x`` as a bf16 mma operand in ``hi_s``; with SPLIT as two halves, hi = bf16(x) in
        ``hi_s`` and lo = bf16(x - hi) in ``lo_s`` (hi + lo carries 16 significand bits of x)."""
        hi = x.to(gl.bfloat16)
        hi_s.store(hi)
        if SPLIT:
            lo_s.store((x - hi.to(gl.float32)).to(gl.bfloat16))

    @gluon.jit
    def _chunk_start(i, n_chunks, bos, BT: gl.constexpr, REVERSE: gl.constexpr):
        """First token of the walk's i-th chunk (reverse walks go from the segment's last chunk to its first)."""
        if REVERSE:
            return bos + (n_chunks - 1 - i) * BT
        else:
            return bos + i * BT

    @gluon.jit
    def _wait_chunk(ready, i, n_chunks, bos, eos, BT: gl.constexpr, STAGES: gl.constexpr, REVERSE: gl.constexpr):
        """Waits until the producer has filled chunk i's stage; returns (the stage, the chunk's first token, its
        length)."""
        s = i % STAGES
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        lo = _chunk_start(i, n_chunks, bos, BT, REVERSE)
        return s, lo, gl.minimum(lo + BT, eos) - lo

    @gluon.jit
    def _producer(q_desc, k_desc, v_desc, q_s, k_s, v_s, ready, empty, n_chunks, bos, i_vp,
                  BT: gl.constexpr, BV: gl.constexpr, STAGES: gl.constexpr, REVERSE: gl.constexpr,
                  LOAD_Q: gl.constexpr):  # fmt: skip
        """Fills stage i % STAGES with chunk i's k, two v tiles and (LOAD_Q: the walk, not the pre-pass) q, once both
        consumers have released it."""
        nbytes: gl.constexpr = k_desc.block_type.nbytes + 2 * v_desc.block_type.nbytes
        for i in range(n_chunks):
            s = i % STAGES
            # a fresh barrier counts as released for the phase before its first (parity 1): the first round passes
            mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
            lo = _chunk_start(i, n_chunks, bos, BT, REVERSE)
            if LOAD_Q:
                mbarrier.expect(ready.index(s), nbytes + q_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(q_desc, [lo, 0], ready.index(s), q_s.index(s))
            else:
                mbarrier.expect(ready.index(s), nbytes)
            tma.async_copy_global_to_shared(k_desc, [lo, 0], ready.index(s), k_s.index(s))
            tma.async_copy_global_to_shared(v_desc, [lo, 2 * i_vp * BV], ready.index(s), v_s.index(2 * s))
            tma.async_copy_global_to_shared(v_desc, [lo, (2 * i_vp + 1) * BV], ready.index(s), v_s.index(2 * s + 1))

    @gluon.jit
    def _program(slope, T, H, NS, SEG, NVP: gl.constexpr, HAS_DECAY: gl.constexpr):
        """This program's (value-tile pair, head, segment, sequence, segment index in it, first and end token of the
        segment, decay coefficient c = slope·log2(e)): pairs fastest, then heads, then segments."""
        pid = gl.program_id(0)
        i_vp = pid % NVP
        i_h = (pid // NVP) % H
        i_s = pid // (NVP * H)
        j = i_s % NS
        bos = j * SEG
        eos = gl.minimum(bos + SEG, T)
        if HAS_DECAY:
            c = gl.load(slope + i_h) * RCP_LN2
        else:
            c = gl.to_tensor(0.0)
        return i_vp, i_h, i_s, i_s // NS, j, bos, eos, c

    @gluon.jit
    def _rows_desc(base, s, n64, h64, eos, D: gl.constexpr, BR: gl.constexpr, BC: gl.constexpr):
        """A descriptor over the rows [0, eos) of one (batch row, head) of a [B, T, H, D] tensor with strides ``s`` =
        (batch, token, head), in [BR, BC] tiles: rows past eos read as zeros and are not written."""
        layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BR, BC], gl.bfloat16)
        return tma.make_tensor_descriptor(base + n64 * s[0] + h64 * s[2], shape=[eos, D], strides=[s[1], 1],
                                          block_shape=[BR, BC], layout=layout)  # fmt: skip

    @gluon.jit
    def _stage_barriers(STAGES: gl.constexpr):
        """Per stage a "full" barrier (the producer's transaction bytes) and an "empty" one (both consumers)."""
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=2)
        return ready, empty

    @gluon.jit
    def _stages(BT: gl.constexpr, DK: gl.constexpr, BV: gl.constexpr, STAGES: gl.constexpr, LOAD_Q: gl.constexpr):
        """The ring the producer fills and both consumers read, the same in the walk, the pre-pass and the fused dk/dv
        walk: q and k [STAGES, BT, DK] (one chunk's rows per stage, read by both consumers; without LOAD_Q, the
        pre-pass, there is no q buffer and k's stands in for it), v [2·STAGES, BT, BV] (a stage's two value tiles at
        2·s and 2·s + 1, one per consumer) and per stage the "full" and "empty" barriers of :func:`_stage_barriers`,
        which also guard the fused dk/dv walk's do ring."""
        qk_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, DK], gl.bfloat16)
        v_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, BV], gl.bfloat16)
        if LOAD_Q:
            q_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BT, DK], qk_layout)
        k_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BT, DK], qk_layout)
        if not LOAD_Q:
            q_s = k_s
        v_s = gl.allocate_shared_memory(gl.bfloat16, [2 * STAGES, BT, BV], v_layout)
        ready, empty = _stage_barriers(STAGES)
        return q_s, k_s, v_s, ready, empty

    @gluon.jit
    def _slot(base, s, i64, h64):
        """The [DK, DV] state of slot ``i64`` (a sequence or a segment) and head ``h64`` of ``base`` [slots, H, DK, DV]
        with strides ``s`` (slot, head, row, column)."""
        return base + i64 * s[0] + h64 * s[1]

    @gluon.jit
    def _incoming_state(states, sst, i_s, h0, sh0, n64, h64, SEG_IN: gl.constexpr):
        """This program's incoming state and its (row, column) strides: its segment's slot of ``states`` with SEG_IN,
        else its sequence's slot of ``h0``."""
        if SEG_IN:
            return _slot(states, sst, i_s.to(gl.int64), h64), sst[2], sst[3]
        else:
            return _slot(h0, sh0, n64, h64), sh0[2], sh0[3]

    @gluon.jit
    def _state_ptrs(base, s_k, s_v, col0, DK: gl.constexpr, BV: gl.constexpr, layout: gl.constexpr):
        """Pointers to this consumer's [DK, BV] block (columns col0 …) of a state with strides (s_k, s_v), in
        ``layout``."""
        rk = gl.arange(0, DK, layout=gl.SliceLayout(1, layout))
        cv = gl.arange(0, BV, layout=gl.SliceLayout(0, layout))
        return base + rk[:, None].to(gl.int64) * s_k + (col0 + cv)[None, :].to(gl.int64) * s_v

    @gluon.jit
    def _intra_decay(c, scale, BT: gl.constexpr, REVERSE: gl.constexpr, layout: gl.constexpr):
        """The chunk's [BT, BT] decay matrix in ``layout``: scale · λ^(p_i - p_j) where p_i >= p_j and 0 elsewhere (the
        causal mask), p = the walk position up to a shift common to the chunk (forward: the token's index in the
        chunk, reverse: its negation). Built once per program and held in registers."""
        ti = gl.arange(0, BT, layout=gl.SliceLayout(1, layout))
        tj = gl.arange(0, BT, layout=gl.SliceLayout(0, layout))
        if REVERSE:
            dist = tj[None, :] - ti[:, None]
        else:
            dist = ti[:, None] - tj[None, :]
        return gl.where(dist >= 0, gl.exp2(-c * gl.maximum(dist, 0).to(gl.float32)) * scale, 0.0)

    @gluon.jit
    def _initial_state(s_in, s_k, s_v, col0, DK: gl.constexpr, BV: gl.constexpr, HAS_IN: gl.constexpr,
                       layout: gl.constexpr):  # fmt: skip
        """This consumer's [DK, BV] fp32 block (columns col0 …) of the incoming state at ``s_in`` (strides s_k, s_v)
        in ``layout``, or zeros without HAS_IN."""
        if HAS_IN:
            return gl.load(_state_ptrs(s_in, s_k, s_v, col0, DK, BV, layout))
        else:
            return gl.zeros([DK, BV], gl.float32, layout)

    @gluon.jit
    def _consumer(CID: gl.constexpr, o_desc, q_s, k_s, v_s, ready, empty, s_s, s_lo, vd_s, vd_lo, o_s, s_in, ht,
                  sin_k, sin_v, sht_k, sht_v, n_chunks, bos, eos, last, c, scale_intra, scale_inter, scale_upd, i_vp,
                  DK: gl.constexpr, BT: gl.constexpr, BV: gl.constexpr, STAGES: gl.constexpr, REVERSE: gl.constexpr,
                  HAS_IN: gl.constexpr, STORE_HT: gl.constexpr, SPLIT: gl.constexpr):  # fmt: skip
        """Walks value tile 2·i_vp + CID from the incoming state at ``s_in`` (zeros without HAS_IN), storing each
        chunk's o and, with STORE_HT, the final state at ``ht`` (pointers to this program's [DK, BV] block). The
        state's and the decayed values' bf16 operands go to ``s_s`` and ``vd_s``, with SPLIT their low halves to
        ``s_lo`` and ``vd_lo``."""
        mma_a: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BT, 16])
        mma_o: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BV, 16])
        a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_o, k_width=2)
        v_blk: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [4, 1], [1, 0])
        col0 = (2 * i_vp + CID) * BV

        decay = _intra_decay(c, scale_intra, BT, REVERSE, mma_a)
        to = gl.arange(0, BT, layout=gl.SliceLayout(1, mma_o))
        tv = gl.arange(0, BT, layout=gl.SliceLayout(1, v_blk))

        S = _initial_state(s_in, sin_k, sin_v, col0, DK, BV, HAS_IN, mma_o)
        # exponent offset of the incoming state (kernels/walk.py): 1, except a reverse walk that starts from dht
        if REVERSE:
            d0 = gl.where(last, 0, 1)
        else:
            d0 = eos * 0 + 1
        _store_operand(S, s_s, s_lo, SPLIT)
        fence_async_shared()
        for i in range(n_chunks):
            s, lo, L = _wait_chunk(ready, i, n_chunks, bos, eos, BT, STAGES, REVERSE)
            q = q_s.index(s)
            kt = k_s.index(s).permute((1, 0))  # [DK, BT]
            v = v_s.index(2 * s + CID)
            # q kᵀ and q S issued together (with SPLIT q S is two products); the scores are waited for first
            a_acc = warpgroup_mma(q, kt, gl.zeros([BT, BT], gl.float32, mma_a), use_acc=False, is_async=True)
            o_acc = warpgroup_mma(q, s_s, gl.zeros([BT, BV], gl.float32, mma_o), use_acc=False, is_async=True)
            if SPLIT:
                o_acc = warpgroup_mma(q, s_lo, o_acc, is_async=True)
                a_acc = warpgroup_mma_wait(num_outstanding=2, deps=(a_acc,))
            else:
                a_acc = warpgroup_mma_wait(num_outstanding=1, deps=(a_acc,))
            # the mask selects (a NaN or inf score of a later token must not reach an earlier output: 0·NaN = NaN), on
            # decay, which is 0 exactly above the diagonal and live anyway: selecting on the distances kept them live
            # through the loop and spilled 188 bytes per thread at sm_90 (K = 256 forward 18% slower)
            a32 = gl.where(decay != 0.0, a_acc * decay, 0.0)
            a_hi = a32.to(gl.bfloat16)
            if SPLIT:
                a_lo = gl.convert_layout((a32 - a_hi.to(gl.float32)).to(gl.bfloat16), a_op)
            a = gl.convert_layout(a_hi, a_op)
            o_acc = warpgroup_mma_wait(num_outstanding=0, deps=(o_acc,))
            # inter: λ^(r + d0) on the rows of q·S, r = the walk position from the chunk's first token in walk order
            if REVERSE:
                r = L - 1 - to
            else:
                r = to
            inter = gl.where(to < L, gl.exp2(-c * (gl.maximum(r, 0) + d0).to(gl.float32)), 0.0) * scale_inter
            o_acc = warpgroup_mma(a, v, o_acc * inter[:, None], is_async=True)
            if SPLIT:
                o_acc = warpgroup_mma(a_lo, v, o_acc, is_async=True)
            # state update: S = λ^(L-1+d0) S + scale_upd · kᵀ (λ^(L-1-r) v), the factors on the v tile's rows
            if REVERSE:
                rv = L - 1 - tv
            else:
                rv = tv
            k_dec = gl.where(tv < L, gl.exp2(-c * gl.maximum(L - 1 - rv, 0).to(gl.float32)), 0.0) * scale_upd
            _store_operand(v.load(v_blk).to(gl.float32) * k_dec[:, None], vd_s, vd_lo, SPLIT)
            fence_async_shared()
            S = warpgroup_mma(kt, vd_s, S * gl.exp2(-c * (L - 1 + d0).to(gl.float32)), is_async=True)
            if SPLIT:
                S = warpgroup_mma(kt, vd_lo, S, is_async=True)
            o_acc, S = warpgroup_mma_wait(num_outstanding=0, deps=(o_acc, S))
            mbarrier.arrive(empty.index(s), count=1)  # this consumer is done with the stage's tiles
            tma.store_wait(pendings=0)  # the previous chunk's o has left o_s
            o_s.store(o_acc.to(gl.bfloat16))
            _store_operand(S, s_s, s_lo, SPLIT)
            fence_async_shared()
            tma.async_copy_shared_to_global(o_desc, [lo, col0], o_s)
            d0 = d0 * 0 + 1
        tma.store_wait(pendings=0)
        if STORE_HT:
            if REVERSE:
                S = S * gl.exp2(-c * d0.to(gl.float32))  # dh0 = λ G_0 (= dht when the sequence is empty)
            gl.store(_state_ptrs(ht, sht_k, sht_v, col0, DK, BV, mma_o), S)

    @gluon.jit(do_not_specialize=["T", "NS", "SEG"])
    def lightning_walk_ws_kernel(
        q, k, v, o,  # [B, T, H, DK] / [B, T, H, DV] bf16, last dim contiguous, TMA-aligned (ops/lightning/tma.py)
        slope,  # [H] float32 (unused without HAS_DECAY)
        h0,  # [N, H, DK, DV] incoming state through strides (may be a transposed view)
        ht,  # [N, H, DK, DV] final state (forward) or dh0 (reverse)
        states,  # [NSEG, H, DK, DV] incoming state of each segment (SEG_IN)
        sq, sk, sv, so,  # strides (batch, token, head) of q, k, v, o
        sh0, sht, sst,  # strides (slot, head, row, column) of h0, ht, states
        scale_intra, scale_inter, scale_upd,
        T, H, NS, SEG,
        DK: gl.constexpr, DV: gl.constexpr,
        BT: gl.constexpr, BV: gl.constexpr, STAGES: gl.constexpr,
        REVERSE: gl.constexpr,
        HAS_DECAY: gl.constexpr,
        USE_H0: gl.constexpr,
        STORE_HT: gl.constexpr,
        SEG_IN: gl.constexpr,
        SPLIT: gl.constexpr,  # the split precision (WS_SPLIT_KEY_DIMS)
    ):  # fmt: skip
        """One program per (pair of value tiles, head, segment), pairs fastest; a fixed-length batch cut into NS
        segments of SEG tokens per sequence (NS = 1: whole sequences). Launched with num_warps = 4 (the first
        consumer); the second consumer and the producer are the warp-specialised workers."""
        i_vp, i_h, i_s, i_n, j, bos, eos, c = _program(slope, T, H, NS, SEG, DV // (2 * BV), HAS_DECAY)
        last = j == NS - 1
        n64 = i_n.to(gl.int64)
        h64 = i_h.to(gl.int64)

        v_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, BV], gl.bfloat16)
        s_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([DK, BV], gl.bfloat16)
        q_desc = _rows_desc(q, sq, n64, h64, eos, DK, BT, DK)
        k_desc = _rows_desc(k, sk, n64, h64, eos, DK, BT, DK)
        v_desc = _rows_desc(v, sv, n64, h64, eos, DV, BT, BV)
        o_desc = _rows_desc(o, so, n64, h64, eos, DV, BT, BV)
        s_in, sin_k, sin_v = _incoming_state(states, sst, i_s, h0, sh0, n64, h64, SEG_IN)
        s_out = _slot(ht, sht, n64, h64)

        q_s, k_s, v_s, ready, empty = _stages(BT, DK, BV, STAGES, True)
        s_s0 = gl.allocate_shared_memory(gl.bfloat16, [DK, BV], s_layout)
        s_s1 = gl.allocate_shared_memory(gl.bfloat16, [DK, BV], s_layout)
        vd_s0 = gl.allocate_shared_memory(gl.bfloat16, [BT, BV], v_layout)
        vd_s1 = gl.allocate_shared_memory(gl.bfloat16, [BT, BV], v_layout)
        o_s0 = gl.allocate_shared_memory(gl.bfloat16, [BT, BV], v_layout)
        o_s1 = gl.allocate_shared_memory(gl.bfloat16, [BT, BV], v_layout)
        if SPLIT:
            s_lo0 = gl.allocate_shared_memory(gl.bfloat16, [DK, BV], s_layout)
            s_lo1 = gl.allocate_shared_memory(gl.bfloat16, [DK, BV], s_layout)
            vd_lo0 = gl.allocate_shared_memory(gl.bfloat16, [BT, BV], v_layout)
            vd_lo1 = gl.allocate_shared_memory(gl.bfloat16, [BT, BV], v_layout)
        else:  # never written or read
            s_lo0, s_lo1, vd_lo0, vd_lo1 = s_s0, s_s1, vd_s0, vd_s1
        n_chunks = gl.cdiv(eos - bos, BT)
        HAS_IN: gl.constexpr = SEG_IN or USE_H0
        gl.warp_specialize(
            [
                (_consumer, (0, o_desc, q_s, k_s, v_s, ready, empty, s_s0, s_lo0, vd_s0, vd_lo0, o_s0, s_in, s_out,
                             sin_k, sin_v, sht[2], sht[3], n_chunks, bos, eos, last, c, scale_intra, scale_inter,
                             scale_upd, i_vp, DK, BT, BV, STAGES, REVERSE, HAS_IN, STORE_HT, SPLIT)),
                (_consumer, (1, o_desc, q_s, k_s, v_s, ready, empty, s_s1, s_lo1, vd_s1, vd_lo1, o_s1, s_in, s_out,
                             sin_k, sin_v, sht[2], sht[3], n_chunks, bos, eos, last, c, scale_intra, scale_inter,
                             scale_upd, i_vp, DK, BT, BV, STAGES, REVERSE, HAS_IN, STORE_HT, SPLIT)),
                (_producer, (q_desc, k_desc, v_desc, q_s, k_s, v_s, ready, empty, n_chunks, bos, i_vp, BT, BV, STAGES,
                             REVERSE, True)),
            ],
            worker_num_warps=[4, 1],
            worker_num_regs=[232, 40],
        )

    @gluon.jit
    def _state_consumer(CID: gl.constexpr, k_s, v_s, ready, empty, vd_s, vd_lo, out, sout_k, sout_v, n_chunks, bos,
                        eos, c, scale_upd, i_vp, DK: gl.constexpr, BT: gl.constexpr, BV: gl.constexpr,
                        STAGES: gl.constexpr, REVERSE: gl.constexpr, SPLIT: gl.constexpr):  # fmt: skip
        """The local state of value tile 2·i_vp + CID over the segment, from zeros: S = λ^L S + scale_upd·kᵀ (λ^(L-1-r)
        v) per chunk (the walk's update with d0 = 1), stored at ``out`` (this program's [DK, BV] block)."""
        mma_o: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BV, 16])
        v_blk: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [4, 1], [1, 0])
        col0 = (2 * i_vp + CID) * BV
        tv = gl.arange(0, BT, layout=gl.SliceLayout(1, v_blk))
        S = gl.zeros([DK, BV], gl.float32, mma_o)
        for i in range(n_chunks):
            s, lo, L = _wait_chunk(ready, i, n_chunks, bos, eos, BT, STAGES, REVERSE)
            if REVERSE:
                rv = L - 1 - tv
            else:
                rv = tv
            k_dec = gl.where(tv < L, gl.exp2(-c * gl.maximum(L - 1 - rv, 0).to(gl.float32)), 0.0) * scale_upd
            _store_operand(v_s.index(2 * s + CID).load(v_blk).to(gl.float32) * k_dec[:, None], vd_s, vd_lo, SPLIT)
            fence_async_shared()
            kt = k_s.index(s).permute((1, 0))
            S = warpgroup_mma(kt, vd_s, S * gl.exp2(-c * L.to(gl.float32)), is_async=True)
            if SPLIT:
                S = warpgroup_mma(kt, vd_lo, S, is_async=True)
            S = warpgroup_mma_wait(num_outstanding=0, deps=(S,))
            mbarrier.arrive(empty.index(s), count=1)
        gl.store(_state_ptrs(out, sout_k, sout_v, col0, DK, BV, mma_o), S)

    @gluon.jit(do_not_specialize=["T", "NS", "SEG"])
    def lightning_state_ws_kernel(
        k, v,  # [B, T, H, DK] / [B, T, H, DV] bf16, last dim contiguous, TMA-aligned
        slope,  # [H] float32 (unused without HAS_DECAY)
        states,  # [NSEG, H, DK, DV] out: each segment's local state
        sk, sv,  # strides (batch, token, head) of k, v
        sst,  # strides (slot, head, row, column) of states
        scale_upd,
        T, H, NS, SEG,
        DK: gl.constexpr, DV: gl.constexpr,
        BT: gl.constexpr, BV: gl.constexpr, STAGES: gl.constexpr,
        REVERSE: gl.constexpr,
        HAS_DECAY: gl.constexpr,
        SKIP_FINAL: gl.constexpr,  # the walk's last segment (the first of a reverse walk) stores zeros unread
        SPLIT: gl.constexpr,  # the decayed values as two halves (the split precision)
    ):  # fmt: skip
        """The segment pre-pass (the Triton walk's STATE_ONLY mode) with two consumer warpgroups: one program per
        (pair of value tiles, head, segment) of a fixed-length batch cut into NS segments of SEG tokens."""
        i_vp, i_h, i_s, i_n, j, bos, eos, c = _program(slope, T, H, NS, SEG, DV // (2 * BV), HAS_DECAY)
        n64 = i_n.to(gl.int64)
        h64 = i_h.to(gl.int64)
        n_chunks = gl.cdiv(eos - bos, BT)
        if SKIP_FINAL:
            if REVERSE:
                n_chunks = gl.where(j == 0, 0, n_chunks)
            else:
                n_chunks = gl.where(j == NS - 1, 0, n_chunks)
        v_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, BV], gl.bfloat16)
        k_desc = _rows_desc(k, sk, n64, h64, eos, DK, BT, DK)
        v_desc = _rows_desc(v, sv, n64, h64, eos, DV, BT, BV)
        out = _slot(states, sst, i_s.to(gl.int64), h64)

        _, k_s, v_s, ready, empty = _stages(BT, DK, BV, STAGES, False)
        vd_s0 = gl.allocate_shared_memory(gl.bfloat16, [BT, BV], v_layout)
        vd_s1 = gl.allocate_shared_memory(gl.bfloat16, [BT, BV], v_layout)
        if SPLIT:
            vd_lo0 = gl.allocate_shared_memory(gl.bfloat16, [BT, BV], v_layout)
            vd_lo1 = gl.allocate_shared_memory(gl.bfloat16, [BT, BV], v_layout)
        else:  # never written or read
            vd_lo0, vd_lo1 = vd_s0, vd_s1
        gl.warp_specialize(
            [
                (_state_consumer, (0, k_s, v_s, ready, empty, vd_s0, vd_lo0, out, sst[2], sst[3], n_chunks, bos, eos,
                                   c, scale_upd, i_vp, DK, BT, BV, STAGES, REVERSE, SPLIT)),
                (_state_consumer, (1, k_s, v_s, ready, empty, vd_s1, vd_lo1, out, sst[2], sst[3], n_chunks, bos, eos,
                                   c, scale_upd, i_vp, DK, BT, BV, STAGES, REVERSE, SPLIT)),
                # no q: k and its buffer stand in for it, unread (LOAD_Q off)
                (_producer, (k_desc, k_desc, v_desc, k_s, k_s, v_s, ready, empty, n_chunks, bos, i_vp, BT, BV, STAGES,
                             REVERSE, False)),
            ],
            worker_num_warps=[4, 1],
            worker_num_regs=[232, 40],
        )
else:
    lightning_walk_ws_kernel = lightning_state_ws_kernel = None
