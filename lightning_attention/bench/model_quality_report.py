"""What a model-quality run shows: statistics over seeds, verdicts against the reference, the docs section.

:func:`summarize` turns the run records of a ``model_quality.json`` into per-context, per-architecture statistics
(mean and sample standard deviation over seeds) of every metric, and compares each architecture with
:data:`REFERENCE_ARCH` (LLaMA): the difference of the means and the pooled standard deviation
``√((s_a² + s_ref²) / 2)``. An architecture **matches** when ``|difference| ≤ 2 × pooled``, is **better** or
**worse** beyond that (lower bits per byte is better); with fewer than two seeds on either side there is no verdict.

:func:`render_markdown` writes the "Model quality" section of ``docs/performance.md`` from the JSON alone: nothing in
it is typed by hand, so a fresh run replaces it whole.
"""

import math
import statistics

from lightning_attention.bench.model_quality_protocol import REFERENCE_ARCH, Protocol

_LABELS = {"tnl": "TNL", "minimax": "MiniMax lightning", "hybrid": "hybrid (1 softmax in 8)", "llama": "LLaMA"}


def label(arch: str) -> str:
    return _LABELS.get(arch, arch)


def stats(values: list[float]) -> dict:
    """``{"values", "n", "mean", "std"}`` (sample std, None below two values) of the finite values."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    mean = statistics.fmean(finite) if finite else None
    std = statistics.stdev(finite) if len(finite) >= 2 else None
    return {"values": finite, "n": len(finite), "mean": mean, "std": std}


def compare(a: dict, ref: dict) -> dict:
    """``{"difference", "relative", "pooled_std", "verdict"}`` of stats ``a`` against stats ``ref``."""
    if a["mean"] is None or ref["mean"] is None:
        return {"difference": None, "relative": None, "pooled_std": None, "verdict": "no data"}
    diff = a["mean"] - ref["mean"]
    out = {"difference": diff, "relative": diff / ref["mean"] if ref["mean"] else None, "pooled_std": None}
    if a["std"] is None or ref["std"] is None:
        return {**out, "verdict": "fewer than 2 seeds"}
    pooled = math.sqrt((a["std"] ** 2 + ref["std"] ** 2) / 2)
    verdict = "matches" if abs(diff) <= 2 * pooled else ("better" if diff < 0 else "worse")
    return {**out, "pooled_std": pooled, "verdict": verdict}


def _ok(doc: dict, stage: str) -> list[dict]:
    return [r for r in doc.get("runs", []) if r["spec"]["stage"] == stage and r.get("status") == "ok"]


def _metrics(run: dict) -> dict[str, float]:
    """Flat ``{metric name: bits per byte}`` of a final run: overall, per bucket, per length, copy halves."""
    context = run["spec"]["context"]
    out = {"overall": run["final"]["bpb"]}
    for length, ev in run.get("lengths", {}).items():
        if int(length) != context:
            out[f"length {length}"] = ev["bpb"]
    longest = run.get("lengths", {}).get(str(max(map(int, run.get("lengths", {str(context): 0})))))
    for bucket in (longest or {}).get("buckets", []):
        out[f"positions {bucket['start']}-{bucket['end']}"] = bucket["bpb"]
    for length, probe in run.get("copy", {}).items():
        out[f"copy {length} first half"] = probe["first_half"]["bpb"]
        out[f"copy {length} second half"] = probe["second_half"]["bpb"]
    return out


def summarize(doc: dict) -> dict:
    """``{"sweep": {arch: [{"lr", "bpb", "status"}]}, "best_lr": {arch: lr}, "contexts": {context: {"archs": {arch:
    {"lr", "seeds", "tokens_per_s", "metrics": {name: stats}}}, "comparisons": {arch: {name: compare}}}}}``."""
    protocol = Protocol.from_json(doc["protocol"])
    sweep = {arch: [] for arch in protocol.archs}
    for run in doc.get("runs", []):
        if run["spec"]["stage"] == "sweep":
            sweep[run["spec"]["arch"]].append({"lr": run["spec"]["lr"], "status": run["status"],
                                               "bpb": run.get("final", {}).get("bpb")})
    contexts = {}
    for context in protocol.contexts:
        archs = {}
        for arch in protocol.archs:
            runs = [r for r in _ok(doc, "final") if r["spec"]["arch"] == arch and r["spec"]["context"] == context]
            if not runs:
                continue
            names = list(_metrics(runs[0]))
            archs[arch] = {
                "lr": runs[0]["spec"]["lr"], "seeds": [r["spec"]["seed"] for r in runs],
                "tokens_per_s": statistics.fmean(r["tokens_per_s"] for r in runs),
                "epochs": runs[0]["epochs"],
                "metrics": {name: stats([_metrics(r).get(name) for r in runs]) for name in names},
            }
        comparisons = {}
        if REFERENCE_ARCH in archs:
            ref = archs[REFERENCE_ARCH]["metrics"]
            for arch, entry in archs.items():
                if arch != REFERENCE_ARCH:
                    comparisons[arch] = {name: compare(s, ref[name]) for name, s in entry["metrics"].items()
                                         if name in ref}
        contexts[str(context)] = {"archs": archs, "comparisons": comparisons}
    return {"sweep": sweep, "best_lr": doc.get("best_lr", {}), "contexts": contexts}


def _tokens(n: int) -> str:
    return f"{n / 2**20:g} Mi" if n >= 2**20 else f"{n:,}"


def _command(argv: list[str]) -> str:
    """The command line of a run as a user types it (``argv[0]`` is whichever script started it)."""
    rest = argv[argv.index("model-quality"):] if "model-quality" in argv else argv[1:]
    return " ".join(["lightning-attention bench", *rest])


def _num(x, spec=".4f") -> str:
    return "-" if x is None else format(x, spec)


def _pm(s: dict) -> str:
    if s["mean"] is None:
        return "-"
    return f"{s['mean']:.4f} ± {s['std']:.4f}" if s["std"] is not None else f"{s['mean']:.4f}"


def _table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def _sentence(arch: str, name: str, c: dict) -> str:
    what = f"{label(arch)} against LLaMA, {name}"
    if c["verdict"] in ("no data", "fewer than 2 seeds"):
        return f"{what}: {c['verdict']}"
    rel = f" ({100 * c['relative']:+.1f}%)" if c["relative"] is not None else ""
    return (f"{what}: **{c['verdict']}** — difference {c['difference']:+.4f} bits/byte{rel}, 2 × pooled std "
            f"{2 * c['pooled_std']:.4f}")


def target_lines(summary: dict, protocol: Protocol) -> list[str]:
    """The two quality targets: TNL at the paper's context (512), the hybrid at 2,048 overall and on the copy probe."""
    lines = []
    for arch, context, names in (("tnl", 512, ["overall"]),
                                 ("hybrid", 2048, ["overall"] + [f"copy {2048} second half"])):
        comparisons = summary["contexts"].get(str(context), {}).get("comparisons", {}).get(arch)
        if comparisons is None:
            lines.append(f"- {label(arch)} against LLaMA at context {context}: not measured in this run")
            continue
        for name in names:
            if name in comparisons:
                goal = "met" if comparisons[name]["verdict"] in ("matches", "better") else "not met"
                if comparisons[name]["pooled_std"] is None:
                    goal = "undecided"
                lines.append(f"- target ({goal}), context {context}: " + _sentence(arch, name, comparisons[name]))
    return lines


