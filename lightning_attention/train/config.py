"""Options of a training run: one dataclass whose fields carry their own help text (the ``train`` CLI is built from
them), the ``--smoke`` values, and which options a resumed run may change.
"""

from dataclasses import MISSING, asdict, dataclass, field, fields

from lightning_attention.models.presets import PRESETS
from lightning_attention.train.errors import UserError
from lightning_attention.train.parallel import DEFAULT_UNIT_BLOCKS

# the values of ``--smoke`` (CI): the smoke preset, a few steps of a few short sequences, seconds on a CPU
SMOKE = dict(preset="smoke", steps=6, context=64, batch_size=4, eval_every=3, eval_batches=2, warmup=2,
             max_chars=60_000)

# What a resumed run may change without --resume-override: its length and cadence (resuming in slices changes them)
# and how it runs (device, threads, display, compile, activation checkpointing, how the ranks split the work and FSDP2
# its units: the same training either way; a changed number of data-parallel ranks keeps the global batch, see the
# trainer).
CHANGEABLE_ON_RESUME = frozenset({"steps", "stop_at", "save_every", "eval_every", "out", "resume", "resume_overrides",
                                  "device", "threads", "progress", "compile", "gradient_checkpointing",
                                  "sequence_parallel", "data_parallel", "fsdp_unit_blocks"})
# What a resumed run does not take over from the checkpoint's options: where this slice ends, and where it resumes
# from and writes to
NOT_CARRIED_OVER = frozenset({"stop_at", "resume", "resume_overrides", "out"})


def option(default, help: str, *, choices=None, shown: str | None = None):
    """A field with its CLI help; ``shown`` replaces the printed default (e.g. where a preset decides it)."""
    return field(default=default, metadata={"help": help, "choices": choices, "shown": shown})


def _preset_values(key: str) -> str:
    return "the preset's: " + ", ".join(f"{name} {size[key]}" for name, size in PRESETS.items())


