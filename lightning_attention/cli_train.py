"""``lightning-attention train``: train a small TransNormerLLM (or the LLaMA baseline) and save a checkpoint folder.

With no arguments it trains the ``tiny`` TNL on Python's own documentation (``pydoc_data.topics``) with the byte
tokenizer — a few minutes on a 2-core CPU, falling loss visible in the progress bar — and saves the transformers
folder ``checkpoints/tnl``; ``lightning-attention generate`` then samples from it. ``--smoke`` runs a handful of steps
in seconds (CI). On a GPU the same command uses the Triton kernels and bf16 autocast; ``torchrun --nproc-per-node N -m
lightning_attention train ...`` trains data parallel, and ``--sequence-parallel S`` splits every sequence over groups
of S ranks (LASP-2 style), composed with data parallel.

The flags are the fields of :class:`~lightning_attention.train.config.TrainConfig`, with the help text each field
carries. Plain argparse rather than transformers' ``HfArgumentParser``: that one prints "(default: None)" where a
preset or ``--smoke`` decides the value, and ``--help`` would import transformers.
"""

import argparse
import typing
from dataclasses import fields

from lightning_attention.train.config import NOT_CARRIED_OVER, SMOKE, TrainConfig

SPECIAL = ("resume", "resume_overrides")  # flags with their own syntax, added below the loop


def _value_type(f) -> type:
    """The argparse type of a field: its default's type, or the non-None member of ``X | None``."""
    default = TrainConfig.default(f.name)
    if default is not None:
        return type(default)
    return next(t for t in typing.get_args(f.type) if t is not type(None))


def _shown_default(name: str) -> str:
    default = TrainConfig.default(name)
    shown = TrainConfig.__dataclass_fields__[name].metadata["shown"]
    if shown is None:
        shown = ("on" if default else "off") if isinstance(default, bool) else str(default)
    if name in SMOKE and SMOKE[name] != default:
        shown += f"; {SMOKE[name]} with --smoke"
    return shown


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for f in fields(TrainConfig):
        if f.name in SPECIAL:
            continue
        help_text = f"{f.metadata['help']} (default: {_shown_default(f.name)})"
        flag = "--" + f.name.replace("_", "-")
        kind = _value_type(f)
        if kind is bool:
            parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                                help=help_text)
        else:
            parser.add_argument(flag, dest=f.name, type=kind, choices=f.metadata["choices"],
                                default=argparse.SUPPRESS, help=help_text)
    parser.add_argument("--smoke", action="store_true",
                        help="CI mode: " + ", ".join(f"{k.replace('_', '-')} {v}" for k, v in SMOKE.items())
                        + " (seconds on a CPU)")
    parser.add_argument("--resume", nargs="?", const=True, default=argparse.SUPPRESS, metavar="PATH",
                        help=TrainConfig.__dataclass_fields__["resume"].metadata["help"]
                        + "; with PATH, --out defaults to PATH")
    parser.add_argument("--resume-override", dest="resume_overrides", default=argparse.SUPPRESS, metavar="NAMES",
                        help=TrainConfig.__dataclass_fields__["resume_overrides"].metadata["help"])


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The run's options: flags given on the command line over the defaults (of ``--smoke`` mode when set); when
    resuming, over the checkpoint's own options instead (a changed one is refused unless in ``--resume-override``).

    Raises :class:`~lightning_attention.train.checkpoint.CheckpointError` when ``--resume`` finds no checkpoint.
    """
    names = set(TrainConfig.field_names())
    given = {name: value for name, value in vars(args).items() if name in names}
    resume = given.get("resume", False)
    arch = given.get("arch", "tnl")
    if isinstance(resume, str):
        given.setdefault("out", resume)
    given.setdefault("out", f"checkpoints/{arch}-smoke" if args.smoke else f"checkpoints/{arch}")
    if resume:
        from lightning_attention.train.checkpoint import load_training_state

        source = given["out"] if resume is True else resume
        saved = load_training_state(source)["options"]
        base = {k: v for k, v in saved.items() if k in names and k not in NOT_CARRIED_OVER}
        return TrainConfig(**{**base, **given})
    return TrainConfig.smoke(**given) if args.smoke else TrainConfig(**given)


def run(args: argparse.Namespace) -> int:
    import os

    from lightning_attention.train.trainer import train

    result = train(config_from_args(args))
    if result.val_losses and os.environ.get("RANK", "0") == "0":  # under torchrun, rank 0 reports
        (_, val), (_, bpb) = result.val_losses[-1], result.val_bits_per_byte[-1]
        print(f"done: {result.step} steps, final validation loss {val:.4f} nats/token, {bpb:.4f} bits/byte "
              f"({result.tokens_per_second:,.0f} tokens/s)")
    return 0
