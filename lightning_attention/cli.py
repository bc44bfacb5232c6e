"""Command line: ``lightning-attention {train,generate,bench}``.

Each subcommand lives in its own module and registers itself through :data:`SUBCOMMANDS`:
a module with ``add_arguments(parser)`` and ``run(args) -> int``.
"""

import argparse
import importlib
import sys

import lightning_attention

# name -> (module, one-line help); modules are imported only when their subcommand runs
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "train": ("lightning_attention.cli_train", "train a small TransNormerLLM (or --arch llama) and save a checkpoint "
                                               "folder"),
    "generate": ("lightning_attention.cli_generate", "stream text from a checkpoint with constant memory"),
    "bench": ("lightning_attention.bench.cli",
              "benchmarks: kernels, decode, model, hybrid, serving, model-quality (JSON + PNG)"),
}


# optional dependencies -> the extra that installs them (pyproject.toml)
EXTRAS = {"transformers": "hf", "tokenizers": "hf", "safetensors": "hf", "tqdm": "hf", "datasets": "data",
          "matplotlib": "bench"}


def _available_subcommands() -> dict[str, tuple[str, str]]:
    found = {}
    for name, (module, help_text) in SUBCOMMANDS.items():
        if importlib.util.find_spec(module) is not None:
            found[name] = (module, help_text)
    return found


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lightning-attention",
        description="Lightning Attention: train and sample a TransNormerLLM, benchmark the kernels.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {lightning_attention.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in _available_subcommands().items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        importlib.import_module(module).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    module, _ = SUBCOMMANDS[args.command]
    from lightning_attention.train.errors import UserError

    try:
        return int(importlib.import_module(module).run(args) or 0)
    except UserError as exc:  # a problem the user can fix: its message, not a traceback
        message = str(exc)
    except ModuleNotFoundError as exc:
        top = (exc.name or "").split(".")[0]
        if top not in EXTRAS:
            raise
        message = f"this needs {top}: pip install 'lightning-attention[{EXTRAS[top]}]'"
    print(f"{parser.prog} {args.command}: error: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