def render_markdown(doc: dict, figure_dir: str = ".") -> str:
    """The "Model quality" section for ``docs/performance.md`` (figures linked under ``figure_dir``)."""
    protocol = Protocol.from_json(doc["protocol"])
    summary = summarize(doc)
    out = ["## Model quality", "", _setup(doc, protocol), "", _provenance(doc)]
    if not doc.get("complete", False):
        out += ["", f"**Incomplete**: {len(doc.get('remaining', []))} planned runs have not run yet."]
    out += ["", "Where the architectures stand (verdicts: mean over seeds against LLaMA, matching within 2× the "
                "pooled standard deviation):", ""]
    out += target_lines(summary, protocol)
    for context, entry in summary["contexts"].items():
        for arch, c in entry["comparisons"].items():
            out.append(f"- context {context}: " + _sentence(arch, "overall", c["overall"]))
    out += ["", f"### Learning-rate sweep (context {protocol.sweep_context}, final validation bits per byte)", "",
            _sweep_table(summary, protocol)]
    for context, entry in summary["contexts"].items():
        if entry["archs"]:
            out += ["", f"### Context {context}", "", *_context_tables(context, entry)]
    out += ["", "Training tokens/s above are those of these runs (evaluations excluded); the throughput benchmark is "
                "`lightning-attention bench model` (see [Model training throughput](#model-training-throughput)).",
            "", "Every run:", "", _run_table(doc.get("runs", []))]
    for name, caption in (("curves", "validation bits per byte vs training tokens (mean and seed range)"),
                          ("sweep", "final validation bits per byte vs learning rate"),
                          ("positions", "bits per byte by position bucket"), ("copy", "copy probe")):
        out += ["", f"![{caption}]({figure_dir.rstrip('/')}/model_quality_{name}.png)"]
    return "\n".join(out) + "\n"


