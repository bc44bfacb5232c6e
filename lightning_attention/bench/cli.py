"""``lightning-attention bench {kernels,decode,model,hybrid}``: argument parsing and the run envelope.

Every run prints the machine line first, writes ``<out>/<subcommand>.json`` (rewritten after every measurement) and
PNG figures under ``--out``, prints tables, and ends stdout with one JSON summary line.

    lightning-attention bench kernels --out runs/bench                 # grids (a) and (b), K = V = 128, H100 ≈ 6 min
    lightning-attention bench kernels --grid a --head-dims 64,256      # the other head dims of grid (a)
    lightning-attention bench decode --out runs/bench
    lightning-attention bench model --out runs/bench
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
}


# the flag that sets each benchmark's sizes: without it (or --quick) a CPU run is refused
SIZE_FLAGS = {"kernels": "--seqlens", "decode": "--batches", "model": "--contexts", "hybrid": "--seqlens"}


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from e
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _choices(allowed: tuple[str, ...]):
    def parse(text: str) -> list[str]:
        names = [x.strip() for x in text.split(",") if x.strip()]
        bad = [n for n in names if n not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {','.join(allowed)}")
        return names

    return parse


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("runs/bench"), help="output folder (JSON, PNG)")
    p.add_argument(
        "--baselines",
        type=_choices(BASELINES + ("none",)),
        default=list(BASELINES),
        help=f"comma-separated baselines to run when installed ({','.join(BASELINES)}; 'none' for ours only)",
    )
    p.add_argument("--quick", action="store_true", help="tiny shapes, PyTorch path on CPU: a smoke test (< 1 min)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
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
        _common(p)
        if name == "kernels":
            p.add_argument(
                "--grid", choices=("a", "b", "all"), default="all", help="grid (a), (b) or both (docs/design.md)"
            )
            p.add_argument(
                "--head-dims", type=_int_list, default=None, help="K = V values (default 128; 32 in --quick)"
            )
            p.add_argument(
                "--ours",
                type=_choices(OURS),
                default=list(OURS),
                help=f"our variants: {','.join(OURS)} (Triton chunk / recompute backward, PyTorch path)",
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
        elif name == "decode":
            p.add_argument("--batches", type=_int_list, default=None, help="default 1,8,64,256")
            p.add_argument("--memory-tokens", type=_int_list, default=None, help="default 1024,1048576")
        elif name == "model":
            p.add_argument("--contexts", type=_int_list, default=None, help="default 2048,8192,32768,65536")
            p.add_argument("--archs", type=_choices(("tnl", "llama")), default=["tnl", "llama"])
            p.add_argument("--loss-steps", type=int, default=None, help="training steps of the loss curves")
        elif name == "hybrid":
            p.add_argument("--seqlens", type=_int_list, default=None, help="default 4096,...,65536")


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


def run(args: argparse.Namespace) -> int:
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
    config["argv"] = sys.argv
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
    parser = argparse.ArgumentParser(prog="python -m lightning_attention.bench", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))
