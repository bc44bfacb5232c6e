"""Probe (not part of the package): the K = V = 256 forward walk written in Gluon with two consumer warpgroups.

`benchmarks/NOTES-kernels.md` (session 9) found the Triton walk at K = 256 bound by one dependency chain per SM: one
4-warp block fits the shared memory, and its warpgroup waits on each of its own products in turn. This kernel gives
the SM two chains. One program owns one (batch row, head) and two neighbouring 32-wide value tiles; a one-warp
producer streams each chunk's q and k tiles (shared by both) and the two v tiles through a ring of ``STAGES`` shared
buffers; each consumer warpgroup walks its own [K, 32] state with the Triton walk's arithmetic, issuing q·kᵀ and q·S
together and (A ⊙ D)·V with the state update together, so its products overlap each other and the other
consumer's. Forward only, fixed-length batches, decay, no initial or final state: enough to time the idea against
the Triton walk and check it against float64.

    python benchmarks/gluon_walk_probe.py --check --shapes 16x4096,64x1024,2x32768
    TRITON_INTERPRET=0 python benchmarks/gluon_walk_probe.py --compile-only    # an sm_90 build on a machine without GPU
"""

import argparse
import json
import sys

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

RCP_LN2 = gl.constexpr(1.4426950408889634)  # log2(e)


@gluon.jit
def _producer(q_desc, k_desc, v_desc, q_s, k_s, v_s, ready, empty, n_chunks, i_vp,
              BT: gl.constexpr, BV: gl.constexpr, STAGES: gl.constexpr):  # fmt: skip
    """Fills stage i % STAGES with chunk i's q, k and the two v tiles once both consumers have released it."""
    nbytes: gl.constexpr = q_desc.block_type.nbytes + k_desc.block_type.nbytes + 2 * v_desc.block_type.nbytes
    for i in range(n_chunks):
        s = i % STAGES
        # a fresh barrier counts as released for the phase before its first (parity 1): the first round passes
        mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(s), nbytes)
        lo = i * BT
        tma.async_copy_global_to_shared(q_desc, [lo, 0], ready.index(s), q_s.index(s))
        tma.async_copy_global_to_shared(k_desc, [lo, 0], ready.index(s), k_s.index(s))
        tma.async_copy_global_to_shared(v_desc, [lo, (2 * i_vp) * BV], ready.index(s), v_s.index(2 * s))
        tma.async_copy_global_to_shared(v_desc, [lo, (2 * i_vp + 1) * BV], ready.index(s), v_s.index(2 * s + 1))


@gluon.jit
def _consumer(CID: gl.constexpr, o_desc, q_s, k_s, v_s, ready, empty, s_s, vd_s, o_s, n_chunks, T, c, scale, i_vp,
              DK: gl.constexpr, BT: gl.constexpr, BV: gl.constexpr, STAGES: gl.constexpr):  # fmt: skip
    """Walks value tile 2·i_vp + CID: o = scale·[(q kᵀ) ⊙ D] v + scale·λ^(t+1) q S, S = λ^L S + kᵀ (λ^(L-1-t) v)."""
    mma_a: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BT, 16])
    mma_o: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BV, 16])
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_o, k_width=2)
    v_blk: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [4, 1], [1, 0])
    i_v = 2 * i_vp + CID

    # D_ij = scale·λ^(i-j) for i >= j, else 0 (the same for every whole chunk; rows past a ragged end read zeros)
    ti = gl.arange(0, BT, layout=gl.SliceLayout(1, mma_a))
    tj = gl.arange(0, BT, layout=gl.SliceLayout(0, mma_a))
    dist = ti[:, None] - tj[None, :]
    decay = gl.where(dist >= 0, gl.exp2(-c * gl.maximum(dist, 0).to(gl.float32)) * scale, 0.0)
    to = gl.arange(0, BT, layout=gl.SliceLayout(1, mma_o))
    tv = gl.arange(0, BT, layout=gl.SliceLayout(1, v_blk))

    S = gl.zeros([DK, BV], gl.float32, mma_o)
    s_s.store(S.to(gl.bfloat16))
    fence_async_shared()
    for i in range(n_chunks):
        s = i % STAGES
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        lo = i * BT
        L = gl.minimum(lo + BT, T) - lo
        q = q_s.index(s)
        kt = k_s.index(s).permute((1, 0))  # [DK, BT]
        v = v_s.index(2 * s + CID)
        # q kᵀ and q S issued together; the scores are ready first
        a_acc = warpgroup_mma(q, kt, gl.zeros([BT, BT], gl.float32, mma_a), use_acc=False, is_async=True)
        o_acc = warpgroup_mma(q, s_s, gl.zeros([BT, BV], gl.float32, mma_o), use_acc=False, is_async=True)
        a_acc = warpgroup_mma_wait(num_outstanding=1, deps=(a_acc,))
        a = gl.convert_layout((a_acc * decay).to(gl.bfloat16), a_op)
        o_acc = warpgroup_mma_wait(num_outstanding=0, deps=(o_acc,))
        inter = gl.where(to < L, gl.exp2(-c * (to + 1).to(gl.float32)), 0.0) * scale
        o_acc = warpgroup_mma(a, v, o_acc * inter[:, None], is_async=True)
        # state update: S = λ^L S + kᵀ (λ^(L-1-t) v), the row factor on the v tile (rows past L are zeros)
        k_dec = gl.where(tv < L, gl.exp2(-c * gl.maximum(L - 1 - tv, 0).to(gl.float32)), 0.0)
        vd_s.store((v.load(v_blk).to(gl.float32) * k_dec[:, None]).to(gl.bfloat16))
        fence_async_shared()
        S = warpgroup_mma(kt, vd_s, S * gl.exp2(-c * L.to(gl.float32)), is_async=True)
        o_acc, S = warpgroup_mma_wait(num_outstanding=0, deps=(o_acc, S))
        mbarrier.arrive(empty.index(s), count=1)  # this consumer is done with the stage's tiles
        tma.store_wait(pendings=0)  # the previous chunk's o has left o_s
        o_s.store(o_acc.to(gl.bfloat16))
        s_s.store(S.to(gl.bfloat16))
        fence_async_shared()
        tma.async_copy_shared_to_global(o_desc, [lo, i_v * BV], o_s)
    tma.store_wait(pendings=0)


