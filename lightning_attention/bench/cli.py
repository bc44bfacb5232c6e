"""``lightning-attention bench {kernels,decode,model,hybrid,serving,model-quality}``: argument parsing and the run
envelope.

Every run prints the machine line first, writes ``<out>/<subcommand>.json`` (rewritten after every measurement) and
PNG figures under ``--out``, prints tables, and ends stdout with one JSON summary line.

    lightning-attention bench kernels --out runs/bench                 # grids (a) and (b), K = V = 128, H100 ≈ 6 min
    lightning-attention bench kernels --grid a --head-dims 64,256      # the other head dims of grid (a)
    lightning-attention bench kernels --grid varlen                    # packed sequences of mixed lengths
    lightning-attention bench decode --out runs/bench
    lightning-attention bench model --out runs/bench
    lightning-attention bench serving --out runs/bench                 # HF generate(), TNL vs LLaMA, batch x prompt
    lightning-attention bench model-quality --corpus .corpus --out runs/mq --resume --time-limit 540   # see its module
    lightning-attention bench kernels --quick                          # CPU smoke test (< 1 min): PyTorch path
    lightning-attention bench kernels --replot runs/bench              # tables + figures of a saved run, no timing
    python -m lightning_attention.bench kernels ...                    # the same, importing only the benchmarks
"""

import argparse
import importlib
import json
import pathlib
import sys
import time

import torch

from lightning_attention.bench.machine import machine_info, machine_line
from lightning_attention.bench.providers import BASELINES, GRID_A_SEQLENS, OURS
from lightning_attention.bench.results import ResultWriter, print_final_line

# subcommand -> (module with run(args, device, writer, out) -> summary dict, help)
BENCHES = {
    "kernels": ("lightning_attention.bench.kernels", "lightning_attn: fwd, fwd+bwd, memory, accuracy vs baselines"),
    "decode": ("lightning_attention.bench.decode", "decode step latency vs batch, with the floor; flat memory"),
    "model": ("lightning_attention.bench.model", "training tokens/s vs context and loss curves, TNL vs LLaMA"),
    "hybrid": ("lightning_attention.bench.hybrid", "hybrid softmax/linear chunk attention vs SDPA causal"),
    "serving": ("lightning_attention.bench.serving", "HF generate(), TNL vs LLaMA: "
                "first token, decode tokens/s, memory"),
    "model-quality": ("lightning_attention.bench.model_quality", "TNL, MiniMax, hybrid vs LLaMA at equal size: "
                      "learning-rate sweep, seeds, loss by position, beyond the context, copy probe"),
}


# the flag that sets each benchmark's sizes: without it (or --quick) a CPU run is refused
SIZE_FLAGS = {"kernels": "--seqlens", "decode": "--batches", "model": "--contexts", "hybrid": "--seqlens",
              "serving": "--prompts", "model-quality": "--tokens"}
# subcommands without the kernel timer's options (--baselines, --warmup-ms, --rep-ms)
UNTIMED = ("serving", "model-quality")


def _list_of(convert, accept, what: str):
    """An argparse type: comma-separated values, each ``convert``-ed and ``accept``-ed (e.g. "positive integers")."""

    def parse(text: str) -> tuple:
        try:
            values = tuple(convert(x) for x in text.split(",") if x.strip())
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"expected comma-separated {what}, got {text!r}") from e
        if not values or not all(accept(v) for v in values) or len(set(values)) != len(values):
            raise argparse.ArgumentTypeError(f"expected distinct {what}, got {text!r}")
        return values

    return parse


_int_list = _list_of(int, lambda v: v > 0, "positive integers")
_float_list = _list_of(float, lambda v: v > 0, "positive numbers")
_seed_list = _list_of(int, lambda v: v >= 0, "non-negative integers")


