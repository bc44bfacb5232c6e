"""Figures of ``bench model-quality`` (matplotlib, from the JSON document alone), each titled with the machine line.

- ``model_quality_curves.png``: validation (top) and training (bottom, a moving average) bits per byte against
  training tokens, one column per context: the mean over seeds and the band from the lowest to the highest seed;
- ``model_quality_sweep.png``: final validation bits per byte against the learning rate (diverged runs marked);
- ``model_quality_positions.png``: bits per byte by position bucket at the longest evaluated length, mean ± std
  over seeds, the training context marked;
- ``model_quality_copy.png``: the copy probe's second half (bars, mean ± std) and first half (ticks) per length.
"""

import pathlib

import torch

from lightning_attention.bench import plots
from lightning_attention.bench.model_quality_report import label, summarize

plt = plots.plt
COLORS = {"tnl": "tab:red", "minimax": "tab:orange", "hybrid": "tab:green", "llama": "tab:blue"}
SMOOTH_STEPS = 16  # moving average of the per-step training loss


def _std(values: torch.Tensor) -> list[float]:
    """Sample std over seeds (dim 0) of ``values [seeds, points]``; zeros for one seed."""
    return (values.std(0) if values.shape[0] > 1 else torch.zeros(values.shape[1], dtype=values.dtype)).tolist()


def _final_runs(doc: dict, context: int) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in doc.get("runs", []):
        s = r["spec"]
        if s["stage"] == "final" and s["context"] == context and r["curve"]["step"]:
            out.setdefault(s["arch"], []).append(r)
    return out


def _legend(ax) -> None:
    """The legend, or a note that the panel is empty (a call cut short by --time-limit draws what it has)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no finished runs yet", ha="center", va="center", transform=ax.transAxes)


def _band(ax, x, ys: list[list[float]], arch: str) -> None:
    n = min(len(y) for y in ys)
    values = torch.tensor([y[:n] for y in ys], dtype=torch.float64)  # [seeds, points]
    ax.plot(x[:n], values.mean(0).tolist(), color=COLORS.get(arch), label=f"{label(arch)} ({len(ys)} seeds)")
    if len(ys) > 1:
        ax.fill_between(x[:n], values.amin(0).tolist(), values.amax(0).tolist(), color=COLORS.get(arch), alpha=0.2,
                        linewidth=0)


def curves(doc: dict, path: pathlib.Path) -> pathlib.Path:
    contexts = doc["protocol"]["contexts"]
    fig, axes = plt.subplots(2, len(contexts), figsize=(5.5 * len(contexts), 7), squeeze=False)
    for col, context in enumerate(contexts):
        top, bottom = axes[0][col], axes[1][col]
        for arch, runs in _final_runs(doc, context).items():
            _band(top, runs[0]["curve"]["tokens"], [r["curve"]["bpb"] for r in runs], arch)
            window = max(1, min(SMOOTH_STEPS, len(runs[0]["train"]["bpb"]) // 4))
            smooth = [torch.tensor(r["train"]["bpb"]).unfold(0, window, 1).mean(1).tolist() for r in runs]
            tokens = [(window + i) * doc["protocol"]["batch_tokens"] for i in range(len(smooth[0]))]
            _band(bottom, tokens, smooth, arch)
        top.set(title=f"context {context}: validation", xlabel="training tokens", ylabel="bits per byte")
        bottom.set(title=f"context {context}: training (moving mean, up to {SMOOTH_STEPS} steps)",
                   xlabel="training tokens",
                   ylabel="bits per byte")
        for ax in (top, bottom):
            ax.grid(True, alpha=0.3)
            _legend(ax)
    return plots._finish(fig, path, "model quality: loss curves at each arch's best learning rate",
                         doc["machine_line"])


def sweep(doc: dict, summary: dict, path: pathlib.Path) -> pathlib.Path:
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for arch, entries in summary["sweep"].items():
        ok = sorted((e["lr"], e["bpb"]) for e in entries if e["status"] == "ok" and e["bpb"] is not None)
        if ok:
            ax.plot(*zip(*ok), marker="o", color=COLORS.get(arch), label=label(arch))
        for e in entries:
            if e["status"] != "ok":
                ax.annotate(e["status"], (e["lr"], 0.95), xycoords=("data", "axes fraction"), color=COLORS.get(arch),
                            fontsize=7, rotation=90)
    ax.set(xscale="log", xlabel="peak learning rate", ylabel="final validation bits per byte")
    ax.grid(True, which="both", alpha=0.3)
    _legend(ax)
    return plots._finish(fig, path, f"learning-rate sweep, context {doc['protocol']['sweep_context']}",
                         doc["machine_line"])


def _bucket_stats(runs: list[dict]) -> tuple[list[str], list[float], list[float]]:
    """Bucket names and the mean and std over seeds of each bucket's bits per byte at the longest length."""
    longest = str(max(int(n) for n in runs[0]["lengths"]))
    names = [f"{b['start']}-{b['end']}" for b in runs[0]["lengths"][longest]["buckets"]]
    values = torch.tensor([[b["bpb"] for b in r["lengths"][longest]["buckets"]] for r in runs], dtype=torch.float64)
    return names, values.mean(0).tolist(), _std(values)


