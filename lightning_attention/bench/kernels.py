"""``lightning-attention bench kernels``: speed, memory, accuracy and cold start of every ``lightning_attn`` provider.

For each head dim and grid (docs/design.md, "Benchmark grids": (a) a 65,536-token budget with batch = 65536 / T,
(b) batch 1 up to 1M tokens; and the varlen point, the same budget as packed sequences of mixed lengths) and each
provider (:mod:`.providers`), provider-major so a failing provider fails alone:

1. cold start: wall time of the first fwd+bwd call of a new shape class (compile + autotune), for ours and FLA;
2. two warm-up calls, then fwd and fwd+bwd medians (``triton.testing.do_bench`` on CUDA), each with the GPU's SM
   clock over its measurement and the share of it under the power cap (:mod:`.clocks`); with ``--settle-s`` each
   measurement comes after that many seconds of the same call back to back, so it times the sustained state;
3. peak memory of one fwd+bwd and the workspace (:func:`metrics.workspace_bytes`), on CUDA;
4. tokens/s, TFLOP/s, the HBM floor from the copy bandwidth measured at the start of the run, and the ratio to it.

Then the relative L2 error of o, dq, dk, dv vs float64 at a small size, the speedups of ours over every other
provider measured in the same run, tables, JSON (rewritten after every record) and PNG figures. An out-of-memory
or any other exception is recorded for that provider and shape, and the run goes on.
"""

import pathlib

import torch

from lightning_attention.bench import clocks, metrics, providers
from lightning_attention.bench.progress import progress, write
from lightning_attention.bench.registry import Provider, Shape, ShapeSet, head_class_of
from lightning_attention.bench.results import ResultWriter, fmt, format_table, load_plots
from lightning_attention.bench.timing import (
    bench,
    graphed,
    measure_copy_bandwidth,
    peak_memory,
    record_failure,
    release,
    wall_seconds,
)
from lightning_attention.utils.testing import relative_error

OP = providers.LIGHTNING_ATTN


def select_providers(ours: list[str], baselines: list[str], device: torch.device, writer: ResultWriter):
    """The providers that can run here; the others are recorded as skipped with the reason."""
    chosen = []
    for name in [providers.OURS_PROVIDER[o] for o in ours] + baselines:
        provider = OP.providers[name]
        reason = provider.available(device)
        if reason is None:
            chosen.append(provider)
        else:
            writer.skip(f"provider {name}", reason)
    return chosen


