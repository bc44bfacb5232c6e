"""The training loop of ``lightning-attention train``: a small language model on a text, on CPU or GPU(s).

One code path for every device: on a CPU the lightning layers run the PyTorch chunked op, on CUDA the Triton kernels
(with bf16 autocast); under ``torchrun`` every rank reads its own slice of each global batch and the model is
DistributedDataParallel or, with ``data_parallel = "fsdp"``, sharded by FSDP2; with ``sequence_parallel = N`` every
group of N consecutive ranks shares one batch and splits its sequences along T (lightning layers run
:func:`lightning_attention.distributed.lightning_attn_sp`), the groups themselves being data parallel. The ranks form
one ("dp", "sp") DeviceMesh (see :mod:`lightning_attention.train.parallel`). The loss is next-token cross entropy in
nats; validation (a fixed tail of the text, every ``eval_every`` steps and at the end) also reports bits per byte,
which compares runs with different tokenizers. The learning rate follows transformers' cosine schedule with warmup
and a floor.

A checkpoint (a transformers folder plus the training state, see :mod:`lightning_attention.train.checkpoint`) is
written every ``save_every`` steps and at the end; ``resume`` continues from it bit for bit (same batches, RNG,
optimizer state and schedule), refusing options that differ from the run's own (see ``train/config.py``). A run may
resume on another number of processes, with or without sequence parallelism, under DDP or FSDP2: the optimizer state
is resharded on load, and the per-rank batch follows the number of data-parallel replicas so that the global batch,
and with it the batches, the data position and the loss curve, stay the run's (equal up to float rounding: the
gradient sums run in another order). ``--batch-size`` with ``--resume-override batch_size`` changes it instead.
"""

import contextlib
import dataclasses
import functools
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from transformers import get_cosine_with_min_lr_schedule_with_warmup

from lightning_attention.models.presets import model_config, model_from_config, parameter_count
from lightning_attention.train import checkpoint as ckpt_io
from lightning_attention.train import distributed as dist_utils
from lightning_attention.train import parallel
from lightning_attention.train.config import TrainConfig, changed_on_resume
from lightning_attention.train.data import WindowLoader, check_split, load_text, split_text, validation_batches
from lightning_attention.train.errors import UserError
from lightning_attention.train.optimizer_state import FOLDER as OPTIMIZER_FOLDER
from lightning_attention.train.optimizer_state import load_optimizer_state, save_optimizer_state
from lightning_attention.train.tokenizer import encode_corpus, resolve_tokenizer, token_byte_lengths

STATE_VERSION = 3  # 3: the optimizer state in optimizer/, sharded, keyed by parameter name


@dataclass
class TrainResult:
    step: int
    train_losses: list[float] = field(default_factory=list)  # one per step, from step 0
    val_losses: list[tuple[int, float]] = field(default_factory=list)  # (step, nats per token)
    val_bits_per_byte: list[tuple[int, float]] = field(default_factory=list)  # (step, bits per UTF-8 byte)
    tokens_per_second: float = 0.0
    parameters: int = 0
    checkpoint: str | None = None


def _device(cfg: TrainConfig, info: dist_utils.DistInfo) -> torch.device:
    name = cfg.device
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        name = f"cuda:{info.local_rank}"  # an explicit index: DDP and the DeviceMesh place their work by it
    return torch.device(name)


def autocast_context(cfg: TrainConfig, device: torch.device):
    """``cfg.dtype``'s autocast on ``device`` ("auto": bf16 on CUDA, none on CPU)."""
    dtype = cfg.dtype
    if dtype == "auto":
        dtype = "bfloat16" if device.type == "cuda" else "float32"
    if dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=getattr(torch, dtype))


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW of the run (``cfg.lr``, ``cfg.weight_decay``) over ``model``'s parameters, as they are: build it after
    :func:`prepare_model` (FSDP2 replaces the parameters by their shards)."""
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


def train_step(net, model, optimizer, batch: torch.Tensor, autocast, *, sp_group=None,
               grad_clip: float = 0.0) -> torch.Tensor:
    """One optimizer step on ``batch [B, T + 1]``: forward through ``net`` (the wrapped model), backward, gradient
    clipping over ``model``'s parameters (whole or sharded), AdamW. Returns the loss, detached, without a host sync."""
    with autocast:
        loss = lm_loss(net, batch, sp_group)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    return loss.detach()


