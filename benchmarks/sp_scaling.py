"""Sequence-parallel scaling of one TNL-like attention layer: longest trainable T, tokens/s, bytes per layer.

Run on the 2-GPU machine::

    torchrun --standalone --nproc_per_node 2 benchmarks/sp_scaling.py --out benchmarks/results/sp_scaling.json

The layer (fwd + bwd, bf16 weights and activations, H = 16, K = V = 128, d_model = 2048) is TNL's gated linear
attention: ``qkvu = x W``; ``q, k = silu``; ``o = lightning_attn(q, k, v, slope)``; RMS-normalised, gated by ``u``,
projected back. On one GPU it calls ``lightning_attention.lightning_attn`` on the whole sequence; on the SP group
it calls ``lightning_attn_sp`` on each rank's slice of it.

Three measurements, written as one JSON by rank 0:

1. **Longest sequence.** Double T from ``--start-len`` until a fwd + bwd runs out of memory (caught), on one GPU
   (each rank searches alone, on its own GPU, no communication) and on the SP group (global T, T / P per rank;
   ranks agree on success through a gloo all-reduce). The ranks run identical shapes, so they run out of memory at
   the same allocation; should one not, the NCCL timeout (``--timeout-min``) ends the run instead of a hang.
2. **Tokens/s** at ``--fixed-len`` (global T): one GPU vs the SP group, median of ``--iters`` timed steps after
   warm-up. SP runs the attention op once per rank plus the inter-rank term λ^(t+1) q_t S_in, which the ratio
   includes.
3. **Communication bytes per layer** recorded from the collectives that ``lightning_attn_sp`` issues at two T
   (``--comm-lens``), next to the prediction ``sp_communication_bytes``: the same bytes at every T.

NVLink multicast stays off: the script never sets NCCL_NVLS_ENABLE (it only fills in "0" when unset). Smoke test
on CPU: ``torchrun --nproc_per_node 2 benchmarks/sp_scaling.py --device cpu --heads 2 --dim 16 --start-len 64
--max-len 256 --fixed-len 128 --comm-lens 64,128 --iters 2``.
"""

import argparse
import gc
import json
import os
import platform
import statistics
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import lightning_attention as la
from lightning_attention.distributed import (
    lightning_attn_sp,
    record_communication,
    sequence_bounds,
    sp_communication_bytes,
)

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


class TNLAttention(nn.Module):
    """TNL gated linear attention, the layer sequence parallelism exists for. Input/output ``[B, T_r, D]``.

    ``group=None`` runs the single-device op on the whole sequence; a group runs ``lightning_attn_sp`` on this
    rank's slice (``T_r`` tokens of the global sequence).
    """

    def __init__(self, heads: int, dim: int, layer_idx: int = 0, num_layers: int = 24, group=None):
        super().__init__()
        self.heads, self.dim, self.group = heads, dim, group
        d_model = heads * dim
        self.qkvu = nn.Linear(d_model, 4 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)
        self.register_buffer("slope", la.tnl_slopes(heads, layer_idx, num_layers), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v, u = self.qkvu(x).view(B, T, 4, self.heads, self.dim).unbind(2)  # strided views, no copies
        q, k = F.silu(q), F.silu(k)
        if self.group is None:
            o, _ = la.lightning_attn(q, k, v, self.slope)
        else:
            o, _ = lightning_attn_sp(q, k, v, self.slope, group=self.group)
        o = F.rms_norm(o.reshape(B, T, -1), (o.shape[-2] * o.shape[-1],))
        return self.out(o * u.reshape(B, T, -1))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--dim", type=int, default=128, help="K = V")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    p.add_argument("--start-len", type=int, default=64 * 1024, help="first global T of the doubling search")
    p.add_argument("--max-len", type=int, default=64 * 1024 * 1024, help="stop doubling here even without OOM")
    p.add_argument("--fixed-len", type=int, default=256 * 1024, help="global T of the tokens/s comparison")
    p.add_argument("--comm-lens", default="65536,262144", help="two (or more) global T for the bytes check")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--timeout-min", type=float, default=10.0, help="collective timeout (turns a hang into an error)")
    p.add_argument("--out", default="benchmarks/results/sp_scaling.json")
    return p.parse_args(argv)


def init_distributed(args) -> tuple[int, int, torch.device]:
    """torchrun environment -> (rank, world size, device); NCCL on CUDA, gloo on CPU."""
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # never enable NVLink multicast (only fills in a missing value)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = timedelta(minutes=args.timeout_min)
    if args.device == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        dist.init_process_group("nccl", timeout=timeout, device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timeout)
    return rank, world_size, device


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def train_step(layer: TNLAttention, local_len: int, args, device: torch.device) -> None:
    """One fwd + bwd of the layer on ``local_len`` tokens (random input and output gradient)."""
    d_model = args.heads * args.dim
    x = torch.randn(1, local_len, d_model, device=device, dtype=DTYPES[args.dtype])
    y = layer(x)
    y.backward(torch.randn_like(y))


def try_step(layer, local_len: int, args, device) -> dict | None:
    """One fwd + bwd; ``None`` when it runs out of memory. Returns peak memory and seconds otherwise."""
    release(device)
    layer.zero_grad(set_to_none=True)
    try:
        t0 = time.perf_counter()
        train_step(layer, local_len, args, device)
        sync(device)
        seconds = time.perf_counter() - t0
    except torch.OutOfMemoryError:
        ok = None
    else:
        peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
        ok = {"seconds": seconds, "peak_memory_gib": peak / 2**30}
    layer.zero_grad(set_to_none=True)
    release(device)
    return ok


def all_ranks_ok(ok: bool, control) -> bool:
    """Whether every rank succeeded; a gloo all-reduce, so it works whatever state the GPUs are in."""
    flag = torch.tensor([0 if ok else 1], dtype=torch.int32)
    dist.all_reduce(flag, group=control)
    return int(flag.item()) == 0


def longest_sequence(layer, world_size: int, rank: int, args, device, control) -> dict:
    """Doubles the global T until a step fails anywhere; returns the last T that trained and every trial."""
    trials, longest, T = [], 0, args.start_len
    while T <= args.max_len:
        start, end = sequence_bounds(T, rank, world_size) if layer.group is not None else (0, T)
        result = try_step(layer, end - start, args, device)
        ok = result is not None
        if layer.group is not None:
            ok = all_ranks_ok(ok, control)
        trials.append({"seq_len": T, "ok": ok, **(result or {})})
        if not ok:
            break
        longest, T = T, 2 * T
    return {"longest_seq_len": longest, "trials": trials}


def tokens_per_second(layer, world_size: int, rank: int, args, device, control) -> dict:
    """Median fwd + bwd time at the global ``--fixed-len`` (slowest rank) and tokens/s of the whole group."""
    T = args.fixed_len
    start, end = sequence_bounds(T, rank, world_size) if layer.group is not None else (0, T)
    for _ in range(args.warmup):
        train_step(layer, end - start, args, device)
    times = []
    for _ in range(args.iters):
        sync(device)
        if layer.group is not None:
            dist.barrier(group=control)
        t0 = time.perf_counter()
        train_step(layer, end - start, args, device)
        sync(device)
        times.append(time.perf_counter() - t0)
    seconds = statistics.median(times)
    if layer.group is not None:  # the step is as slow as its slowest rank
        t = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=control)
        seconds = t.item()
    layer.zero_grad(set_to_none=True)
    release(device)
    return {"seq_len": T, "seconds_per_step": seconds, "tokens_per_second": T / seconds, "times": times}


