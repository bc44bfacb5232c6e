"""Which inter-only (or full-op) call faults or computes wrong values on a GPU: each case in its own process (a fault
poisons the CUDA context), CUDA_LAUNCH_BLOCKING=1, fwd+bwd at the hybrid bench's head count (B = 1, T = 1024,
H = 16, K = 128, bf16), every output and gradient compared with the float64 PyTorch path (relative L2 error).

    python benchmarks/inter_debug.py                 # the GPU test's cases and the full op at small V
    python benchmarks/inter_debug.py --probes        # also pinned configurations that probe the fault rule

A case line: ``V C seg pin: rc  o=err ht=err dq=err dk=err dv=err dh0=err`` (C = 0: the full op
``lightning_attn``; seg: ``LIGHTNING_ATTENTION_SEGMENT_LEN``, '-' = the default plan; errors above 5e-3 are wrong).
"""

import argparse
import os
import subprocess
import sys

CASE = r"""
import torch, lightning_attention as la
from lightning_attention.ops.lightning.chunk import lightning_attn_inter_triton
from lightning_attention.ops.lightning.inter import inter_lightning_attn_torch
from lightning_attention.ops.lightning.naive import recurrent_lightning_attn
from lightning_attention.utils.testing import relative_error
B, T, H, K, V, C = 1, 1024, 16, 128, {V}, {C}
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

# (V, C, segment length or '' for the default plan): the GPU test's inter-only cases (tests/ops/test_chunk_gpu.py),
# then the full op at small V without segments (V = 16 faulted there while autotuned, h100-2026-11-22k)
CASES = [(v, c, "") for v, c in ((16, 64), (32, 128), (48, 64), (128, 64), (128, 256), (129, 128))]
CASES += [(16, 0, "0"), (48, 0, "0"), (16, 64, "0")]
# pinned configurations probing the fault rules (configs._FIXED_BT_CONFIG, configs.NARROW_TILE_MAX_WARPS)
PROBES = [(16, 0, "0", "BV=16,num_warps=4,num_stages=1"), (16, 0, "0", "BV=16,num_warps=8,num_stages=2")]


def run_case(V: int, C: int, seg: str, pin: str) -> None:
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
    if seg:
        env["LIGHTNING_ATTENTION_SEGMENT_LEN"] = seg
    if pin:
        env["LIGHTNING_ATTENTION_KERNEL_CONFIG"] = "BT=64," + pin
    proc = subprocess.run([sys.executable, "-c", CASE.format(V=V, C=C)], env=env, capture_output=True, text=True)
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    result = [line for line in lines if line.startswith("o=")]
    where = [line for line in lines if 'File "/work' in line][-2:]
    summary = result[-1] if result and proc.returncode == 0 else (lines[-1][:160] if lines else "")
    print(f"V={V} C={C} seg={seg or '-'} pin={pin or '-'}: rc={proc.returncode} {summary}", flush=True)
    for line in where:
        print("    ", line.strip()[:160], flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--probes", action="store_true", help="also run the pinned probe configurations")
    args = parser.parse_args()
    for V, C, seg in CASES:
        run_case(V, C, seg, "")
    for V, C, seg, pin in PROBES if args.probes else []:
        run_case(V, C, seg, pin)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
