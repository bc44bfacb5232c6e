"""The training loop of ``lightning-attention train``: a small language model on a text, on CPU or GPU(s).

One code path for every device: on a CPU the lightning layers run the PyTorch chunked op, on CUDA the Triton kernels
(with bf16 autocast); under ``torchrun`` the model is wrapped in DistributedDataParallel and every rank reads its own
slice of each global batch; with ``sequence_parallel = N`` every group of N consecutive ranks shares one batch and
splits its sequences along T (lightning layers run :func:`lightning_attention.distributed.lightning_attn_sp`), the
groups themselves being data parallel. Loss is next-byte cross entropy in nats; validation loss is measured on a fixed tail of
the text every ``eval_every`` steps and at the end. A checkpoint (see :mod:`lightning_attention.train.checkpoint`)
is written every ``save_every`` steps and at the end; ``resume=True`` continues from it bit for bit (same batches,
same RNG, same optimizer state, same learning-rate schedule).
"""

import contextlib
import math
import os
import time
from dataclasses import asdict, dataclass, field, fields

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from lightning_attention.models.presets import model_config, model_from_config, parameter_count
from lightning_attention.train import checkpoint as ckpt_io
from lightning_attention.train import distributed as dist_utils
from lightning_attention.train.data import WindowLoader, load_text, split_tokens, validation_batches
from lightning_attention.train.tokenizer import ByteTokenizer


@dataclass
class TrainConfig:
    """Options of a training run (the CLI flags of ``lightning-attention train`` map one to one onto these)."""

    arch: str = "tnl"  # "tnl" (TransNormerLLM on lightning attention) or "llama" (softmax baseline, equal size)
    preset: str = "tiny"  # model size, see lightning_attention.models.presets
    d_model: int | None = None  # size overrides of the preset
    n_layers: int | None = None
    n_heads: int | None = None
    ffn_dim: int | None = None
    decay_recipe: str | None = None  # TNL only: "tnl" | "paper"
    attention_variant: str | None = None  # TNL only: "tnl" | "minimax"
    softmax_attention_every: int | None = None  # TNL only: hybrid, one softmax layer every N
    data: str | None = None  # None: Python's documentation (pydoc_data.topics); a text file; or hf:NAME[:CONFIG]
    text_field: str = "text"  # column of an hf: dataset
    max_chars: int | None = None  # truncate the text
    val_fraction: float = 0.05
    context: int = 128
    batch_size: int = 16  # sequences per rank per step
    steps: int = 400
    lr: float = 3e-3
    min_lr_ratio: float = 0.1  # cosine decay to lr · min_lr_ratio
    warmup: int = 20
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    eval_every: int = 100
    eval_batches: int = 8
    save_every: int = 0  # 0: only at the end
    stop_at: int | None = None  # end this run (with a checkpoint) after this step; --resume continues (time slices)
    out: str = "checkpoints/tnl"
    resume: bool = False
    seed: int = 1234
    device: str = "auto"  # "auto": cuda if available, else cpu
    dtype: str = "auto"  # "auto": bf16 autocast on cuda, float32 on cpu; or "float32" / "bfloat16"
    compile: bool = False
    progress: bool = True
    # CPU intra-op threads during the run (None: torch's default). One by default: the small models trained on a
    # CPU gain little from a second thread, and OpenMP's spin-waiting made 2 threads 10-25x slower per step than 1
    # on the shared 2-core CI machine (0.18 s vs 2-4.7 s per step of the tiny preset, measured side by side).
    threads: int | None = 1
    # Under torchrun: ranks per sequence-parallel group (TNL without softmax layers). The world size must be a
    # multiple; world / sequence_parallel groups then train data parallel.
    sequence_parallel: int = 1

    @classmethod
    def smoke(cls, **overrides) -> "TrainConfig":
        """A CI-sized run: the smoke preset, a few steps of a few short sequences, seconds on a CPU."""
        base = dict(preset="smoke", steps=6, context=64, batch_size=4, eval_every=3, eval_batches=2, warmup=2,
                    max_chars=60_000)
        base.update(overrides)
        return cls(**base)

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


@dataclass
class TrainResult:
    step: int
    train_losses: list[float] = field(default_factory=list)  # one per step, from step 0
    val_losses: list[tuple[int, float]] = field(default_factory=list)  # (step, loss)
    tokens_per_second: float = 0.0
    parameters: int = 0
    checkpoint: str | None = None