@dataclass
class TrainConfig:
    """Options of a training run; the flags of ``lightning-attention train`` map one to one onto these fields."""

    arch: str = option("tnl", "tnl (TransNormerLLM, lightning attention) or llama (softmax baseline of equal size)",
                       choices=("tnl", "llama"))
    preset: str = option("tiny", "model size (see lightning_attention/models/presets.py)", choices=tuple(PRESETS))
    d_model: int | None = option(None, "override the preset's width", shown=_preset_values("d_model"))
    n_layers: int | None = option(None, "override the preset's depth", shown=_preset_values("n_layers"))
    n_heads: int | None = option(None, "override the preset's head count", shown=_preset_values("n_heads"))
    ffn_dim: int | None = option(None, "override the preset's channel-mixer width (TNL glu_dim; LLaMA gets "
                                       "ffn_dim + d/3)", shown=_preset_values("ffn_dim"))
    decay_recipe: str | None = option(None, "TNL decay slopes: tnl (released checkpoints) | paper (eq. 10)",
                                      choices=("tnl", "paper"), shown="tnl")
    attention_variant: str | None = option(None, "TNL token mixer: tnl | minimax (SiLU on v, weighted RMSNorm, "
                                                 "sigmoid gate)", choices=("tnl", "minimax"), shown="tnl")
    softmax_attention_every: int | None = option(None, "TNL hybrid: every N-th layer is softmax attention "
                                                       "(MiniMax-01: 8)", shown="0, none")
    learn_decay: bool = option(False, "TNL: learn each lightning layer's decay slopes, starting from the recipe's "
                                      "(not with --sequence-parallel)")
    dropout: float = option(0.0, "dropout on the embedding and every residual branch's output (0: none)")
    tokenizer: str = option("bytes", "bytes (one token per UTF-8 byte, id = byte value) | bpe (byte-level BPE "
                                     "trained on the training split, --vocab-size tokens) | PATH (a tokenizer folder "
                                     "or tokenizer.json)")
    vocab_size: int = option(8192, "vocabulary of --tokenizer bpe")
    data: str | None = option(None, "training text: a UTF-8 file, stdlib (Python's library source, ~30 MB), or "
                                    "hf:NAME[:CONFIG] (a Hugging Face dataset: pip install "
                                    "'lightning-attention[data]')",
                              shown="Python's documentation topics, pydoc_data")
    text_field: str = option("text", "text column of an hf: dataset")
    max_chars: int | None = option(None, "use only the first N characters of the text", shown="all")
    val_fraction: float = option(0.05, "fraction of the text (its tail) held out for validation")
    context: int = option(128, "tokens per training sequence")
    batch_size: int = option(16, "sequences per process per step")
    steps: int = option(400, "optimizer steps")
    lr: float = option(3e-3, "peak learning rate (AdamW)")
    min_lr_ratio: float = option(0.1, "final learning rate as a fraction of --lr (cosine schedule)")
    warmup: int = option(20, "linear warmup steps")
    weight_decay: float = option(0.1, "AdamW weight decay of the matrices")
    grad_clip: float = option(1.0, "gradient-norm clip (0: off)")
    eval_every: int = option(100, "validation every N steps (and at the end)")
    eval_batches: int = option(8, "validation batches per evaluation")
    save_every: int = option(0, "checkpoint every N steps (0: only at the end)")
    stop_at: int | None = option(None, "end this run after step N with a checkpoint (continue later with --resume)",
                                 shown="the last step, --steps")
    out: str = option("checkpoints/tnl", "checkpoint folder (a transformers folder, see the README)",
                      shown="checkpoints/<arch>; checkpoints/<arch>-smoke with --smoke")
    resume: bool | str = option(False, "continue exactly from the checkpoint in --out (or in PATH); options left "
                                       "off the command line are the run's own")
    resume_overrides: tuple[str, ...] = option((), "options that may differ from the checkpoint's on --resume, "
                                                   "comma-separated (e.g. lr,batch_size)", shown="none")
    seed: int = option(1234, "seed of the init, the batch order and the RNG")
    device: str = option("auto", "auto (cuda if available, else cpu) | cpu | cuda")
    dtype: str = option("auto", "auto (bf16 autocast on cuda, float32 on cpu) | float32 | bfloat16 | float16",
                        choices=("auto", "float32", "bfloat16", "float16"))
    compile: bool = option(False, "torch.compile the model")
    gradient_checkpointing: bool = option(False, "recompute each block in the backward pass (activation "
                                                 "checkpointing): less memory, about one more forward of compute")
    progress: bool = option(True, "progress bar")
    # CPU intra-op threads during the run (None: torch's default). One by default: the small models trained on a
    # CPU gain little from a second thread, and OpenMP's spin-waiting made 2 threads 10-25x slower per step than 1
    # on a shared 2-core machine (0.18 s vs 2-4.7 s per step of the tiny preset, measured side by side).
    threads: int | None = option(1, "CPU threads (1: faster than 2 for the small CPU models when cores are shared)")
    # Under torchrun: ranks per sequence-parallel group (TNL without softmax layers). The world size must be a
    # multiple; world / sequence_parallel groups then train data parallel.
    sequence_parallel: int = option(1, "under torchrun: ranks that split each sequence along T (TNL; world = sp x "
                                       "data-parallel)")
    # How the data-parallel replicas keep the model: DDP replicates parameters and optimizer state on every rank;
    # FSDP2 (fully_shard) shards them over every rank, sequence-parallel ones included. Works in one process too
    # (a process group of one: nothing to shard, same training).
    data_parallel: str = option("ddp", "ddp (a full replica per rank) | fsdp (PyTorch FSDP2: parameters, gradients "
                                       "and optimizer state sharded over the ranks)", choices=("ddp", "fsdp"))
    # FSDP2's host work per step grows with its units (one all-gather and one reduce-scatter each); with few tokens per
    # rank (sequence parallelism, activation checkpointing's recompute) it can outlast the GPU's work
    fsdp_unit_blocks: int = option(DEFAULT_UNIT_BLOCKS, "with --data-parallel fsdp: consecutive decoder blocks sharded "
                                   "as one unit (fewer units, less host work per step; more parameters gathered at "
                                   "once; 1: a unit per block)")

    def __post_init__(self):
        if isinstance(self.resume_overrides, str):
            self.resume_overrides = tuple(x.strip() for x in self.resume_overrides.split(",") if x.strip())
        unknown = sorted(set(self.resume_overrides) - set(self.field_names()))
        if unknown:
            raise ValueError(f"resume_overrides names unknown options {unknown}")
        if self.fsdp_unit_blocks < 1:
            raise UserError(f"--fsdp-unit-blocks must be at least 1 (decoder blocks per FSDP2 unit), got "
                            f"{self.fsdp_unit_blocks}")

    @classmethod
    def smoke(cls, **overrides) -> "TrainConfig":
        """A CI-sized run (:data:`SMOKE`), with ``overrides`` on top."""
        return cls(**{**SMOKE, **overrides})

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def default(cls, name: str):
        f = cls.__dataclass_fields__[name]
        return f.default if f.default is not MISSING else f.default_factory()

    def options(self) -> dict:
        """The options as plain data (what a checkpoint stores)."""
        return asdict(self)


def changed_on_resume(saved: dict, cfg: TrainConfig) -> list[str]:
    """Options of ``cfg`` that differ from a checkpoint's ``saved`` options and may not (see
    :data:`CHANGEABLE_ON_RESUME` and ``cfg.resume_overrides``), as ``"name: old -> new"`` lines."""
    current = cfg.options()
    allowed = CHANGEABLE_ON_RESUME | set(cfg.resume_overrides)
    return [f"{name}: {saved[name]!r} -> {value!r}" for name, value in current.items()
            if name not in allowed and name in saved and _comparable(saved[name]) != _comparable(value)]


def _comparable(value):
    return list(value) if isinstance(value, tuple) else value
