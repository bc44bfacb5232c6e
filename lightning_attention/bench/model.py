"""``lightning-attention bench model``: training tokens/s (per GPU) vs context, TNL vs LLaMA, and their loss curves.

Times through ``lightning_attention/bench/model_timing.py`` (written with the TNL model):
``time_training_step(arch, context, ...) -> dict`` (tokens/s of fwd + bwd + optimizer step, ≈40M parameters) and a
loss-curve function (the first of :data:`LOSS_FUNCTIONS` it defines) training both archs on the same corpus. Until
that module exists this subcommand says so, records the skip and still writes JSON and figures saying why they are
empty. Extra keyword hints (``quick``, ``device``, ``steps``) are passed only where the function accepts them.
"""

import pathlib

import torch

from lightning_attention.bench.external import call_with_supported, find_function, numbers
from lightning_attention.bench.progress import progress
from lightning_attention.bench.results import ResultWriter, clean, fmt, format_table, load_plots
from lightning_attention.bench.timing import measured, record_failure, release

TIMING_MODULE = "lightning_attention.bench.model_timing"
ARCHS = ("tnl", "llama")
CONTEXTS = (2048, 8192, 32768, 65536)
QUICK_CONTEXTS = (64, 128)
LOSS_FUNCTIONS = ("loss_curves", "train_loss_curves", "compare_loss_curves", "train_both")


def _tokens_per_s(values: dict[str, float]) -> float | None:
    """The throughput field of a timing result (the first key that names tokens per second)."""
    for key, value in values.items():
        k = key.lower()
        if "token" in k and ("per_s" in k or "/s" in k or "per_sec" in k or k.endswith("tps")):
            return value
    return None


def _curve(obj) -> list[tuple[float, float]]:
    """A loss curve as [(step, loss)] from a list of losses, a list of pairs, or a dict of step and loss lists."""
    if isinstance(obj, dict):
        steps = next((v for k, v in obj.items() if "step" in k.lower() and isinstance(v, (list, tuple))), None)
        losses = next((v for k, v in obj.items() if "loss" in k.lower() and isinstance(v, (list, tuple))), None)
        if losses is None:
            return []
        return list(zip(steps if steps is not None else range(len(losses)), losses))
    if isinstance(obj, (list, tuple)):
        if obj and isinstance(obj[0], (list, tuple)):
            return [(float(a), float(b)) for a, b in obj]
        return [(float(i), float(x)) for i, x in enumerate(obj)]
    return []


def run(args, device: torch.device, writer: ResultWriter, out: pathlib.Path) -> dict:
    contexts = args.contexts or (QUICK_CONTEXTS if args.quick else CONTEXTS)
    hints = {"device": device, "quick": args.quick}
    if args.quick:
        hints.update(steps=2, warmup_steps=1, batch_size=1)

    time_step, where = find_function(TIMING_MODULE, ("time_training_step",))
    writer.set("throughput_source", where)
    if time_step is None:
        writer.skip("model throughput", where)
    else:
        cases = [(a, c) for a in args.archs for c in contexts]
        for arch, context in progress(cases, desc="model", unit="case"):
            record = {"arch": arch, "context": context}
            try:
                result = call_with_supported(time_step, arch, context, **hints)
                record.update(status="ok", tokens_per_s=_tokens_per_s(numbers(result)), result=clean(result))
            except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
                record_failure(record, exc)
            finally:
                release(device)
            writer.add("throughput", record)

    loss_fn, where = find_function(TIMING_MODULE, LOSS_FUNCTIONS)
    writer.set("loss_source", where)
    if loss_fn is None:
        writer.skip("model loss curves", where)
    else:
        writer.set("loss_curves", measured(
            device, call_with_supported, loss_fn, archs=tuple(args.archs), **{**hints, "steps": args.loss_steps}
        ))  # fmt: skip
    figures = report(writer.doc, out, writer)
    return {"figures": figures, "skipped": len(writer.doc["skipped"])}


def report(doc: dict, out: pathlib.Path, writer: ResultWriter | None = None) -> list[str]:
    """Table and figures from a model JSON document (a fresh run, or ``--replot`` of a saved one)."""
    throughput = doc.get("throughput", [])
    per_gpu = bool(doc.get("machine", {}).get("gpu"))  # a CPU run is one process, not one GPU
    unit = "tokens/s/GPU" if per_gpu else "tokens/s"
    if throughput:
        print(
            format_table(
                ["arch", "context", unit, "status"],
                [[r["arch"], str(r["context"]), fmt(r.get("tokens_per_s")), r["status"]] for r in throughput],
            )
        )
    losses = doc.get("loss_curves", {})
    curves = {}
    if losses.get("status") == "ok" and isinstance(losses.get("result"), dict):
        curves = {arch: _curve(c) for arch, c in losses["result"].items()}
        curves = {arch: c for arch, c in curves.items() if c}
        for arch, c in curves.items():
            print(f"{arch}: loss {fmt(c[0][1])} -> {fmt(c[-1][1])} over {len(c)} points")

    plots = load_plots(doc, writer)
    if plots is None:
        return []
    line = doc["machine_line"]
    figures = []
    if not throughput:
        figures.append(
            plots.missing_part(out / "model_throughput.png", "training throughput", doc, "throughput_source")
        )
    else:
        series: dict[str, list] = {}
        for r in throughput:
            series.setdefault(r["arch"], []).append((r["context"], r.get("tokens_per_s")))
        figures.append(
            plots.xy_lines(
                series,
                "context length",
                "training tokens / s / GPU" if per_gpu else "training tokens / s (CPU)",
                out / "model_throughput.png",
                "training throughput, TNL vs LLaMA",
                line,
                logx=True,
            )
        )
    if not curves:
        error = losses.get("error")
        figures.append(plots.missing_part(out / "model_loss.png", "loss curves", doc, "loss_source", error))
    else:
        figures.append(
            plots.xy_lines(curves, "step", "loss", out / "model_loss.png", "loss curves, TNL vs LLaMA", line)
        )
    names = [p.name for p in figures]
    if writer is not None:
        writer.set("figures", names)
    return names