def positions(doc: dict, path: pathlib.Path) -> pathlib.Path:
    contexts = doc["protocol"]["contexts"]
    fig, axes = plt.subplots(1, len(contexts), figsize=(5.5 * len(contexts), 4.2), squeeze=False)
    for ax, context in zip(axes[0], contexts):
        names = []
        for arch, runs in _final_runs(doc, context).items():
            names, mean, std = _bucket_stats(runs)
            ax.errorbar(range(len(names)), mean, yerr=std, marker="o", capsize=3, color=COLORS.get(arch),
                        label=label(arch))
        if names:
            inside = sum(int(n.split("-")[1]) <= context for n in names)  # the context is a bucket edge
            if inside < len(names):
                ax.axvline(inside - 0.5, color="k", linestyle="--", linewidth=0.8, label="training context")
            ax.set_xticks(range(len(names)), names, fontsize=7)
        ax.set(title=f"trained at {context}", xlabel="target position in the window", ylabel="bits per byte")
        ax.grid(True, alpha=0.3)
        _legend(ax)
    return plots._finish(fig, path, "validation loss by position", doc["machine_line"])


def copy(doc: dict, path: pathlib.Path) -> pathlib.Path:
    contexts = doc["protocol"]["contexts"]
    fig, axes = plt.subplots(1, len(contexts), figsize=(5.5 * len(contexts), 4.2), squeeze=False)
    for ax, context in zip(axes[0], contexts):
        groups = _final_runs(doc, context)
        lengths = sorted({int(n) for runs in groups.values() for n in runs[0].get("copy", {})})
        width = 0.8 / max(1, len(groups))
        for i, (arch, runs) in enumerate(groups.items()):
            x = [j + (i - (len(groups) - 1) / 2) * width for j in range(len(lengths))]
            half = {h: torch.tensor([[r["copy"][str(n)][h]["bpb"] for n in lengths] for r in runs],
                                    dtype=torch.float64) for h in ("first_half", "second_half")}
            ax.bar(x, half["second_half"].mean(0).tolist(), width, yerr=_std(half["second_half"]), capsize=3,
                   color=COLORS.get(arch), label=label(arch))
            ax.scatter(x, half["first_half"].mean(0).tolist(), marker="_", s=200, color="k", zorder=3,
                       label="first half (not copyable)" if i == 0 else None)
        ax.set_xticks(range(len(lengths)), [f"{n} tokens" for n in lengths])
        ax.set(title=f"trained at {context}: second half", ylabel="bits per byte")
        ax.grid(True, axis="y", alpha=0.3)
        _legend(ax)
    return plots._finish(fig, path, "copy probe: text whose second half repeats its first", doc["machine_line"])


def draw(doc: dict, out: pathlib.Path) -> list[pathlib.Path]:
    """Every figure of a model-quality document, into ``out``."""
    out = pathlib.Path(out)
    return [curves(doc, out / "model_quality_curves.png"), sweep(doc, summarize(doc), out / "model_quality_sweep.png"),
            positions(doc, out / "model_quality_positions.png"), copy(doc, out / "model_quality_copy.png")]
