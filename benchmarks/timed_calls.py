"""The calls the timing scripts in this folder time, and the four ways they time them.

A problem (:func:`make_problem`): q, k, v ``[B, T, H, D]`` (bf16 unless asked otherwise) that require grad, an
upstream gradient ``do``, TNL slopes (layer 0 of 12), and two calls: the forward under ``no_grad`` and the forward +
``torch.autograd.grad`` w.r.t. q, k, v. The timers:

- :func:`device_ms`: ``triton.testing.do_bench`` median (CUDA events around each call, L2 flushed before it): what
  ``lightning-attention bench kernels`` reports. A call that waits on the host shows it only beyond the flush's time.
- :func:`host_ms`: the host time to *enqueue* one call (a loop of calls without synchronisation, divided by their
  number, after warm-up; median of a few loops). Above the device time, the GPU waits for the host.
- :func:`graph_ms`: the call captured in a CUDA graph and replayed (device time without host time).
- :func:`kernel_ms`: the CUDA time of the call's kernels added up (torch.profiler): device time without host time,
  for calls that cannot be captured as well.

:func:`child_runs` repeats a script's measurement in fresh processes (a process's luck is then visible as such).

Only the public API and PyTorch / Triton: ``benchmarks/guard.py`` times two versions of the package with this same
code. Scripts import it as ``from timed_calls import ...`` (``python benchmarks/<script>.py`` puts this folder first
on ``sys.path``).
"""

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton.testing

import lightning_attention as la


