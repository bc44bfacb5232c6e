"""What ``benchmarks/guard.py`` measures: its points, grouped by the pinned launch configuration they run under, and
the measurement of one group on the GPU.

A group runs in a process of its own because a pin is the process's ``LIGHTNING_ATTENTION_KERNEL_CONFIG``, which
some versions of the package read when they are imported. Every point uses only the public API (``lightning_attn``,
``lightning_attn_decode``, ``tnl_slopes``, the model presets) and the timers of ``timed_calls.py``, so that two
versions of the package are measured by the same code.

Imports of torch, the package and ``timed_calls`` are inside the measuring functions: ``guard.py``'s parent process
reads the points without importing either.

Each point has a value (what is compared), and beside it the device time and the host time per call of the same
call where they are known: a point whose host time is above its device time is launch-bound.

Host times, and the decode step's times, are the minimum over many loops in the process, as ``timeit`` reports:
the host is shared (other tenants, other cores' work, frequency changes), so a loop is only ever slowed down by
interference, and on the H100 machines medians of a few loops spread ±30% between processes running the same code.
The minimum measures the code; the guard's median over processes then discards a process that ran slow throughout.

Even the minimum of a process moves by up to 1.6× between processes of the same code (the core it runs on, what
shares that core, the layout of its memory), far beyond the 5% a host-time point is judged by. The ``host`` group
is therefore paired: one process imports both packages, the older one renamed (:data:`OLD_PACKAGE`, a copy that
``guard.py`` makes), and interleaves their loops, so that whatever slows the process slows both; the guard judges
the median of the per-process ratios.

The K = 256 forward is paired for a device-side reason: on the H200 its do_bench median settles per process anywhere
from 1.12 to 1.27 ms, mostly near either end, for either package (seven processes of each gave both ends), a 10%
step that a few unpaired processes per package cannot tell from a 3% change. Its paired processes time both packages
on the same input tensors, their do_bench rounds interleaved.
"""

import dataclasses
import statistics
import time


@dataclasses.dataclass(frozen=True)
class Point:
    """One compared number: ``unit`` "ms", "us" or "tokens/s" (higher is better only for tokens/s)."""

    name: str
    group: str
    what: str
    unit: str

    @property
    def higher_is_better(self) -> bool:
        return self.unit == "tokens/s"


# group -> the pinned configuration of the chunk walks (None: the default plan and tuning)
PINS = {
    "k128": "BT=64,BV=64,num_warps=4,num_stages=4",
    "k64": "BT=64,BV=64,num_warps=4,num_stages=2",
    "k256": "BT=64,BV=32,num_warps=4,num_stages=3",
    "decode": None,
    "host": "BT=64,BV=64,num_warps=4,num_stages=4",  # the k128 pin: the host points are K = V = 128 calls
}
# groups whose one process measures both packages (each run gives a value of each package and their ratio)
PAIRED_GROUPS = frozenset({"host", "k256"})
OLD_PACKAGE = "lightning_attention_old"  # the older package's name in a paired process
HEADS = 16
GRID_A_TOKENS = 65536  # grid (a): batch = 65536 / T
GRID_A_K128 = (2048, 8192, 32768)
HOST_SHAPE = (1, 1024)  # (B, T) of the host-time points: a small chunk call, bound by the host
DECODE_BATCHES = (1, 64)
MODEL_BATCH, MODEL_CONTEXT, MODEL_WARMUP, MODEL_STEPS = 16, 2048, 3, 10


def _grid_points(group: str, dim: int, seqlens) -> list[Point]:
    points = []
    for T in seqlens:
        B = GRID_A_TOKENS // T
        for call, label in (("fwd", "forward"), ("fwdbwd", "forward + backward")):
            what = f"grid (a) K = V = {dim}, T = {T}, B = {B}: {label}, do_bench median"
            points.append(Point(f"a{dim}-T{T}-{call}", group, what, "ms"))
    return points


