"""Timers and memory probes: ``triton.testing.do_bench`` on CUDA, ``torch.utils.benchmark`` on CPU.

Every timing is a median with its 20th and 80th percentiles, in milliseconds. Memory is measured on CUDA only
(PyTorch keeps no peak statistics for CPU tensors); CPU runs report it as not measured.
"""

import dataclasses
import gc
import statistics
import time
from collections.abc import Callable

import torch

from lightning_attention.bench import clocks, metrics
from lightning_attention.bench.results import clean
from lightning_attention.utils.cuda_graph import capture


@dataclasses.dataclass(frozen=True)
class Timing:
    """``clock``: the GPU's clock over the measurement's window (:func:`.clocks.summarise_window`), where sampled."""

    median_ms: float
    p20_ms: float
    p80_ms: float
    clock: dict | None = None

    def to_json(self) -> dict:
        out = {"median_ms": self.median_ms, "p20_ms": self.p20_ms, "p80_ms": self.p80_ms}
        return out if self.clock is None else {**out, "clock": self.clock}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _clear_grads(tensors: list[torch.Tensor] | None) -> None:
    for t in tensors or ():
        t.grad = None


def bench(
    fn: Callable[[], object],
    device: torch.device,
    *,
    warmup_ms: float,
    rep_ms: float,
    grad_to_none: list[torch.Tensor] | None = None,
    sampler: clocks.Sampler | None = None,
    settle_s: float = 0.0,
) -> Timing:
    """Median time of ``fn()`` with the 20/80 percentiles (gradients of ``grad_to_none`` cleared before each run),
    and the GPU's clock over the measurement where a ``sampler`` (:func:`.clocks.start`) polls it. ``settle_s``: on
    CUDA, first :func:`settle` for that many seconds, so that the measurement times the sustained state.

    CUDA: ``triton.testing.do_bench`` (flushes L2 between runs). CPU: ``torch.utils.benchmark.Timer``'s
    ``blocked_autorange`` over ``rep_ms`` with this process's thread count (its percentiles are over blocks of runs)
    — a smoke-test timer, not a measurement to publish.
    """
    if device.type == "cuda":
        import triton.testing

        settle(fn, device, settle_s, grad_to_none)
        t0 = time.monotonic()
        q50, q20, q80 = triton.testing.do_bench(
            fn, warmup=warmup_ms, rep=rep_ms, grad_to_none=grad_to_none, quantiles=[0.5, 0.2, 0.8]
        )
        clock = sampler.window(t0, time.monotonic()) if sampler is not None else None
        return Timing(float(q50), float(q20), float(q80), clock)
    from torch.utils import benchmark

    def run() -> None:
        _clear_grads(grad_to_none)
        fn()

    run()  # warm-up
    timer = benchmark.Timer(stmt="run()", globals={"run": run}, num_threads=torch.get_num_threads())
    times = sorted(t * 1e3 for t in timer.blocked_autorange(min_run_time=rep_ms * 1e-3).times)
    if len(times) < 2:
        return Timing(times[0], times[0], times[0])
    q = statistics.quantiles(times, n=10, method="inclusive")  # deciles: q[1] = p20, q[7] = p80
    return Timing(statistics.median(times), q[1], q[7])


_SETTLE_BATCH = 8  # calls between two looks at the wall time in :func:`settle`


def settle(
    fn: Callable[[], object], device: torch.device, seconds: float, grad_to_none: list[torch.Tensor] | None = None
) -> int:
    """Calls ``fn()`` back to back for ``seconds`` of wall time (nothing where ``seconds`` <= 0 or on CPU) and returns
    how many calls it made.

    A call that brings the GPU to its power cap slows over its first few hundred back-to-back runs as the SM clock
    drops, and a short measurement lands anywhere in that drift (docs/kernels.md, "The power cap"); after this, it
    finds the clock where sustained work, a training loop's, holds it. The queue is drained every few calls, so the
    host never runs more than a few calls ahead of the time it reads.
    """
    if seconds <= 0 or device.type != "cuda":
        return 0
    synchronize(device)
    end, calls = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        for _ in range(_SETTLE_BATCH):
            _clear_grads(grad_to_none)
            fn()
        calls += _SETTLE_BATCH
        synchronize(device)
    return calls


