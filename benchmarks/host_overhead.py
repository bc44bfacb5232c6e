"""Is a ``lightning_attn`` call bound by the host (Python, autotuner dispatch, launches) or by the GPU?

Per shape: ``gpu_ms`` = ``triton.testing.do_bench`` of the call (what the kernels benchmark reports), ``host_ms`` =
the time the host needs to *enqueue* one call (a loop of calls without synchronisation, divided by their number,
after warm-up), and ``graph_ms`` = the same call captured in a CUDA graph and replayed (device time without host
overhead). host_ms close to or above graph_ms means the GPU waits for the host at that size.

``bwd_op_host_ms``: the host time of the backward op alone (``chunk._chunk_bwd_direct`` called directly, no autograd),
to split fwd_bwd_host_ms into our code and the autograd engine around it. The rest of the split, per fwd+bwd in the
same enqueue loop: ``function_fwd_host_ms`` / ``function_bwd_host_ms`` (inside ``LightningAttnFunction.forward`` /
``.backward``), ``triton_launches`` (launches that went through ``JITFunction.run`` rather than the direct path: 0
once every launch key is learnt) and ``fwd_bwd_host_ms_one_thread`` (the autograd engine without its device threads:
``torch.autograd.set_multithreading_enabled(False)``, the backward on the calling thread).

    python benchmarks/host_overhead.py --shapes 1x32768,32x2048,4x16384x64 --out benchmarks/results/host_overhead.json
"""

import argparse
import contextlib
import json
import time

import torch
import triton
from kernel_problem import make_problem, parse_shape, write_json


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


@contextlib.contextmanager
def _host_split(calls: int):
    """Counts, while active, the time inside the autograd Function's forward/backward and Triton's normal launches;
    yields a dict that holds them per call (of ``calls``) on exit."""
    from triton.runtime.jit import JITFunction

    from lightning_attention.ops.lightning.chunk import LightningAttnFunction

    split = {"function_fwd_host_ms": 0.0, "function_bwd_host_ms": 0.0, "triton_launches": 0}
    fwd, bwd, run = LightningAttnFunction.forward, LightningAttnFunction.backward, JITFunction.run

    def timed(fn, name):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                split[name] += (time.perf_counter() - t0) * 1e3

        return staticmethod(wrapper)

    def counted_run(self, *args, **kwargs):
        split["triton_launches"] += 1
        return run(self, *args, **kwargs)

    LightningAttnFunction.forward = timed(fwd, "function_fwd_host_ms")
    LightningAttnFunction.backward = timed(bwd, "function_bwd_host_ms")
    JITFunction.run = counted_run
    try:
        yield split
    finally:
        LightningAttnFunction.forward, LightningAttnFunction.backward = staticmethod(fwd), staticmethod(bwd)
        JITFunction.run = run
    for key in split:
        split[key] /= calls + 1  # _enqueue_ms makes one warm-up call before its timed ones


def measure(B: int, T: int, H: int = 16, D: int = 128) -> dict:
    problem = make_problem(B, T, H, D)
    row = {"B": B, "T": T, "D": D}
    for name, fn in (("fwd", problem.fwd), ("fwd_bwd", problem.fwd_bwd)):
        fn()
        row[f"{name}_gpu_ms"] = triton.testing.do_bench(fn, warmup=25, rep=200)
        row[f"{name}_host_ms"] = _enqueue_ms(fn)
        row[f"{name}_graph_ms"] = _graph_ms(fn)
    row["bwd_op_host_ms"] = _enqueue_ms(_backward_op(problem))
    calls = 50
    with _host_split(calls) as split:
        _enqueue_ms(problem.fwd_bwd, calls)
    row.update(split)
    with torch.autograd.set_multithreading_enabled(False):
        row["fwd_bwd_host_ms_one_thread"] = _enqueue_ms(problem.fwd_bwd, calls)
    print(json.dumps(row), flush=True)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="1x32768,2x32768,32x2048,1x131072", help="BxT or BxTxD, comma-separated")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    rows = []
    for shape in args.shapes.split(","):
        B, T, D = parse_shape(shape)
        rows.append(measure(B, T, D=D))
    write_json(args.out, {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