def measure_case(
    provider: Provider,
    shape: Shape,
    grid: str,
    device: torch.device,
    bandwidth: float,
    *,
    cold: bool,
    warmup_ms: float,
    rep_ms: float,
    seed: int,
    cuda_graphs: bool = False,
    sampler: clocks.Sampler | None = None,
    settle_s: float = 0.0,
) -> dict:
    """Every number of one (provider, shape) point; never raises for a provider failure (status says what happened).
    ``cuda_graphs``: also the fwd+bwd as a CUDA-graph replay (:func:`_graph_replay`). ``sampler``: the clock of each
    timed measurement, as ``<timer>_sm_mhz`` (the window's mean) and ``<timer>_capped_share``. ``settle_s``: each
    timed measurement after that many seconds of the same call back to back (:func:`.timing.settle`)."""
    record = {"grid": grid, "provider": provider.name, "family": provider.family, **shape.to_json()}
    record["tokens"] = shape.tokens
    if provider.max_seqlen is not None and shape.seqlen > provider.max_seqlen:
        record.update(status="skipped", error=f"T > {provider.max_seqlen} is outside this provider's range")
        return record
    if shape.lengths is not None and not provider.varlen:
        record.update(status="skipped", error="takes no packed sequences")
        return record
    fwd_bytes, fwdbwd_bytes = OP.io_bytes(shape)
    flops_fwd, flops_fwdbwd = (provider.flops or OP.flops)(shape)
    record.update(
        io_bytes_fwd=fwd_bytes,
        io_bytes_fwdbwd=fwdbwd_bytes,
        floor_fwd_ms=metrics.floor_ms(fwd_bytes, bandwidth),
        floor_fwdbwd_ms=metrics.floor_ms(fwdbwd_bytes, bandwidth),
        flops_fwd=flops_fwd,
        flops_fwdbwd=flops_fwdbwd,
    )
    inputs = prepared = None
    try:
        inputs = OP.make_inputs(shape, device, seed)
        prepared = provider.prepare(inputs)
        if cold:
            record["cold_start_s"] = wall_seconds(prepared.forward_backward, device)
        for _ in range(2 if device.type == "cuda" else 0):  # finish any autotuning before the clock runs
            _clear(prepared.leaves)
            prepared.forward_backward()
        timer = {"warmup_ms": warmup_ms, "rep_ms": rep_ms, "grad_to_none": prepared.leaves, "sampler": sampler,
                 "settle_s": settle_s}  # fmt: skip
        fwd = bench(prepared.run_forward, device, **timer)
        fwdbwd = bench(prepared.forward_backward, device, **timer)
        record.update(
            status="ok",
            fwd_ms=fwd.median_ms,
            fwd_p20_ms=fwd.p20_ms,
            fwd_p80_ms=fwd.p80_ms,
            fwdbwd_ms=fwdbwd.median_ms,
            fwdbwd_p20_ms=fwdbwd.p20_ms,
            fwdbwd_p80_ms=fwdbwd.p80_ms,
            tokens_per_s_fwd=metrics.tokens_per_s(shape.tokens, fwd.median_ms),
            tokens_per_s_fwdbwd=metrics.tokens_per_s(shape.tokens, fwdbwd.median_ms),
            tflops_fwd=metrics.tflops(flops_fwd, fwd.median_ms),
            tflops_fwdbwd=metrics.tflops(flops_fwdbwd, fwdbwd.median_ms),
            floor_ratio_fwd=fwd.median_ms / record["floor_fwd_ms"],
            floor_ratio_fwdbwd=fwdbwd.median_ms / record["floor_fwdbwd_ms"],
            **clock_fields("fwd", fwd),
            **clock_fields("fwdbwd", fwdbwd),
        )
        _clear(prepared.leaves)
        memory = peak_memory(prepared.forward_backward, device)
        if memory is not None:
            baseline, peak = memory
            workspace = metrics.workspace_bytes(
                peak, baseline, metrics.output_bytes(shape), metrics.gradient_bytes(shape)
            )
            record.update(
                peak_bytes=peak - baseline + _resident_bytes(prepared, inputs),
                workspace_bytes=workspace,
                workspace_ratio=workspace / metrics.input_bytes(shape),
            )
        if cuda_graphs and device.type == "cuda":
            record.update(_graph_replay(prepared, shape, device, warmup_ms, rep_ms, sampler, settle_s))
            if "fwdbwd_graph_ms" in record:
                record["floor_ratio_fwdbwd_graph"] = record["fwdbwd_graph_ms"] / record["floor_fwdbwd_ms"]
    except Exception as exc:  # noqa: BLE001 - one provider failing must not stop the run
        record_failure(record, exc)
    finally:
        del inputs, prepared
        release(device)
    return record


def clock_fields(timer: str, timing) -> dict:
    """``<timer>_sm_mhz`` and ``<timer>_capped_share`` of a :class:`.timing.Timing` whose clock was sampled."""
    clock = timing.clock or {}
    if not clock.get("samples"):
        return {}
    return {f"{timer}_sm_mhz": clock["sm_mhz_mean"], f"{timer}_capped_share": clock["capped_share"]}