def _setup(doc: dict, protocol: Protocol) -> str:
    """What was compared and how it was trained."""
    sizes = "; ".join(f"{label(a)} {p['total'] / 1e6:.2f} M / {p['non_embedding'] / 1e6:.2f} M"
                      for a, p in doc.get("parameters", {}).items())
    depth = f", {protocol.n_layers} layers" if protocol.n_layers else ""
    options = ", ".join(protocol.options.enabled()) or "none (no dropout, untied embeddings, scaled residual init)"
    return (f"{', '.join(label(a) for a in protocol.archs)} at equal size (preset `{protocol.preset}`{depth}; "
            f"parameters total / without embeddings: {sizes}), trained on the same batches in the same order: "
            f"{_tokens(protocol.tokens)} tokens per run ({protocol.steps(protocol.tokens)} steps of "
            f"{protocol.batch_tokens:,} tokens), AdamW (weight decay {protocol.weight_decay}), "
            f"{protocol.warmup_fraction:.0%} warmup, cosine to {protocol.min_lr_ratio:g}× the peak rate, clip "
            f"{protocol.grad_clip}. Learning rate per architecture from the grid "
            f"{', '.join(f'{x:g}' for x in protocol.lrs)} at context {protocol.sweep_context} "
            f"({_tokens(protocol.sweep_tokens)} tokens, seed {protocol.seeds[0]}), extended by a factor of 2 past "
            f"its edge while an architecture's best rate sat there (at most {protocol.lr_extensions}); then seeds "
            f"{', '.join(map(str, protocol.seeds))} at each one's best rate. Options on: {options}.")


def _provenance(doc: dict) -> str:
    """Corpus, tokenizer, machines, commits and the command of the runs."""
    runs = doc.get("runs", [])
    machines = sorted({r["machine_line"].rsplit(" | ", 1)[0] for r in runs if r.get("machine_line")})  # no date
    commits = sorted({r.get("git") or "n/a" for r in runs})
    corpus, tokenizer = doc.get("corpus", {}), doc.get("tokenizer", {})
    return (f"Corpus: {corpus.get('bytes', 0) / 1e6:.1f} MB of documentation prose "
            f"({'; '.join(corpus.get('sources', []))}), train.txt sha256 "
            f"`{corpus.get('sha256', {}).get('train.txt', '?')[:16]}…`; tokenizer {tokenizer.get('spec')} "
            f"({tokenizer.get('vocab_size')} ids, {tokenizer.get('train_bytes_per_token', 0):.2f} bytes per token), "
            f"{tokenizer.get('train_tokens', 0):,} training tokens. Losses are bits per UTF-8 byte of the validation "
            f"split (held-out documents). Machine: {'; '.join(machines) or 'n/a'}; commit "
            f"{', '.join(f'`{c}`' for c in commits)}. Command: `{_command(doc.get('config', {}).get('argv', []))}`.")


