"""``lightning-attention bench model-quality``: does TNL learn as well as a Transformer of equal size?

A fixed protocol (:mod:`.model_quality_protocol`) trains TNL, MiniMax-01's lightning layer, the MiniMax-01 hybrid (one
softmax layer in 8) and LLaMA at equal parameters on the same batches of a natural-language corpus
(:mod:`.corpus`, built offline from installed documentation) with a byte-level BPE, sweeps the learning rate of each,
then trains 3 seeds at each one's best rate at contexts 512 (the paper's) and 2,048, and evaluates every final run
by position in the window, beyond its training context and on a copy probe (:mod:`.model_quality_eval`). Every run
is reported, with bits per byte so tokenizers compare; the verdicts and the docs section come from the JSON
(:mod:`.model_quality_report`).

    python -m lightning_attention.bench.corpus --out .corpus                  # once, on any machine (~2 min)
    lightning-attention bench model-quality --corpus .corpus --out runs/mq --resume --time-limit 540
    lightning-attention bench model-quality --quick                           # CPU smoke test (< 1 min)
    lightning-attention bench model-quality --replot runs/mq                  # tables, figures, markdown again

Output: ``<out>/model-quality.json`` (protocol, corpus and tokenizer digests, parameters per architecture, every
run: its spec, machine, per-step train loss and bits per byte, the validation curve, final evaluations),
``<out>/model_quality_runs/<run id>.json`` (one file per finished run), ``model_quality.md`` (the docs section) and
the figures of :mod:`.model_quality_plots`.

**Calls that continue each other.** A run's file is written as soon as it finishes; with ``--resume`` a call keeps
the finished runs of ``--out`` recorded under the same settings (model size and options, schedule, evaluation,
corpus and tokenizer digests: anything else is refused) and runs the rest, in plan order: the sweep, then context by
context and seed by seed. ``--time-limit S`` starts no run that the throughput measured so far says would end past
``S`` seconds, so a call stops cleanly inside the machine's limit and the same command continues later.

**Budget** (fixed before any GPU run). Default model: the ``40m`` preset's width (d = 512, 8 heads) at 8 layers,
8,192-token BPE: ≈ 28 M parameters besides 8.4 M of embeddings (each architecture within 1% of the others; the JSON
records all counts). ``bench model`` measured, on an H100 in bf16 with the 12-layer ``40m`` preset and bytes, 555 K
training tokens/s for TNL at every context and 273 K for LLaMA at 2,048. Per token this model costs 0.765× that one
(forward FLOPs: 8 layers and an 8,192-token head, 2·27.8 M + 2·512·8,192 = 64 M, against 2·41.7 M + 2·512·256 = 84
M), so: TNL ≈ 1.4 µs, MiniMax ≈ 1.45 µs, hybrid ≈ 1.5 µs, LLaMA ≈ 2.7 µs at 512 and 2.8 µs at 2,048 (its time per
token falls by about 0.1 µs per 1K of context, from the 2K-64K measurements) — about 7.0 µs per token for the four
together.

- sweep: 4 rates × 4 Mi tokens × 7.0 µs ≈ 120 s, and ≈ 10-30 s per rate an architecture adds past the grid's edge;
- context 512: 3 seeds × 16 Mi tokens × 7.0 µs ≈ 350 s;
- context 2,048: 3 seeds × 16 Mi tokens × 7.1 µs ≈ 360 s;
- evaluations, model builds and first-call compilation ≈ 3 s per run × 40 runs (16 sweep, 24 final) ≈ 120 s,
  tokenizing ≈ 5 s per call.

About 960 s (448 Mi training tokens) in all: two calls of ``--time-limit 540`` (the first ends in the 512 stage, the
second finishes), with a third short one if the throughput estimate was optimistic. 16 Mi tokens are 2.5 epochs of
the default corpus (6.7 M training tokens), which is why the window boundaries move every epoch (``WindowLoader``).
"""

import dataclasses
import json
import pathlib
import time

import torch

from lightning_attention.bench.model_quality_protocol import (
    ARCHS,
    ModelOptions,
    Protocol,
    RunSpec,
    best_learning_rates,
    final_runs,
    quick_protocol,
    settings_key,
    sweep_runs,
)
from lightning_attention.bench.results import ResultWriter, load_plots
from lightning_attention.train.errors import UserError