@torch.no_grad()
def evaluate(model, batches, device, autocast, info, byte_lengths: torch.Tensor, sp_group=None, *,
             context: int | None = None) -> tuple[float, float]:
    """``(nats per token, bits per byte)`` of the validation batches of every rank.

    Token-weighted over all ranks. Bits per byte divide the summed loss by ``ln 2`` times the UTF-8 bytes the target
    tokens stand for (``byte_lengths [vocab]``): with the byte tokenizer it is nats / ln 2, with a BPE the measure that
    compares across vocabularies. Every rank runs as many forward passes as the rank with the most batches (FSDP2
    all-gathers parameters in each): a rank with fewer repeats a stand-in (its first batch, or zeros ``[1, context +
    1]`` when it has none) and counts nothing of it.
    """
    was_training = model.training
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64, device=device)
    sp = 1 if sp_group is None else torch.distributed.get_world_size(sp_group)
    for i in range(dist_utils.all_reduce_max(len(batches), info, device)):
        counted = i < len(batches)
        batch = batches[i] if counted else batches[0] if batches else torch.zeros(1, context + 1, dtype=torch.long)
        batch = batch.to(device)
        with autocast:
            loss = lm_loss(model, batch, sp_group)
        if not counted:
            continue
        # every rank of a sequence-parallel group holds the whole batch and a 1/sp share of its tokens
        n = batch[:, 1:].numel() / sp
        n_bytes = float(byte_lengths[batch[:, 1:].cpu()].sum()) / sp
        totals += torch.tensor([loss.item() * n, n, n_bytes], dtype=torch.float64, device=device)
    parallel.reshard(model)
    dist_utils.all_reduce_sum(totals, info)
    model.train(was_training)
    return float(totals[0] / totals[1]), float(totals[0] / (math.log(2) * totals[2]))