@gluon.jit
def walk_fwd_ws_kernel(q, k, v, o, slope, sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sv_b, sv_t, sv_h, so_b, so_t, so_h,
                       scale, T, H, DK: gl.constexpr, DV: gl.constexpr, BT: gl.constexpr, BV: gl.constexpr,
                       STAGES: gl.constexpr):  # fmt: skip
    """One program per (batch row, head, pair of value tiles); q, k, v, o [B, T, H, D] bf16, last dim contiguous."""
    NVP: gl.constexpr = DV // (2 * BV)
    pid = gl.program_id(0)
    i_vp = pid % NVP
    i_h = (pid // NVP) % H
    i_b = pid // (NVP * H)
    c = gl.load(slope + i_h) * RCP_LN2
    b64 = i_b.to(gl.int64)
    h64 = i_h.to(gl.int64)
    qk_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, DK], gl.bfloat16)
    v_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, BV], gl.bfloat16)
    s_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([DK, BV], gl.bfloat16)
    q_desc = tma.make_tensor_descriptor(q + b64 * sq_b + h64 * sq_h, shape=[T, DK], strides=[sq_t, 1],
                                        block_shape=[BT, DK], layout=qk_layout)  # fmt: skip
    k_desc = tma.make_tensor_descriptor(k + b64 * sk_b + h64 * sk_h, shape=[T, DK], strides=[sk_t, 1],
                                        block_shape=[BT, DK], layout=qk_layout)  # fmt: skip
    v_desc = tma.make_tensor_descriptor(v + b64 * sv_b + h64 * sv_h, shape=[T, DV], strides=[sv_t, 1],
                                        block_shape=[BT, BV], layout=v_layout)  # fmt: skip
    o_desc = tma.make_tensor_descriptor(o + b64 * so_b + h64 * so_h, shape=[T, DV], strides=[so_t, 1],
                                        block_shape=[BT, BV], layout=v_layout)  # fmt: skip

    q_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BT, DK], qk_layout)
    k_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BT, DK], qk_layout)
    v_s = gl.allocate_shared_memory(gl.bfloat16, [2 * STAGES, BT, BV], v_layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)
    s_s0 = gl.allocate_shared_memory(gl.bfloat16, [DK, BV], s_layout)
    s_s1 = gl.allocate_shared_memory(gl.bfloat16, [DK, BV], s_layout)
    vd_s0 = gl.allocate_shared_memory(gl.bfloat16, [BT, BV], v_layout)
    vd_s1 = gl.allocate_shared_memory(gl.bfloat16, [BT, BV], v_layout)
    o_s0 = gl.allocate_shared_memory(gl.bfloat16, [BT, BV], v_layout)
    o_s1 = gl.allocate_shared_memory(gl.bfloat16, [BT, BV], v_layout)
    n_chunks = gl.cdiv(T, BT)
    gl.warp_specialize(
        [
            (_consumer, (0, o_desc, q_s, k_s, v_s, ready, empty, s_s0, vd_s0, o_s0, n_chunks, T, c, scale, i_vp,
                         DK, BT, BV, STAGES)),  # fmt: skip
            (_consumer, (1, o_desc, q_s, k_s, v_s, ready, empty, s_s1, vd_s1, o_s1, n_chunks, T, c, scale, i_vp,
                         DK, BT, BV, STAGES)),  # fmt: skip
            (_producer, (q_desc, k_desc, v_desc, q_s, k_s, v_s, ready, empty, n_chunks, i_vp, BT, BV, STAGES)),
        ],
        worker_num_warps=[4, 1],
        worker_num_regs=[232, 40],
    )