RUNS_FOLDER = "model_quality_runs"
QUICK_BPE_VOCAB = 512
# protocol fields a flag may set (flag dest -> field); None values keep the protocol's own
_FIELD_FLAGS = ("archs", "preset", "contexts", "sweep_context", "lrs", "lr_extensions", "seeds", "sweep_tokens",
                "tokens", "batch_tokens", "eval_lengths")


def protocol_from_args(args) -> Protocol:
    """The protocol of a command line: the default (or ``--quick``) one with the given flags on top."""
    base = quick_protocol() if args.quick else Protocol()
    fields = {name: getattr(args, name) for name in _FIELD_FLAGS if getattr(args, name, None) is not None}
    if getattr(args, "layers", None) is not None:
        fields["n_layers"] = args.layers
    options = ModelOptions(dropout=args.dropout, tie_embeddings=args.tie_embeddings,
                           official_init=args.official_init, lrpe_float32=args.lrpe_float32)
    try:
        return dataclasses.replace(base, options=options, **{k: tuple(v) if isinstance(v, list) else v
                                                             for k, v in fields.items()})
    except ValueError as exc:
        raise UserError(str(exc)) from None


def _quick_corpus(out: pathlib.Path) -> pathlib.Path:
    """A tiny corpus for ``--quick`` (Python's documentation topics, ~0.3 MB), built by the corpus script."""
    from lightning_attention.bench.corpus import build_corpus
    from lightning_attention.bench.corpus_sources import PYTHON_DOCS

    folder = out / "corpus-quick"
    build_corpus(folder, (PYTHON_DOCS,), val_fraction=0.1, bpe_vocab=0, log=lambda *_: None)
    return folder


def _previous_runs(folder: pathlib.Path, key: str, resume: bool) -> dict[str, dict]:
    files = sorted(folder.glob("*.json")) if folder.is_dir() else []
    if files and not resume:
        raise UserError(f"{folder} holds {len(files)} finished runs of an earlier call: pass --resume to continue "
                        f"them, or choose another --out")
    runs = {}
    for path in files:
        record = json.loads(path.read_text())
        if record.get("settings_key") != key:
            raise UserError(f"{path} was recorded under other settings (key {record.get('settings_key')}, this call "
                            f"{key}: model size or options, schedule, evaluation, corpus or tokenizer differ); "
                            f"choose another --out")
        runs[record["id"]] = record
    return runs


class _Deadline:
    """Whether a run still fits in ``--time-limit``, from the tokens/s and evaluation time measured so far."""

    def __init__(self, limit: float | None):
        self.limit, self.start = limit, time.perf_counter()

    def fits(self, spec: RunSpec, records: dict[str, dict]) -> bool:
        if self.limit is None:
            return True
        same = [r for r in records.values() if r["spec"]["arch"] == spec.arch and r.get("tokens_per_s")]
        closest = [r for r in same if r["spec"]["context"] == spec.context] or same
        if not closest:
            return True  # nothing measured yet for this architecture: run it and learn
        tokens_per_s = min(r["tokens_per_s"] for r in closest)
        evals = max(r.get("eval_seconds", 0.0) for r in closest)
        return time.perf_counter() - self.start + spec.tokens / tokens_per_s + evals <= self.limit


def run(args, device: torch.device, writer: ResultWriter, out: pathlib.Path) -> dict:
    threads = torch.get_num_threads()
    if device.type == "cpu":  # small models on shared cores: one thread is faster (see TrainConfig.threads)
        torch.set_num_threads(1)
    try:
        return _run(args, device, writer, out)
    finally:
        torch.set_num_threads(threads)


