"""The model-quality protocol: which architectures, which runs in which order, and how the best learning rate is chosen.

A :class:`Protocol` fixes everything a comparison depends on before any run: the architectures (:data:`ARCHS`), the
model size, the contexts, the learning-rate grid, the seeds, the token budgets, the evaluation sizes and the model
options. :func:`plan` turns it into :class:`RunSpec` s:

1. **sweep**: every architecture at every learning rate, one seed, ``sweep_tokens`` at ``sweep_context``; an
   architecture whose best rate is the lowest or the highest it has tried gets one more rate, a factor of 2 beyond
   that edge (up to ``lr_extensions`` of them), so the rate it is compared at is a measured minimum, not a bound;
2. **final**: at each architecture's best sweep learning rate (lowest final validation bits per byte), every seed,
   ``tokens`` at every context (the 2,048 runs use the rate chosen at 512: same tokens per step).

Every run of one seed sees the same batches in the same order, whatever the architecture or learning rate (one
``WindowLoader`` seed, tokens per step fixed at every context); a seed changes the initialisation and the order.
"""

import dataclasses
import hashlib
import json
import math

# name -> (model arch of presets.model_config, its config overrides)
ARCHS: dict[str, tuple[str, dict]] = {
    "tnl": ("tnl", {}),  # TransNormerLLM as released: SiLU q/k, u gate, SRMSNorm, LRPE on layer 0
    "minimax": ("tnl", {"attention_variant": "minimax"}),  # MiniMax-01's lightning layer: SiLU q/k/v, sigmoid gate
    # MiniMax-01 as it ships: its lightning layers and one softmax-attention layer (RoPE) after every 7
    "hybrid": ("tnl", {"attention_variant": "minimax", "softmax_attention_every": 8}),
    "llama": ("llama", {}),  # transformers' LlamaForCausalLM: RoPE, SwiGLU, RMSNorm
}
REFERENCE_ARCH = "llama"
# position buckets of the validation loss: [0, 64), [64, 256), [256, 1K), [1K, 2K), [2K, 8K), clipped to a length
POSITION_EDGES = (0, 64, 256, 1024, 2048, 8192)


@dataclasses.dataclass(frozen=True)
class ModelOptions:
    """Options of the official setups that differ from this library's defaults (all off by default)."""

    dropout: float = 0.0  # embedding and residual-branch dropout, every architecture (the paper: 0.1)
    tie_embeddings: bool = False  # LM head shares the input embedding, every architecture
    official_init: bool = False  # every weight N(0, 0.02), as the released TNL code (no 1/√(2L) residual scaling)
    lrpe_float32: bool = False  # TNL's LRPE layer in float32 under autocast (its angles' gradient)

    def overrides(self, model_arch: str) -> dict:
        """Config overrides of these options for a ``presets.model_config`` arch."""
        out = {"dropout": self.dropout, "tie_word_embeddings": self.tie_embeddings,
               "scale_residual_init": not self.official_init}
        if model_arch == "tnl":
            out["lrpe_float32"] = self.lrpe_float32
        return out

    def enabled(self) -> list[str]:
        return [f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self)
                if getattr(self, f.name) != f.default]


@dataclasses.dataclass(frozen=True)
class Protocol:
    archs: tuple[str, ...] = tuple(ARCHS)
    preset: str = "40m"
    contexts: tuple[int, ...] = (512, 2048)
    sweep_context: int = 512
    lrs: tuple[float, ...] = (5e-4, 1e-3, 2e-3, 4e-3)
    seeds: tuple[int, ...] = (0, 1, 2)
    lr_extensions: int = 2  # sweep rates an architecture may add past the grid's edge (see the module docstring)
    sweep_tokens: int = 2**22  # 128 steps
    tokens: int = 2**24  # 512 steps
    batch_tokens: int = 2**15  # tokens per optimizer step at every context (64 x 512, 16 x 2048)
    warmup_fraction: float = 0.1
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    eval_points: int = 8  # validation evaluations along a run (the curve)
    curve_eval_tokens: int = 2**16
    final_eval_tokens: int = 2**18  # per evaluated length: 512 windows of 512, 32 of 8,192
    eval_lengths: tuple[int, ...] = (2048, 8192)  # evaluated beyond a run's context when longer than it
    # the preset's depth replaced: 8 layers, so the hybrid has exactly one softmax layer in 8 (MiniMax-01's ratio)
    # and the runs fit the GPU budget of model_quality.py (the 40m width: d 512, 8 heads; ≈ 28 M parameters besides
    # the embeddings)
    n_layers: int | None = 8
    options: ModelOptions = ModelOptions()

    def __post_init__(self):
        unknown = sorted(set(self.archs) - set(ARCHS))
        if unknown:
            raise ValueError(f"unknown architectures {unknown}; choose from {','.join(ARCHS)}")
        for context in (*self.contexts, self.sweep_context):
            if self.batch_tokens % context:
                raise ValueError(f"context {context} must divide the tokens per step ({self.batch_tokens})")
        for name in ("sweep_tokens", "tokens"):
            if getattr(self, name) < self.batch_tokens:
                raise ValueError(f"{name} ({getattr(self, name)}) is less than one step of {self.batch_tokens} tokens")
        if not self.lrs or not self.seeds or not self.contexts:
            raise ValueError("the protocol needs at least one learning rate, one seed and one context")

    def steps(self, tokens: int) -> int:
        return tokens // self.batch_tokens

    def batch_size(self, context: int) -> int:
        return self.batch_tokens // context

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Protocol":
        d = dict(d)
        d["options"] = ModelOptions(**d.get("options", {}))
        for key in ("archs", "contexts", "lrs", "seeds", "eval_lengths"):
            d[key] = tuple(d[key])
        return cls(**d)


