"""Accuracy of sequence-parallel Lightning Attention on 2 GPUs (NCCL) at T = 256K, bf16 vs a float64 reference.

Run on the 2-GPU machine (the gpu-marked test in tests/distributed/test_sequence_parallel.py runs this too)::

    torchrun --standalone --nproc_per_node 2 benchmarks/sp_check_gpu.py --out benchmarks/results/sp_check_gpu.json

Every rank builds the same full-sequence inputs (same seed, on its GPU), runs ``lightning_attn_sp`` on its slice
(bf16, the Triton kernels on CUDA), and also computes the float64 chunked reference (PyTorch,
``naive.chunk_lightning_attn``) on the full sequence from the same rounded inputs; each rank then compares its own
slice and the replicated final state / dh0. The relative L2 error of the concatenated slices is assembled exactly
from per-rank sums of squares (one all-reduce). Loss: ``(o·do).sum() + (final·dht_r).sum()`` with
``Σ_r dht_r = dht``. Cases: no decay, and TNL slopes (layer 0 of 2: strong decay on some heads). The JSON holds
every error, the tolerance (DESIGN §5) and ``passed``.

Smoke test anywhere: ``torchrun --nproc_per_node 2 benchmarks/sp_check_gpu.py --device cpu --seq-len 300 --heads 2
--dim 32 --dtype float32`` (gloo, the PyTorch path). NVLink multicast stays off: NCCL_NVLS_ENABLE is never set to 1.
"""

import argparse
import json
import os
import platform
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import lightning_attention as la
from lightning_attention.distributed import lightning_attn_sp, record_communication, sequence_bounds
from lightning_attention.ops.lightning import naive
from lightning_attention.utils.testing import tolerance

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seq-len", type=int, default=256 * 1024, help="global T (split evenly over the ranks)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--dim", type=int, default=128, help="K = V")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    p.add_argument("--decays", default="none,tnl", help="comma list of: none, tnl")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="JSON report path (written by rank 0)")
    return p.parse_args(argv)


def init_distributed(device: str) -> tuple[int, int, torch.device]:
    """torchrun environment -> (rank, world size, this rank's device); NCCL on CUDA, gloo on CPU."""
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # never enable NVLink multicast (only fills in a missing value)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if device == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
        dist.init_process_group("nccl", timeout=timedelta(minutes=20), device_id=dev)
    else:
        dev = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timedelta(minutes=20))
    return rank, world_size, dev


def make_inputs(args, device: torch.device, slope_kind: str) -> dict:
    """Full-sequence inputs, identical on every rank (same seed, same device type), rounded to --dtype."""
    gen = torch.Generator(device=device).manual_seed(args.seed)
    B, T, H, D, dt = args.batch, args.seq_len, args.heads, args.dim, DTYPES[args.dtype]

    def randn(*shape, scale=1.0, dtype=dt):
        return (torch.randn(*shape, generator=gen, device=device) * scale).to(dtype)

    slope = None if slope_kind == "none" else la.tnl_slopes(H, 0, 2).to(device)
    return {
        "q": randn(B, T, H, D),
        "k": randn(B, T, H, D, scale=D**-0.5),
        "v": randn(B, T, H, D),
        "do": randn(B, T, H, D),
        "h0": randn(B, H, D, D, dtype=torch.float32),
        "dht": randn(B, H, D, D, dtype=torch.float32),
        "slope": slope,
    }


def run_sp(x: dict, start: int, end: int, world_size: int) -> tuple[dict, list, float]:
    """This rank's slice through lightning_attn_sp, fwd + bwd; returns its results, the collectives, seconds."""
    q, k, v = (x[n][:, start:end].detach().clone().requires_grad_() for n in ("q", "k", "v"))
    h0 = x["h0"].clone().requires_grad_()
    sync(q.device)
    t0 = time.perf_counter()
    with record_communication() as log:
        o, final = lightning_attn_sp(q, k, v, x["slope"], initial_state=h0, output_final_state=True)
        loss = (o.float() * x["do"][:, start:end].float()).sum() + (final * (x["dht"] / world_size)).sum()
        loss.backward()
    sync(q.device)
    seconds = time.perf_counter() - t0
    out = {"o": o.detach(), "final": final.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad, "dh0": h0.grad}
    return out, [(c.direction, c.send_bytes, c.recv_bytes) for c in log], seconds


