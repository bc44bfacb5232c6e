"""``lightning-attention bench decode``: decode step latency vs batch, with the floor, and flat memory.

Times through ``lightning_attention/bench/decode_timing.py`` (written with the decode kernel):

- ``time_decode_step(batch, heads, k_dim, v_dim, dtype, cuda_graph, *, device) -> dict`` with, in µs, ``ours_us``
  (per step, host included), ``ours_gpu_us`` (device time, ``do_bench``), ``ours_graph_us`` / ``ours_graph_gpu_us``
  (CUDA-graph replay, when ``cuda_graph``), the same with ``fla_`` when FLA's ``fused_recurrent_simple_gla`` ran,
  and ``floor_us`` (state bytes at the nominal 3.0 TB/s);
- ``decode_memory_flat(tokens, *, heads, k_dim, v_dim, device) -> {"runs": [{"tokens", "peak_bytes",
  "kv_cache_bytes", ...}], "flat": bool}``.

Beside ``floor_us`` the figure draws this run's floor: :func:`metrics.decode_step_bytes` (fp32 state read and
written once, plus q, k, v, o) over the copy bandwidth measured in the same run. Until the timing module exists
this subcommand says so, records the skip and still writes JSON and a figure saying why it is empty.
"""

import pathlib

import torch

from lightning_attention.bench import metrics
from lightning_attention.bench.external import call_with_supported, find_function
from lightning_attention.bench.progress import progress
from lightning_attention.bench.results import ResultWriter, clean, fmt, format_table, load_plots
from lightning_attention.bench.timing import measure_copy_bandwidth, measured, record_failure, release

TIMING_MODULE = "lightning_attention.bench.decode_timing"
BATCHES = (1, 8, 64, 256)
MEMORY_TOKENS = (1024, 1048576)
QUICK = {"batches": (1, 4), "heads": 2, "k_dim": 32, "v_dim": 32, "tokens": (16, 256)}
# result key -> figure label (µs)
SERIES = {
    "ours_us": "ours",
    "ours_gpu_us": "ours, GPU time",
    "ours_graph_us": "ours, CUDA graph",
    "fla_us": "FLA fused_recurrent",
    "fla_gpu_us": "FLA fused_recurrent, GPU time",
    "fla_graph_us": "FLA fused_recurrent, CUDA graph",
    "floor_us": "floor (3.0 TB/s nominal)",
}
TABLE = (
    "ours_us",
    "ours_gpu_us",
    "ours_graph_us",
    "fla_us",
    "fla_graph_us",
    "speedup_vs_fla",
    "floor_us",
    "gpu_vs_floor",
)


def run(args, device: torch.device, writer: ResultWriter, out: pathlib.Path) -> dict:
    heads, k_dim, v_dim = (QUICK["heads"], QUICK["k_dim"], QUICK["v_dim"]) if args.quick else (16, 128, 128)
    batches = args.batches or (QUICK["batches"] if args.quick else BATCHES)
    tokens = args.memory_tokens or (QUICK["tokens"] if args.quick else MEMORY_TOKENS)
    dtype = torch.bfloat16
    writer.set("decode_shape", {"heads": heads, "k_dim": k_dim, "v_dim": v_dim, "dtype": "bfloat16"})
    bandwidth = measure_copy_bandwidth(device, args.quick, args.warmup_ms, args.rep_ms)
    writer.set("copy_bandwidth", bandwidth)
    floor_us = {
        b: 1e3 * metrics.floor_ms(metrics.decode_step_bytes(b, heads, k_dim, v_dim, dtype), bandwidth["bytes_per_s"])
        for b in batches
    }
    writer.set("floor_us", {str(b): us for b, us in floor_us.items()})

    time_step, where = find_function(TIMING_MODULE, ("time_decode_step",))
    writer.set("latency_source", where)
    if time_step is None:
        writer.skip("decode latency", where)
    else:
        graph = device.type == "cuda"  # one call times both the plain and the graph-replayed step
        for batch in progress(batches, desc="decode", unit="batch"):
            record = {"batch": batch, "cuda_graph": graph, "floor_run_us": floor_us[batch]}
            try:
                result = call_with_supported(
                    time_step,
                    batch,
                    heads=heads,
                    k_dim=k_dim,
                    v_dim=v_dim,
                    dtype=dtype,
                    cuda_graph=graph,
                    device=device,
                )
                record.update(status="ok", result=clean(result))
                if result.get("fla_skipped"):
                    record["fla_skipped"] = result["fla_skipped"]
            except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
                record_failure(record, exc)
            finally:
                release(device)
            writer.add("latency", record)
        for reason in {r["fla_skipped"] for r in writer.doc.get("latency", []) if r.get("fla_skipped")}:
            writer.skip("FLA decode baseline", reason)

    memory_flat, where = find_function(TIMING_MODULE, ("decode_memory_flat",))
    writer.set("memory_source", where)
    if memory_flat is None:
        writer.skip("decode memory", where)
    else:
        writer.set("memory", measured(
            device, call_with_supported, memory_flat, tokens=tuple(tokens), heads=heads, k_dim=k_dim, v_dim=v_dim,
            dtype=dtype, device=device,
        ))  # fmt: skip
    figures = report(writer.doc, out, writer)
    return {"figures": figures, "skipped": len(writer.doc["skipped"])}


