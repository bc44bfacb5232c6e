"""Is a ``lightning_attn`` call bound by the host (Python, dispatch, launches) or by the GPU, and where does its host
time go?

Per shape (bf16, H = 16, TNL slopes), for the forward and the forward + backward (``timed_calls.py``):

- ``*_gpu_ms``: ``triton.testing.do_bench`` of the call (what the kernels benchmark reports);
- ``*_host_ms``: the host time to enqueue one call (calls without synchronisation, divided by their number);
- ``*_graph_ms``: the call as a CUDA-graph replay (device time without host time).

``host_ms`` close to or above ``graph_ms``: the GPU waits for the host at that size. Then the split of a fwd+bwd's
host time: ``fwd_program_host_ms`` / ``bwd_program_host_ms`` (the forward's / backward's launch program run
directly: no autograd, no ``torch.library`` dispatch; what the host spends beyond the two is the autograd Function,
the engine and the hand-over between threads), ``function_fwd_host_ms`` / ``function_bwd_host_ms`` (inside the
autograd Function's forward / backward, operators included), ``triton_launches`` per call (launches that went
through Triton's ``JITFunction.run`` instead of the direct launcher: 0 once every launch is verified;
``launchers_disabled`` names the launchers that left the direct path, and why) and ``fwd_bwd_host_ms_one_thread``
(the backward on the calling thread: ``torch.autograd.set_multithreading_enabled(False)``). docs/kernels.md, "Host
overhead", explains the numbers.

    python benchmarks/host_overhead.py --shapes 1x32768,32x2048,4x16384x64 --out host_overhead.json
    python benchmarks/host_overhead.py --shapes 1x1024 --set direct_launch=0      # every launch through Triton
"""

import argparse
import contextlib
import time

import torch
from timed_calls import (
    add_settings_option,
    device_ms,
    graph_ms,
    host_ms,
    make_problem,
    parse_shape,
    settings_changes,
    write_json,
)

from lightning_attention import settings
from lightning_attention.ops.lightning import launches, run


def _programs(problem):
    """The forward and the backward of ``problem.fwd_bwd`` as their launch programs run them (the backward with the
    forward's segment states), without autograd or operator dispatch: two calls."""
    q, k, v, do, slope = problem.q.detach(), problem.k.detach(), problem.v.detach(), problem.do, problem.slope
    scale = 1.0  # lightning_attn's default, as in problem.fwd_bwd
    _, _, states = run.chunk_forward(q, k, v, slope, None, None, None, scale, False)
    return (
        lambda: run.chunk_forward(q, k, v, slope, None, None, None, scale, False),
        lambda: run.chunk_backward(q, k, v, do, None, slope, None, None, None, scale, False, 0, states),
    )


@contextlib.contextmanager
def _host_split(calls: int):
    """Counts, while active, the time inside the autograd Function's forward and backward and the launches through
    Triton's ``JITFunction.run``; yields a dict that holds them per call on exit (``calls`` calls, one warm-up
    included)."""
    from triton.runtime.jit import JITFunction

    from lightning_attention.ops.lightning.ops import LightningAttnFunction

    split = {"function_fwd_host_ms": 0.0, "function_bwd_host_ms": 0.0, "triton_launches": 0}
    fwd, bwd, triton_run = LightningAttnFunction.forward, LightningAttnFunction.backward, JITFunction.run

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
        return triton_run(self, *args, **kwargs)

    LightningAttnFunction.forward = timed(fwd, "function_fwd_host_ms")
    LightningAttnFunction.backward = timed(bwd, "function_bwd_host_ms")
    JITFunction.run = counted_run
    try:
        yield split
    finally:
        LightningAttnFunction.forward, LightningAttnFunction.backward = staticmethod(fwd), staticmethod(bwd)
        JITFunction.run = triton_run
    for key in split:
        split[key] /= calls


def measure(B: int, T: int, H: int = 16, D: int = 128, calls: int = 50) -> dict:
    problem = make_problem(B, T, H, D)
    row = {"B": B, "T": T, "H": H, "D": D}
    for name, fn in (("fwd", problem.fwd), ("fwd_bwd", problem.fwd_bwd)):
        fn()
        row[f"{name}_gpu_ms"] = device_ms(fn)
        row[f"{name}_host_ms"] = host_ms(fn, calls)
        row[f"{name}_graph_ms"] = graph_ms(fn)
    forward, backward = _programs(problem)
    row["fwd_program_host_ms"] = host_ms(forward, calls)
    row["bwd_program_host_ms"] = host_ms(backward, calls)
    with _host_split(calls + 1) as split:  # host_ms makes one warm-up call before its loop
        host_ms(problem.fwd_bwd, calls, loops=1)
    row.update(split)
    with torch.autograd.set_multithreading_enabled(False):
        row["fwd_bwd_host_ms_one_thread"] = host_ms(problem.fwd_bwd, calls)
    # a launcher off the direct path (it warned once) sends every launch through Triton: the first suspect
    row["launchers_disabled"] = {
        launcher.name: launcher.disabled for launcher in launches.launchers() if launcher.disabled
    }
    print(", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()), flush=True)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="1x1024,1x32768,2x32768,32x2048,1x131072",
                        help="BxT or BxTxD, comma-separated")  # fmt: skip
    parser.add_argument("--calls", type=int, default=50, help="calls per host-time loop")
    add_settings_option(parser)
    parser.add_argument("--out", default=None, help="write the rows as JSON to this file")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    changes = settings_changes(args.set)
    rows = []
    with settings.override(**changes):
        for shape in args.shapes.split(","):
            B, T, D = parse_shape(shape)
            rows.append(measure(B, T, D=D, calls=args.calls))
    write_json(args.out, {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "settings": args.set,
                          "rows": rows})  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