POINTS: tuple[Point, ...] = (
    *_grid_points("k128", 128, GRID_A_K128),
    Point("b128-T131072-fwdbwd", "k128", "grid (b) K = V = 128, T = 131072, B = 1: forward + backward", "ms"),
    *(Point(f"host-T1024-{call}", "host", f"host time per call, B = 1, T = 1024, K = V = 128: {label}", "us")
      for call, label in (("fwd", "forward"), ("fwdbwd", "forward + backward"))),
    *_grid_points("k64", 64, (8192,)),
    Point("tnl40m-train", "k64", f"TNL 40m training step (bf16 autocast, AdamW), {MODEL_BATCH} x {MODEL_CONTEXT} "
          "random tokens", "tokens/s"),
    *_grid_points("k256", 256, (4096,)),
    *(Point(f"decode-b{b}-{kind}", "decode", f"decode step, batch {b}, H = {HEADS}, K = V = 128, bf16, out= and "
            f"state_indices: time per step, {how}", "us")
      for b in DECODE_BATCHES
      for kind, how in (("step", "CUDA events around a loop of steps"), ("wall", "wall clock (host included)"))),
)  # fmt: skip


# ---------------------------------------------------------------------------------------------------- on the GPU


def _chunk_point(fn, host_calls: int) -> dict:
    from timed_calls import device_ms, host_ms

    fn()
    # 250 ms of repetitions: a 5 ms call (K = 256 fwd+bwd) still gets ~50, where 60 ms left it ±6% between processes
    value = device_ms(fn, warmup=10, rep=250)
    return {"value": value, "device": value, "host": host_ms(fn, calls=host_calls, loops=5, statistic=min)}


def _device_us(fn) -> float:
    """Device µs of one call as a CUDA-graph replay (do_bench if it cannot be captured)."""
    from timed_calls import device_ms, graph_ms

    device = graph_ms(fn, warmup=10, rep=60)
    return (device_ms(fn, warmup=10, rep=60) if device is None else device) * 1e3


def _interleaved(fns: dict, rounds: int, time_one) -> dict[str, list[float]]:
    """{"old" | "new": ``time_one(fns[label])`` of each of ``rounds`` rounds}, taken in the order old, new, then new,
    old, ...: whatever drifts in the process reaches both packages alike."""
    times = {"old": [], "new": []}
    for i in range(rounds):
        for label in ("old", "new") if i % 2 == 0 else ("new", "old"):
            times[label].append(time_one(fns[label]))
    return times


def _host_pair(loops: int = 25, calls: int = 40) -> dict[str, dict[str, dict]]:
    """The host points of both packages in this process: {"old" | "new": {point: {"value", "device", "host"}}}.
    Their loops interleave (old, new, then new, old, ...), each package's host time the minimum of its ``loops``."""
    import importlib

    from timed_calls import host_ms, make_problem

    import lightning_attention

    packages = {"old": importlib.import_module(OLD_PACKAGE), "new": lightning_attention}
    problems = {label: make_problem(*HOST_SHAPE, HEADS, 128, package=p) for label, p in packages.items()}
    out = {"old": {}, "new": {}}
    for name, call in (("host-T1024-fwd", "fwd"), ("host-T1024-fwdbwd", "fwd_bwd")):
        fns = {label: getattr(problem, call) for label, problem in problems.items()}
        host = _interleaved(fns, loops, lambda fn: host_ms(fn, calls=calls, loops=1) * 1e3)
        for label, fn in fns.items():
            out[label][name] = {"value": min(host[label]), "device": _device_us(fn), "host": min(host[label])}
    return out


