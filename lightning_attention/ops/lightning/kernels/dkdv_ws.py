"""The fused dk/dv reverse walk with two consumer warpgroups per program (Gluon, sm_90): the K = V = 128 form of
``kernels/dkdv_walk.py``.

The backward's dk and dv come from one reverse-time state G [K, V] (the formulas: ``kernels/dkdv_walk.py``; the
derivation: docs/kernels.md, "Backward as three more walks"). At K = V = 128 a whole G does not fit one warpgroup's
registers beside its tiles, so the Triton fused walk loses there, and without this kernel the backward runs two
reverse walks, each reading three tensors and rebuilding G (8 tensor passes). Here one program owns one (segment,
head) and splits G by value columns:

- a one-warp producer streams each chunk's q, k and the two halves of v and do through a ring of ``STAGES`` shared
  buffers (TMA), as in ``kernels/walk_ws.py``;
- consumer c walks G_c = G[:, c·BV:(c+1)·BV] in registers. The columns of dv in its half need only G_c::

      dv_c = scale·[(K Qᵀ) ⊙ D] dO_c + Λ K G_c

  dk sums over every value column, so each consumer computes the part of its value half, and the two parts meet in
  shared memory::

      dk = Σ_c scale·[(V_c dO_cᵀ) ⊙ D] Q + Λ V_c G_cᵀ

  consumer c computes its part of the other consumer's K/2 key columns first and hands it over through a float32
  tile, then its part of its own key columns, adds the other's and stores them (each stores half of dk);
- G_c = λ^(L-1+d0) G_c + Qᵀ (scale·Λ' dO_c), the walk's update with the decay on the do rows.

Bytes: q, k, v, do read once and dk, dv written once: 6 tensor passes instead of the two walks' 8. Roundings are the
two walks' (scores, G and the weighted do to bf16 as mma operands; accumulators fp32), but that dk's scores are
rounded per value half. The products of a chunk run one after another, two at a time at most: with more in flight
the consumers spill (their registers hold G_c, 64 per thread, and the chunk's decay matrix, 32). Shared memory at
K = V = 128 with two stages: 229,768 B as built for sm_90 (the stages 128 KB, G's operands 32 KB, the weighted do
16 KB, one output tile per consumer 16 KB, the exchange 32 KB), of the 227 KB a block may take; dv and dk leave
through the same output tile one after the other.

Only the shapes the plan gives it (``plan.use_dkdv_ws``): bf16 with the bf16 inter product, K = V = 128, fixed-length
batches, whole sequences or host-planned segments (``SEG_IN``), tensor descriptors, sm_90. Gluon has no interpreter:
CI builds it for sm_90 (tests/ops/test_aot.py) and the GPU suite checks it against float64 and the two walks
(docs/kernels.md, "The fused dk/dv walk").
"""

from lightning_attention.ops.lightning.kernels import walk_ws

gluon = walk_ws.gluon
if gluon is not None:
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    from lightning_attention.ops.lightning.kernels.walk_ws import (
        _chunk_start,
        _incoming_state,
        _initial_state,
        _intra_decay,
        _program,
        _rows_desc,
        _slot,
        _stages,
        _state_ptrs,
        _wait_chunk,
    )

# the head dims it is built for (K = V), two value halves of DKDV_WS_BV columns (one per consumer), two stages
DKDV_WS_DIMS = (128,)
DKDV_WS_BV = 64
DKDV_WS_STAGES = 2