def _at_least(minimum: int):
    """An argparse type: an integer of ``minimum`` or more."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from e
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer of at least {minimum}, got {text!r}")
        return value

    return parse


def _token_count(text: str) -> int:
    """An integer, or one with a binary suffix: ``16Mi`` = 16 · 2^20, ``64Ki`` = 64 · 2^10."""
    scale = {"Ki": 2**10, "Mi": 2**20}.get(text[-2:], 1)
    try:
        value = int(text[:-2] if scale > 1 else text) * scale
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected a token count like 16777216 or 16Mi, got {text!r}") from e
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive token count, got {text!r}")
    return value


def _choices(allowed: tuple[str, ...]):
    def parse(text: str) -> list[str]:
        names = [x.strip() for x in text.split(",") if x.strip()]
        bad = [n for n in names if n not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {','.join(allowed)}")
        return names

    return parse


def _common(p: argparse.ArgumentParser, timed: bool = True) -> None:
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("runs/bench"), help="output folder (JSON, PNG)")
    p.add_argument("--quick", action="store_true", help="tiny shapes, PyTorch path on CPU: a smoke test (< 1 min)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    if timed:  # the timing benchmarks' options
        p.add_argument(
            "--baselines",
            type=_choices(BASELINES + ("none",)),
            default=list(BASELINES),
            help=f"comma-separated baselines to run when installed ({','.join(BASELINES)}; 'none' for ours only)",
        )
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--warmup-ms", type=float, default=10.0, help="do_bench warm-up per measurement (ms)")
        p.add_argument("--rep-ms", type=float, default=50.0, help="do_bench repetition time per measurement (ms)")
    p.add_argument(
        "--replot",
        type=pathlib.Path,
        default=None,
        metavar="DIR",
        help="measure nothing: print the tables and draw the figures of DIR/<bench>.json (e.g. a GPU run) into DIR",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench", metavar="BENCH", required=True)
    for name, (_, help_text) in BENCHES.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        _common(p, timed=name not in UNTIMED)
        if name == "kernels":
            p.add_argument(
                "--grid",
                choices=("a", "b", "all", "varlen"),
                default="all",
                help="grid (a), (b) or both (docs/design.md); varlen: 65,536 tokens as packed sequences of mixed "
                "lengths",
            )
            p.add_argument(
                "--head-dims", type=_int_list, default=None, help="K = V values (default 128; 32 in --quick)"
            )
            p.add_argument(
                "--ours",
                type=_choices(OURS),
                default=[o for o in OURS if o != "split"],
                help=f"our variants: {','.join(OURS)} (Triton chunk / recompute backward, the chunk backward under "
                "the split precision, PyTorch path; default: all but split)",
            )
            p.add_argument("--tokens", type=int, default=65536, help="token budget per call of grid (a)")
            p.add_argument(
                "--seqlens", type=_int_list, default=None, help="override the grid's sequence lengths (e.g. 2048,32768)"
            )
            p.add_argument(
                "--cuda-graphs",
                action="store_true",
                help="also time each fwd+bwd as a CUDA-graph replay (device time without host time; grid (b)'s "
                "flatness may use it)",
            )
            p.add_argument(
                "--settle-s",
                type=float,
                default=0.0,
                help="run each timed call back to back this many seconds before its measurement, so that it times "
                "the clock that sustained work settles at under the GPU's power cap (default 0: a burst)",
            )
        elif name == "decode":
            p.add_argument("--batches", type=_int_list, default=None, help="default 1,8,64,256")
            p.add_argument("--memory-tokens", type=_int_list, default=None, help="default 1024,1048576")
        elif name == "model":
            p.add_argument("--contexts", type=_int_list, default=None, help="default 2048,8192,32768,65536")
            p.add_argument("--archs", type=_choices(("tnl", "llama")), default=["tnl", "llama"])
            p.add_argument("--loss-steps", type=int, default=None, help="training steps of the loss curves")
        elif name == "hybrid":
            p.add_argument("--seqlens", type=_int_list, default=None, help="default 4096,...,65536")
        elif name == "serving":
            _serving_arguments(p)
        elif name == "model-quality":
            _model_quality_arguments(p)


def _serving_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of ``bench serving`` (lightning_attention/bench/serving.py)."""
    from lightning_attention.models.presets import PRESETS
    from lightning_attention.models.presets import SERVING_ARCHS as ARCHS

    p.add_argument("--batches", type=_int_list, default=None, help="sequences per request: default 1,64 (--quick 1,2)")
    p.add_argument("--prompts", type=_int_list, default=None,
                   help="prompt lengths in tokens: default 1024,32768 (--quick 16,64)")
    p.add_argument("--new-tokens", type=_at_least(2), default=None,
                   help="tokens generated per sequence, every request exactly this many: default 128 (--quick 8)")
    p.add_argument("--repeats", type=_at_least(1), default=None,
                   help="timed prefills and requests per point, the fastest reported (default 3)")
    p.add_argument("--archs", type=_choices(ARCHS), default=list(ARCHS), help=f"subset of {','.join(ARCHS)}")
    p.add_argument("--preset", choices=tuple(PRESETS), default=None, help="size of both archs (default 40m; "
                   "--quick smoke)")
    p.add_argument("--seed", type=int, default=0, help="seeds the weights and the random prompts")