def learning_rate(cfg: TrainConfig, step: int) -> float:
    """Linear warmup for ``warmup`` steps, then cosine from ``lr`` to ``lr · min_lr_ratio`` at ``steps``."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def _device(cfg: TrainConfig, info: dist_utils.DistInfo) -> torch.device:
    name = cfg.device
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and info.enabled:
        name = f"cuda:{info.local_rank}"
    return torch.device(name)


def _autocast(cfg: TrainConfig, device: torch.device):
    dtype = cfg.dtype
    if dtype == "auto":
        dtype = "bfloat16" if device.type == "cuda" else "float32"
    if dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=getattr(torch, dtype))


def _optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    # weight decay on matrices (projections, embeddings) only; not on LRPE angles, norm weights or biases
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2 and p.shape[-2] != 1]
    keep = [p for p in model.parameters() if p.requires_grad and not (p.ndim >= 2 and p.shape[-2] != 1)]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": keep, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8)


def lm_loss(model, batch: torch.Tensor, sp_group=None) -> torch.Tensor:
    """Mean next-token cross entropy of ``batch [B, T + 1]`` (inputs ``[:, :-1]``, targets ``[:, 1:]``), float32.

    With a sequence-parallel group, this rank sees its slice of T (targets shifted before slicing, LRPE given the
    global positions) and returns its summed loss over 1/sp of the batch's tokens: the mean of these over the group
    is the batch's mean loss, and so is the gradient average that DDP takes over all ranks.
    """
    inputs, targets, positions = batch[:, :-1], batch[:, 1:], None
    denominator = targets.numel()
    if sp_group is not None:
        from lightning_attention.distributed import shard_sequence

        B, T = inputs.shape
        positions = torch.arange(T, device=batch.device).expand(B, T)
        inputs, targets, positions = (shard_sequence(x, sp_group) for x in (inputs, targets, positions))
        denominator = denominator / torch.distributed.get_world_size(sp_group)
    logits = model(inputs, position_ids=positions, use_cache=False).logits
    loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum")
    return loss / denominator


@torch.no_grad()
def evaluate(model, batches, device, autocast, info, sp_group=None) -> float:
    """Token-weighted mean validation loss over this rank's batches, summed over ranks."""
    was_training = model.training
    model.eval()
    totals = torch.zeros(2, dtype=torch.float64, device=device)
    for batch in batches:
        batch = batch.to(device)
        with autocast:
            loss = lm_loss(model, batch, sp_group)
        n = batch[:, 1:].numel() / (1 if sp_group is None else torch.distributed.get_world_size(sp_group))
        totals += torch.tensor([loss.item() * n, n], dtype=torch.float64, device=device)
    dist_utils.all_reduce_sum(totals, info)
    model.train(was_training)
    return float(totals[0] / totals[1])


def train(cfg: TrainConfig) -> TrainResult:
    """Runs (or resumes) a training run; returns the loss history. Rank 0 prints progress and saves."""
    info = dist_utils.setup("cuda" if (cfg.device in ("auto", "cuda") and torch.cuda.is_available()) else "cpu")
    threads = torch.get_num_threads()
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    try:
        return _train(cfg, info)
    finally:
        torch.set_num_threads(threads)  # process-wide setting: restore it for whoever runs next in this process
        dist_utils.teardown(info)


def _sequence_parallel(cfg: TrainConfig, info: dist_utils.DistInfo):
    """``(sp_group, dp_rank, dp_world)``: the sequence-parallel group (None without it) and this rank's place among
    the data-parallel replicas (each group of ``sequence_parallel`` consecutive ranks is one replica)."""
    sp = cfg.sequence_parallel
    if sp == 1:
        return None, info.rank, info.world_size
    if cfg.arch != "tnl" or cfg.softmax_attention_every:
        raise ValueError("--sequence-parallel needs --arch tnl without softmax layers (--softmax-attention-every)")
    if sp < 1 or info.world_size % sp != 0:
        raise ValueError(f"--sequence-parallel must divide the number of processes {info.world_size}, got {sp}")
    from lightning_attention.distributed import init_sequence_parallel

    sp_group, _ = init_sequence_parallel(sp)
    return sp_group, info.rank // sp, info.world_size // sp


