"""Time every pass of one ``lightning_attn`` fwd+bwd on its own (``triton.testing.do_bench``), with the launch
configuration the autotuner picked for it.

All walks are one Triton kernel (``_walk_kernel``), so a profiler cannot tell them apart; this script calls the
launchers of ``ops/lightning/chunk.py`` pass by pass, in the order and with the inputs ``chunk_forward`` and
``chunk_backward`` use:

    fwd: [pre-pass (k, v), scan,] walk (q, k, v)          bwd: [pre-pass (v, k), scan,] dq walk (do, v, k),
                                                               [pre-pass (q, do) reverse, scan,]
                                                               dk/dv: fused walk, or dv walk + dk walk

    python benchmarks/chunk_passes.py --shapes 32x2048,2x32768 --out benchmarks/results/chunk_passes.json
"""

import argparse
import json

import torch
import triton
from kernel_problem import parse_shape

import lightning_attention as la
from lightning_attention.ops.lightning import chunk
from lightning_attention.ops.lightning.kernels.configs import DKDV_MAX_DIM, padded_dim
from lightning_attention.ops.lightning.kernels.dkdv_walk import lightning_dkdv_kernel
from lightning_attention.ops.lightning.kernels.walk import lightning_state_kernel, lightning_walk_kernel


def _best(kernel) -> str | None:
    cfg = getattr(kernel, "best_config", None)
    return None if cfg is None else str(cfg)


def passes(B: int, T: int, H: int = 16, D: int = 128, dtype=torch.bfloat16) -> list[dict]:
    """[{pass, ms, config}] for one shape (bf16, TNL slopes, scale 1)."""
    slope = la.tnl_slopes(H, 0, 12).cuda()
    q, k, v, do = (torch.randn(B, T, H, D, device="cuda", dtype=dtype) for _ in range(4))
    plan = chunk.plan_segments(q, v, None, None)
    out = torch.empty_like(q)
    out2 = torch.empty_like(q)
    states = torch.empty(plan.total, H, D, D, device="cuda", dtype=torch.float32) if plan.segmented else None
    common = dict(plan=plan, T=T, H=H)
    rows = []

    def timed(name, fn, kernel=None):
        fn()  # compile + autotune outside the timing
        ms = triton.testing.do_bench(fn, warmup=10, rep=100)
        rows.append({"pass": name, "ms": ms, "config": _best(kernel) if kernel is not None else None})
        print(f"  {name:28s} {ms:7.3f} ms   {rows[-1]['config']}", flush=True)

    def walk(qq, kk, vv, oo, reverse, seg_states, upd=1.0, inter=1.0):
        return lambda: chunk._walk(
            qq, kk, vv, oo, slope=slope, h0=None, ht=None, states=seg_states, scale_intra=1.0, scale_inter=inter,
            scale_upd=upd, reverse=reverse, state_only=False, **common,
        )  # fmt: skip

    def pre_pass(kk, vv, reverse, pieces):  # as without a final state: the walk's last segment skipped
        return lambda: chunk._prepass(
            kk, vv, states, pieces, slope=slope, plan=plan, N=B, H=H, T=T, scale_upd=1.0, reverse=reverse,
            skip_final=True,
        )  # fmt: skip

    def scan(local, pieces):
        return lambda: chunk._scan(
            states, local, pieces, slope=slope, h0=None, ht=None, plan=plan, N=B, H=H, T=T, reverse=False
        )

    def segment_states(kk, vv, reverse):  # what the op runs: the pre-pass and the scan
        return lambda: chunk._segmented_states(
            kk, vv, slope=slope, h0=None, ht=None, plan=plan, N=B, H=H, T=T, scale_upd=1.0, reverse=reverse
        )

    print(f"== B={B} T={T} segmented={plan.segmented} segments/seq={plan.per_seq} seg_len={plan.seg_len}", flush=True)
    if plan.segmented:
        whole = chunk.PrepassPieces(1, plan.seg_len, 0, T, plan.per_seq, 0)  # the walk's own segments, in place
        pieces = chunk._prepass_pieces(k, plan, T, H, D, skip_final=True, reverse=False)  # what the op picks
        print(f"   {pieces}", flush=True)
        timed("fwd pre-pass on segments", pre_pass(k, v, False, whole), lightning_state_kernel)
        timed("scan of segments", scan(states, whole))
        if pieces.split > 1:
            timed("fwd pre-pass on pieces", pre_pass(k, v, False, pieces), lightning_state_kernel)
            local = pre_pass(k, v, False, pieces)()
            timed("scan of pieces", scan(local, pieces))
        timed("fwd pre-pass + scan (op)", segment_states(k, v, False), lightning_state_kernel)
    timed("fwd walk (q, k, v)", walk(q, k, v, out, False, states), lightning_walk_kernel)
    timed("dq walk (do, v, k)", walk(do, v, k, out, False, states), lightning_walk_kernel)
    if plan.segmented:
        timed("g pre-pass + scan (q, do) reverse (op)", segment_states(q, do, True), lightning_state_kernel)
    g_t = None if states is None else states.transpose(-1, -2)
    timed("dv walk (k, q, do) reverse", walk(k, q, do, out, True, states, upd=1.0), lightning_walk_kernel)
    timed("dk walk (v, do, q) reverse", walk(v, do, q, out2, True, g_t, upd=1.0), lightning_walk_kernel)
    if padded_dim(D) > DKDV_MAX_DIM:  # the fused walk holds the whole [K, V] state: not built for larger dims
        return rows
    timed(
        "fused dk/dv walk",
        lambda: chunk._dkdv(
            q, k, v, do, out, out2, slope=slope, dht=None, dh0=None, g_states=states, scale=1.0, **common
        ),
        lightning_dkdv_kernel,
    )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="32x2048,2x32768", help="BxT or BxTxD, comma-separated")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__}
    result["shapes"] = {}
    for shape in args.shapes.split(","):
        B, T, D = parse_shape(shape)
        result["shapes"][shape] = passes(B, T, D=D)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