def report(doc: dict, out: pathlib.Path, writer: ResultWriter | None = None) -> list[str]:
    """Table and figures from a decode JSON document (a fresh run, or ``--replot`` of a saved one)."""
    latency = doc.get("latency", [])
    rows = []
    for r in latency:
        res = r.get("result", {}) if r["status"] == "ok" else {}
        rows.append([str(r["batch"]), r["status"], *(fmt(res.get(k)) for k in TABLE), fmt(r.get("floor_run_us"))])
    if rows:
        print(format_table(["batch", "status", *TABLE, "floor_run_us"], rows))
    memory = doc.get("memory")
    if memory:
        res = memory.get("result", {})
        print(f"decode memory ({res.get('metric', memory.get('error'))}): flat = {res.get('flat')}")

    plots = load_plots(doc, writer)
    if plots is None:
        return []
    line, shape = doc["machine_line"], doc.get("decode_shape", {})
    dims = f"H={shape.get('heads')}, K={shape.get('k_dim')}, V={shape.get('v_dim')}"
    figures = []
    if not latency:
        figures.append(plots.missing_part(out / "decode_latency.png", "decode step latency", doc, "latency_source"))
    else:
        series = {"floor (this run's copy bandwidth)": [(int(b), us) for b, us in doc.get("floor_us", {}).items()]}
        for r in latency:
            for key, label in SERIES.items():
                value = r.get("result", {}).get(key)
                if isinstance(value, (int, float)):
                    series.setdefault(label, []).append((r["batch"], float(value)))
        figures.append(
            plots.decode_latency(
                series, out / "decode_latency.png", f"decode step latency, {dims}, bf16 q/k/v, fp32 state", line
            )
        )
    if not memory or memory.get("status") != "ok":
        error = memory.get("error") if memory else None
        figures.append(plots.missing_part(out / "decode_memory.png", "decode memory", doc, "memory_source", error))
    else:
        res = memory["result"]
        runs = res.get("runs", [])
        series = {
            f"peak memory ({res.get('metric', 'bytes')})": [(r["tokens"], r["peak_bytes"] / 2**20) for r in runs],
            "a KV cache of the same tokens (for comparison)": [
                (r["tokens"], r["kv_cache_bytes"] / 2**20) for r in runs
            ],
        }
        figures.append(
            plots.xy_lines(
                series,
                "decoded tokens (one sequence)",
                "MiB",
                out / "decode_memory.png",
                f"decode memory, {dims}: flat = {res.get('flat')}",
                line,
                logx=True,
                logy=True,
            )
        )
    names = [p.name for p in figures]
    if writer is not None:
        writer.set("figures", names)
    return names