def graphed(fn: Callable[[], object], device: torch.device) -> Callable[[], None]:
    """Captures one call of ``fn`` in a CUDA graph (after three warm-up calls on a side stream, which finish any
    compiling and autotuning) and returns the graph's replay: ``fn``'s device work without its host time."""
    graph, _ = capture(fn, device)
    return graph.replay


def wall_seconds(fn: Callable[[], object], device: torch.device) -> float:
    """Wall-clock seconds of one synchronised call (used for the cold start: compile + autotune + run)."""
    synchronize(device)
    t0 = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - t0


def peak_memory(fn: Callable[[], object], device: torch.device) -> tuple[int, int] | None:
    """``(allocated before, peak during)`` one call of ``fn`` in bytes; None on CPU (no allocator statistics)."""
    if device.type != "cuda":
        return None
    gc.collect()
    synchronize(device)
    baseline = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    synchronize(device)
    return baseline, torch.cuda.max_memory_allocated(device)


def copy_time_ms(nbytes: int, device: torch.device, *, warmup_ms: float, rep_ms: float) -> float:
    """Median time of a ``nbytes`` device-to-device copy (the bandwidth ceiling the floors are measured against)."""
    src = torch.zeros(nbytes, dtype=torch.uint8, device=device)
    dst = torch.zeros_like(src)
    return bench(lambda: dst.copy_(src), device, warmup_ms=warmup_ms, rep_ms=rep_ms).median_ms


def measure_copy_bandwidth(device: torch.device, quick: bool, warmup_ms: float, rep_ms: float) -> dict:
    """The bandwidth ceiling of this run: a large device-to-device copy (1 GiB on CUDA; 64 MiB on CPU, 8 in --quick)."""
    nbytes = 2**30 if device.type == "cuda" else (2**23 if quick else 2**26)
    ms = copy_time_ms(nbytes, device, warmup_ms=warmup_ms, rep_ms=rep_ms)
    release(device)  # the two copy buffers are gone: hand their memory back before the providers run
    return {"bytes": nbytes, "ms": ms, "bytes_per_s": metrics.copy_bandwidth(nbytes, ms)}


def release(device: torch.device) -> None:
    """Give cached memory back after a provider ran (or ran out of memory), so the next starts clean."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


_OOM = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)  # the top-level alias is recent


def measured(device: torch.device, fn, /, *args, **kwargs) -> dict:
    """``{"status": "ok", "result": fn(*args, **kwargs)}`` (the result made JSON-safe), or the failure as
    :func:`record_failure` records it; device memory is released either way. For a one-off measurement of a run
    (its loss curves, its memory over a long decode) that must not end the run when it fails."""
    try:
        return {"status": "ok", "result": clean(fn(*args, **kwargs))}
    except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
        return record_failure({}, exc)
    finally:
        release(device)


def record_failure(record: dict, exc: BaseException) -> dict:
    """Marks a benchmark record as failed: ``status`` "oom" (see :func:`is_out_of_memory`) or "error", and ``error``
    the exception's type and message on one line (400 characters at most). Returns the record."""
    record["status"] = "oom" if is_out_of_memory(exc) else "error"
    record["error"] = f"{type(exc).__name__}: {exc}".strip().replace("\n", " ")[:400]
    return record


def is_out_of_memory(exc: BaseException) -> bool:
    """A CUDA allocator OOM (or an op that reports one in its message); Triton's shared-memory OutOfResources is not."""
    if isinstance(exc, _OOM):
        return True
    return "out of memory" in str(exc).lower() and not isinstance(exc, AssertionError)
