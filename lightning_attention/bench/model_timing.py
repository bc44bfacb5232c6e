"""TNL vs LLaMA at equal size: training throughput per context length, and validation loss on the same corpus.

Used by ``lightning-attention bench model`` (which finds :func:`time_training_step` and :func:`loss_curves` here) and
runnable directly::

    python -m lightning_attention.bench.model_timing --contexts 2048 8192 32768 65536 --loss-steps 2000

The paper's Table 1 shape: TNL's tokens/s stays flat as the context grows (linear cost per token) while LLaMA's falls
(attention is quadratic), and at equal parameters and tokens TNL's loss is slightly lower.
"""

import argparse
import json
import tempfile
import time

import torch
import torch.nn.functional as F

from lightning_attention.models.presets import model_config, model_from_config, parameter_count


def _device(device) -> torch.device:
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_training_step(
    arch: str,
    context: int,
    *,
    preset: str = "40m",
    batch_size: int | None = None,
    tokens_per_step: int = 65536,
    steps: int = 10,
    warmup_steps: int = 3,
    device=None,
    dtype: str = "auto",
    quick: bool = False,
    compile: bool = False,
) -> dict:
    """Times fwd + bwd + AdamW step of ``arch`` ("tnl" | "llama") at ``context`` tokens per sequence.

    Args:
        preset: model size (default "40m", ≈42M parameters; ``quick`` uses "smoke").
        batch_size: sequences per step (default ``max(1, tokens_per_step // context)``: same tokens per step at
            every context, the paper's setting).
        steps, warmup_steps: timed and untimed steps (warmup covers Triton compilation and autotuning).
        dtype: "auto" (bf16 autocast on CUDA, float32 on CPU), "bfloat16", "float32".

    Returns:
        dict with ``tokens_per_s``, ``step_ms``, ``batch_size``, ``parameters``, ``peak_memory_gb`` (CUDA), ...
    """
    device = _device(device)
    if quick:
        preset, steps, warmup_steps = "smoke", min(steps, 2), min(warmup_steps, 1)
        tokens_per_step = min(tokens_per_step, 256)
    batch = batch_size or max(1, tokens_per_step // context)
    torch.manual_seed(0)
    model = model_from_config(arch, model_config(arch, preset)).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    net = torch.compile(model) if compile else model
    if dtype == "auto":
        dtype = "bfloat16" if device.type == "cuda" else "float32"
    autocast = torch.autocast(device.type, dtype=getattr(torch, dtype), enabled=dtype != "float32")
    ids = torch.randint(0, model.config.vocab_size, (batch, context + 1), device=device)

    def step():
        with autocast:
            logits = net(ids[:, :-1], use_cache=False).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    for _ in range(warmup_steps):
        step()
    _sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    _sync(device)
    elapsed = (time.perf_counter() - start) / max(steps, 1)
    result = {
        "arch": arch, "context": context, "batch_size": batch, "preset": preset, "parameters": parameter_count(model),
        "step_ms": elapsed * 1e3, "tokens_per_s": batch * context / elapsed, "device": str(device), "dtype": dtype,
    }
    if device.type == "cuda":
        result["peak_memory_gb"] = torch.cuda.max_memory_allocated(device) / 2**30
    return result


def loss_curves(
    archs=("tnl", "llama"),
    *,
    steps: int = 2000,
    preset: str = "40m",
    context: int = 2048,
    batch_size: int = 16,
    data: str | None = "stdlib",
    lr: float = 1e-3,
    eval_every: int | None = None,
    eval_batches: int = 16,
    device=None,
    quick: bool = False,
    seed: int = 1234,
) -> dict:
    """Trains every arch of ``archs`` for ``steps`` on the same corpus, batches and schedule; returns their curves.

    The default corpus is Python's standard-library source (~30 MB, offline on any machine); ``quick`` shrinks
    everything to the smoke preset on Python's documentation topics.

    Returns:
        ``{arch: {"steps": [...], "val_loss": [...], "train_loss": [one per step], "final_val_loss": x,
        "parameters": n, "tokens_per_s": x}}``
    """
    from lightning_attention.train.trainer import TrainConfig, train

    device = _device(device)
    if quick:
        preset, steps, context, batch_size, data = "smoke", min(steps, 4), 64, 2, None
    eval_every = eval_every or max(1, steps // 10)
    curves = {}
    for arch in archs:
        with tempfile.TemporaryDirectory() as out:
            cfg = TrainConfig(arch=arch, preset=preset, data=data, context=context, batch_size=batch_size,
                              steps=steps, lr=lr, warmup=max(1, steps // 20), eval_every=eval_every,
                              eval_batches=eval_batches, out=out, progress=False, seed=seed, device=str(device),
                              max_chars=200_000 if quick else None)
            result = train(cfg)
        curves[arch] = {
            "steps": [s for s, _ in result.val_losses],
            "val_loss": [v for _, v in result.val_losses],
            "train_loss": result.train_losses,
            "final_val_loss": result.val_losses[-1][1],
            "parameters": result.parameters,
            "tokens_per_s": result.tokens_per_second,
        }
    return curves


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--archs", nargs="+", default=["tnl", "llama"])
    parser.add_argument("--contexts", nargs="+", type=int, default=[2048, 8192, 32768, 65536])
    parser.add_argument("--preset", default="40m")
    parser.add_argument("--loss-steps", type=int, default=0, help="also train each arch this many steps (0: skip)")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    report = {"throughput": [], "loss": None}
    for arch in args.archs:
        for context in args.contexts:
            r = time_training_step(arch, context, preset=args.preset, quick=args.quick)
            report["throughput"].append(r)
            print(f"{arch:6s} context {context:6d}: {r['tokens_per_s']:12,.0f} tokens/s  ({r['step_ms']:.1f} ms/step)",
                  flush=True)
    if args.loss_steps:
        report["loss"] = loss_curves(tuple(args.archs), steps=args.loss_steps, preset=args.preset, quick=args.quick)
        for arch, c in report["loss"].items():
            print(f"{arch:6s} final validation loss {c['final_val_loss']:.4f}", flush=True)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
