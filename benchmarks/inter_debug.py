"""Which inter-only (or full-op) call faults or computes wrong values on a GPU: each case in its own process (a fault
poisons the CUDA context), CUDA_LAUNCH_BLOCKING=1, fwd+bwd at the hybrid bench's head count (B = 1, T = 1024,
H = 16, bf16), every output and gradient compared with the float64 PyTorch path (relative L2 error).

    python benchmarks/inter_debug.py                 # the GPU test's cases and the full op at small V (K = 128)
    python benchmarks/inter_debug.py --probes        # also pinned configurations that probe the fault rule
    python benchmarks/inter_debug.py --head-dims     # the full op at K, V = 32 / 64 / 256: defaults and the pinned
                                                     # configurations of the head-dim sweeps
    python benchmarks/inter_debug.py --stages        # K = V = 64, 128 with three pipeline stages pinned
    python benchmarks/inter_debug.py --pins 256 "BT=128,BV=64,num_warps=8,num_stages=1;..."
                                                     # K = V = 256 with each configuration pinned, unsegmented and
                                                     # in segments of 256 tokens (before a dispatcher may pick it)

A case line: ``K V C seg pin: rc  o=err ht=err dq=err dk=err dv=err dh0=err`` (C = 0: the full op
``lightning_attn``; seg: ``LIGHTNING_ATTENTION_SEGMENT_LEN``, '-' = the default plan; errors above 5e-3 are wrong).
"""

import argparse
import os
import subprocess
import sys

CASE = r"""
import sys
sys.path.insert(0, {bench_dir!r})
from kernel_problem import apply_probe_overrides
apply_probe_overrides()
import torch, lightning_attention as la
from lightning_attention.ops.lightning.chunk import lightning_attn_inter_triton
from lightning_attention.ops.lightning.inter import inter_lightning_attn_torch
from lightning_attention.ops.lightning.naive import recurrent_lightning_attn
from lightning_attention.utils.testing import relative_error
B, T, H, K, V, C = 1, 1024, 16, {K}, {V}, {C}
g = torch.Generator(device="cuda").manual_seed(0)
q, k = (torch.randn(B, T, H, K, device="cuda", generator=g).div(K ** 0.5).bfloat16().requires_grad_() for _ in range(2))
v = torch.randn(B, T, H, V, device="cuda", generator=g).bfloat16().requires_grad_()
h0 = torch.randn(B, H, K, V, device="cuda", generator=g).div(K).requires_grad_()
do = torch.randn(B, T, H, V, device="cuda", generator=g).bfloat16()
dht = torch.randn(B, H, K, V, device="cuda", generator=g)
slope = la.tnl_slopes(H, 0, 2).cuda()
def run(q, k, v, h0, ref):
    if C:
        f = inter_lightning_attn_torch if ref else lightning_attn_inter_triton
        kw = dict(chunk_size=C, initial_state=h0)
        if not ref:
            kw["output_final_state"] = True
        o, ht = f(q, k, v, slope, **kw)
    else:
        if ref:
            o, ht = recurrent_lightning_attn(q, k, v, slope, initial_state=h0)
        else:
            o, ht = la.lightning_attn(q, k, v, slope, initial_state=h0, output_final_state=True)
    loss = (o.double() * do.double()).sum() + (ht.double() * dht.double()).sum()
    return (o, ht, *torch.autograd.grad(loss, (q, k, v, h0)))
got = run(q, k, v, h0, False)
torch.cuda.synchronize()
ref = run(*[t.detach().double().requires_grad_() for t in (q, k, v, h0)], True)
print(" ".join(f"{{n}}={{relative_error(a, b):.2e}}" for n, a, b in zip(("o", "ht", "dq", "dk", "dv", "dh0"), got, ref)))
"""

# (K, V, C, segment length or '' for the default plan, pinned configuration or ''): the GPU test's inter-only cases
# (tests/ops/test_chunk_gpu.py), then the full op at small V without segments (V = 16 faulted there while
# autotuned, h100-2026-11-22k)
CASES = [(128, v, c, "", "") for v, c in ((16, 64), (32, 128), (48, 64), (128, 64), (128, 256), (129, 128))]
CASES += [(128, 16, 0, "0", ""), (128, 48, 0, "0", ""), (128, 16, 64, "0", "")]
# pinned configurations probing the fault rules (configs._FIXED_BT_CONFIG, configs.NARROW_TILE_MIN_WARPS)
PROBES = [(128, 16, 0, "0", "BT=64,BV=16,num_warps=4,num_stages=1"), (128, 16, 0, "0", "BT=64,BV=16,num_warps=8,num_stages=2")]
# small and large head dims (issue 4): the defaults, unsegmented and in segments of 256 tokens, and the pinned
# configurations of the sweeps (h100-2026-11-22n: BV = 32 with 4 warps faulted at K = V = 64, pinned for every pass)
HEAD_DIMS = [(k, v, 0, seg, "") for k, v in ((64, 64), (64, 32), (32, 32), (32, 64), (256, 256)) for seg in ("0", "256")]
HEAD_DIMS += [
    (64, 64, 0, seg, pin)
    for pin in ("BT=64,BV=32,num_warps=4,num_stages=1", "BT=64,BV=32,num_warps=8,num_stages=1",
                "BT=64,BV=64,num_warps=4,num_stages=2")
    for seg in ("0", "256")
]  # fmt: skip
HEAD_DIMS += [
    (256, 256, 0, seg, pin)
    for pin in ("BT=64,BV=32,num_warps=4,num_stages=1", "BT=64,BV=64,num_warps=8,num_stages=2")
    for seg in ("0", "256")
]

# three pipeline stages (configs.PREFERRED_BY_BK): pinned, every pass
STAGES = [(d, d, 0, seg, "BT=64,BV=64,num_warps=4,num_stages=3") for d in (128, 64) for seg in ("0", "256")]


def run_case(K: int, V: int, C: int, seg: str, pin: str) -> None:
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
    if seg:
        env["LIGHTNING_ATTENTION_SEGMENT_LEN"] = seg
    if pin:
        env["LIGHTNING_ATTENTION_KERNEL_CONFIG"] = pin
    code = CASE.format(K=K, V=V, C=C, bench_dir=os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    result = [line for line in lines if line.startswith("o=")]
    where = [line for line in lines if 'File "/work' in line][-2:]
    summary = result[-1] if result and proc.returncode == 0 else (lines[-1][:160] if lines else "")
    print(f"K={K} V={V} C={C} seg={seg or '-'} pin={pin or '-'}: rc={proc.returncode} {summary}", flush=True)
    for line in where:
        print("    ", line.strip()[:160], flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--probes", action="store_true", help="also run the pinned probe configurations")
    parser.add_argument("--head-dims", action="store_true", help="only the small and large head-dim cases")
    parser.add_argument("--stages", action="store_true", help="only the pinned three-stage cases")
    parser.add_argument("--pins", nargs=2, metavar=("D", "CONFIGS"),
                        help="only K = V = D with each ';'-separated configuration pinned")  # fmt: skip
    args = parser.parse_args()
    if args.pins:
        d, configs = int(args.pins[0]), [c for c in args.pins[1].split(";") if c]
        cases = [(d, d, 0, seg, pin) for pin in configs for seg in ("0", "256")]
    elif args.stages:
        cases = STAGES
    else:
        cases = HEAD_DIMS if args.head_dims else CASES + (PROBES if args.probes else [])
    for case in cases:
        run_case(*case)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
