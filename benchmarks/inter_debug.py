"""Find which inter-only call of the hybrid bench faults on a GPU: each case in its own process (a fault poisons
the CUDA context), CUDA_LAUNCH_BLOCKING=1, fwd+bwd of lightning_attn_inter at the bench's shapes.

    python benchmarks/inter_debug.py
"""

import os
import subprocess
import sys

CASE = r"""
import torch, lightning_attention as la
from lightning_attention.ops.lightning.inter import lightning_attn_inter
B, T, H, K, V, C = 1, {T}, 16, 128, {V}, {C}
q, k = (torch.rand(B, T, H, K, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
v = torch.rand(B, T, H, V, device="cuda", dtype=torch.bfloat16, requires_grad=True)
slope = la.tnl_slopes(H, 0, 2).cuda()
o, _ = lightning_attn_inter(q, k, v, slope, chunk_size=C) if C else la.lightning_attn(q, k, v, slope)
g = torch.autograd.grad(o.float().sum(), (q, k, v))
torch.cuda.synchronize()
print("ok", float(o.float().abs().sum()), [float(x.float().abs().sum()) for x in g])
"""


def main() -> int:
    # (T, V, C, pinned config); C = 0: the full op lightning_attn (no inter-only mode). First the GPU test's cases
    # with the configuration the dispatcher picks (configs.inter_only_config), then probes of the fault rule there:
    # 8 warps on a 64-token tile (predicted to fault), 4 warps at 256 with a 32-wide value tile
    cases = [(1024, v, c, "") for v, c in ((16, 64), (32, 128), (48, 64), (128, 64), (128, 256), (129, 128))]
    cases += [(1024, 128, 64, "BV=32,num_warps=8,num_stages=1"), (1024, 128, 256, "BV=32,num_warps=4,num_stages=1")]
    for T, V, C, pin in cases:
        env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
        if pin:
            env["LIGHTNING_ATTENTION_KERNEL_CONFIG"] = "BT=64," + pin
        proc = subprocess.run(
            [sys.executable, "-c", CASE.format(T=T, V=V, C=C)], env=env, capture_output=True, text=True
        )
        tail = (proc.stdout + proc.stderr).strip().splitlines()
        where = [line for line in tail if "File \"/work" in line][-2:]
        print(f"T={T} V={V} C={C} pin={pin or '-'}: rc={proc.returncode} {tail[-1][:160] if tail else ''}", flush=True)
        for line in where:
            print("    ", line.strip()[:160], flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
