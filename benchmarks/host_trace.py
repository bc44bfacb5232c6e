"""The host's timeline of a few ``lightning_attn`` fwd+bwd calls (and FLA's, when installed): who waits for whom.

``host_overhead.py`` says how long a call's host part takes; this shows where inside it, per thread, with the
PyTorch profiler (CPU and CUDA activities): every ``cudaLaunchKernel`` / ``cuLaunchKernelEx``, allocation and
autograd node on the calling thread and on the autograd engine's device thread. It writes, per provider and shape,
the profiler's table (self CPU time per event, sorted) and a gzipped Chrome trace to open in Perfetto, plus a
summary: the host's wall time per call (profiled), the launches per call and their mean time, and how many threads
launched.

Also the facts about the machine that move host time: CPU model, cores visible to the process, load average, and
a pure-Python loop's speed (to compare hosts).

    python benchmarks/host_trace.py --shapes 8x8192x64,2x32768x64 --out /tmp/host_trace
"""

import argparse
import gzip
import json
import os
import pathlib
import platform
import shutil
import time

import torch
from timed_calls import make_problem, parse_shape, write_json

LAUNCH_EVENTS = ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC")


def machine_facts() -> dict:
    """CPU model, cores this process may use, load average, and the time of a fixed pure-Python loop (ms)."""
    lines = pathlib.Path("/proc/cpuinfo").read_text().splitlines()
    model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "?")
    t0 = time.perf_counter()
    total = 0
    for i in range(1_000_000):
        total += i & 7
    python_loop_ms = (time.perf_counter() - t0) * 1e3
    return {
        "cpu": model,
        "cpus_visible": len(os.sched_getaffinity(0)),
        "loadavg": os.getloadavg(),
        "python": platform.python_version(),
        "python_loop_1e6_ms": python_loop_ms,
    }


def _fla_fwd_bwd(problem):
    from fla.ops.simple_gla import chunk_simple_gla

    g_gamma = -problem.slope

    def fwd_bwd():
        o, _ = chunk_simple_gla(problem.q, problem.k, problem.v, g_gamma=g_gamma, scale=1.0)
        return torch.autograd.grad(o, (problem.q, problem.k, problem.v), problem.do)

    return fwd_bwd


def trace(fn, calls: int, path: str) -> dict:
    """Profiles ``calls`` calls of ``fn`` (after warm-up); writes the table and the gzipped trace beside ``path``."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        host_ms = (time.perf_counter() - t0) * 1e3 / calls
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40)
    with open(path + ".txt", "w") as f:
        f.write(table)
    prof.export_chrome_trace(path + ".json")
    with open(path + ".json", "rb") as src, gzip.open(path + ".json.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.remove(path + ".json")
    launches = [e for e in prof.events() if e.name in LAUNCH_EVENTS]
    return {
        "host_ms_per_call_profiled": host_ms,
        "launches_per_call": len(launches) / calls,
        "launch_us_mean": sum(e.time_range.elapsed_us() for e in launches) / max(len(launches), 1),
        "threads_launching": len({e.thread for e in launches}),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="8x8192x64,2x32768x64", help="BxT or BxTxD, comma-separated")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--out", required=True, help="folder for the tables, traces and summary.json")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    summary = {"machine": machine_facts(), "rows": []}
    print(json.dumps(summary["machine"]), flush=True)
    for shape in args.shapes.split(","):
        B, T, D = parse_shape(shape)
        problem = make_problem(B, T, D=D)
        providers = {"ours": problem.fwd_bwd}
        try:
            providers["fla"] = _fla_fwd_bwd(problem)
        except ImportError:
            pass
        for name, fn in providers.items():
            row = {"provider": name, "B": B, "T": T, "D": D}
            row.update(trace(fn, args.calls, os.path.join(args.out, f"{name}_{B}x{T}x{D}")))
            print(json.dumps(row), flush=True)
            summary["rows"].append(row)
    write_json(os.path.join(args.out, "summary.json"), summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