@dataclass
class Problem:
    """q, k, v: ``[B, T, H, D]`` leaves; do: ``[B, T, H, D]``; slope: ``[H]``; fwd / fwd_bwd: the timed calls."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    do: torch.Tensor
    slope: torch.Tensor
    fwd: Callable[[], tuple]
    fwd_bwd: Callable[[], tuple]


def make_problem(B: int, T: int, H: int = 16, D: int = 128, dtype=torch.bfloat16, seed: int = 0, package=la) -> Problem:
    """``fwd``: ``package.lightning_attn(q, k, v, slope)`` under no_grad; ``fwd_bwd``: forward + ``autograd.grad``
    w.r.t. q, k, v (no ``.grad`` accumulates, so repeated calls need no clearing). ``package``: this package, or
    another version of it imported under another name (the guard's paired points)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    slope = package.tnl_slopes(H, 0, 12).cuda()
    q, k, v, do = (torch.randn(B, T, H, D, device="cuda", dtype=dtype, generator=gen) for _ in range(4))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    return same_inputs(Problem(q, k, v, do, slope, fwd=None, fwd_bwd=None), package)


def same_inputs(problem: Problem, package) -> Problem:
    """``problem``'s tensors with ``package``'s calls: two versions of the package timed on the same memory."""
    q, k, v, do, slope = problem.q, problem.k, problem.v, problem.do, problem.slope

    def fwd():
        with torch.no_grad():
            return package.lightning_attn(q, k, v, slope)

    def fwd_bwd():
        o, _ = package.lightning_attn(q, k, v, slope)
        return torch.autograd.grad(o, (q, k, v), do)

    return Problem(q, k, v, do, slope, fwd, fwd_bwd)


def device_ms(fn: Callable[[], object], warmup: int = 25, rep: int = 100) -> float:
    """Median ms of ``fn()`` over ``rep`` ms of repetitions after ``warmup`` ms (``triton.testing.do_bench``)."""
    return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def profiled_kernels(fn: Callable[[], object], calls: int) -> list[list[dict]]:
    """The CUDA kernels of each of ``calls`` calls of ``fn`` (torch.profiler), in launch order: per call a list of
    ``{"kernel": name, "us": its CUDA time}``. Every call must launch the same number of kernels."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    kernels = sorted(
        (e for e in prof.events() if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA),
        key=lambda e: e.time_range.start,
    )
    per_call = len(kernels) // calls
    if per_call * calls != len(kernels):  # a call that launched more (a compile, an autotuning run) shifts the rest
        raise RuntimeError(f"{len(kernels)} kernels in {calls} calls: the calls launch different kernels")
    rows = [{"kernel": e.name[:80], "us": e.time_range.elapsed_us()} for e in kernels]
    return [rows[i * per_call : (i + 1) * per_call] for i in range(calls)]


def kernel_ms(fn: Callable[[], object], calls: int = 20) -> float:
    """Median over ``calls`` calls of ``fn`` (after one warm-up call) of the CUDA time of its kernels, added up: the
    device's own time, which no wait on the host enters (``device_ms`` of a call that waits on the host measures the
    host)."""
    fn()
    return statistics.median(sum(k["us"] for k in call) / 1e3 for call in profiled_kernels(fn, calls))


def event_block(fn: Callable[[], object], calls: int) -> tuple[float, float]:
    """``calls`` back-to-back calls of ``fn`` between two CUDA events: (device ms per call from the events, host
    seconds from the first call to the closing event's completion)."""
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    begin.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / calls, time.perf_counter() - t0


def host_ms(fn: Callable[[], object], calls: int = 50, loops: int = 3, statistic=statistics.median) -> float:
    """Host ms to enqueue one call of ``fn``: ``calls`` calls without a synchronisation in between, timed before the
    closing synchronisation, divided by ``calls``; the ``statistic`` (median, or ``min`` to compare code on a shared
    host: see ``guard_points.py``) of ``loops`` such loops after one warm-up call.

    Keep ``calls`` × launches per call well under the GPU's launch queue (about a thousand launches): a full queue
    makes the host wait for the device and the loop measures the device instead."""
    fn()
    times = []
    for _ in range(loops):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()  # before the synchronisation: host time only
        torch.cuda.synchronize()
        times.append((t1 - t0) / calls * 1e3)
    return statistic(times)


def capture(fn: Callable[[], object], steps: int = 1) -> torch.cuda.CUDAGraph:
    """``steps`` calls of ``fn`` captured in one CUDA graph, after three warm-up calls on a side stream (which finish
    any compiling and autotuning)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(steps):
            fn()
    return graph


def graph_ms(fn: Callable[[], object], steps: int = 1, warmup: int = 10, rep: int = 100) -> float | None:
    """Device ms of one call of ``fn`` as a CUDA-graph replay (``steps`` calls in the graph, time divided by them);
    None, with the reason printed, when the call cannot be captured."""
    try:
        graph = capture(fn, steps)
    except Exception as e:  # noqa: BLE001 - reported, not hidden: a call that cannot be captured is a finding
        print(f"  graph capture failed: {type(e).__name__}: {e}", flush=True)
        return None
    return device_ms(graph.replay, warmup=warmup, rep=rep) / steps


def float64_reference(q, k, v, do, slope, rows: int | None = None) -> tuple[torch.Tensor, ...]:
    """(o, dq, dk, dv) of the first ``rows`` sequences (all: None) in float64 through the chunked PyTorch path, one
    sequence at a time (its memory stays that of one sequence), for the loss ``(o · do).sum()``."""
    # imported here, not at the top: guard.py measures versions of the package through this module and the public API
    from lightning_attention.ops.lightning import naive

    outs = []
    for b in range(q.shape[0] if rows is None else rows):
        leaves = [x[b : b + 1].detach().double().requires_grad_() for x in (q, k, v)]
        o, _ = naive.chunk_lightning_attn(*leaves, slope)
        outs.append((o.detach(), *torch.autograd.grad(o, leaves, do[b : b + 1].double())))
    return tuple(torch.cat([out[i] for out in outs]) for i in range(4))


def parse_shape(text: str, D: int = 128) -> tuple[int, int, int]:
    """``"BxT"`` or ``"BxTxD"`` (the scripts' ``--shapes`` items) -> (B, T, D); D defaults to ``D``."""
    dims = [int(x) for x in text.split("x")]
    if len(dims) not in (2, 3):
        raise ValueError(f"a shape is BxT or BxTxD, got {text!r}")
    return dims[0], dims[1], dims[2] if len(dims) == 3 else D


def add_settings_option(parser, help: str = "a setting for the whole run, repeatable") -> None:
    """The scripts' ``--set NAME=VALUE`` option (a field of ``lightning_attention.settings.Settings``; read it with
    :func:`settings_changes`)."""
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help=f"{help} (a lightning_attention.settings.Settings field, e.g. segment_len=0)")  # fmt: skip


def settings_changes(items: list[str]) -> dict:
    """``["segment_len=0", "kernel_config=BT=64,BV=64,num_warps=4,num_stages=2", "tma=0"]`` (the scripts' ``--set``)
    -> keyword arguments of ``lightning_attention.settings.override``: each a field of ``settings.Settings``, booleans
    as 0/1, ``none`` for None (``auto`` too, for a boolean that may be None: the plan's choice)."""
    import dataclasses
    import typing

    # imported here, not at the top: guard.py imports this module under versions of the package without settings
    from lightning_attention.settings import Settings

    fields = {f.name: f for f in dataclasses.fields(Settings)}
    changes = {}
    for item in items:
        name, _, text = item.partition("=")
        if name not in fields:
            raise ValueError(f"--set {item!r}: {name!r} is not a setting; settings are {sorted(fields)}")
        kind = fields[name].type
        if text.strip().lower() == "none" and type(None) in typing.get_args(kind):
            changes[name] = None
        elif bool in (kind, *typing.get_args(kind)):
            value = text.strip().lower()
            optional = type(None) in typing.get_args(kind)
            if value == "auto" and optional:  # the setting's own choice, as its environment variable spells it
                changes[name] = None
            elif value in ("1", "true", "yes", "on", "0", "false", "no", "off"):
                changes[name] = value in ("1", "true", "yes", "on")
            else:
                raise ValueError(f"--set {item!r}: {name} takes 0 or 1" + (", auto or none" if optional else ""))
        elif int in (kind, *typing.get_args(kind)):
            changes[name] = int(text)
        else:  # str, and the kernel pin in its text form (override parses it)
            changes[name] = text
    return changes


def child_runs(script: str, argv: list[str], processes: int, env: dict | None = None) -> list:
    """What each of ``processes`` fresh processes of ``python script --child *argv`` prints as JSON on its last line
    (a script's measurement in processes of their own; ``env``: their environment, this one's by default)."""
    runs = []
    for _ in range(processes):
        cmd = [sys.executable, script, "--child", *argv]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return runs


def write_json(path: str | None, result: dict) -> None:
    """Writes ``result`` to ``path`` (indented) when a path is given."""
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
