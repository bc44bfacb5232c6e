"""PNG figures (matplotlib, Agg backend), each titled with the machine line.

- ``kernels_runtime_d{K}.png``: fwd and fwd+bwd time vs T, log-log, every provider and the HBM floor (Fig. 3 shape).
- ``kernels_memory_d{K}.png``: peak memory and workspace during fwd+bwd vs T (Fig. 4 shape).
- ``kernels_tokens_per_s_d{K}.png``: tokens/s vs T at batch 1 (the constant-speed claim), OOMs marked.
- ``decode_latency.png``, ``decode_memory.png``, ``model_throughput.png``, ``model_loss.png``, ``hybrid_runtime.png``.
"""

import pathlib
import textwrap

import matplotlib

matplotlib.use("Agg")  # files only, never a display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import ticker  # noqa: E402

_STYLE = {  # stable colours per provider across figures
    "ours-chunk": ("tab:red", "o"),
    "ours-recompute": ("tab:orange", "s"),
    "ours-split": ("tab:pink", "P"),
    "torch": ("tab:brown", "v"),
    "fla": ("tab:blue", "^"),
    "official": ("tab:green", "D"),
    "sdpa": ("tab:purple", "x"),
}


def _style(name: str):
    return _STYLE.get(name, (None, "o"))


# characters of the machine line per title row: 8-point text across the narrowest figure (6.4 in at 120 dpi) holds
# about 110; 130 cut both ends off the figures of the first H100 runs
_TITLE_WIDTH = 100


def _finish(fig, path: pathlib.Path, title: str, machine_line: str) -> pathlib.Path:
    fig.suptitle(title + "\n" + textwrap.fill(machine_line, _TITLE_WIDTH), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def placeholder(path: pathlib.Path, title: str, message: str, machine_line: str) -> pathlib.Path:
    """A figure that says why there is no data (a skipped part still leaves a file the report can point at)."""
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.axis("off")
    ax.text(0.5, 0.5, textwrap.fill(message, 80), ha="center", va="center", fontsize=9)
    return _finish(fig, path, title, machine_line)


def missing_part(path: pathlib.Path, title: str, doc: dict, source_key: str, error: str | None = None) -> pathlib.Path:
    """The :func:`placeholder` of a part of a run that has no data: its ``error`` when it failed, else why the run
    skipped it (the reason it recorded under ``doc[source_key]``)."""
    return placeholder(path, title, error or f"skipped: {doc.get(source_key)}", doc["machine_line"])


def _ok(records: list[dict], key: str) -> list[dict]:
    return [r for r in records if r.get("status") == "ok" and r.get(key) is not None]


def _by_provider(records: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in records:
        out.setdefault(r["provider"], []).append(r)
    return out


def _line(ax, rows: list[dict], x: str, y: str, name: str, label: str, scale: float = 1.0, **kw):
    rows = sorted(_ok(rows, y), key=lambda r: r[x])
    if not rows:
        return
    color, marker = _style(name)
    ax.plot([r[x] for r in rows], [r[y] * scale for r in rows], marker=marker, color=color, label=label, **kw)


def _size_label(n: float) -> str:
    n = int(n)
    if n >= 2**20 and n % 2**20 == 0:
        return f"{n // 2**20}M"
    if n >= 1024 and n % 1024 == 0:
        return f"{n // 1024}K"
    return str(n)


def _integer_ticks(ax, values) -> None:
    """Ticks at the measured sizes, labelled 1K / 64K / 1M (log axes otherwise show 2x10^0)."""
    values = sorted({v for v in values if v is not None})
    if values:
        ax.set_xticks(values, [_size_label(v) for v in values])
        ax.xaxis.set_minor_locator(ticker.NullLocator())


def _log_values(ax) -> None:
    """A log y axis labelled in plain numbers at 1, 2, 3, 5 × 10^n (call after ``set_yscale``): with the default
    locator a range within one decade, as the runtime figures' often is, carried one label (10^0)."""
    ax.yaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 3.0, 5.0)))
    ax.yaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(ticker.NullFormatter())


def _mark_failures(ax, rows: list[dict], x: str):
    """Failed points (OOM, error) as a text mark at the bottom of the axis, so absence is visible."""
    for r in rows:
        if r.get("status") in ("oom", "error"):
            ax.annotate(
                r["status"].upper(),
                (r[x], 0.02),
                xycoords=("data", "axes fraction"),
                color=_style(r["provider"])[0],
                fontsize=7,
                rotation=90,
            )


