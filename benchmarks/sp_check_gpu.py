"""Accuracy of sequence-parallel Lightning Attention on 2 GPUs (NCCL) at T = 256K, bf16 vs a float64 reference.

Run on the 2-GPU machine (``bash benchmarks/gpu_suite.sh sp`` runs this and sp_scaling.py; the gpu-marked test in
tests/distributed/test_sequence_parallel.py runs it too)::

    torchrun --standalone --nproc_per_node 2 benchmarks/sp_check_gpu.py --out benchmarks/results/<run>/sp

Every rank builds the same full-sequence inputs (same seed, on its GPU), runs ``lightning_attn_sp`` on its slice
(bf16, the Triton kernels on CUDA), and also computes the float64 chunked reference (PyTorch,
``naive.chunk_lightning_attn``) on the full sequence from the same rounded inputs; each rank then compares its own
slice and the replicated final state / dh0. The relative L2 error of the concatenated slices is assembled exactly
from per-rank sums of squares (one all-reduce). Loss: ``(o·do).sum() + (final·dht_r).sum()`` with
``Σ_r dht_r = dht``. The single-process ``lightning_attn`` on the full sequence (same dtype, same loss with ``dht``)
is held against the same reference, so the report puts the SP error next to the error of the op it replaces
(two low-precision results are never compared with each other: docs/design.md, "Testing discipline"). Cases: no
decay, and TNL slopes (layer 0 of 2: strong decay on some heads). ``<out>/sp_check.json`` holds every error, the
tolerance and ``passed`` (SP within the tolerance of the input dtype).

Smoke test anywhere: ``torchrun --standalone --nproc_per_node 2 benchmarks/sp_check_gpu.py --quick --out /tmp/sp``
(CPU, gloo, the PyTorch path, T = 300, H = 2, K = V = 32, float32).
"""

import argparse
import time

import torch
import torch.distributed as dist
from sp_common import DTYPES, add_common_arguments, fill_defaults, init_distributed, open_report

import lightning_attention as la
from lightning_attention.bench.timing import synchronize
from lightning_attention.distributed import lightning_attn_sp, record_communication, sequence_bounds
from lightning_attention.ops.lightning import naive
from lightning_attention.utils.testing import tolerance

FULL = {"seq_len": 256 * 1024, "heads": 8, "dim": 128, "dtype": "bfloat16"}
QUICK = {"seq_len": 300, "heads": 2, "dim": 32, "dtype": "float32"}
TENSORS = ("o", "dq", "dk", "dv", "final", "dh0")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seq-len", type=int, default=None, help="global T, split evenly over the ranks (default 256K)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=None, help="default 8")
    p.add_argument("--dim", type=int, default=None, help="K = V (default 128)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default bfloat16")
    p.add_argument("--decays", default="none,tnl", help="comma list of: none, tnl")
    p.add_argument("--seed", type=int, default=0)
    add_common_arguments(p)
    args = p.parse_args(argv)
    fill_defaults(args, FULL, QUICK)
    return args


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


def fwd_bwd(attn, x: dict, start: int, end: int, dht: torch.Tensor) -> tuple[dict, list, float]:
    """``attn`` (lightning_attn_sp or lightning_attn) on tokens [start, end), fwd + bwd with the loss of the module
    docstring; returns o, the final state and the gradients, the collectives it issued, and its seconds."""
    q, k, v = (x[n][:, start:end].detach().clone().requires_grad_() for n in ("q", "k", "v"))
    h0 = x["h0"].clone().requires_grad_()
    synchronize(q.device)
    t0 = time.perf_counter()
    with record_communication() as log:
        o, final = attn(q, k, v, x["slope"], initial_state=h0, output_final_state=True)
        loss = (o.float() * x["do"][:, start:end].float()).sum() + (final * dht).sum()
        loss.backward()
    synchronize(q.device)
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