def walk_fwd_ws(q, k, v, slope, scale: float = 1.0, BT: int = 64, BV: int = 32, STAGES: int = 2):
    """o [B, T, H, V] of the forward (no initial or final state) through the Gluon kernel."""
    B, T, H, DK = q.shape
    DV = v.shape[-1]
    assert q.dtype == torch.bfloat16 and DV % (2 * BV) == 0
    o = torch.empty_like(v)
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=q.device))
    grid = (B * H * (DV // (2 * BV)),)
    walk_fwd_ws_kernel[grid](
        q, k, v, o, slope, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3], float(scale), T, H,
        DK=DK, DV=DV, BT=BT, BV=BV, STAGES=STAGES, num_warps=4,
    )  # fmt: skip
    return o


def compile_only() -> None:
    """An sm_90 build without a GPU (triton's own ptxas): shared memory, registers and the wgmma waits per chunk."""
    import re

    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    fn = walk_fwd_ws_kernel
    sig = {n: ("*bf16" if n in "qkvo" else "*fp32" if n == "slope" else "fp32" if n == "scale" else "i32")
           for n in fn.arg_names}  # fmt: skip
    consts = dict(DK=256, DV=256, BT=64, BV=32, STAGES=2)
    for n in consts:
        sig[n] = "constexpr"
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names) if n in "qkvo" or n == "slope"}
    src = GluonASTSource(fn, sig, consts, attrs)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    ptx = kernel.asm["ptx"]
    print(json.dumps({"shared": kernel.metadata.shared, "num_warps": kernel.metadata.num_warps,
                      "waits": re.findall(r"wgmma\.wait_group\.sync\.aligned\s+\d+", ptx)[:12],
                      "setmaxnreg": sorted(set(re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+\d+", ptx)))}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="16x4096,64x1024,2x32768", help="BxT, comma-separated (H = 16, K = 256)")
    parser.add_argument("--check", action="store_true", help="against float64 and the Triton walk first")
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.compile_only:
        compile_only()
        return 0

    import lightning_attention as la
    from lightning_attention.ops.lightning.naive import chunk_lightning_attn

    rows = []
    H, D = 16, 256
    slope = la.tnl_slopes(H, 0, 12).cuda()
    if args.check:
        for B, T in ((1, 1024), (2, 1000)):  # one whole, one ragged
            g = torch.Generator(device="cuda").manual_seed(0)
            q, k, v = (torch.randn(B, T, H, D, device="cuda", generator=g).div(D**0.5).bfloat16() for _ in range(3))
            o = walk_fwd_ws(q, k, v, slope)
            ref, _ = chunk_lightning_attn(q.double(), k.double(), v.double(), slope, chunk_size=256)
            ours, _ = la.lightning_attn(q, k, v, slope)
            err = ((o.double() - ref).norm() / ref.norm()).item()
            err_triton = ((ours.double() - ref).norm() / ref.norm()).item()
            row = {"check": f"{B}x{T}", "rel_err": err, "rel_err_triton": err_triton, "ok": err < 5e-3}
            rows.append(row)
            print(json.dumps(row), flush=True)
    for item in args.shapes.split(","):
        B, T = map(int, item.split("x"))
        q, k, v = (torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        with torch.no_grad():
            gluon_ms = triton.testing.do_bench(lambda: walk_fwd_ws(q, k, v, slope), warmup=25, rep=100)
            triton_ms = triton.testing.do_bench(lambda: la.lightning_attn(q, k, v, slope), warmup=25, rep=100)
        row = {"shape": item, "gluon_fwd_ms": gluon_ms, "triton_fwd_ms": triton_ms, "ratio": triton_ms / gluon_ms}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