def reference(x: dict) -> dict:
    """Float64 chunked reference on the full sequence (O(T) memory, unlike the quadratic one), with gradients."""
    q, k, v = (x[n].to(torch.float64).requires_grad_() for n in ("q", "k", "v"))
    h0 = x["h0"].to(torch.float64).requires_grad_()
    o, final = naive.chunk_lightning_attn(q, k, v, x["slope"], initial_state=h0)
    loss = (o * x["do"].to(torch.float64)).sum() + (final * x["dht"].to(torch.float64)).sum()
    loss.backward()
    return {"o": o.detach(), "final": final.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad, "dh0": h0.grad}


def sq_norms(actual: torch.Tensor, ref: torch.Tensor) -> list[float]:
    """[‖actual - ref‖², ‖ref‖², non-finite count] in float64."""
    a, r = actual.to(torch.float64), ref.to(torch.float64)
    return [float(((a - r) ** 2).sum()), float((r**2).sum()), float((~torch.isfinite(a)).sum())]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check_case(args, rank: int, world_size: int, device: torch.device, slope_kind: str) -> dict:
    x = make_inputs(args, device, slope_kind)
    start, end = sequence_bounds(args.seq_len, rank, world_size)
    sp, collectives, sp_seconds = run_sp(x, start, end, world_size)
    t0 = time.perf_counter()
    ref = reference(x)
    ref_seconds = time.perf_counter() - t0
    del x

    tol = tolerance(DTYPES[args.dtype])
    errors = {}
    for name in ("o", "dq", "dk", "dv"):  # slices: sum the squares over ranks, then one relative error
        parts = torch.tensor(sq_norms(sp[name], ref[name][:, start:end]), dtype=torch.float64, device=device)
        dist.all_reduce(parts)
        num, den, bad = parts.tolist()
        errors[name] = {"rel_l2": (num / den) ** 0.5 if den > 0 else num**0.5, "non_finite": int(bad)}
    for name in ("final", "dh0"):  # replicated: every rank must match; report the worst rank
        num, den, bad = sq_norms(sp[name], ref[name])
        worst = torch.tensor([(num / den) ** 0.5 if den > 0 else num**0.5, bad], dtype=torch.float64, device=device)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        errors[name] = {"rel_l2": worst[0].item(), "non_finite": int(worst[1].item())}
    passed = all(e["rel_l2"] <= tol and e["non_finite"] == 0 for e in errors.values())
    return {
        "decay": slope_kind,
        "errors": errors,
        "tolerance": tol,
        "passed": passed,
        "sp_fwd_bwd_seconds_first_call": sp_seconds,
        "reference_seconds": ref_seconds,
        "collectives_rank0": collectives,
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    rank, world_size, device = init_distributed(args.device)
    cases = [check_case(args, rank, world_size, device, kind) for kind in args.decays.split(",")]
    report = {
        "script": "benchmarks/sp_check_gpu.py",
        "world_size": world_size,
        "backend": dist.get_backend(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "lightning_attention_backend": os.environ.get("LIGHTNING_ATTENTION_BACKEND", "auto"),
        "NCCL_NVLS_ENABLE": os.environ.get("NCCL_NVLS_ENABLE"),
        "shape": {"batch": args.batch, "seq_len": args.seq_len, "heads": args.heads, "dim_k": args.dim,
                  "dim_v": args.dim, "dtype": args.dtype},
        "slices": [sequence_bounds(args.seq_len, r, world_size) for r in range(world_size)],
        "cases": cases,
        "passed": all(c["passed"] for c in cases),
    }
    if rank == 0:
        text = json.dumps(report, indent=2)
        print(text)
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "w") as f:
                f.write(text + "\n")
    dist.destroy_process_group()
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