def _sweep_table(summary: dict, protocol: Protocol) -> str:
    """One row per architecture, one column per rate any of them tried (the grid and its edge extensions)."""
    rates = sorted({*protocol.lrs, *(e["lr"] for entries in summary["sweep"].values() for e in entries)})
    rows = []
    for arch, entries in summary["sweep"].items():
        by_lr = {e["lr"]: e for e in entries}
        cells = [("-" if lr not in by_lr else _num(by_lr[lr]["bpb"]) if by_lr[lr]["status"] == "ok"
                  else by_lr[lr]["status"]) for lr in rates]
        best = summary["best_lr"].get(arch)
        # still an edge after the extensions: the true optimum may lie beyond the rates tried
        edge = " (edge of the rates tried)" if by_lr and best in (min(by_lr), max(by_lr)) else ""
        rows.append([label(arch), *cells, f"{best:g}{edge}" if best else "-"])
    return _table(["arch", *(f"lr {x:g}" for x in rates), "best"], rows)


def _context_tables(context: str, entry: dict) -> list[str]:
    """The overall table of one context (with the verdicts), then its position, length and copy-probe tables."""
    archs, comparisons = entry["archs"], entry["comparisons"]
    rows = []
    for arch, a in archs.items():
        c = comparisons.get(arch, {}).get("overall")
        rows.append([label(arch), f"{a['lr']:g}", _pm(a["metrics"]["overall"]), str(a["metrics"]["overall"]["n"]),
                     _num(c and c["difference"], "+.4f"), _num(c and c["pooled_std"]),
                     c["verdict"] if c else "reference", f"{a['tokens_per_s'] / 1e3:.0f} K", f"{a['epochs']:.2f}"])
    out = [_table(["arch", "lr", "val bits/byte", "seeds", "− LLaMA", "pooled std", "verdict", "train tokens/s",
                   "epochs"], rows)]
    names = list(next(iter(archs.values()))["metrics"])
    for prefix, title in _GROUPS:
        group = [n for n in names if n.startswith(prefix)]
        if group:
            rows = [[label(arch), *(_pm(a["metrics"][n]) if n in a["metrics"] else "-" for n in group)]
                    for arch, a in archs.items()]
            out += ["", title, "", _table(["arch", *(n[len(prefix):].strip() for n in group)], rows)]
    for arch, c in comparisons.items():
        worse = [n for n, x in c.items() if x["verdict"] == "worse"]
        if worse:
            out.append(f"\n{label(arch)} is worse than LLaMA at context {context} on: {', '.join(worse)}.")
    return out


# metric groups of the per-context tables: name prefix -> caption
_GROUPS = (
    ("positions", "By position of the target in the window, at the longest evaluated length (bits per byte, mean ± "
                  "std over seeds):"),
    ("length", "Whole windows longer than the training context (bits per byte):"),
    ("copy", "Copy probe: sequences whose second half repeats the first, by sequence length (bits per byte):"),
)


def _run_table(runs: list[dict]) -> str:
    rows = []
    for r in runs:
        s = r["spec"]
        train = r["train"]["bpb"][-16:]
        rows.append([s["stage"], label(s["arch"]), str(s["context"]), f"{s['lr']:g}", str(s["seed"]),
                     f"{r['steps_done']}/{r['steps']}", f"{r['epochs']:.2f}", r["status"],
                     _num(statistics.fmean(train) if train else None), _num(r.get("final", {}).get("bpb")),
                     f"{r['tokens_per_s'] / 1e3:.0f} K"])
    return _table(["stage", "arch", "context", "lr", "seed", "steps", "epochs", "status", "train bits/byte (last 16)",
                   "val bits/byte", "tokens/s"], rows)


def print_tables(doc: dict) -> None:
    """The sweep and per-context tables on stdout (the markdown's tables, as text)."""
    summary = summarize(doc)
    for arch, entries in summary["sweep"].items():
        print(f"sweep {label(arch)}: " + ", ".join(f"lr {e['lr']:g} {_num(e['bpb'])} ({e['status']})"
                                                   for e in entries), flush=True)
    for context, entry in summary["contexts"].items():
        for arch, a in entry["archs"].items():
            c = entry["comparisons"].get(arch, {}).get("overall")
            print(f"context {context} {label(arch)}: val bits/byte {_pm(a['metrics']['overall'])} (lr {a['lr']:g}, "
                  f"{a['metrics']['overall']['n']} seeds)" + (f", {c['verdict']} vs LLaMA" if c else ""), flush=True)