def _grid_pair(dim: int, seqlens, rounds: int = 6) -> dict[str, dict[str, dict]]:
    """The grid (a) points of both packages in this process, on the same tensors (q, k, v, do ``[65536 / T, T, 16,
    dim]`` bf16): {"old" | "new": {point: ...}}. Their do_bench rounds interleave (old, new, then new, old, ...), each
    package's value the median of its ``rounds``."""
    import importlib

    from timed_calls import device_ms, host_ms, make_problem, same_inputs

    old = importlib.import_module(OLD_PACKAGE)
    out = {"old": {}, "new": {}}
    for T in seqlens:
        new_problem = make_problem(GRID_A_TOKENS // T, T, HEADS, dim)
        problems = {"old": same_inputs(new_problem, old), "new": new_problem}
        for call, method in (("fwd", "fwd"), ("fwdbwd", "fwd_bwd")):
            fns = {label: getattr(problem, method) for label, problem in problems.items()}
            times = _interleaved(fns, rounds, lambda fn: device_ms(fn, warmup=10, rep=100))
            for label, fn in fns.items():
                value = statistics.median(times[label])
                host = host_ms(fn, calls=10, loops=5, statistic=min)
                out[label][f"a{dim}-T{T}-{call}"] = {"value": value, "device": value, "host": host}
    return out


def _grid(dim: int, seqlens) -> dict:
    from timed_calls import make_problem

    out = {}
    for T in seqlens:
        problem = make_problem(GRID_A_TOKENS // T, T, HEADS, dim)
        out[f"a{dim}-T{T}-fwd"] = _chunk_point(problem.fwd, host_calls=10)
        out[f"a{dim}-T{T}-fwdbwd"] = _chunk_point(problem.fwd_bwd, host_calls=10)
        del problem
    return out


def _model_tokens_per_s() -> dict:
    """The training step of ``lightning-attention bench model`` written out here, not imported from the package's
    ``bench/model_timing.py``: both packages must be timed by the same code."""
    import torch
    import torch.nn.functional as F

    from lightning_attention.models.presets import model_config, model_from_config

    torch.manual_seed(0)
    model = model_from_config("tnl", model_config("tnl", "40m")).cuda().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    ids = torch.randint(0, model.config.vocab_size, (MODEL_BATCH, MODEL_CONTEXT + 1), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=ids[:, :-1], use_cache=False).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    for _ in range(MODEL_WARMUP):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(MODEL_STEPS):
        step()
    torch.cuda.synchronize()
    tokens_per_s = MODEL_BATCH * MODEL_CONTEXT * MODEL_STEPS / (time.perf_counter() - t0)
    # a step enqueues hundreds of kernels (it would fill the launch queue): its host time is not measured
    return {"value": tokens_per_s, "device": None, "host": None}


def _decode(batch: int, steps: int = 200, loops: int = 15) -> dict:
    """The decode step of ``batch`` sequences in a pool of twice as many rows: µs per step from CUDA events around
    ``steps`` steps, and from the wall clock (synchronised), each the minimum of ``loops`` loops; host µs per step
    enqueued (the minimum of as many loops), and device µs per step of 20 steps replayed as a CUDA graph."""
    import torch
    from timed_calls import event_block, graph_ms, host_ms

    import lightning_attention as la

    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(batch, HEADS, 128, device="cuda", generator=gen).bfloat16() for _ in range(3))
    k = k / 128**0.5
    state = torch.zeros(2 * batch, HEADS, 128, 128, device="cuda")
    rows = torch.randperm(2 * batch, generator=gen, device="cuda")[:batch].to(torch.int32)
    out = torch.empty(batch, HEADS, 128, device="cuda", dtype=torch.bfloat16)
    slope = la.tnl_slopes(HEADS, 0, 12).cuda()

    def step():
        return la.lightning_attn_decode(q, k, v, state, slope, state_indices=rows, out=out)

    for _ in range(10):
        step()
    torch.cuda.synchronize()
    events, walls = [], []
    for _ in range(loops):
        torch.cuda.synchronize()
        ms, seconds = event_block(step, steps)
        walls.append(seconds / steps * 1e6)
        events.append(ms * 1e3)
    host = host_ms(step, calls=steps, loops=loops, statistic=min) * 1e3
    device = graph_ms(step, steps=20, warmup=10, rep=60)
    device = None if device is None else device * 1e3
    return {
        f"decode-b{batch}-step": {"value": min(events), "device": device, "host": host},
        f"decode-b{batch}-wall": {"value": min(walls), "device": device, "host": host},
    }


def measure_pair(group: str) -> dict[str, dict[str, dict]]:
    """What :func:`measure_group` returns, for each package ("old", "new") of a paired group: both measured in this
    process (the older one importable as :data:`OLD_PACKAGE`)."""
    if group == "host":
        return _host_pair()
    if group == "k256":
        return _grid_pair(256, (4096,))
    raise ValueError(f"{group!r} is not a paired group; paired groups are {sorted(PAIRED_GROUPS)}")


def measure_group(group: str) -> dict[str, dict]:
    """point name -> {"value", "device", "host"} (device and host in the point's unit, None where not measured) of
    every point of ``group``, measured in this process (the pin is already in its environment)."""
    if group == "k128":
        from timed_calls import make_problem

        out = _grid(128, GRID_A_K128)
        b = make_problem(1, 131072, HEADS, 128)
        out["b128-T131072-fwdbwd"] = _chunk_point(b.fwd_bwd, host_calls=10)
        return out
    if group == "k64":
        return {**_grid(64, (8192,)), "tnl40m-train": _model_tokens_per_s()}
    if group == "decode":
        return {name: value for batch in DECODE_BATCHES for name, value in _decode(batch).items()}
    raise ValueError(f"unknown group {group!r}; groups are {sorted(PINS)}")