def kernel_runtime(records, labels, path, title, machine_line) -> pathlib.Path:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, (key, floor, name) in zip(
        axes, (("fwd_ms", "floor_fwd_ms", "forward"), ("fwdbwd_ms", "floor_fwdbwd_ms", "forward + backward"))
    ):
        for provider, rows in _by_provider(records).items():
            _line(ax, rows, "seqlen", key, provider, labels.get(provider, provider))
            _mark_failures(ax, rows, "seqlen")
        floors = sorted({(r["seqlen"], r[floor]) for r in records if r.get(floor) is not None})
        if floors:
            ax.plot(*zip(*floors), "k--", label="HBM floor")
        ax.set(xscale="log", yscale="log", xlabel="sequence length T", ylabel="time (ms)", title=name)
        _integer_ticks(ax, [r["seqlen"] for r in records])
        _log_values(ax)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    return _finish(fig, path, title, machine_line)


def kernel_memory(records, labels, path, title, machine_line) -> pathlib.Path:
    measured = _ok(records, "peak_bytes")
    if not measured:
        return placeholder(
            path, title, "memory is measured on CUDA only (no allocator statistics on CPU)", machine_line
        )
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, (key, name) in zip(axes, (("peak_bytes", "peak during fwd+bwd"), ("workspace_bytes", "workspace"))):
        for provider, rows in _by_provider(records).items():
            _line(ax, rows, "seqlen", key, provider, labels.get(provider, provider), scale=2.0**-30)
            _mark_failures(ax, rows, "seqlen")
        ax.set(xscale="log", xlabel="sequence length T", ylabel="GiB", title=name)
        _integer_ticks(ax, [r["seqlen"] for r in records])
        # workspace may be ~0 or slightly negative (allocator rounding): a linear y axis shows it honestly
        ax.set_yscale("log" if key == "peak_bytes" else "linear")
        if key == "peak_bytes":
            _log_values(ax)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    return _finish(fig, path, title, machine_line)


def tokens_per_second(records, labels, path, title, machine_line) -> pathlib.Path:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, (key, name) in zip(axes, (("tokens_per_s_fwd", "forward"), ("tokens_per_s_fwdbwd", "forward + backward"))):
        for provider, rows in _by_provider(records).items():
            _line(ax, rows, "seqlen", key, provider, labels.get(provider, provider))
            _mark_failures(ax, rows, "seqlen")
        ax.set(xscale="log", xlabel="sequence length T (batch 1)", ylabel="tokens / s", title=name)
        _integer_ticks(ax, [r["seqlen"] for r in records])
        ax.set_ylim(bottom=0)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    return _finish(fig, path, title, machine_line)


def decode_latency(series: dict[str, list[tuple[int, float]]], path, title, machine_line) -> pathlib.Path:
    """``series``: label -> [(batch, µs)]; labels containing 'floor' are drawn dashed black."""
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for label, points in sorted(series.items()):
        points = sorted(p for p in points if p[1] is not None)
        if not points:
            continue
        if "floor" in label:
            style = {"linestyle": "--", "color": "k" if "this run" in label else "grey"}
        else:
            style = {"marker": "o", "linestyle": ":" if "graph" in label else "-"}
        ax.plot(*zip(*points), label=label, **style)
    ax.set(xscale="log", yscale="log", xlabel="batch (sequences, one token each)", ylabel="step latency (µs)")
    _integer_ticks(ax, [b for points in series.values() for b, _ in points])
    _log_values(ax)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return _finish(fig, path, title, machine_line)


def xy_lines(
    series: dict[str, list[tuple[float, float]]], xlabel, ylabel, path, title, machine_line, logx=False, logy=False
):
    """Generic labelled lines: model throughput vs context, loss curves, hybrid runtime vs T."""
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for label, points in sorted(series.items()):
        points = sorted(p for p in points if p[1] is not None)
        if points:
            ax.plot(*zip(*points), marker="o" if len(points) < 30 else None, label=label)
    ax.set(xlabel=xlabel, ylabel=ylabel)
    if logx:
        ax.set_xscale("log")
        _integer_ticks(ax, [x for points in series.values() for x, _ in points])
    if logy:
        ax.set_yscale("log")
        _log_values(ax)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return _finish(fig, path, title, machine_line)
