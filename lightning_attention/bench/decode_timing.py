"""Decode-step timing and the constant-memory generation loop, as plain functions for the bench CLI.

- :func:`time_decode_step`: one step of :func:`lightning_attention.lightning_attn_decode` (bf16 q/k/v, fp32 state
  pool addressed through ``state_indices``, ``out=``) against FLA's ``fused_recurrent_simple_gla`` with T = 1 (when
  ``fla`` imports and the device is CUDA) and against the floor of reading and writing the fp32 state once.
- :func:`decode_memory_flat`: a kernel-level loop decoding N tokens of one sequence (on CUDA as replays of a
  CUDA graph of 1024 steps, so 1M tokens take seconds); peak memory at each N.

Two clocks, because a decode step at small batch is bound by host overhead, not by the GPU:

- ``*_us`` (per step, host included): back-to-back steps between two synchronisations, divided by their number —
  what a generation loop pays per token (the larger of host overhead and GPU time);
- ``*_gpu_us``: ``triton.testing.do_bench`` (CUDA events around each call, L2 flushed in between) — device time
  with the state coming from HBM, the number to hold against the floor at batch 64 and 256.

With ``cuda_graph=True`` the step is also captured in a CUDA graph (possible because of ``out=``) and replays are
timed the same two ways (``*_graph_us``, ``*_graph_gpu_us``). All times are medians in microseconds.
"""

import gc
import os
import statistics
import time

import torch

import lightning_attention as la
from lightning_attention import settings
from lightning_attention.bench.timing import graphed
from lightning_attention.utils.dtypes import dtype_name

HBM_BYTES_PER_S = 3.0e12  # H100 80GB copy ceiling (3.02 TB/s, docs/design.md "Benchmark grids")


def state_floor_us(batch: int, heads: int, k_dim: int, v_dim: int) -> float:
    """Microseconds to read and write the fp32 state once at :data:`HBM_BYTES_PER_S` (the issue's floor)."""
    return 2 * batch * heads * k_dim * v_dim * 4 / HBM_BYTES_PER_S * 1e6


def _default_device(device) -> torch.device:
    if device is not None:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _host_inclusive_us(fn, device: torch.device, *, steps: int, reps: int) -> float:
    """Median over ``reps`` rounds of (``steps`` back-to-back calls between two syncs) / steps, in µs."""
    per_step = []
    for _ in range(reps):
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        _sync(device)
        per_step.append((time.perf_counter() - t0) / steps * 1e6)
    return statistics.median(per_step)