def _model_quality_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of ``bench model-quality``; a protocol flag left out keeps the protocol's value (see
    lightning_attention/bench/model_quality_protocol.py, or --quick's)."""
    from lightning_attention.bench.model_quality_protocol import ARCHS
    from lightning_attention.models.presets import PRESETS

    p.add_argument("--corpus", type=pathlib.Path, default=None,
                   help="corpus folder of `python -m lightning_attention.bench.corpus` (default .corpus; --quick "
                        "builds a tiny one under --out and trains a 512-token BPE on it)")
    p.add_argument("--tokenizer", default="corpus",
                   help="corpus (the corpus folder's BPE) | bpe (trained here on the training split) | bytes | PATH")
    p.add_argument("--vocab-size", type=int, default=8192, help="vocabulary of --tokenizer bpe")
    p.add_argument("--archs", type=_choices(tuple(ARCHS)), default=None, help=f"subset of {','.join(ARCHS)}")
    p.add_argument("--preset", choices=tuple(PRESETS), default=None, help="model width and heads (default 40m)")
    p.add_argument("--layers", type=int, default=None, help="model depth (default 8)")
    p.add_argument("--contexts", type=_int_list, default=None, help="training contexts of the final runs (512,2048)")
    p.add_argument("--sweep-context", type=int, default=None, help="context of the learning-rate sweep (512)")
    p.add_argument("--lrs", type=_float_list, default=None, help="learning-rate grid (5e-4,1e-3,2e-3,4e-3)")
    p.add_argument("--lr-extensions", type=int, default=None,
                   help="rates an architecture may add past the grid's edge while its best sits there (2)")
    p.add_argument("--seeds", type=_seed_list, default=None,
                   help="seeds of the final runs; the first also seeds the sweep (0,1,2)")
    p.add_argument("--sweep-tokens", type=_token_count, default=None, help="tokens per sweep run (4Mi)")
    p.add_argument("--tokens", type=_token_count, default=None, help="tokens per final run (16Mi)")
    p.add_argument("--batch-tokens", type=_token_count, default=None, help="tokens per optimizer step (32Ki)")
    p.add_argument("--eval-lengths", type=_int_list, default=None,
                   help="window lengths evaluated beyond a run's context (2048,8192)")
    p.add_argument("--dropout", type=float, default=0.0, help="embedding and residual dropout, every arch (paper: 0.1)")
    p.add_argument("--tie-embeddings", action="store_true", help="tie the LM head to the embedding, every arch")
    p.add_argument("--official-init", action="store_true",
                   help="every weight N(0, 0.02) as the released TNL code (default: residual outputs / sqrt(2L))")
    p.add_argument("--lrpe-float32", action="store_true", help="TNL's LRPE layer in float32 under autocast")
    p.add_argument("--time-limit", type=float, default=None, metavar="S",
                   help="start no run expected to end after S seconds (continue with the same command and --resume)")
    p.add_argument("--resume", action="store_true", help="keep the finished runs of --out and run the rest")


def replot(args: argparse.Namespace) -> int:
    """Tables and figures of a saved run, without measuring (the GPU machine may lack matplotlib)."""
    folder = pathlib.Path(args.replot)
    path = folder / f"{args.bench}.json"
    if not path.is_file():
        print(f"error: {path} does not exist", file=sys.stderr)
        return 2
    doc = json.loads(path.read_text())
    print(doc["machine_line"], flush=True)
    module, _ = BENCHES[args.bench]
    figures = importlib.import_module(module).report(doc, folder)
    print_final_line(
        {"bench": args.bench, "machine": doc["machine_line"], "json": str(path), "replot": True, "figures": figures}
    )
    return 0


def run(args: argparse.Namespace, argv: list[str] | None = None) -> int:
    """Runs a parsed command (``argv``: its words, when not those of this process, for the record)."""
    if args.replot is not None:
        return replot(args)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but no CUDA GPU is available", file=sys.stderr)
        return 2
    sizes = SIZE_FLAGS[args.bench]
    if device.type == "cpu" and not args.quick and getattr(args, sizes.lstrip("-")) is None:
        print(f"error: the full {args.bench} grid is sized for a GPU and would run for hours on a CPU; run "
              f"`lightning-attention bench {args.bench} --quick` (a CPU smoke test), or choose the sizes with "
              f"{sizes}", file=sys.stderr)
        return 2
    if hasattr(args, "baselines"):
        args.baselines = [b for b in args.baselines if b != "none"]
    if args.bench == "kernels" and not args.quick and args.tokens % max(GRID_A_SEQLENS):
        print(f"error: --tokens must be a multiple of {max(GRID_A_SEQLENS)} (batch = tokens / T)", file=sys.stderr)
        return 2
    if getattr(args, "head_dims", "unset") is None:
        args.head_dims = (32,) if args.quick else (128,)
    if args.quick and getattr(args, "loss_steps", 0) is None:
        args.loss_steps = 4
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    info = machine_info(device)
    line = machine_line(info)
    print(line, flush=True)
    config = {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(args).items() if k not in ("func",)}
    config["out"] = str(out)
    config["argv"] = sys.argv if argv is None else ["python -m lightning_attention.bench", *argv]
    writer = ResultWriter(out / f"{args.bench}.json", args.bench, info, line, config)
    module, _ = BENCHES[args.bench]
    start = time.perf_counter()
    summary = importlib.import_module(module).run(args, device, writer, out)
    elapsed = time.perf_counter() - start
    writer.set("elapsed_s", elapsed)
    summary = {
        "bench": args.bench,
        "machine": line,
        "json": str(writer.path),
        "out": str(out),
        "elapsed_s": round(elapsed, 2),
        "skipped": writer.doc["skipped"],
        **summary,
    }
    print_final_line(summary)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m lightning_attention.bench BENCH ...``: the same as ``lightning-attention bench BENCH ...`` without
    importing the other subcommands (their dependencies, e.g. tqdm for training, need not exist on a GPU box)."""
    from lightning_attention.train.errors import UserError

    parser = argparse.ArgumentParser(prog="python -m lightning_attention.bench", description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args, argv)
    except UserError as exc:  # a problem the user can fix: its message, not a traceback
        print(f"{parser.prog} {args.bench}: error: {exc}", file=sys.stderr)
        return 2
