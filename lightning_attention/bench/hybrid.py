"""``lightning-attention bench hybrid``: the hybrid softmax-intra / linear-inter chunk attention vs SDPA causal.

Times through ``lightning_attention/bench/hybrid_timing.py::time_hybrid(T, *, device, quick, ...) -> dict``
(``hybrid_fwd_ms``, ``hybrid_fwdbwd_ms``, ``sdpa_fwd_ms``, ``sdpa_fwdbwd_ms``, speedups; bf16, B = 1, H = 16, D = 128
by default), written with the hybrid attention; every ``*_ms`` field is drawn against T. Until that
module exists this subcommand says so, records the skip and still writes JSON and a figure saying why it is empty.
"""

import pathlib

import torch

from lightning_attention.bench.external import call_with_supported, find_function, numbers
from lightning_attention.bench.progress import progress
from lightning_attention.bench.results import ResultWriter, clean, fmt, format_table, load_plots
from lightning_attention.bench.timing import record_failure, release

TIMING_MODULE = "lightning_attention.bench.hybrid_timing"
SEQLENS = (4096, 8192, 16384, 32768, 65536)
QUICK_SEQLENS = (64, 128)
TABLE = ("hybrid_fwd_ms", "hybrid_fwdbwd_ms", "sdpa_fwd_ms", "sdpa_fwdbwd_ms", "speedup_fwd", "speedup_fwdbwd")


def run(args, device: torch.device, writer: ResultWriter, out: pathlib.Path) -> dict:
    seqlens = args.seqlens or (QUICK_SEQLENS if args.quick else SEQLENS)
    time_hybrid, where = find_function(TIMING_MODULE, ("time_hybrid",))
    writer.set("source", where)
    if time_hybrid is None:
        writer.skip("hybrid attention", where)
    else:
        hints = {"device": device, "quick": args.quick, "warmup_ms": args.warmup_ms, "rep_ms": args.rep_ms}
        if args.quick:  # a smoke run: small heads, several chunks per sequence
            hints.update(num_heads=2, head_dim=32, chunk_size=32)
        for seqlen in progress(seqlens, desc="hybrid", unit="T"):
            record = {"seqlen": seqlen}
            try:
                record.update(status="ok", result=clean(call_with_supported(time_hybrid, seqlen, **hints)))
            except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
                record_failure(record, exc)
            finally:
                release(device)
            writer.add("results", record)
    figures = report(writer.doc, out, writer)
    return {"figures": figures, "skipped": len(writer.doc["skipped"])}


def report(doc: dict, out: pathlib.Path, writer: ResultWriter | None = None) -> list[str]:
    """Table and figure from a hybrid JSON document (a fresh run, or ``--replot`` of a saved one)."""
    results = doc.get("results", [])
    if results:
        rows = [[str(r["seqlen"]), r["status"], *(fmt(r.get("result", {}).get(k)) for k in TABLE)] for r in results]
        print(format_table(["T", "status", *TABLE], rows))
    plots = load_plots(doc, writer)
    if plots is None:
        return []
    path = out / "hybrid_runtime.png"
    if not results:
        figure = plots.missing_part(path, "hybrid chunk attention", doc, "source")
    else:
        series: dict[str, list] = {}
        for r in results:
            for key, value in numbers(r.get("result", {})).items():
                if key.endswith("_ms"):  # times; sizes and ratios stay in the table
                    series.setdefault(key, []).append((r["seqlen"], value))
        figure = plots.xy_lines(
            series,
            "sequence length T",
            "time (ms)",
            path,
            "hybrid chunk attention vs SDPA causal",
            doc["machine_line"],
            logx=True,
            logy=True,
        )
    if writer is not None:
        writer.set("figures", [figure.name])
    return [figure.name]
