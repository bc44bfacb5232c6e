"""Launch-configuration sweep of the chunk walk on a GPU: one subprocess per pinned configuration.

For each (BT, BV, num_warps, num_stages) and bf16 inter-product mode, a child process pins the configuration with
``LIGHTNING_ATTENTION_KERNEL_CONFIG``, times the forward and forward + backward at one shape
(``triton.testing.do_bench`` medians) and reports registers / spills / shared memory of the compiled walk kernels.
It times, it does not check values: on the H100 a configuration that computed wrong values (K = 64) or faulted
(K = 256) timed as the fastest. Check a candidate with ``benchmarks/inter_debug.py`` (pinned, against float64)
before the dispatcher may pick it.

    python benchmarks/chunk_sweep.py --B 16 --T 4096 --out benchmarks/results/chunk_sweep_h100.json
    python benchmarks/chunk_sweep.py --D 256 --inter input --configs "BT=64,BV=64,num_warps=8,num_stages=2;..."
"""

import argparse
import json
import os
import subprocess
import sys

CONFIGS = [
    "BT=64,BV=64,num_warps=4,num_stages=2",
    "BT=64,BV=64,num_warps=8,num_stages=2",
    "BT=64,BV=32,num_warps=4,num_stages=2",
    "BT=64,BV=128,num_warps=8,num_stages=2",
    "BT=32,BV=64,num_warps=4,num_stages=2",
    "BT=64,BV=64,num_warps=4,num_stages=1",
    "BT=128,BV=64,num_warps=8,num_stages=2",
]


def child(B: int, T: int, H: int, D: int) -> dict:
    import triton
    from kernel_problem import apply_probe_overrides, make_problem

    apply_probe_overrides()
    from lightning_attention.ops.lightning.kernels import walk

    problem = make_problem(B, T, H, D)
    fwd, fwd_bwd = problem.fwd, problem.fwd_bwd

    fwd_bwd()
    res = {
        "fwd_ms": triton.testing.do_bench(fwd, warmup=25, rep=100),
        "fwd_bwd_ms": triton.testing.do_bench(fwd_bwd, warmup=25, rep=100),
    }
    kernels = []
    try:
        for cache in walk._walk_kernel.device_caches.values():
            for compiled in cache[0].values():
                kernels.append(
                    {"n_regs": compiled.n_regs, "n_spills": compiled.n_spills, "shared": compiled.metadata.shared}
                )
    except Exception as e:  # introspection differs across Triton versions: report, do not fail
        kernels.append({"error": repr(e)})
    res["kernels"] = kernels
    return res


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--B", type=int, default=16)
    parser.add_argument("--T", type=int, default=4096)
    parser.add_argument("--H", type=int, default=16)
    parser.add_argument("--D", type=int, default=128)
    parser.add_argument("--out", default=None)
    parser.add_argument("--configs", default=";".join(CONFIGS), help="pinned configurations, ';'-separated")
    parser.add_argument("--inter", default="tf32,input", help="bf16 inter-product modes, comma-separated")
    parser.add_argument("--child", action="store_true")
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.B, args.T, args.H, args.D)))
        return 0
    rows = []
    for inter in args.inter.split(","):
        for cfg in args.configs.split(";"):
            env = dict(os.environ, LIGHTNING_ATTENTION_KERNEL_CONFIG=cfg, LIGHTNING_ATTENTION_BF16_INTER=inter)
            cmd = [sys.executable, __file__, "--child", f"--B={args.B}", f"--T={args.T}", f"--H={args.H}", f"--D={args.D}"]
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
            line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
            row = {"config": cfg, "inter": inter}
            row.update(json.loads(line[0][7:]) if line else {"error": proc.stderr[-800:]})
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"B": args.B, "T": args.T, "H": args.H, "D": args.D, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