def _gpu_us(fn, device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")) * 1e3


def _time_all(prefix: str, fn, device: torch.device, cuda_graph: bool, steps: int, reps: int, warmup: int) -> dict:
    for _ in range(warmup):  # compile / autotune / allocator warm-up
        fn()
    _sync(device)
    res = {
        f"{prefix}_us": _host_inclusive_us(fn, device, steps=steps, reps=reps),
        f"{prefix}_gpu_us": _gpu_us(fn, device),
    }
    if cuda_graph and device.type == "cuda":
        try:
            replay = graphed(fn, device)
        except Exception as e:  # a baseline that cannot be captured is reported, not fatal
            res[f"{prefix}_graph_error"] = f"{type(e).__name__}: {e}"
        else:
            res[f"{prefix}_graph_us"] = _host_inclusive_us(replay, device, steps=steps, reps=reps)
            res[f"{prefix}_graph_gpu_us"] = _gpu_us(replay, device)
    return res


def _fla_step(q, k, v, slope, state):
    """FLA's decode step as its layers run it: T = 1, new state returned (not in place), no state pool."""
    try:
        from fla.ops.simple_gla import fused_recurrent_simple_gla
    except ImportError as e:
        return None, f"fla not importable: {e}"
    g_gamma = -slope  # FLA's per-head log decay: λ = exp(g_gamma)
    q1, k1, v1 = q[:, None], k[:, None], v[:, None]  # [B, 1, H, D]

    def step():
        return fused_recurrent_simple_gla(
            q1, k1, v1, g_gamma=g_gamma, scale=1.0, initial_state=state, output_final_state=True
        )

    return step, None


def time_decode_step(
    batch: int,
    heads: int = 16,
    k_dim: int = 128,
    v_dim: int = 128,
    dtype: torch.dtype = torch.bfloat16,
    cuda_graph: bool = False,
    *,
    device=None,
    steps: int | None = None,
    reps: int = 20,
    warmup: int = 10,
    seed: int = 0,
) -> dict:
    """Median decode-step time of ours and of FLA ``fused_recurrent_simple_gla`` (T = 1), and the state floor.

    Ours: ``lightning_attn_decode(q, k, v, pool, slope, state_indices=idx, out=out)`` with q, k ``[batch, heads,
    k_dim]``, v ``[batch, heads, v_dim]`` in ``dtype``, pool ``[batch, heads, k_dim, v_dim]`` fp32 addressed through
    a permutation ``idx`` (a serving pool), TNL slopes. FLA runs on the same q/k/v/slope and a dense state.

    Returns a dict: ``ours_us``, ``ours_gpu_us`` (+ ``ours_graph_us``, ``ours_graph_gpu_us`` with ``cuda_graph``),
    the same keys with ``fla_`` when FLA ran (else ``fla_skipped``: why), ``floor_us``, ``state_bytes``, ratios
    ``speedup_vs_fla`` (fla_us / ours_us, host-inclusive) and ``gpu_vs_floor`` (ours_gpu_us / floor_us), and the
    configuration. On CPU everything runs (interpreter or PyTorch path) but only as a smoke test.
    """
    device = _default_device(device)
    steps = steps if steps is not None else (100 if device.type == "cuda" else 2)
    g = torch.Generator(device="cpu").manual_seed(seed)
    q, k = (torch.randn(batch, heads, k_dim, generator=g).to(device=device, dtype=dtype) for _ in range(2))
    v = torch.randn(batch, heads, v_dim, generator=g).to(device=device, dtype=dtype)
    k = k * k_dim**-0.5  # keeps the undecayed heads' state growth modest over thousands of timed steps
    slope = la.tnl_slopes(heads, 0, 1).to(device=device, dtype=torch.float32)
    pool = torch.zeros(batch, heads, k_dim, v_dim, device=device, dtype=torch.float32)
    idx = torch.randperm(batch, generator=g).to(device=device, dtype=torch.int32)
    out = torch.empty(batch, heads, v_dim, device=device, dtype=dtype)

    def ours():
        la.lightning_attn_decode(q, k, v, pool, slope, state_indices=idx, out=out)

    res = {
        "batch": batch,
        "heads": heads,
        "k_dim": k_dim,
        "v_dim": v_dim,
        "dtype": dtype_name(dtype),
        "device": str(device),
        "backend": settings.current().backend,
        "cuda_graph": cuda_graph and device.type == "cuda",
        "state_bytes": batch * heads * k_dim * v_dim * 4,
        "floor_us": state_floor_us(batch, heads, k_dim, v_dim),
    }
    res.update(_time_all("ours", ours, device, cuda_graph, steps, reps, warmup))
    if not bool(torch.isfinite(pool).all()):
        raise RuntimeError("decode benchmark produced non-finite states")

    fla_step, why = (None, "FLA needs a CUDA device") if device.type != "cuda" else _fla_step(q, k, v, slope, pool)
    if fla_step is None:
        res["fla_skipped"] = why
    else:
        res.update(_time_all("fla", fla_step, device, cuda_graph, steps, reps, warmup))
        res["speedup_vs_fla"] = res["fla_us"] / res["ours_us"]
        if "ours_graph_us" in res and "fla_graph_us" in res:
            res["graph_speedup_vs_fla"] = res["fla_graph_us"] / res["ours_graph_us"]
    if res["ours_gpu_us"] is not None:
        res["gpu_vs_floor"] = res["ours_gpu_us"] / res["floor_us"]
    if res.get("ours_graph_gpu_us") is not None:
        res["graph_gpu_vs_floor"] = res["ours_graph_gpu_us"] / res["floor_us"]
    return res


def _rss_bytes() -> int | None:
    """Resident set size of this process (Linux); the CPU stand-in for the CUDA allocator's peak."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _graphed_block(step, steps: int, device: torch.device):
    """Captures ``step(t)`` for t = 0 .. steps - 1 in one CUDA graph (after warm-up calls on a side stream, which
    compile the kernel and settle its launch path); returns the graph's replay."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for t in range(3):
            step(t)
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for t in range(steps):
            step(t)
    return graph.replay


def decode_memory_flat(
    tokens=(1024, 1048576),
    *,
    heads: int = 16,
    k_dim: int = 128,
    v_dim: int = 128,
    dtype: torch.dtype = torch.bfloat16,
    device=None,
    ring: int = 64,
    block: int = 1024,
    cuda_graph: bool | None = None,
    verbose: bool = True,
) -> dict:
    """Decodes ``n`` tokens of one sequence for each ``n`` in ``tokens`` and records the peak memory of each loop.

    The loop is what a generator runs, minus the model: each step calls ``lightning_attn_decode`` on the next token
    (q, k, v ``[1, heads, k_dim|v_dim]`` cycled from a ring of ``ring`` random tokens so the inputs cost nothing per
    step). The only thing carried between steps is the fp32 state ``[1, heads, k_dim, v_dim]``, so peak memory does
    not depend on ``n``; a KV cache would grow by ``2 · heads · k_dim · 2`` bytes per token (reported as
    ``kv_cache_bytes`` for comparison).

    Two ways to run the loop:

    - CUDA graph (default on CUDA): ``block`` consecutive steps (``min(block, min(tokens))``) writing into one
      ``out`` buffer ``[1, heads, v_dim]`` are captured in one CUDA graph, and ``n`` tokens are ``n // block``
      replays (plus ``n % block`` eager steps). A Python loop of 1M eager steps costs ~50 s of host time on an H100
      host; 1024 replays of a 1024-step graph cost the GPU time of the steps. The peak is measured over the replays
      (the graph was captured, and its kernels compiled, before the first run).
    - eager (CPU, or ``cuda_graph=False``): one Python call per token, without ``out=`` (the step allocates o and
      frees it, as a plain generation loop would).

    Returns ``{"device", "metric", "mode", "steps_per_graph", "runs": [{"tokens", "peak_bytes", "start_bytes",
    "seconds", "us_per_token", "graph_replays", "state_finite", "kv_cache_bytes"}, ...], "flat": bool}``. On CUDA
    ``peak_bytes`` is ``torch.cuda.max_memory_allocated`` over the run after ``reset_peak_memory_stats`` (an exact
    allocator count: flat means equal); on CPU (no allocator statistics) it is the process RSS after the loop —
    keep ``tokens`` tiny there.
    """
    device = _default_device(device)
    use_graph = device.type == "cuda" and (cuda_graph is None or cuda_graph)
    g = torch.Generator(device="cpu").manual_seed(0)
    slope = la.tnl_slopes(heads, 0, 1).to(device=device, dtype=torch.float32)
    qs, ks = (torch.randn(ring, 1, heads, k_dim, generator=g).to(device=device, dtype=dtype) for _ in range(2))
    vs = torch.randn(ring, 1, heads, v_dim, generator=g).to(device=device, dtype=dtype)
    ks = ks * k_dim**-0.5
    state = torch.zeros(1, heads, k_dim, v_dim, device=device, dtype=torch.float32)
    out = torch.empty(1, heads, v_dim, device=device, dtype=dtype)

    def step(t: int, out=out) -> None:
        j = t % ring
        la.lightning_attn_decode(qs[j], ks[j], vs[j], state, slope, out=out)

    steps_per_graph = min(block, *tokens) if use_graph and tokens else 0
    # one step first: compilation and the first launch stay out of every run's seconds
    step(0, out=None)
    replay = _graphed_block(step, steps_per_graph, device) if steps_per_graph else None
    runs = []
    for n in tokens:
        state.zero_()
        gc.collect()
        _sync(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            start = torch.cuda.memory_allocated(device)
        else:
            start = _rss_bytes()
        replays = n // steps_per_graph if replay is not None else 0
        t0 = time.perf_counter()
        for _ in range(replays):
            replay()
        for t in range(replays * steps_per_graph, n):
            step(t, out=out if replay is not None else None)
        _sync(device)
        seconds = time.perf_counter() - t0
        peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else _rss_bytes()
        run = {
            "tokens": n,
            "peak_bytes": peak,
            "start_bytes": start,
            "seconds": seconds,
            "us_per_token": seconds / max(n, 1) * 1e6,
            "graph_replays": replays,
            "state_finite": bool(torch.isfinite(state).all()),
            "kv_cache_bytes": 2 * n * heads * k_dim * torch.finfo(dtype).bits // 8,
        }
        runs.append(run)
        if verbose:
            print(
                f"decode {n:>9,d} tokens: peak {peak / 2**20:9.3f} MiB (start {start / 2**20:9.3f} MiB), "
                f"{seconds:8.2f} s, {run['us_per_token']:7.2f} us/token"
                f"{f' ({replays} graph replays)' if replays else ''}; a KV cache would hold "
                f"{run['kv_cache_bytes'] / 2**20:,.1f} MiB"
            )
    peaks = [r["peak_bytes"] for r in runs]
    # CUDA peaks are exact allocator counts: equal means flat. RSS moves with the interpreter: allow 1 MiB.
    slack = 0 if device.type == "cuda" else 2**20
    flat = None if None in peaks else max(peaks) - min(peaks) <= slack
    return {
        "device": str(device),
        "metric": "torch.cuda.max_memory_allocated" if device.type == "cuda" else "process RSS",
        "mode": f"cuda graph of {steps_per_graph} steps" if steps_per_graph else "eager",
        "steps_per_graph": steps_per_graph,
        "runs": runs,
        "flat": flat,
    }