def _graph_replay(prepared, shape: Shape, device: torch.device, warmup_ms: float, rep_ms: float,
                  sampler: clocks.Sampler | None = None, settle_s: float = 0.0) -> dict:  # fmt: skip
    """The fwd+bwd captured once in a CUDA graph and timed as replays: the device's time without the host's (launches,
    autograd), which the grid (b) target lets take out at batch 1. A provider that cannot be captured gets the reason
    instead of a time (its plain timing stands)."""

    def fresh_gradients():  # as the plain timing (grad_to_none): no accumulation into the previous call's .grad
        _clear(prepared.leaves)  # host-side, so it runs at capture: the captured backward assigns, never adds
        prepared.forward_backward()

    try:
        replay = graphed(fresh_gradients, device)
    except Exception as exc:  # noqa: BLE001 - a capture failure is a finding about the provider, not a crash
        return {"fwdbwd_graph_error": f"{type(exc).__name__}: {exc}"[:300]}
    timing = bench(replay, device, warmup_ms=warmup_ms, rep_ms=rep_ms, sampler=sampler, settle_s=settle_s)
    return {
        "fwdbwd_graph_ms": timing.median_ms,
        "fwdbwd_graph_p20_ms": timing.p20_ms,
        "fwdbwd_graph_p80_ms": timing.p80_ms,
        "tokens_per_s_fwdbwd_graph": metrics.tokens_per_s(shape.tokens, timing.median_ms),
        **clock_fields("fwdbwd_graph", timing),
    }


def _clear(leaves: list[torch.Tensor]) -> None:
    for x in leaves:
        x.grad = None


def _resident_bytes(prepared, inputs) -> int:
    """Bytes of the tensors a user holds during the call: q, k, v and grad_output (as the provider laid them out)."""
    tensors = [*prepared.leaves, prepared.grad_output]
    return sum(t.numel() * t.element_size() for t in tensors)


def accuracy_reference(shape: Shape, device: torch.device, seed: int) -> list[torch.Tensor]:
    """float64 [o, dq, dk, dv] of the accuracy inputs of ``shape`` and ``seed`` (every provider gets the same)."""
    o_ref, grads_ref = OP.reference(OP.make_inputs(shape, device, seed))
    return [o_ref, *grads_ref]


