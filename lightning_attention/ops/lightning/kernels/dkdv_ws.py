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

  dk sums over every value column::

      dk = scale·[(V dOᵀ) ⊙ D] Q + Λ Σ_c V_c G_cᵀ

  so consumer c computes dk's key columns c·K/2 … whole: the scores V dOᵀ over both value halves (both are in the
  stage), and V_c G_cᵀ from both consumers' G operands. Each consumer keeps the bf16 operand copy of its G_c in
  shared memory for its own products anyway; the other reads it there too, so the copies are double-buffered (the
  one of chunk i in buffer i % 2) with a "full" barrier per copy that its writer arrives on and an "empty" one that
  the other consumer arrives on once its products have read it;
- G_c = λ^(L-1+d0) G_c + Qᵀ (scale·Λ' dO_c), the walk's update with the decay on the do rows.

Bytes: q, k, v, do read once and dk, dv written once: 6 tensor passes instead of the two walks' 8. Roundings are the
two walks' (scores, G and the weighted do to bf16 as mma operands; accumulators fp32). The products of a chunk run in
small groups, each waited for before the next: the consumers' registers hold G_c (64 per thread) and the chunk's decay
matrix (32), and more products in flight made them spill; this order builds without spills (sm_90, Triton 3.8). At
K = V = 128 with two stages: 229,784 B as built for sm_90 (the stages 128 KB, G's two operand copies per consumer
64 KB, the weighted do 16 KB, one output tile per consumer 16 KB), of the 227 KB a block may take; dv and dk leave
through the same output tile one after the other. With each consumer's key columns computed whole, no float32 tile
adds up the two consumers' parts of dk (why: docs/kernels.md, "dk whole per consumer").

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
    def _publish_g(G, g_s, g_full, g_empty, CID: gl.constexpr, w):
        """Stores consumer CID's G_c as its w-th bf16 operand copy (w = the chunk that reads it) in its buffer w % 2,
        once the other consumer has read copy w - 2 from there, and tells the other consumer it is there."""
        slot = 2 * CID + w % 2
        # a fresh barrier counts as read for the phase before its first (parity 1): copies 0 and 1 pass
        mbarrier.wait(g_empty.index(slot), ((w // 2) & 1) ^ 1)
        g_s.index(slot).store(G.to(gl.bfloat16))
        fence_async_shared()  # both consumers' products read it through the async proxy
        _sync_warpgroup()  # every thread's part is in shared memory before the one arrival
        mbarrier.arrive(g_full.index(slot), count=1)

    @gluon.jit
    def _dkdv_consumer(CID: gl.constexpr, dk_desc, dv_desc, q_s, k_s, v_s, do_s, ready, empty, g_s, g_full, g_empty,
                       dod_s, out_s, g_in, sin_k, sin_v, dh0, sh0_k, sh0_v, n_chunks, bos, eos, last, c, scale,
                       DK: gl.constexpr, BT: gl.constexpr, BV: gl.constexpr, STAGES: gl.constexpr,
                       HAS_IN: gl.constexpr, STORE_HT: gl.constexpr):  # fmt: skip
        """Walks G_c (value columns CID·BV …) from the incoming G at ``g_in`` (zeros without HAS_IN), storing each
        chunk's dv_c and key columns CID·DK/2 … of dk, and with STORE_HT dh0 = λ^d0 G_0 at ``dh0``. G_c's bf16
        operand for chunk i is in ``g_s`` slot 2·CID + i % 2, where the other consumer reads it too."""
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
        # scores K Qᵀ and the dk scores V dOᵀ take the same factors
        decay = _intra_decay(c, scale, BT, True, mma_a)
        to = gl.arange(0, BT, layout=gl.SliceLayout(1, mma_v))
        tv = gl.arange(0, BT, layout=gl.SliceLayout(1, v_blk))

        G = _initial_state(g_in, sin_k, sin_v, col0, DK, BV, HAS_IN, mma_v)
        d0 = gl.where(last, 0, 1)  # 0 while the walk starts from dht (not decayed before the last token)
        _publish_g(G, g_s, g_full, g_empty, CID, 0)
        for i in range(n_chunks):
            s, lo, L = _wait_chunk(ready, i, n_chunks, bos, eos, BT, STAGES, True)
            q = q_s.index(s)
            k = k_s.index(s)
            doc = do_s.index(2 * s + CID)
            g_own = g_s.index(2 * CID + i % 2)
            # dv_c = Λ K G_c + (P ⊙ D) dO_c with P = K Qᵀ: the scores and the inter product issued together
            p_acc = warpgroup_mma(k, q.permute((1, 0)), gl.zeros([BT, BT], gl.float32, mma_a), use_acc=False,
                                  is_async=True)  # fmt: skip
            dv_acc = warpgroup_mma(k, g_own, gl.zeros([BT, BV], gl.float32, mma_v), use_acc=False, is_async=True)
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
            # dk's scores over all value columns, V dOᵀ = V_0 dO_0ᵀ + V_1 dO_1ᵀ (both halves are in the stage)
            ds_acc = warpgroup_mma(v_s.index(2 * s), do_s.index(2 * s).permute((1, 0)),
                                   gl.zeros([BT, BT], gl.float32, mma_a), use_acc=False, is_async=True)  # fmt: skip
            ds_acc = warpgroup_mma(v_s.index(2 * s + 1), do_s.index(2 * s + 1).permute((1, 0)), ds_acc,
                                   is_async=True)  # fmt: skip
            ds_acc = warpgroup_mma_wait(num_outstanding=0, deps=(ds_acc,))
            ds = gl.convert_layout(gl.where(decay != 0.0, ds_acc * decay, 0.0).to(gl.bfloat16), a_op_v)
            # this consumer's key columns of dk: Λ (V_0 G_0ᵀ + V_1 G_1ᵀ)[:, cols] + (ds ⊙ D) Q[:, cols], G_1-c's
            # operand read from the other consumer's buffer once it is there
            mbarrier.wait(g_full.index(2 * OTHER + i % 2), (i // 2) & 1)
            vg = gl.zeros([BT, KH], gl.float32, mma_v)
            for h in gl.static_range(2):
                g_h = g_s.index(2 * h + i % 2).slice(CID * KH, KH, dim=0).permute((1, 0))
                vg = warpgroup_mma(v_s.index(2 * s + h), g_h, vg, use_acc=h > 0, is_async=True)
            dsq = warpgroup_mma(ds, q.slice(CID * KH, KH, dim=1), gl.zeros([BT, KH], gl.float32, mma_v),
                                use_acc=False, is_async=True)  # fmt: skip
            vg, dsq = warpgroup_mma_wait(num_outstanding=0, deps=(vg, dsq))
            mbarrier.arrive(g_empty.index(2 * OTHER + i % 2), count=1)  # done with the other's G operand
            tma.store_wait(pendings=0)  # dv has left out_s
            out_s.store((vg * inter[:, None] + dsq).to(gl.bfloat16))
            fence_async_shared()
            tma.async_copy_shared_to_global(dk_desc, [lo, CID * KH], out_s)
            # G_c = λ^(L-1+d0) G_c + Qᵀ (scale · λ^(L-1-r) dO_c): the factors on the do tile's rows (r = L-1-t)
            g_dec = gl.where(tv < L, gl.exp2(-c * tv.to(gl.float32)), 0.0) * scale
            dod_s.store((doc.load(v_blk).to(gl.float32) * g_dec[:, None]).to(gl.bfloat16))
            fence_async_shared()
            G = warpgroup_mma(q.permute((1, 0)), dod_s, G * gl.exp2(-c * (L - 1 + d0).to(gl.float32)), is_async=True)
            G = warpgroup_mma_wait(num_outstanding=0, deps=(G,))
            mbarrier.arrive(empty.index(s), count=1)  # this consumer is done with the stage's tiles
            _publish_g(G, g_s, g_full, g_empty, CID, i + 1)
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
        # G's bf16 operands: consumer c's copy for chunk i in slot 2·c + i % 2, read by both consumers; a copy's
        # "full" barrier is its writer's, its "empty" one the other consumer's (the writer's own reads come first)
        g_s = gl.allocate_shared_memory(gl.bfloat16, [4, DK, BV], g_layout)
        g_full = gl.allocate_shared_memory(gl.int64, [4, 1], mbarrier.MBarrierLayout())
        g_empty = gl.allocate_shared_memory(gl.int64, [4, 1], mbarrier.MBarrierLayout())
        for slot in gl.static_range(4):
            mbarrier.init(g_full.index(slot), count=1)
            mbarrier.init(g_empty.index(slot), count=1)
        dod_s0 = gl.allocate_shared_memory(gl.bfloat16, [BT, BV], v_layout)
        dod_s1 = gl.allocate_shared_memory(gl.bfloat16, [BT, BV], v_layout)
        out_s0 = gl.allocate_shared_memory(gl.bfloat16, [BT, BV], v_layout)
        out_s1 = gl.allocate_shared_memory(gl.bfloat16, [BT, BV], v_layout)
        n_chunks = gl.cdiv(eos - bos, BT)
        HAS_IN: gl.constexpr = SEG_IN or USE_H0
        gl.warp_specialize(
            [
                (_dkdv_consumer, (0, dk_desc, dv_desc, q_s, k_s, v_s, do_s, ready, empty, g_s, g_full, g_empty,
                                  dod_s0, out_s0, g_in, sin_k, sin_v, g_out, sh0[2], sh0[3], n_chunks, bos, eos, last,
                                  c, scale, DK, BT, BV, STAGES, HAS_IN, STORE_HT)),
                (_dkdv_consumer, (1, dk_desc, dv_desc, q_s, k_s, v_s, do_s, ready, empty, g_s, g_full, g_empty,
                                  dod_s1, out_s1, g_in, sin_k, sin_v, g_out, sh0[2], sh0[3], n_chunks, bos, eos, last,
                                  c, scale, DK, BT, BV, STAGES, HAS_IN, STORE_HT)),
                (_dkdv_producer, (q_desc, k_desc, v_desc, do_desc, q_s, k_s, v_s, do_s, ready, empty, n_chunks, bos,
                                  BT, BV, STAGES)),
            ],
            worker_num_warps=[4, 1],
            worker_num_regs=[232, 40],
        )
else:
    lightning_dkdv_ws_kernel = None