if gluon is not None:
    # a barrier among the threads of one warp-specialised partition (``thread_barrier`` in Triton 3.6)
    _sync_warpgroup = gl.barrier if hasattr(gl, "barrier") else gl.thread_barrier

    @gluon.jit
    def _dkdv_producer(q_desc, k_desc, v_desc, do_desc, q_s, k_s, v_s, do_s, ready, empty, n_chunks, bos,
                       BT: gl.constexpr, BV: gl.constexpr, STAGES: gl.constexpr):  # fmt: skip
        """Fills stage i % STAGES with chunk i's q, k and both halves of v and do (chunks from the segment's last to
        its first), once both consumers have released it."""
        nbytes: gl.constexpr = (
            q_desc.block_type.nbytes + k_desc.block_type.nbytes + 2 * v_desc.block_type.nbytes
            + 2 * do_desc.block_type.nbytes
        )  # fmt: skip
        for i in range(n_chunks):
            s = i % STAGES
            mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)  # a fresh barrier passes the first round
            lo = _chunk_start(i, n_chunks, bos, BT, True)
            mbarrier.expect(ready.index(s), nbytes)
            tma.async_copy_global_to_shared(q_desc, [lo, 0], ready.index(s), q_s.index(s))
            tma.async_copy_global_to_shared(k_desc, [lo, 0], ready.index(s), k_s.index(s))
            for h in gl.static_range(2):
                tma.async_copy_global_to_shared(v_desc, [lo, h * BV], ready.index(s), v_s.index(2 * s + h))
                tma.async_copy_global_to_shared(do_desc, [lo, h * BV], ready.index(s), do_s.index(2 * s + h))

    @gluon.jit
    def _dk_part(vc, g_s, q, ds, inter, HALF: gl.constexpr, KH: gl.constexpr, BT: gl.constexpr,
                 mma: gl.constexpr):  # fmt: skip
        """This consumer's part of dk's key columns HALF·KH … [BT, KH]: Λ V_c G_c[those rows]ᵀ + (ds ⊙ D) Q[:, those
        columns], the two products in flight together; ``inter`` [BT] is Λ's diagonal."""
        a = warpgroup_mma(vc, g_s.slice(HALF * KH, KH, dim=0).permute((1, 0)), gl.zeros([BT, KH], gl.float32, mma),
                          use_acc=False, is_async=True)  # fmt: skip
        b = warpgroup_mma(ds, q.slice(HALF * KH, KH, dim=1), gl.zeros([BT, KH], gl.float32, mma), use_acc=False,
                          is_async=True)  # fmt: skip
        a, b = warpgroup_mma_wait(num_outstanding=0, deps=(a, b))
        return a * inter[:, None] + b

    @gluon.jit
    def _dkdv_consumer(CID: gl.constexpr, dk_desc, dv_desc, q_s, k_s, v_s, do_s, ready, empty, g_s, dod_s, out_s,
                       x_s, x_full, x_empty, g_in, sin_k, sin_v, dh0, sh0_k, sh0_v, n_chunks, bos, eos, last, c, scale,
                       DK: gl.constexpr, BT: gl.constexpr, BV: gl.constexpr, STAGES: gl.constexpr,
                       HAS_IN: gl.constexpr, STORE_HT: gl.constexpr):  # fmt: skip
        """Walks G_c (value columns CID·BV …) from the incoming G at ``g_in`` (zeros without HAS_IN), storing each
        chunk's dv_c and key columns CID·DK/2 … of dk, and with STORE_HT dh0 = λ^d0 G_0 at ``dh0``."""
        # a consumer's half of the key columns is as wide as its value half, so dk's tiles take dv's layouts
        KH: gl.constexpr = DK // 2
        gl.static_assert(KH == BV)
        OTHER: gl.constexpr = 1 - CID
        mma_a: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BT, 16])
        mma_v: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BV, 16])
        a_op_v: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_v, k_width=2)
        v_blk: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [4, 1], [1, 0])
        col0 = CID * BV

        # scale · λ^(j - i) for later-or-same tokens j >= i of a chunk, 0 above them (the reverse walk's mask): the dv
        # scores K Qᵀ and the dk scores V_c dO_cᵀ take the same factors
        decay = _intra_decay(c, scale, BT, True, mma_a)
        to = gl.arange(0, BT, layout=gl.SliceLayout(1, mma_v))
        tv = gl.arange(0, BT, layout=gl.SliceLayout(1, v_blk))

        G = _initial_state(g_in, sin_k, sin_v, col0, DK, BV, HAS_IN, mma_v)
        d0 = gl.where(last, 0, 1)  # 0 while the walk starts from dht (not decayed before the last token)
        g_s.store(G.to(gl.bfloat16))
        fence_async_shared()
        for i in range(n_chunks):
            s, lo, L = _wait_chunk(ready, i, n_chunks, bos, eos, BT, STAGES, True)
            q = q_s.index(s)
            k = k_s.index(s)
            vc = v_s.index(2 * s + CID)
            doc = do_s.index(2 * s + CID)
            # dv_c = Λ K G_c + (P ⊙ D) dO_c with P = K Qᵀ: the scores and the inter product issued together
            p_acc = warpgroup_mma(k, q.permute((1, 0)), gl.zeros([BT, BT], gl.float32, mma_a), use_acc=False,
                                  is_async=True)  # fmt: skip
            dv_acc = warpgroup_mma(k, g_s, gl.zeros([BT, BV], gl.float32, mma_v), use_acc=False, is_async=True)
            p_acc = warpgroup_mma_wait(num_outstanding=1, deps=(p_acc,))
            # the mask selects, never multiplies (0·NaN = NaN: a non-finite score must not reach another token)
            p = gl.convert_layout(gl.where(decay != 0.0, p_acc * decay, 0.0).to(gl.bfloat16), a_op_v)
            dv_acc = warpgroup_mma_wait(num_outstanding=0, deps=(dv_acc,))
            # inter: λ^(r + d0) on the rows, r = L - 1 - t the distance from the chunk's last token
            inter = gl.where(to < L, gl.exp2(-c * (gl.maximum(L - 1 - to, 0) + d0).to(gl.float32)), 0.0)
            dv_acc = warpgroup_mma(p, doc, dv_acc * inter[:, None], is_async=True)
            dv_acc = warpgroup_mma_wait(num_outstanding=0, deps=(dv_acc,))
            tma.store_wait(pendings=0)  # the previous chunk's dk has left out_s
            out_s.store(dv_acc.to(gl.bfloat16))
            fence_async_shared()
            tma.async_copy_shared_to_global(dv_desc, [lo, col0], out_s)
            # dk's scores from this value half, V_c dO_cᵀ
            ds_acc = warpgroup_mma(vc, doc.permute((1, 0)), gl.zeros([BT, BT], gl.float32, mma_a), use_acc=False,
                                   is_async=True)  # fmt: skip
            ds_acc = warpgroup_mma_wait(num_outstanding=0, deps=(ds_acc,))
            ds = gl.convert_layout(gl.where(decay != 0.0, ds_acc * decay, 0.0).to(gl.bfloat16), a_op_v)
            # dk's partial for the other consumer's key columns, Λ V_c G_c[cols]ᵀ + (ds ⊙ D) Q[:, cols], handed over
            x = _dk_part(vc, g_s, q, ds, inter, OTHER, KH, BT, mma_v)
            mbarrier.wait(x_empty.index(OTHER), (i & 1) ^ 1)  # the other consumer has read the previous chunk's
            x_s.index(OTHER).store(x)
            _sync_warpgroup()  # every thread's part is in shared memory before the one arrival
            mbarrier.arrive(x_full.index(OTHER), count=1)
            # this consumer's key columns
            y = _dk_part(vc, g_s, q, ds, inter, CID, KH, BT, mma_v)
            mbarrier.wait(x_full.index(CID), i & 1)
            y = y + x_s.index(CID).load(mma_v)
            _sync_warpgroup()  # every thread has read the exchange tile before it is released
            mbarrier.arrive(x_empty.index(CID), count=1)
            tma.store_wait(pendings=0)  # dv has left out_s
            out_s.store(y.to(gl.bfloat16))
            fence_async_shared()
            tma.async_copy_shared_to_global(dk_desc, [lo, CID * KH], out_s)
            # G_c = λ^(L-1+d0) G_c + Qᵀ (scale · λ^(L-1-r) dO_c): the factors on the do tile's rows (r = L-1-t)
            g_dec = gl.where(tv < L, gl.exp2(-c * tv.to(gl.float32)), 0.0) * scale
            dod_s.store((doc.load(v_blk).to(gl.float32) * g_dec[:, None]).to(gl.bfloat16))
            fence_async_shared()
            G = warpgroup_mma(q.permute((1, 0)), dod_s, G * gl.exp2(-c * (L - 1 + d0).to(gl.float32)), is_async=True)
            G = warpgroup_mma_wait(num_outstanding=0, deps=(G,))
            mbarrier.arrive(empty.index(s), count=1)  # this consumer is done with the stage's tiles
            g_s.store(G.to(gl.bfloat16))
            fence_async_shared()
            d0 = d0 * 0 + 1
        tma.store_wait(pendings=0)
        if STORE_HT:
            G = G * gl.exp2(-c * d0.to(gl.float32))  # dh0 = λ G_0 (= dht when the sequence is empty)
            gl.store(_state_ptrs(dh0, sh0_k, sh0_v, col0, DK, BV, mma_v), G)

    @gluon.jit(do_not_specialize=["T", "NS", "SEG"])
    def lightning_dkdv_ws_kernel(
        q, k, v, do, dk, dv,  # [B, T, H, DK] / [B, T, H, DV] bf16, last dim contiguous, TMA-aligned
        slope,  # [H] float32 (unused without HAS_DECAY)
        dht,  # [N, H, DK, DV] gradient of the final state (USE_H0)
        dh0,  # [N, H, DK, DV] gradient of the initial state (STORE_HT)
        states,  # [NSEG, H, DK, DV] incoming G of each segment (SEG_IN)
        sq, sk, sv, sdo, sdk, sdv,  # strides (batch, token, head) of q, k, v, do, dk, dv
        sht, sh0, sst,  # strides (slot, head, row, column) of dht, dh0, states
        scale,
        T, H, NS, SEG,
        DK: gl.constexpr, DV: gl.constexpr,
        BT: gl.constexpr, BV: gl.constexpr, STAGES: gl.constexpr,
        HAS_DECAY: gl.constexpr,
        USE_H0: gl.constexpr,
        STORE_HT: gl.constexpr,
        SEG_IN: gl.constexpr,
    ):  # fmt: skip
        """One program per (head, segment), heads fastest; a fixed-length batch cut into NS segments of SEG tokens per
        sequence (NS = 1: whole sequences). Launched with num_warps = 4 (the first consumer); the second consumer
        and the producer are the warp-specialised workers."""
        _, i_h, i_s, i_n, j, bos, eos, c = _program(slope, T, H, NS, SEG, 1, HAS_DECAY)
        last = j == NS - 1
        n64 = i_n.to(gl.int64)
        h64 = i_h.to(gl.int64)

        v_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, BV], gl.bfloat16)
        g_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([DK, BV], gl.bfloat16)
        # the exchange tile is written and read in the accumulator's layout, never by an mma: rows swizzled in 32-byte
        # units so that the four rows a half-warp stores or loads fall on distinct banks (docs/kernels.md, "Two
        # warpgroups at K = 128")
        x_layout: gl.constexpr = gl.SwizzledSharedLayout(8, 1, 4, [1, 0])
        q_desc = _rows_desc(q, sq, n64, h64, eos, DK, BT, DK)
        k_desc = _rows_desc(k, sk, n64, h64, eos, DK, BT, DK)
        v_desc = _rows_desc(v, sv, n64, h64, eos, DV, BT, BV)
        do_desc = _rows_desc(do, sdo, n64, h64, eos, DV, BT, BV)
        dk_desc = _rows_desc(dk, sdk, n64, h64, eos, DK, BT, DK // 2)
        dv_desc = _rows_desc(dv, sdv, n64, h64, eos, DV, BT, BV)
        g_in, sin_k, sin_v = _incoming_state(states, sst, i_s, dht, sht, n64, h64, SEG_IN)
        g_out = _slot(dh0, sh0, n64, h64)

        q_s, k_s, v_s, ready, empty = _stages(BT, DK, BV, STAGES, True)
        do_s = gl.allocate_shared_memory(gl.bfloat16, [2 * STAGES, BT, BV], v_layout)  # the stages' do tiles
        g_s0 = gl.allocate_shared_memory(gl.bfloat16, [DK, BV], g_layout)
        g_s1 = gl.allocate_shared_memory(gl.bfloat16, [DK, BV], g_layout)
        dod_s0 = gl.allocate_shared_memory(gl.bfloat16, [BT, BV], v_layout)
        dod_s1 = gl.allocate_shared_memory(gl.bfloat16, [BT, BV], v_layout)
        out_s0 = gl.allocate_shared_memory(gl.bfloat16, [BT, BV], v_layout)
        out_s1 = gl.allocate_shared_memory(gl.bfloat16, [BT, BV], v_layout)
        # the exchange of dk's partials: x_s[c] receives the other consumer's partial of consumer c's key columns
        x_s = gl.allocate_shared_memory(gl.float32, [2, BT, DK // 2], x_layout)
        x_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        x_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for h in gl.static_range(2):
            mbarrier.init(x_full.index(h), count=1)
            mbarrier.init(x_empty.index(h), count=1)
        n_chunks = gl.cdiv(eos - bos, BT)
        HAS_IN: gl.constexpr = SEG_IN or USE_H0
        gl.warp_specialize(
            [
                (_dkdv_consumer, (0, dk_desc, dv_desc, q_s, k_s, v_s, do_s, ready, empty, g_s0, dod_s0, out_s0, x_s,
                                  x_full, x_empty, g_in, sin_k, sin_v, g_out, sh0[2], sh0[3], n_chunks, bos, eos, last,
                                  c, scale, DK, BT, BV, STAGES, HAS_IN, STORE_HT)),
                (_dkdv_consumer, (1, dk_desc, dv_desc, q_s, k_s, v_s, do_s, ready, empty, g_s1, dod_s1, out_s1, x_s,
                                  x_full, x_empty, g_in, sin_k, sin_v, g_out, sh0[2], sh0[3], n_chunks, bos, eos, last,
                                  c, scale, DK, BT, BV, STAGES, HAS_IN, STORE_HT)),
                (_dkdv_producer, (q_desc, k_desc, v_desc, do_desc, q_s, k_s, v_s, do_s, ready, empty, n_chunks, bos,
                                  BT, BV, STAGES)),
            ],
            worker_num_warps=[4, 1],
            worker_num_regs=[232, 40],
        )
else:
    lightning_dkdv_ws_kernel = None
