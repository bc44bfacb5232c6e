"""Host cost per call of the sequence-parallel call header (the consistency check of ``lightning_attn_sp``).

Run under torchrun, on CPU (gloo) or GPUs (NCCL)::

    torchrun --standalone --nproc_per_node 2 benchmarks/sp_header_cost.py --device cpu  --out runs/sp
    torchrun --standalone --nproc_per_node 2 benchmarks/sp_header_cost.py --device cuda --out runs/sp

Per call, median of ``--repeats`` loops of ``--calls`` calls, slowest rank (the all-gather makes the ranks wait for
each other, so that is what a training step sees):

- ``build_us``: forming this rank's header (shapes, flags, slope checksum), no communication;
- ``check_us``: the whole check (header, its all-gather, the comparison on the host); on CUDA this includes the
  device->host sync of reading the gathered header;
- ``all_gather_us``: a bare all-gather of a buffer of the header's size, for scale (the floor of ``check_us``);
- ``forward_checked_us`` / ``forward_cached_us``: one ``lightning_attn_sp`` forward (no grad) with the header
  exchanged on every call (what CPU tensors and ``LIGHTNING_ATTENTION_DEBUG=1`` do) and with the signature
  already checked (what CUDA tensors do after the first call); their difference is the header's cost in context.

``<out>/sp_header_cost.json`` holds the numbers; rank 0 prints them.
"""

import argparse
import statistics
import time

import torch
import torch.distributed as dist
from sp_common import DTYPES, add_common_arguments, fill_defaults, init_distributed, open_report

from lightning_attention.bench.timing import synchronize
from lightning_attention.distributed import call_header, lightning_attn_sp
from lightning_attention.distributed.comm_volume import recorded_all_gather

FULL = {"heads": 16, "dim": 128, "slice_len": 1024, "dtype": "bfloat16"}
QUICK = {"heads": 16, "dim": 64, "slice_len": 256, "dtype": "float32"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--heads", type=int, default=None)
    p.add_argument("--dim", type=int, default=None, help="K = V")
    p.add_argument("--slice-len", type=int, default=None, help="tokens per rank")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--repeats", type=int, default=5)
    add_common_arguments(p)
    args = p.parse_args(argv)
    fill_defaults(args, QUICK if args.device == "cpu" else FULL, QUICK)
    return args


def per_call_us(fn, calls: int, repeats: int, device: torch.device) -> float:
    """Median over ``repeats`` of the mean time of ``calls`` calls of ``fn``, in µs, on the slowest rank."""
    fn()  # warm-up (and, for the first-call rule, the one checked call)
    samples = []
    for _ in range(repeats):
        synchronize(device)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        synchronize(device)
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    slowest = torch.tensor([statistics.median(samples)], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return slowest.item()


def main(argv=None) -> None:
    args = parse_args(argv)
    rank, world_size, device = init_distributed(args.device, args.timeout_min)
    if device.type == "cpu":
        torch.set_num_threads(1)  # the ranks share the host's cores
    writer = open_report("sp_header_cost", args, rank, world_size, device)
    H, D, T, dtype = args.heads, args.dim, args.slice_len, DTYPES[args.dtype]
    gen = torch.Generator().manual_seed(rank)
    q, k, v = (torch.randn(1, T, H, D, generator=gen).to(device, dtype) for _ in range(3))
    slope = torch.linspace(0.0, 1.0, H, device=device)
    call = {"q": q, "k": k, "v": v, "slope": slope, "scale": 1.0, "initial_state": None, "output_final_state": False}

    def check():
        call_header.check_call_consistency(None, world_size, local_error=None, **call)

    def build():
        header = call_header._header(q, k, v, slope, 1.0, None, False, True)
        call_header._add_checksums(header, slope, None)

    def forward():
        with torch.no_grad():
            lightning_attn_sp(q, k, v, slope)

    results = {"shape": {"B": 1, "T_r": T, "H": H, "K": D, "V": D, "dtype": args.dtype}}
    for mode, every_call in (("checked", True), ("cached", False)):
        # the rule normally follows the device and LIGHTNING_ATTENTION_DEBUG; forced here to time both on one machine
        call_header.checks_every_call = lambda device, group, every_call=every_call: every_call
        if every_call:
            results["build_us"] = per_call_us(build, args.calls, args.repeats, device)
            results["check_us"] = per_call_us(check, args.calls, args.repeats, device)
            send = torch.zeros(call_header.HEADER_SLOTS, dtype=torch.int64, device=device)
            results["all_gather_us"] = per_call_us(
                lambda send=send: recorded_all_gather(send, world_size, None, "check"), args.calls, args.repeats, device
            )
        results[f"forward_{mode}_us"] = per_call_us(forward, args.calls, args.repeats, device)
    results["header_bytes_per_rank"] = call_header.HEADER_BYTES
    for key, value in results.items():
        writer.set(key, value)
    if rank == 0:
        print(results, flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
