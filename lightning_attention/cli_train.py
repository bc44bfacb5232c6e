"""``lightning-attention train``: train a small TransNormerLLM (or the LLaMA baseline) and save a checkpoint.

With no arguments it trains the ``tiny`` TNL on Python's own documentation (``pydoc_data.topics``) with a byte-level
tokenizer — a few minutes on a 2-core CPU, falling loss visible in the progress bar — and saves
``checkpoints/tnl/checkpoint.pt``; ``lightning-attention generate --checkpoint checkpoints/tnl`` then samples from it.
``--smoke`` runs a handful of steps in seconds (CI). On a GPU the same command uses the Triton kernels and bf16
autocast; ``torchrun --nproc-per-node N -m lightning_attention train ...`` trains data parallel, and
``--sequence-parallel S`` splits every sequence over groups of S ranks (LASP-2 style), composed with data parallel.
"""

import argparse
import os

from lightning_attention.train.trainer import TrainConfig

_HELP = {
    "arch": "tnl (TransNormerLLM, lightning attention) or llama (softmax baseline of equal size)",
    "preset": "model size: smoke | tiny | 40m (see lightning_attention/models/presets.py)",
    "d_model": "override the preset's width",
    "n_layers": "override the preset's depth",
    "n_heads": "override the preset's head count",
    "ffn_dim": "override the preset's channel-mixer width (TNL glu_dim; LLaMA gets ffn_dim + d/3)",
    "decay_recipe": "TNL decay slopes: tnl (released checkpoints) | paper (eq. 10)",
    "attention_variant": "TNL token mixer: tnl | minimax (SiLU on v, weighted RMSNorm, sigmoid gate)",
    "softmax_attention_every": "TNL hybrid: every N-th layer is softmax attention (MiniMax-01: 8)",
    "data": "training text: a UTF-8 file, stdlib (Python's library source, ~30 MB), or hf:NAME[:CONFIG] "
            "(needs `datasets`); default: Python's documentation topics",
    "text_field": "text column of an hf: dataset",
    "max_chars": "use only the first N characters of the text",
    "val_fraction": "fraction of the text (its tail) held out for validation",
    "context": "tokens (bytes) per training sequence",
    "batch_size": "sequences per process per step",
    "steps": "optimizer steps",
    "lr": "peak learning rate (AdamW)",
    "min_lr_ratio": "final learning rate as a fraction of --lr (cosine schedule)",
    "warmup": "linear warmup steps",
    "weight_decay": "AdamW weight decay of the matrices",
    "grad_clip": "gradient-norm clip (0: off)",
    "eval_every": "validation every N steps (and at the end)",
    "eval_batches": "validation batches per evaluation",
    "save_every": "checkpoint every N steps (0: only at the end)",
    "out": "checkpoint directory (default: checkpoints/<arch>, checkpoints/<arch>-smoke with --smoke)",
    "stop_at": "end this run after step N with a checkpoint (continue later with --resume)",
    "seed": "seed of the init, the batch order and the RNG",
    "device": "auto | cpu | cuda",
    "threads": "CPU threads (1 by default: faster than 2 for the small CPU models when cores are shared)",
    "dtype": "auto (bf16 autocast on cuda, float32 on cpu) | float32 | bfloat16",
    "sequence_parallel": "under torchrun: ranks that split each sequence along T (TNL; world = sp x data-parallel)",
}
_CHOICES = {"arch": ["tnl", "llama"], "preset": ["smoke", "tiny", "40m"], "decay_recipe": ["tnl", "paper"],
            "attention_variant": ["tnl", "minimax"], "dtype": ["auto", "float32", "bfloat16", "float16"]}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = TrainConfig()
    for name, help_text in _HELP.items():
        default = getattr(defaults, name)
        kind = type(default) if default is not None else (str if name in ("data", "decay_recipe",
                                                                          "attention_variant") else int)
        shown = default if name != "out" else None
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=kind, default=None,
                            choices=_CHOICES.get(name), help=f"{help_text} (default: {shown})")
    parser.add_argument("--smoke", action="store_true", help="CI mode: the smoke preset, a few steps, seconds")
    parser.add_argument("--resume", action="store_true", help="continue exactly from the checkpoint in --out")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """Flags given on the command line override the defaults (of ``--smoke`` mode when set)."""
    given = {name: getattr(args, name) for name in _HELP if getattr(args, name, None) is not None}
    given.update(resume=args.resume, compile=args.compile, progress=args.progress)
    arch = given.get("arch", "tnl")
    given.setdefault("out", f"checkpoints/{arch}-smoke" if args.smoke else f"checkpoints/{arch}")
    return TrainConfig.smoke(**given) if args.smoke else TrainConfig(**given)


def run(args: argparse.Namespace) -> int:
    from lightning_attention.train.trainer import train

    result = train(config_from_args(args))
    if result.val_losses and os.environ.get("RANK", "0") == "0":  # under torchrun, rank 0 reports
        step, val = result.val_losses[-1]
        print(f"done: {result.step} steps, final validation loss {val:.4f} nats/byte "
              f"({result.tokens_per_second:,.0f} tokens/s)")
    return 0