def enable_activation_checkpointing(model) -> None:
    """Recompute every block in the backward pass: transformers' ``activation_checkpointing_enable`` (5.x) or
    ``gradient_checkpointing_enable`` (4.x), with PyTorch's non-reentrant checkpoint."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def prepare_model(model, layout: parallel.Layout, device: torch.device, *, data_parallel: str = "ddp",
                  gradient_checkpointing: bool = False, compile: bool = False, compile_backend: str = "inductor",
                  fsdp_unit_blocks: int = parallel.DEFAULT_UNIT_BLOCKS):
    """Activation checkpointing first (PyTorch's order: before ``torch.compile`` and ``fully_shard``), then
    :func:`~lightning_attention.train.parallel.parallelize` (``fsdp_unit_blocks``: its ``unit_blocks``); returns the
    module to call in the training loop."""
    if gradient_checkpointing:
        enable_activation_checkpointing(model)
    return parallel.parallelize(model, layout, data_parallel, device, compile=compile, compile_backend=compile_backend,
                                unit_blocks=fsdp_unit_blocks)


def train(cfg: TrainConfig) -> TrainResult:
    """Runs (or resumes) a training run; returns the loss history. Rank 0 prints progress and saves.

    Under torchrun, or in a process group the caller has set up, every rank of the default group calls it.
    """
    device_kind = "cuda" if (cfg.device in ("auto", "cuda") and torch.cuda.is_available()) else "cpu"
    info = dist_utils.setup(device_kind, need_group=cfg.data_parallel == "fsdp")
    threads = torch.get_num_threads()
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    completed = False
    try:
        result = _train(cfg, info)
        completed = True
        return result
    finally:
        torch.set_num_threads(threads)  # process-wide setting: restore it for whoever runs next in this process
        dist_utils.teardown(info, completed=completed)


def _resume_source(cfg: TrainConfig) -> str | None:
    """The checkpoint folder to resume from (``None`` for a fresh run)."""
    if cfg.resume is False or cfg.resume is None:
        return None
    return cfg.out if cfg.resume is True else str(cfg.resume)


def _load_resume_state(cfg: TrainConfig, source: str) -> dict:
    """The verified training state of ``source``; refuses options that differ from the run's own."""
    state = ckpt_io.load_training_state(source)
    if state.get("format_version") != STATE_VERSION:
        raise ckpt_io.CheckpointError(f"checkpoint {source}: training state version {state.get('format_version')}, "
                                      f"expected {STATE_VERSION}")
    changed = changed_on_resume(state["options"], cfg)
    if changed:
        names = ",".join(line.split(":")[0] for line in changed)
        raise UserError(f"--resume from {source} with options that differ from the run's own: {'; '.join(changed)}. "
                        f"Leave them off the command line to continue the run as it was, or accept the change with "
                        f"--resume-override {names}")
    return state


def _keep_global_batch(cfg: TrainConfig, state: dict, dp_world: int) -> TrainConfig:
    """``cfg`` with the per-rank batch that keeps the checkpoint's global batch on ``dp_world`` replicas (unless
    ``--resume-override batch_size`` asks for another batch)."""
    saved_world, saved_batch = state["data_parallel_ranks"], state["options"]["batch_size"]
    if dp_world == saved_world or "batch_size" in cfg.resume_overrides:
        return cfg
    global_batch = saved_batch * saved_world
    if global_batch % dp_world:
        raise UserError(f"the run's global batch of {global_batch} sequences ({saved_world} data-parallel ranks x "
                        f"{saved_batch}) does not split over {dp_world} data-parallel ranks: use another number of "
                        f"processes, or a new --batch-size with --resume-override batch_size")
    return dataclasses.replace(cfg, batch_size=global_batch // dp_world)


def _tokenizer(cfg: TrainConfig, source: str | None, train_text: str, info: dist_utils.DistInfo):
    """The run's tokenizer: the checkpoint's when resuming; a BPE is trained on rank 0 and sent to the others."""
    from transformers import AutoTokenizer

    if source is not None:
        return AutoTokenizer.from_pretrained(source)
    if cfg.tokenizer != "bpe" or not info.enabled:
        return resolve_tokenizer(cfg.tokenizer, train_text=train_text, vocab_size=cfg.vocab_size)
    from tokenizers import Tokenizer

    from lightning_attention.train.tokenizer import wrap_tokenizer

    payload = [resolve_tokenizer("bpe", train_text=train_text, vocab_size=cfg.vocab_size).backend_tokenizer.to_str()
               if info.is_main else None]
    torch.distributed.broadcast_object_list(payload, src=0)
    return wrap_tokenizer(Tokenizer.from_str(payload[0]))


def build_model(build: Callable[[], torch.nn.Module], layout: parallel.Layout, info: dist_utils.DistInfo,
                device: torch.device, data_parallel: str, source: str | None = None):
    """``(model, fill)``: the model ``build()`` makes (on the CPU, from the current random state), with the weights of
    the checkpoint folder ``source`` when given, and what must run once :func:`prepare_model` has sharded it (None:
    nothing).

    Under FSDP2 (``data_parallel == "fsdp"`` on a mesh) ``model`` is built on the meta device on every rank, and rank 0
    alone builds it whole on its CPU (then resumes it); ``fill`` (``parallel.fill_shards``, collective) gives the
    shards their values from that copy, so no GPU ever holds the whole model. Otherwise ``model`` is built whole on
    every rank and moved to ``device`` (DDP keeps a full replica anyway).
    """
    if data_parallel != "fsdp" or layout.mesh is None:
        model = build()
        if source is not None:
            ckpt_io.load_weights(model, source)
        return model.to(device), None
    whole, error, failure = None, None, [None]
    if info.is_main:
        try:
            whole = build()
            if source is not None:
                ckpt_io.load_weights(whole, source)
        except Exception as exc:  # the other ranks would wait for rank 0's weights: tell them before raising
            error, failure = exc, [f"{type(exc).__name__}: {exc}"]
    torch.distributed.broadcast_object_list(failure, src=0)
    if error is not None:
        raise error
    if failure[0] is not None:
        raise RuntimeError(f"rank 0 could not build the model: {failure[0]}")
    with torch.device("meta"):
        model = build()
    return model, functools.partial(parallel.fill_shards, model, whole, device)


def _train(cfg: TrainConfig, info: dist_utils.DistInfo) -> TrainResult:
    device = _device(cfg, info)
    source = _resume_source(cfg)
    state = _load_resume_state(cfg, source) if source is not None else None
    layout = parallel.build_layout(info, cfg.sequence_parallel, device,
                                   sp_capable=cfg.arch == "tnl" and not cfg.softmax_attention_every
                                   and not cfg.learn_decay)
    if state is not None:
        cfg = _keep_global_batch(cfg, state, layout.dp_world)
    torch.manual_seed(cfg.seed)
    train_text, val_text = split_text(load_text(cfg.data, text_field=cfg.text_field, max_chars=cfg.max_chars),
                                      cfg.val_fraction)
    tokenizer = _tokenizer(cfg, source, train_text, info)
    train_tokens, val_tokens = encode_corpus(tokenizer, train_text), encode_corpus(tokenizer, val_text)
    check_split(train_tokens, val_tokens, cfg.context)
    byte_lengths = token_byte_lengths(tokenizer)
    loader = WindowLoader(train_tokens, cfg.context, cfg.batch_size, cfg.seed, layout.dp_rank, layout.dp_world)
    val_sets = validation_batches(val_tokens, cfg.context, cfg.batch_size, cfg.eval_batches, layout.dp_rank,
                                  layout.dp_world)

    arch_options = dict(decay_recipe=cfg.decay_recipe, attention_variant=cfg.attention_variant,
                        softmax_attention_every=cfg.softmax_attention_every,
                        learn_decay=cfg.learn_decay or None) if cfg.arch == "tnl" else {}
    mconf = model_config(cfg.arch, cfg.preset, len(tokenizer), d_model=cfg.d_model, n_layers=cfg.n_layers,
                         n_heads=cfg.n_heads, ffn_dim=cfg.ffn_dim, dropout=cfg.dropout or None, **arch_options)
    model, fill = build_model(lambda: model_from_config(cfg.arch, mconf, sequence_parallel_group=layout.sp_group),
                              layout, info, device, cfg.data_parallel, source if state is not None else None)
    result = TrainResult(step=0, parameters=parameter_count(model))
    net = prepare_model(model, layout, device, data_parallel=cfg.data_parallel,
                        gradient_checkpointing=cfg.gradient_checkpointing, compile=cfg.compile,
                        fsdp_unit_blocks=cfg.fsdp_unit_blocks)
    if fill is not None:
        fill()
        del fill  # rank 0's whole CPU copy
    optimizer = make_optimizer(model, cfg)  # over the parameters as the strategy left them (FSDP2: this rank's shards)
    scheduler = get_cosine_with_min_lr_schedule_with_warmup(optimizer, num_warmup_steps=cfg.warmup,
                                                            num_training_steps=cfg.steps, min_lr_rate=cfg.min_lr_ratio)
    if state is not None:
        load_optimizer_state(os.path.join(source, OPTIMIZER_FOLDER), model, optimizer,
                             state["optimizer_hyperparameters"])
        scheduler.load_state_dict(state["scheduler"])
        loader.load_state_dict(state["loader"])
        ckpt_io.set_rng_state(state["rng"])
        result.step = state["step"]
        history = state["history"]
        result.train_losses = list(history["train"])
        result.val_losses = [tuple(x) for x in history["val"]]
        result.val_bits_per_byte = [tuple(x) for x in history["val_bits_per_byte"]]
    autocast = autocast_context(cfg, device)

    def write_files(folder: str) -> None:
        hyperparameters = save_optimizer_state(os.path.join(folder, OPTIMIZER_FOLDER), model, optimizer)
        weights = parallel.full_state_dict(model)  # collective under FSDP2; rank 0 gets them
        if info.is_main:
            training_state = {
                "format_version": STATE_VERSION, "step": result.step,
                "optimizer_hyperparameters": hyperparameters, "scheduler": scheduler.state_dict(),
                "loader": loader.state_dict(), "rng": ckpt_io.rng_state(),
                "options": cfg.options(), "data_parallel_ranks": layout.dp_world,
                "history": {"train": result.train_losses, "val": result.val_losses,
                            "val_bits_per_byte": result.val_bits_per_byte},
            }
            ckpt_io.write_model_files(folder, model, tokenizer, training_state, weights)

    def save() -> str:
        return ckpt_io.save_checkpoint(cfg.out, result.step, write_files, distributed=info.enabled)

    say = tqdm.write if cfg.progress else print
    if info.is_main:
        say(f"{cfg.arch}: {result.parameters / 1e6:.2f}M parameters on {device} "
            f"({info.world_size} process{'es' if info.world_size > 1 else ''}"
            f"{', FSDP2' if cfg.data_parallel == 'fsdp' else ''}), {len(train_tokens):,} training "
            f"tokens ({cfg.tokenizer if source is None else 'checkpoint'} tokenizer, {len(tokenizer)} ids), "
            f"context {cfg.context}, batch {cfg.batch_size * layout.dp_world}"
            f"{f' ({layout.dp_world} replicas x {cfg.batch_size})' if layout.dp_world > 1 else ''}"
            f"{f', sequence parallel over {cfg.sequence_parallel} ranks' if layout.sp_group is not None else ''}, "
            f"steps {result.step}->{cfg.steps}")
    bar = tqdm(total=cfg.steps, initial=result.step, disable=not (cfg.progress and info.is_main), desc="train",
               unit="step", dynamic_ncols=True)
    net.train()
    start, tokens_seen = time.perf_counter(), 0
    end = cfg.steps if cfg.stop_at is None else min(cfg.stop_at, cfg.steps)
    while result.step < end:
        lr = scheduler.get_last_lr()[0]
        batch = loader.next_batch().to(device, non_blocking=True)
        loss = train_step(net, model, optimizer, batch, autocast, sp_group=layout.sp_group, grad_clip=cfg.grad_clip)
        scheduler.step()
        loss_value = float(loss)  # the only host sync of a step
        if info.enabled:
            loss_value = float(dist_utils.all_reduce_sum(loss.clone(), info)) / info.world_size
        result.train_losses.append(loss_value)
        result.step += 1
        tokens_seen += batch[:, 1:].numel() * layout.dp_world
        bar.update(1)
        bar.set_postfix(loss=f"{loss_value:.3f}", lr=f"{lr:.2e}")
        last = result.step == end
        if (cfg.eval_every and result.step % cfg.eval_every == 0) or last:
            val, bpb = evaluate(net, val_sets, device, autocast, info, byte_lengths, layout.sp_group,
                                context=cfg.context)
            result.val_losses.append((result.step, val))
            result.val_bits_per_byte.append((result.step, bpb))
            if info.is_main:
                say(f"step {result.step}: train loss {loss_value:.4f}, val loss {val:.4f} nats/token "
                    f"({bpb:.4f} bits/byte)")
        if (cfg.save_every and result.step % cfg.save_every == 0) or last:
            result.checkpoint = save()
    bar.close()
    elapsed = time.perf_counter() - start
    result.tokens_per_second = tokens_seen / elapsed if elapsed > 0 and tokens_seen else 0.0
    if info.is_main and result.checkpoint:
        say(f"checkpoint: {result.checkpoint}")
    return result