def _run(args, device: torch.device, writer: ResultWriter, out: pathlib.Path) -> dict:
    from lightning_attention.bench.model_quality_data import load_data
    from lightning_attention.bench.model_quality_train import build_model, train_run
    from lightning_attention.models.presets import parameter_counts

    deadline = _Deadline(args.time_limit)
    protocol = protocol_from_args(args)
    corpus = pathlib.Path(args.corpus) if args.corpus is not None else (
        _quick_corpus(out) if args.quick else pathlib.Path(".corpus"))
    tokenizer, vocab = args.tokenizer, args.vocab_size
    if args.quick and args.corpus is None and tokenizer == "corpus":
        tokenizer, vocab = "bpe", QUICK_BPE_VOCAB
    try:
        data = load_data(corpus, tokenizer, vocab)
    except (FileNotFoundError, ValueError) as exc:
        raise UserError(str(exc)) from None
    key = settings_key(protocol, data.corpus["sha256"], data.tokenizer["sha256"])
    with torch.device("meta"):  # counts only: no memory, no init
        parameters = {arch: parameter_counts(build_model(arch, protocol, data.vocab_size)) for arch in protocol.archs}
    for name, value in (("protocol", protocol.to_json()), ("options", protocol.options.enabled()),
                        ("corpus", data.corpus), ("tokenizer", data.tokenizer), ("settings_key", key),
                        ("parameters", parameters)):
        writer.set(name, value)
    runs_dir = out / RUNS_FOLDER
    records = _previous_runs(runs_dir, key, args.resume)
    if records:
        print(f"continuing: {len(records)} finished runs in {runs_dir}", flush=True)
    runs_dir.mkdir(parents=True, exist_ok=True)
    machine = {"machine_line": writer.doc["machine_line"], "gpu": writer.doc["machine"].get("gpu"),
               "git": writer.doc["machine"].get("git"),
               "source_sha256": writer.doc["machine"].get("source_sha256"), "settings_key": key}

    def execute(specs: list[RunSpec]) -> list[str]:
        """Runs the specs not recorded yet; returns those left for a later call."""
        left = []
        for spec in specs:
            if spec.id in records:
                continue
            if left or not deadline.fits(spec, records):
                left.append(spec.id)
                continue
            print(f"{spec.id}: {protocol.steps(spec.tokens)} steps of {protocol.batch_size(spec.context)} x "
                  f"{spec.context} tokens", flush=True)
            record = {**train_run(spec, protocol, data, device), **machine}
            (runs_dir / f"{spec.id}.json").write_text(json.dumps(record) + "\n")
            records[spec.id] = record
            final = record.get("final", {}).get("bpb")
            print(f"{spec.id}: {record['status']}, val {final if final is None else round(final, 4)} bits/byte, "
                  f"{record['tokens_per_s']:,.0f} tokens/s, {record['train_seconds']:.1f} s "
                  f"(+{record['eval_seconds']:.1f} s evaluating)", flush=True)
            writer.set("runs", _ordered(protocol, records))
        return left

    # the sweep grows while finished runs call for rates past the grid's edge: run until it asks for nothing new
    while pending := [s for s in sweep_runs(protocol, records) if s.id not in records]:
        remaining = execute(pending)
        if remaining:
            break
    else:
        remaining = []
    best = best_learning_rates(protocol, records)
    remaining += execute(final_runs(protocol, best))
    remaining += [f"final-{arch}-*" for arch in protocol.archs if arch not in best]  # their sweep is unfinished
    writer.set("runs", _ordered(protocol, records))
    writer.set("best_lr", best)
    writer.set("complete", not remaining)
    writer.set("remaining", remaining)
    if remaining:
        print(f"stopped with {len(remaining)} runs left: run the same command (with --resume) to continue",
              flush=True)
    figures = report(writer.doc, out, writer)
    return {"runs": len(writer.doc["runs"]), "complete": not remaining, "remaining": len(remaining),
            "best_lr": best, "figures": figures, "markdown": str(out / "model_quality.md")}


def _ordered(protocol: Protocol, records: dict[str, dict]) -> list[dict]:
    """The finished runs in plan order (the sweep, then the final runs), then any other run of the folder."""
    order = [s.id for s in sweep_runs(protocol, records) + final_runs(protocol, best_learning_rates(protocol, records))]
    return [records[i] for i in order if i in records] + [r for i, r in records.items() if i not in order]


def report(doc: dict, out: pathlib.Path, writer: ResultWriter | None = None) -> list[str]:
    """Tables on stdout, ``model_quality.md`` and the figures of a model-quality document (fresh or ``--replot``)."""
    from lightning_attention.bench.model_quality_report import print_tables, render_markdown

    if not doc.get("runs"):
        print("no finished runs to report", flush=True)
        return []
    print_tables(doc)
    (pathlib.Path(out) / "model_quality.md").write_text(render_markdown(doc))
    if load_plots(doc, writer) is None:
        return []
    from lightning_attention.bench.model_quality_plots import draw

    names = [p.name for p in draw(doc, out)]
    if writer is not None:
        writer.set("figures", names)
    return names


__all__ = ["ARCHS", "protocol_from_args", "report", "run"]
