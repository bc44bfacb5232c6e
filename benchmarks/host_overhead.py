"""Is a ``lightning_attn`` call bound by the host (Python, autotuner dispatch, launches) or by the GPU?

Per shape: ``gpu_ms`` = ``triton.testing.do_bench`` of the call (what the kernels benchmark reports), ``host_ms`` =
the time the host needs to *enqueue* one call (a loop of calls without synchronisation, divided by their number,
after warm-up), and ``graph_ms`` = the same call captured in a CUDA graph and replayed (device time without host
overhead). host_ms close to or above graph_ms means the GPU waits for the host at that size.

``bwd_op_host_ms``: the host time of the backward op alone (``chunk._chunk_bwd_direct`` called directly, no autograd),
to split fwd_bwd_host_ms into our code and the autograd engine around it.

    python benchmarks/host_overhead.py --shapes 1x32768,32x2048 --out benchmarks/results/host_overhead.json
"""

import argparse
import json
import time

import torch
import triton
from kernel_problem import make_problem, write_json


def _enqueue_ms(fn, calls: int = 50) -> float:
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()  # before the sync: host time only
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e3


def _graph_ms(fn) -> float | None:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn()
    except Exception as e:  # noqa: BLE001 - report, do not hide: a capture failure is a finding
        print(f"  graph capture failed: {type(e).__name__}: {e}", flush=True)
        return None
    return triton.testing.do_bench(graph.replay, warmup=10, rep=100)


def _backward_op(problem):
    """The backward op of ``problem.fwd_bwd`` called directly (the saved segment states included), no autograd."""
    from lightning_attention.ops.lightning import chunk

    q, k, v, do, slope = problem.q.detach(), problem.k.detach(), problem.v.detach(), problem.do, problem.slope
    scale = 1.0  # lightning_attn's default, as in problem.fwd_bwd
    _, _, states = chunk._chunk_fwd_direct(q, k, v, slope, None, None, None, scale, False, 0)
    return lambda: chunk._chunk_bwd_direct(q, k, v, do, None, slope, None, None, None, scale, 0, states)


def measure(B: int, T: int, H: int = 16, D: int = 128) -> dict:
    problem = make_problem(B, T, H, D)
    row = {"B": B, "T": T}
    for name, fn in (("fwd", problem.fwd), ("fwd_bwd", problem.fwd_bwd)):
        fn()
        row[f"{name}_gpu_ms"] = triton.testing.do_bench(fn, warmup=25, rep=200)
        row[f"{name}_host_ms"] = _enqueue_ms(fn)
        row[f"{name}_graph_ms"] = _graph_ms(fn)
    row["bwd_op_host_ms"] = _enqueue_ms(_backward_op(problem))
    print(json.dumps(row), flush=True)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="1x32768,2x32768,32x2048,1x131072")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    rows = [measure(*(int(x) for x in s.split("x"))) for s in args.shapes.split(",")]
    write_json(args.out, {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