def quick_protocol() -> Protocol:
    """The CPU smoke protocol (``--quick``): 8 layers of width 32, contexts 32 and 64, two learning rates (so every
    architecture's best is an edge and its sweep extends once) and two seeds, a few steps each (the sweep, its
    extension and both stages really run, in seconds)."""
    return Protocol(preset="smoke", n_layers=8, contexts=(32, 64), sweep_context=32, lrs=(2e-3, 8e-3), seeds=(0, 1),
                    lr_extensions=1,
                    sweep_tokens=8 * 256, tokens=12 * 256, batch_tokens=256, eval_points=3, curve_eval_tokens=1024,
                    final_eval_tokens=2048, eval_lengths=(128,))


@dataclasses.dataclass(frozen=True)
class RunSpec:
    stage: str  # "sweep" | "final"
    arch: str
    context: int
    lr: float
    seed: int
    tokens: int

    @property
    def id(self) -> str:
        return f"{self.stage}-{self.arch}-ctx{self.context}-lr{self.lr:g}-seed{self.seed}"


def sweep_runs(protocol: Protocol, records: dict[str, dict] | None = None) -> list[RunSpec]:
    """Learning rate by learning rate, every architecture at each (a sweep cut short still compares them all); then
    the rates past the grid's edge that the finished runs of ``records`` (run id -> run record) call for, each
    architecture's in the order they were asked for (the last one may not have run yet)."""
    grid = [_sweep_spec(protocol, arch, lr) for lr in protocol.lrs for arch in protocol.archs]
    return grid + [spec for arch in protocol.archs for spec in _edge_extensions(protocol, arch, records or {})]


def _sweep_spec(protocol: Protocol, arch: str, lr: float) -> RunSpec:
    return RunSpec("sweep", arch, protocol.sweep_context, lr, protocol.seeds[0], protocol.sweep_tokens)


def _edge_extensions(protocol: Protocol, arch: str, records: dict[str, dict]) -> list[RunSpec]:
    """The sweep runs ``arch`` adds past the grid: while every rate tried so far has finished and the best is the
    lowest (highest) of them, one more at half (twice) that rate, at most ``protocol.lr_extensions``."""
    rates, added = sorted(protocol.lrs), []
    for _ in range(protocol.lr_extensions):
        best = _best_rate([(lr, records.get(_sweep_spec(protocol, arch, lr).id)) for lr in rates])
        if best is None:
            break
        if best == rates[0]:
            rate = best / 2
        elif best == rates[-1]:
            rate = best * 2
        else:
            break
        rates = sorted([*rates, rate])
        added.append(_sweep_spec(protocol, arch, rate))
    return added


def final_runs(protocol: Protocol, best_lr: dict[str, float]) -> list[RunSpec]:
    """Context by context and seed by seed, every architecture at its best rate (those whose sweep is complete)."""
    return [RunSpec("final", arch, context, best_lr[arch], seed, protocol.tokens)
            for context in protocol.contexts for seed in protocol.seeds for arch in protocol.archs if arch in best_lr]


def best_learning_rates(protocol: Protocol, records: dict[str, dict]) -> dict[str, float]:
    """``{arch: lr}`` with the lowest final validation bits per byte among the arch's sweep runs, for the archs whose
    sweep runs have all finished, edge extensions included (a diverged run counts as infinitely bad). ``records``:
    run id -> run record."""
    best = {}
    sweep = sweep_runs(protocol, records)
    for arch in protocol.archs:
        rate = _best_rate([(spec.lr, records.get(spec.id)) for spec in sweep if spec.arch == arch])
        if rate is not None:
            best[arch] = rate
    return best


def _best_rate(runs: list[tuple[float, dict | None]]) -> float | None:
    """The rate of the lowest final validation bits per byte among ``(lr, record)`` pairs (the lower rate on a
    tie), or None while any record is missing (None): the one rule of both the edge extensions and the choice."""
    if any(record is None for _, record in runs):
        return None
    return min((_final_bpb(record), lr) for lr, record in runs)[1]


def _final_bpb(record: dict) -> float:
    value = record.get("final", {}).get("bpb")
    return value if record.get("status") == "ok" and value is not None and math.isfinite(value) else math.inf


# protocol fields that choose which runs exist; the run's own spec records its value of them
_RUN_CHOICE_FIELDS = {"archs", "contexts", "sweep_context", "lrs", "lr_extensions", "seeds", "sweep_tokens",
                      "tokens"}


def settings_key(protocol: Protocol, corpus_sha256: dict, tokenizer_sha256: str | None) -> str:
    """A digest of everything a run's result depends on besides its own :class:`RunSpec` (model size and options,
    optimizer and schedule, evaluation sizes, corpus, tokenizer). A recorded run is reused only under the same key,
    so calls that add contexts, seeds or rates share their common runs and nothing else is ever mixed."""
    settings = {k: v for k, v in protocol.to_json().items() if k not in _RUN_CHOICE_FIELDS}
    payload = json.dumps({"settings": settings, "corpus": corpus_sha256, "tokenizer": tokenizer_sha256},
                         sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]
