"""One run of the model-quality protocol: build the model, train it on the protocol's batches, evaluate it.

The step is the training loop's own (``lightning_attention.train.trainer.train_step``): its loss, its AdamW parameter
groups (no weight decay on norms and LRPE angles), transformers' cosine schedule with warmup down to
``min_lr_ratio``, the gradient clip, bf16 autocast on CUDA. What this loop adds: one tokenized corpus shared by every
run of the process (the trainer tokenizes per run), train losses kept on the device (no host sync per step, so
tokens/s is the model's), the bytes of every batch (train bits per byte), evaluations at fixed points, and the final
evaluations of :mod:`.model_quality_eval`. It writes no checkpoint.
"""

import dataclasses
import math
import time

import torch
from transformers import get_cosine_with_min_lr_schedule_with_warmup

from lightning_attention.bench.model_quality_data import QualityData
from lightning_attention.bench.model_quality_eval import copy_probe, length_eval
from lightning_attention.bench.model_quality_protocol import ARCHS, Protocol, RunSpec
from lightning_attention.models.presets import model_config, model_from_config, parameter_counts
from lightning_attention.train.config import TrainConfig
from lightning_attention.train.data import WindowLoader
from lightning_attention.train.trainer import autocast_context, make_optimizer, train_step


def build_model(arch: str, protocol: Protocol, vocab_size: int):
    """A freshly initialised model of protocol architecture ``arch`` (one of :data:`ARCHS`) with its options."""
    model_arch, overrides = ARCHS[arch]
    config = model_config(model_arch, protocol.preset, vocab_size, n_layers=protocol.n_layers, **overrides,
                          **protocol.options.overrides(model_arch))
    return model_from_config(model_arch, config)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def evaluation_lengths(protocol: Protocol, context: int) -> list[int]:
    """The run's own context, then every protocol evaluation length beyond it."""
    return [context] + [n for n in protocol.eval_lengths if n > context]


def copy_lengths(context: int) -> list[int]:
    """Copy-probe lengths of a run: a quarter of its context and the whole (two distances to copy across)."""
    return sorted({max(4, context // 4), context})


def train_run(spec: RunSpec, protocol: Protocol, data: QualityData, device: torch.device, log=print) -> dict:
    """Trains and evaluates one run; returns its record (see ``model_quality.py`` for the fields).

    A run whose loss becomes NaN or infinite stops there with ``status`` "diverged" (its curve up to that point is
    kept); the final evaluations need a finished run.
    """
    steps, batch = protocol.steps(spec.tokens), protocol.batch_size(spec.context)
    torch.manual_seed(spec.seed)  # the init (and dropout masks) of every arch of one seed start from one state
    model = build_model(spec.arch, protocol, data.vocab_size).to(device).train()
    options = TrainConfig(lr=spec.lr, weight_decay=protocol.weight_decay)
    optimizer = make_optimizer(model, options)
    warmup = max(1, round(protocol.warmup_fraction * steps))
    scheduler = get_cosine_with_min_lr_schedule_with_warmup(optimizer, num_warmup_steps=warmup,
                                                            num_training_steps=steps,
                                                            min_lr_rate=protocol.min_lr_ratio)
    autocast = autocast_context(options, device)
    loader = WindowLoader(data.train, spec.context, batch, seed=spec.seed)
    every = max(1, steps // protocol.eval_points)
    curve_windows = max(1, protocol.curve_eval_tokens // spec.context)

    losses = torch.zeros(steps, dtype=torch.float32, device=device)
    batch_bytes = torch.zeros(steps, dtype=torch.float64)
    curve = {"step": [], "tokens": [], "loss": [], "bpb": []}
    status, done, train_seconds, eval_seconds = "ok", 0, 0.0, 0.0
    _sync(device)
    started = time.perf_counter()
    for step in range(steps):
        ids = loader.next_batch()
        batch_bytes[step] = float(data.byte_lengths[ids[:, 1:]].sum())
        ids = ids.to(device, non_blocking=True)
        losses[step] = train_step(model, model, optimizer, ids, autocast, grad_clip=protocol.grad_clip)
        scheduler.step()
        done = step + 1
        if done % every and done != steps:
            continue
        _sync(device)
        now = time.perf_counter()
        train_seconds += now - started
        if not bool(torch.isfinite(losses[:done]).all()):
            status = "diverged"
            log(f"{spec.id}: the training loss is not finite at step {done}: diverged")
            break
        result = length_eval(model, data.val, spec.context, curve_windows, data.byte_lengths, device, autocast)
        curve["step"].append(done)
        curve["tokens"].append(done * protocol.batch_tokens)
        curve["loss"].append(result["loss"])
        curve["bpb"].append(result["bpb"])
        started = time.perf_counter()
        eval_seconds += started - now

    train_loss = losses[:done].double().cpu()
    record = {
        "id": spec.id, "spec": dataclasses.asdict(spec), "status": status, "steps": steps, "steps_done": done,
        "batch_size": batch, "parameters": parameter_counts(model),
        "epochs": done * protocol.batch_tokens / len(data.train),
        "train_bytes": float(batch_bytes[:done].sum()),  # equal for every run of one seed, context and length
        "train_seconds": train_seconds, "tokens_per_s": done * protocol.batch_tokens / max(train_seconds, 1e-9),
        "train": {"loss": train_loss.tolist(),
                  "bpb": (train_loss * (batch * spec.context) / (math.log(2) * batch_bytes[:done])).tolist()},
        "curve": curve,
    }
    if status == "ok":
        now = time.perf_counter()
        record.update(final_evaluations(model, spec, protocol, data, device, autocast))
        eval_seconds += time.perf_counter() - now
    record["eval_seconds"] = eval_seconds
    return record


def final_evaluations(model, spec: RunSpec, protocol: Protocol, data: QualityData, device, autocast) -> dict:
    """``final`` (loss and bits per byte at the run's context on ``final_eval_tokens``), ``lengths`` (by length: the
    same with position buckets, up to the protocol's evaluation lengths; final runs only) and ``copy`` (the copy
    probe at :func:`copy_lengths`; final runs only)."""
    lengths = evaluation_lengths(protocol, spec.context) if spec.stage == "final" else [spec.context]
    evals = {str(n): length_eval(model, data.val, n, max(1, protocol.final_eval_tokens // n), data.byte_lengths,
                                 device, autocast, context=spec.context) for n in lengths}
    own = evals[str(spec.context)]
    out = {"final": {"loss": own["loss"], "bpb": own["bpb"]}, "lengths": evals}
    if spec.stage == "final":
        out["copy"] = {str(n): copy_probe(model, data.val, n, max(1, protocol.final_eval_tokens // (2 * n)),
                                          data.byte_lengths, device, autocast) for n in copy_lengths(spec.context)}
    return out