def _record_errors(record: dict, got: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    for name, actual, exact in zip(("o", "dq", "dk", "dv"), got, expected):
        record[f"err_{name}"] = relative_error(actual, exact)
    record["err_max"] = max(record[f"err_{n}"] for n in ("o", "dq", "dk", "dv"))
    record["status"] = "ok"


def measure_accuracy(
    provider: Provider, shape: Shape, device: torch.device, seed: int, expected: list[torch.Tensor] | None = None
) -> dict:
    """Relative L2 error of o, dq, dk, dv vs float64 from the same rounded inputs (docs/design.md, "Testing
    discipline"); ``expected``: :func:`accuracy_reference` of the same shape and seed, computed here when None."""
    record = {"provider": provider.name, **shape.to_json()}
    if not provider.computes_op:
        record.update(status="skipped", error="computes softmax attention, not this op")
        return record
    inputs = prepared = None
    try:
        inputs = OP.make_inputs(shape, device, seed)
        prepared = provider.prepare(inputs)
        with prepared.context():
            o = prepared.forward()
            o.backward(prepared.grad_output)
        got = [prepared.to_library_layout(o.detach()), *prepared.gradients()]
        _record_errors(record, got, expected if expected is not None else accuracy_reference(shape, device, seed))
    except Exception as exc:  # noqa: BLE001
        record_failure(record, exc)
    finally:
        del inputs, prepared
        release(device)
    return record


def rounding_floor(shape: Shape, expected: list[torch.Tensor]) -> dict:
    """The accuracy record of the float64 result ``expected`` (:func:`accuracy_reference`) rounded to the inputs'
    dtype (provider ``rounding-floor``): the smallest error a kernel that returns that dtype can have
    (docs/design.md, "Precision")."""
    record = {"provider": "rounding-floor", **shape.to_json()}
    _record_errors(record, [x.to(shape.dtype) for x in expected], expected)
    return record


def compute_speedups(results: list[dict]) -> list[dict]:
    """baseline time / ours time for every (ours provider, other provider, grid, shape) measured in this run.

    'Ours' are the Triton providers; when none ran (a CPU smoke run) the PyTorch path stands in.
    """
    ok = [r for r in results if r.get("status") == "ok"]
    ours = sorted({r["provider"] for r in ok if r["family"] == "ours"}) or sorted(
        {r["provider"] for r in ok if r["family"] == "reference"}
    )
    index = {(r["provider"], r["grid"], r["seqlen"], r["batch"]): r for r in ok}
    rows = []
    for mine in ours:
        for (name, grid, seqlen, batch), other in index.items():
            if name == mine or name in ours:
                continue
            me = index.get((mine, grid, seqlen, batch))
            if me is None:
                continue
            rows.append(
                {
                    "grid": grid,
                    "seqlen": seqlen,
                    "batch": batch,
                    "ours": mine,
                    "baseline": name,
                    "fwd": metrics.speedup(other["fwd_ms"], me["fwd_ms"]),
                    "fwdbwd": metrics.speedup(other["fwdbwd_ms"], me["fwdbwd_ms"]),
                    # both sides as CUDA-graph replays (``--cuda-graphs``): device time without the host's
                    "fwdbwd_graph": metrics.speedup(other.get("fwdbwd_graph_ms"), me.get("fwdbwd_graph_ms")),
                }
            )
    return sorted(rows, key=lambda r: (r["grid"], r["ours"], r["baseline"], r["seqlen"]))


def runtime_table(results: list[dict], grid: str) -> str:
    rows = [r for r in results if r["grid"] == grid]
    names = list(dict.fromkeys(r["provider"] for r in rows))
    headers = ["T", "batch"] + [f"{n} fwd/fwdbwd ms" for n in names] + ["floor ms", "ours/floor", "workspace/q"]
    lines = []
    for seqlen in sorted({r["seqlen"] for r in rows}):
        at = {r["provider"]: r for r in rows if r["seqlen"] == seqlen}
        first = next(iter(at.values()))
        cells = [str(seqlen), str(first["batch"])]
        for n in names:
            r = at.get(n)
            if r is None:
                cells.append("-")
            elif r.get("status") != "ok":
                cells.append(r.get("status", "?").upper())
            else:
                cells.append(f"{fmt(r['fwd_ms'])}/{fmt(r['fwdbwd_ms'])}")
        cells.append(f"{fmt(first.get('floor_fwd_ms'))}/{fmt(first.get('floor_fwdbwd_ms'))}")
        # the first of our Triton providers that ran (else the PyTorch path), as in compute_speedups
        primary = next((at[n] for n in names if at.get(n, {}).get("family") == "ours"), None) or at.get("torch")
        if primary is None or primary.get("status") != "ok":
            cells += ["-", "-"]
        else:
            cells.append(f"{fmt(primary.get('floor_ratio_fwd'))}/{fmt(primary.get('floor_ratio_fwdbwd'))}")
            cells.append(fmt(primary.get("workspace_ratio")))
        lines.append(cells)
    return format_table(headers, lines)


def tokens_table(results: list[dict], grid: str) -> str:
    """Tokens/s of fwd+bwd per provider and T, with the flatness (max deviation from the mean) of each row; a second
    row per provider for the CUDA-graph replays where they were timed (``--cuda-graphs``)."""
    rows = [r for r in results if r["grid"] == grid]
    seqlens = sorted({r["seqlen"] for r in rows})
    lines = []
    for name in dict.fromkeys(r["provider"] for r in rows):
        at = {r["seqlen"]: r for r in rows if r["provider"] == name}
        for key, label in (("tokens_per_s_fwdbwd", name), ("tokens_per_s_fwdbwd_graph", f"{name} (graph)")):
            if key != "tokens_per_s_fwdbwd" and not any(key in r for r in at.values()):
                continue
            cells = [label]
            for t in seqlens:
                r = at.get(t)
                ok = r is not None and r.get("status") == "ok" and r.get(key) is not None
                cells.append(fmt(r[key]) if ok else (r.get("status", "-").upper() if r else "-"))
            cells.append(fmt(metrics.flatness(_ok_values(at, seqlens, key))))
            lines.append(cells)
    return format_table(["provider", *(f"T={t}" for t in seqlens), "±max"], lines)


def _ok_values(at: dict, seqlens: list[int], key: str) -> list[float]:
    """``key`` of the ok records among ``at`` (seqlen -> record) at ``seqlens``, where present."""
    return [at[t][key] for t in seqlens if at.get(t, {}).get("status") == "ok" and at[t].get(key) is not None]


def _shape_sets(args) -> list[tuple[int, ShapeSet]]:
    grids = ("a", "b") if args.grid == "all" else (args.grid,)
    quick = {"a": providers.quick_grid_a, "b": providers.quick_grid_b, "varlen": providers.quick_varlen_grid}
    sets = []
    for dim in args.head_dims:
        for g in grids:
            if args.quick:
                sets.append((dim, quick[g](dim)))
            elif g == "varlen":
                sets.append((dim, providers.varlen_grid(dim)))
            elif g == "a":
                seqlens = args.seqlens or providers.GRID_A_SEQLENS
                sets.append((dim, providers.grid_a(dim, args.tokens, seqlens=tuple(seqlens))))
            else:
                seqlens = args.seqlens or providers.GRID_B_SEQLENS
                sets.append((dim, providers.grid_b(dim, seqlens=tuple(seqlens))))
    return sets


def run(args, device: torch.device, writer: ResultWriter, out: pathlib.Path) -> dict:
    """The kernels benchmark; returns the summary for the final JSON line."""
    chosen = select_providers(args.ours, args.baselines, device, writer)
    bandwidth = measure_copy_bandwidth(device, args.quick, args.warmup_ms, args.rep_ms)
    writer.set("copy_bandwidth", bandwidth)
    print(f"copy bandwidth: {bandwidth['bytes_per_s'] / 1e9:.1f} GB/s (read + write of {bandwidth['bytes']} bytes)")
    sets = _shape_sets(args)
    writer.set("grids", {s.name: {"description": s.description, "head_dim": dim} for dim, s in sets})
    writer.set("providers", {p.name: {"label": p.label, "family": p.family} for p in chosen})
    seen_classes: set[tuple[str, str]] = set()
    total = sum(len(s.shapes) for _, s in sets) * len(chosen)
    sampler = clocks.start(device)
    gpu_limits = clocks.limits(device)
    if gpu_limits is not None:
        writer.set("gpu_limits", gpu_limits)
    try:
        with progress(total=total, desc="kernels", unit="case") as bar:
            for _, shape_set in sets:
                for provider in chosen:
                    for shape in shape_set.shapes:
                        bar.set_postfix_str(f"{provider.name} {shape.label()}")
                        key = (provider.name, shape.head_class)
                        cold = provider.cold_start and key not in seen_classes
                        seen_classes.add(key)
                        record = measure_case(
                            provider,
                            shape,
                            shape_set.name,
                            device,
                            bandwidth["bytes_per_s"],
                            cold=cold,
                            warmup_ms=args.warmup_ms,
                            rep_ms=args.rep_ms,
                            seed=args.seed,
                            cuda_graphs=getattr(args, "cuda_graphs", False),
                            sampler=sampler,
                            settle_s=getattr(args, "settle_s", 0.0),
                        )
                        writer.add("results", record)
                        if record["status"] not in ("ok", "skipped"):
                            write(f"{provider.name} {shape.label()}: {record['status']}: {record['error']}")
                        bar.update()
    finally:  # the poller is a process of its own: it must not outlive the run
        if sampler is not None:
            sampler.close()
    for dim in args.head_dims:
        shape = providers.accuracy_shape(dim, args.quick)
        expected = accuracy_reference(shape, device, args.seed)
        for provider in progress(chosen, desc=f"accuracy K=V={dim}", unit="provider"):
            writer.add("accuracy", measure_accuracy(provider, shape, device, args.seed, expected))
        writer.add("accuracy", rounding_floor(shape, expected))
        del expected
        release(device)

    results = writer.doc.get("results", [])
    writer.set("speedups", compute_speedups(results))
    writer.set(
        "cold_start",
        [
            {
                "provider": r["provider"],
                "shape_class": head_class_of(r),
                "seconds": r["cold_start_s"],
            }
            for r in results
            if r.get("cold_start_s") is not None
        ],
    )
    for key, doc_key in (("tokens_per_s_fwdbwd", "tokens_per_s_flatness"),
                         ("tokens_per_s_fwdbwd_graph", "tokens_per_s_flatness_graph")):  # fmt: skip
        flat = {}
        for name in writer.doc["grids"]:
            if "b-d" in name:
                for provider in chosen:
                    at = {r["seqlen"]: r for r in results if r["grid"] == name and r["provider"] == provider.name}
                    values = _ok_values(at, sorted(at), key)
                    if values:
                        flat[f"{provider.name}/{name}"] = metrics.flatness(values)
        if flat or doc_key == "tokens_per_s_flatness":
            writer.set(doc_key, flat)
    figures = report(writer.doc, out, writer)
    statuses = [r["status"] for r in results]
    return {
        "providers": [p.name for p in chosen],
        "cases": len(results),
        "ok": statuses.count("ok"),
        "oom": statuses.count("oom"),
        "error": statuses.count("error"),
        "figures": figures,
    }


def _print_section(title: str, headers: list[str], rows: list[list[str]]) -> None:
    """A titled table of the printed report, when the run has rows for it."""
    if rows:
        print(f"\n{title}")
        print(format_table(headers, rows))


def report(doc: dict, out: pathlib.Path, writer: ResultWriter | None = None) -> list[str]:
    """Tables and figures from a kernels JSON document (a fresh run, or ``--replot`` of a saved one)."""
    results = doc.get("results", [])
    grids = doc.get("grids", {})
    for name, grid in grids.items():
        print(f"\n{grid['description']}")
        print(runtime_table(results, name))
        if "b-d" in name:
            print(f"\ntokens/s, fwd+bwd, {grid['description']}")
            print(tokens_table(results, name))
    _print_section(
        "speedup of ours (baseline time / our time, measured in this run)",
        ["grid", "T", "ours", "vs", "fwd", "fwd+bwd"],
        [[s["grid"], str(s["seqlen"]), s["ours"], s["baseline"], fmt(s["fwd"]), fmt(s["fwdbwd"])]
         for s in doc.get("speedups", [])],
    )  # fmt: skip
    _print_section(
        "relative L2 error vs float64 (same rounded inputs)",
        ["provider", "K", "o", "dq", "dk", "dv", "status"],
        [[a["provider"], str(a["k_dim"]), *(fmt(a.get(f"err_{n}")) for n in ("o", "dq", "dk", "dv")), a["status"]]
         for a in doc.get("accuracy", [])],
    )  # fmt: skip
    _print_section(
        "cold start (first fwd+bwd call of a shape class: compile + autotune)",
        ["provider", "class", "s"],
        [[c["provider"], c["shape_class"], fmt(c["seconds"])] for c in doc.get("cold_start", [])],
    )

    plots = load_plots(doc, writer)
    if plots is None:
        return []
    labels = {name: p["label"] for name, p in doc.get("providers", {}).items()}
    line = doc["machine_line"]
    figures = []
    for name, grid in grids.items():
        rows = [r for r in results if r["grid"] == name]
        title = f"lightning_attn, {grid['description']}"
        dim = grid["head_dim"]
        if "b-d" in name:
            figures.append(plots.tokens_per_second(rows, labels, out / f"kernels_tokens_per_s_d{dim}.png", title, line))
        elif "varlen-d" in name:  # one point: its table says it all
            continue
        else:
            figures.append(plots.kernel_runtime(rows, labels, out / f"kernels_runtime_d{dim}.png", title, line))
            figures.append(plots.kernel_memory(rows, labels, out / f"kernels_memory_d{dim}.png", title, line))
    names = [p.name for p in figures]
    if writer is not None:
        writer.set("figures", names)
    return names