def rel_l2(num: float, den: float) -> float:
    return (num / den) ** 0.5 if den > 0 else num**0.5


def sp_errors(sp: dict, ref: dict, start: int, end: int, device: torch.device) -> dict:
    """Relative L2 errors of the SP results: slices summed over the ranks, replicated tensors at the worst rank."""
    errors = {}
    for name in ("o", "dq", "dk", "dv"):  # slices: sum the squares over ranks, then one relative error
        parts = torch.tensor(sq_norms(sp[name], ref[name][:, start:end]), dtype=torch.float64, device=device)
        dist.all_reduce(parts)
        num, den, bad = parts.tolist()
        errors[name] = {"rel_l2": rel_l2(num, den), "non_finite": int(bad)}
    for name in ("final", "dh0"):  # replicated: every rank must match; report the worst rank
        num, den, bad = sq_norms(sp[name], ref[name])
        worst = torch.tensor([rel_l2(num, den), bad], dtype=torch.float64, device=device)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        errors[name] = {"rel_l2": worst[0].item(), "non_finite": int(worst[1].item())}
    return errors


def check_case(args, rank: int, world_size: int, device: torch.device, slope_kind: str) -> dict:
    x = make_inputs(args, device, slope_kind)
    start, end = sequence_bounds(args.seq_len, rank, world_size)
    sp, collectives, sp_seconds = fwd_bwd(lightning_attn_sp, x, start, end, x["dht"] / world_size)
    # the op SP replaces, on the full sequence, on this rank alone (every rank gets the same; rank 0's is kept)
    single, _, single_seconds = fwd_bwd(la.lightning_attn, x, 0, args.seq_len, x["dht"])
    t0 = time.perf_counter()
    ref = reference(x)
    ref_seconds = time.perf_counter() - t0
    del x

    tol = tolerance(DTYPES[args.dtype])
    errors = sp_errors(sp, ref, start, end, device)
    single_errors = {}
    for name in TENSORS:
        num, den, bad = sq_norms(single[name], ref[name])
        single_errors[name] = {"rel_l2": rel_l2(num, den), "non_finite": int(bad)}
    passed = all(e["rel_l2"] <= tol and e["non_finite"] == 0 for e in errors.values())
    ratio = {
        n: errors[n]["rel_l2"] / single_errors[n]["rel_l2"] if single_errors[n]["rel_l2"] > 0 else None
        for n in TENSORS
    }
    return {
        "decay": slope_kind,
        "errors": errors,
        "single_process_errors": single_errors,
        "sp_over_single_error": ratio,
        "tolerance": tol,
        "passed": passed,
        "sp_fwd_bwd_seconds_first_call": sp_seconds,
        "single_fwd_bwd_seconds": single_seconds,
        "reference_seconds": ref_seconds,
        "collectives_rank0": collectives,
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    rank, world_size, device = init_distributed(args.device, args.timeout_min)
    writer = open_report("sp_check", args, rank, world_size, device)
    writer.set(
        "shape",
        {"batch": args.batch, "seq_len": args.seq_len, "heads": args.heads, "dim_k": args.dim, "dim_v": args.dim,
         "dtype": args.dtype},
    )
    writer.set("slices", [sequence_bounds(args.seq_len, r, world_size) for r in range(world_size)])
    cases = []
    for kind in args.decays.split(","):
        case = check_case(args, rank, world_size, device, kind)
        cases.append(case)
        writer.add("cases", case)
        if rank == 0:
            worst = max(e["rel_l2"] for e in case["errors"].values())
            print(f"decay {kind}: max rel. L2 error {worst:.3g} (tolerance {case['tolerance']:.1g}), "
                  f"passed = {case['passed']}", flush=True)
    passed = all(c["passed"] for c in cases)
    writer.set("passed", passed)
    if rank == 0:
        print(f"wrote {args.out / 'sp_check.json'}: passed = {passed}", flush=True)
    dist.destroy_process_group()
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