def communication(layer, world_size: int, rank: int, args, device) -> list[dict]:
    """Bytes the layer's collectives move at each ``--comm-lens`` T (recorded), and the T-free prediction."""
    rows = []
    for T in (int(t) for t in args.comm_lens.split(",")):
        start, end = sequence_bounds(T, rank, world_size)
        with record_communication() as log:
            train_step(layer, end - start, args, device)
        sync(device)
        layer.zero_grad(set_to_none=True)
        rows.append(
            {
                "seq_len": T,
                "collectives": [{"direction": c.direction, "send": c.send_bytes, "recv": c.recv_bytes} for c in log],
                "send_bytes_per_layer": sum(c.send_bytes for c in log),
            }
        )
    release(device)
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    rank, world_size, device = init_distributed(args)
    control = dist.new_group(backend="gloo")  # CPU control plane: OOM flags, timing barriers
    torch.manual_seed(rank)

    def make_layer(group):
        layer = TNLAttention(args.heads, args.dim, group=group)
        return layer.to(device=device, dtype=DTYPES[args.dtype])

    report = {
        "script": "benchmarks/sp_scaling.py",
        "world_size": world_size,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "lightning_attention_backend": os.environ.get("LIGHTNING_ATTENTION_BACKEND", "auto"),
        "NCCL_NVLS_ENABLE": os.environ.get("NCCL_NVLS_ENABLE"),
        "layer": {"heads": args.heads, "dim_k": args.dim, "dim_v": args.dim, "d_model": args.heads * args.dim,
                  "dtype": args.dtype, "batch": 1, "what": "TNL gated linear attention, fwd + bwd"},
    }

    # 1 GPU: every rank measures alone (same result on identical GPUs; rank 0's is reported, all are kept)
    single = make_layer(None)
    one_gpu = longest_sequence(single, 1, 0, args, device, control)
    one_gpu_rate = tokens_per_second(single, 1, 0, args, device, control)
    del single
    release(device)
    gathered = [None] * world_size
    dist.all_gather_object(gathered, one_gpu["longest_seq_len"], group=control)

    sp = make_layer(dist.group.WORLD)
    sp_longest = longest_sequence(sp, world_size, rank, args, device, control)
    sp_rate = tokens_per_second(sp, world_size, rank, args, device, control)
    comm = communication(sp, world_size, rank, args, device)

    report["longest_seq_len"] = {
        "gpus_1": one_gpu["longest_seq_len"],
        "gpus_1_per_rank": gathered,
        f"gpus_{world_size}": sp_longest["longest_seq_len"],
        "trials_gpus_1": one_gpu["trials"],
        f"trials_gpus_{world_size}": sp_longest["trials"],
        "note": "longest power-of-two multiple of start_len that trained (fwd + bwd) before the first OOM",
        "start_len": args.start_len,
        "max_len": args.max_len,
    }
    report["tokens_per_second"] = {
        "gpus_1": one_gpu_rate,
        f"gpus_{world_size}": sp_rate,
        "speedup": sp_rate["tokens_per_second"] / one_gpu_rate["tokens_per_second"],
    }
    report["communication"] = {
        "measured_per_rank": comm,
        "predicted": sp_communication_bytes(1, args.heads, args.dim, args.dim, world_size).__dict__,
        "independent_of_seq_len": len({row["send_bytes_per_layer"] for row in comm}) == 1,
    }
    if rank == 0:
        text = json.dumps(report, indent=2)
        print(text)
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "w") as f:
                f.write(text + "\n")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