def _train(cfg: TrainConfig, info: dist_utils.DistInfo) -> TrainResult:
    device = _device(cfg, info)
    torch.manual_seed(cfg.seed)
    tokenizer = ByteTokenizer()
    text = load_text(cfg.data, text_field=cfg.text_field, max_chars=cfg.max_chars)
    tokens = tokenizer.encode_tensor(text)  # uint8: one byte of memory per token
    train_tokens, val_tokens = split_tokens(tokens, cfg.val_fraction, cfg.context)
    sp_group, dp_rank, dp_world = _sequence_parallel(cfg, info)
    loader = WindowLoader(train_tokens, cfg.context, cfg.batch_size, cfg.seed, dp_rank, dp_world)
    val_sets = validation_batches(val_tokens, cfg.context, cfg.batch_size, cfg.eval_batches, dp_rank, dp_world)

    arch_options = dict(decay_recipe=cfg.decay_recipe, attention_variant=cfg.attention_variant,
                        softmax_attention_every=cfg.softmax_attention_every) if cfg.arch == "tnl" else {}
    mconf = model_config(cfg.arch, cfg.preset, tokenizer.vocab_size, d_model=cfg.d_model, n_layers=cfg.n_layers,
                         n_heads=cfg.n_heads, ffn_dim=cfg.ffn_dim, **arch_options)
    model = model_from_config(cfg.arch, mconf, sequence_parallel_group=sp_group).to(device)
    model_config_saved = model.config.to_dict()
    optimizer = _optimizer(model, cfg)
    result = TrainResult(step=0, parameters=parameter_count(model))

    if cfg.resume and os.path.isfile(ckpt_io.checkpoint_path(cfg.out)):
        state = ckpt_io.load_checkpoint(cfg.out)
        if state["arch"] != cfg.arch or state["model_config"] != model_config_saved:
            raise ValueError(f"{cfg.out}: the checkpoint's model does not match the requested one")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        loader.load_state_dict(state["loader"])
        ckpt_io.set_rng_state(state["rng"])
        result.step = state["step"]
        result.train_losses = list(state["history"]["train"])
        result.val_losses = [tuple(x) for x in state["history"]["val"]]

    net = model
    if info.enabled:
        net = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    if cfg.compile:
        net = torch.compile(net)
    autocast = _autocast(cfg, device)

    def save() -> str | None:
        path = None
        if info.is_main:
            path = ckpt_io.save_checkpoint(
                cfg.out, arch=cfg.arch, model_config=model_config_saved, model=model.state_dict(),
                optimizer=optimizer.state_dict(), step=result.step, loader=loader.state_dict(),
                rng=ckpt_io.rng_state(), train_config=asdict(cfg), tokenizer=tokenizer.name,
                history={"train": result.train_losses, "val": result.val_losses},
            )
        dist_utils.barrier(info)
        return path

    say = tqdm.write if cfg.progress else print
    if info.is_main:
        say(f"{cfg.arch}: {result.parameters / 1e6:.2f}M parameters on {device} "
            f"({info.world_size} process{'es' if info.world_size > 1 else ''}), {len(train_tokens):,} training "
            f"tokens, context {cfg.context}, batch {cfg.batch_size * dp_world}"
            f"{f', sequence parallel over {cfg.sequence_parallel} ranks' if sp_group is not None else ''}, "
            f"steps {result.step}->{cfg.steps}")
    bar = tqdm(total=cfg.steps, initial=result.step, disable=not (cfg.progress and info.is_main), desc="train",
               unit="step", dynamic_ncols=True)
    net.train()
    start, tokens_seen = time.perf_counter(), 0
    end = cfg.steps if cfg.stop_at is None else min(cfg.stop_at, cfg.steps)
    while result.step < end:
        step = result.step
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(cfg, step)
        batch = loader.next_batch().to(device, non_blocking=True)
        with autocast:
            loss = lm_loss(net, batch, sp_group)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        loss_value = float(loss.detach())  # the only host sync of a step
        if info.enabled:
            loss_value = float(dist_utils.all_reduce_sum(loss.detach().clone(), info)) / info.world_size
        result.train_losses.append(loss_value)
        result.step += 1
        tokens_seen += batch[:, 1:].numel() * dp_world
        bar.update(1)
        bar.set_postfix(loss=f"{loss_value:.3f}", lr=f"{learning_rate(cfg, step):.2e}")
        last = result.step == end
        if (cfg.eval_every and result.step % cfg.eval_every == 0) or last:
            val = evaluate(net, val_sets, device, autocast, info, sp_group)
            result.val_losses.append((result.step, val))
            if info.is_main:
                say(f"step {result.step}: train loss {loss_value:.4f}, val loss {val:.4f}")
        if (cfg.save_every and result.step % cfg.save_every == 0) or last:
            result.checkpoint = save()
    bar.close()
    elapsed = time.perf_counter() - start
    result.tokens_per_second = tokens_seen / elapsed if elapsed > 0 and tokens_seen else 0.0
    if info.is_main and result.checkpoint:
        say(f"checkpoint: {result.checkpoint}")
    return result
