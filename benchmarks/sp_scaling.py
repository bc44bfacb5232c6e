"""Sequence-parallel scaling of one TNL attention layer: longest trainable T, tokens/s, bytes per layer.

Run on the 2-GPU machine (``bash benchmarks/gpu_suite.sh sp`` runs this and sp_check_gpu.py)::

    torchrun --standalone --nproc_per_node 2 benchmarks/sp_scaling.py --budget-s 240 --out benchmarks/results/<run>/sp

The layer is the library's TNL token mixer, :class:`lightning_attention.nn.tnl_attention.TNLAttention` (fwd + bwd,
bf16 weights and activations, H = 16, K = V = 128, d_model = 2048, no LRPE): ``q, k, v, u = x W``; ``q, k = silu``;
``o = lightning_attn(q, k, v, slope)``; SRMSNorm, gated by ``u``, projected back. On one GPU it runs the
single-device op on the whole sequence; with a ``sequence_parallel_group`` it runs ``lightning_attn_sp`` on each
rank's slice of it.

Measurements, cheapest first, each written to ``<out>/sp_scaling.json`` as soon as it is done:

1. **Communication bytes per layer**, recorded from the collectives ``lightning_attn_sp`` issues in one fwd + bwd at
   each ``--comm-lens`` global T, next to the prediction ``sp_communication_bytes`` (which has no T in it).
2. **Tokens/s** at each ``--fixed-lens`` global T: one GPU vs the SP group, median of ``--iters`` timed steps after
   ``--warmup`` (which also compiles the kernels); the SP step includes its all-gathers and the inter-rank term
   λ^(t+1) q_t S_in, and is as slow as its slowest rank.
3. **Longest sequence**: T doubles from ``--start-len`` until a fwd + bwd runs out of memory (caught), first on one
   GPU (each rank searches alone, on its own GPU, no communication), then on the SP group (global T, T / P per
   rank, starting from half the one-GPU result; ranks agree on every step through a gloo all-reduce). The search also
   stops at ``--max-len``, when the next step would pass ``--trial-cap-s`` (a step takes about twice the previous
   one) or when ``--budget-s`` (counted from the start of the script) runs out; the reason is recorded. The ranks
   run identical shapes, so they run out of memory at the same allocation; should one not, the collective timeout
   (``--timeout-min``) ends the run instead of a hang, and the JSON keeps everything measured before.

Smoke test on CPU (gloo, the PyTorch path, tiny sizes)::

    torchrun --standalone --nproc_per_node 2 benchmarks/sp_scaling.py --quick --out /tmp/sp
"""

import argparse
import statistics
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from sp_common import DTYPES, add_common_arguments, fill_defaults, init_distributed, open_report

from lightning_attention.bench.timing import is_out_of_memory, release, synchronize
from lightning_attention.distributed import record_communication, sequence_bounds, sp_communication_bytes
from lightning_attention.nn.tnl_attention import TNLAttention

FULL = {
    "heads": 16,
    "dim": 128,
    "start_len": 64 * 1024,
    "max_len": 64 * 1024 * 1024,
    "fixed_lens": "262144,1048576",
    "comm_lens": "65536,262144,1048576",
    "warmup": 2,
    "iters": 5,
}
QUICK = {
    "heads": 2,
    "dim": 16,
    "start_len": 64,
    "max_len": 256,
    "fixed_lens": "128",
    "comm_lens": "64,128",
    "warmup": 1,
    "iters": 2,
}
NUM_LAYERS = 24  # the decay schedule of layer 0 of a 24-layer TNL


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--heads", type=int, default=None, help="H (default 16)")
    p.add_argument("--dim", type=int, default=None, help="K = V (default 128); d_model = H · dim")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    p.add_argument("--start-len", type=int, default=None, help="first global T of the doubling search (64K)")
    p.add_argument("--max-len", type=int, default=None, help="stop doubling here even without OOM (64M)")
    p.add_argument("--fixed-lens", default=None, help="global T of the tokens/s comparison (256K,1M)")
    p.add_argument("--comm-lens", default=None, help="global T of the bytes check (64K,256K,1M)")
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--iters", type=int, default=None)
    p.add_argument("--trial-cap-s", type=float, default=60.0, help="no search step expected to take longer")
    p.add_argument("--budget-s", type=float, default=0.0, help="stop starting new work after this many seconds")
    add_common_arguments(p)
    args = p.parse_args(argv)
    fill_defaults(args, FULL, QUICK)
    return args


class Clock:
    """Seconds left of ``--budget-s`` (infinite when it is 0)."""

    def __init__(self, budget_s: float):
        self.start = time.perf_counter()
        self.budget_s = budget_s

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        return float("inf") if self.budget_s <= 0 else self.budget_s - self.elapsed()


def all_ranks(flag: bool, control) -> bool:
    """Whether ``flag`` holds on every rank (a gloo all-reduce: it works whatever state the GPUs are in)."""
    t = torch.tensor([0 if flag else 1], dtype=torch.int32)
    dist.all_reduce(t, group=control)
    return int(t.item()) == 0


def local_len(layer: TNLAttention, T: int, rank: int, world_size: int) -> int:
    """Tokens this rank holds of a global ``T``: all of them on one GPU, its slice in the SP group."""
    if layer.sequence_parallel_group is None:
        return T
    start, end = sequence_bounds(T, rank, world_size)
    return end - start


def train_step(layer: TNLAttention, tokens: int, device: torch.device) -> None:
    """One fwd + bwd of the layer on ``tokens`` tokens (random input and output gradient)."""
    x = torch.randn(1, tokens, layer.d_model, device=device, dtype=next(layer.parameters()).dtype)
    y = layer(x)
    y.backward(torch.randn_like(y))


def try_step(layer: TNLAttention, tokens: int, device: torch.device) -> dict:
    """One fwd + bwd: ``{"status": "ok", "seconds", "peak_memory_gib"}`` or ``{"status": "oom", "error"}``."""
    release(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    layer.zero_grad(set_to_none=True)
    try:
        synchronize(device)
        t0 = time.perf_counter()
        train_step(layer, tokens, device)
        synchronize(device)
        seconds = time.perf_counter() - t0
    except Exception as exc:  # an OOM is a result; anything else is re-raised
        if not is_out_of_memory(exc):
            raise
        result = {"status": "oom", "error": f"{type(exc).__name__}: {exc}"[:300]}
    else:
        peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
        result = {"status": "ok", "seconds": seconds, "peak_memory_gib": None if peak is None else peak / 2**30}
    layer.zero_grad(set_to_none=True)
    release(device)
    return result


def communication(layer, world_size: int, rank: int, args, device) -> list[dict]:
    """Bytes the layer's collectives move at each ``--comm-lens`` T (this rank's record)."""
    rows = []
    for T in (int(t) for t in args.comm_lens.split(",")):
        with record_communication() as log:
            train_step(layer, local_len(layer, T, rank, world_size), device)
        synchronize(device)
        layer.zero_grad(set_to_none=True)
        rows.append(
            {
                "seq_len": T,
                "collectives": [{"direction": c.direction, "send": c.send_bytes, "recv": c.recv_bytes} for c in log],
                # the state exchange; the fixed-size call header (on CPU every call, on CUDA the first) apart
                "send_bytes_per_layer": sum(c.send_bytes for c in log if c.direction != "check"),
                "recv_bytes_per_layer": sum(c.recv_bytes for c in log if c.direction != "check"),
                "check_bytes_per_layer": sum(c.send_bytes for c in log if c.direction == "check"),
            }
        )
    release(device)
    return rows


def tokens_per_second(layer, T: int, world_size: int, rank: int, args, device, control) -> dict:
    """Median fwd + bwd time at global ``T`` (slowest rank) and the tokens/s of the whole group."""
    sp = layer.sequence_parallel_group is not None
    tokens = local_len(layer, T, rank, world_size)
    times, failure = [], None
    try:
        for _ in range(args.warmup):
            train_step(layer, tokens, device)
        for _ in range(args.iters):
            synchronize(device)
            if sp:
                dist.barrier(group=control)
            t0 = time.perf_counter()
            train_step(layer, tokens, device)
            synchronize(device)
            times.append(time.perf_counter() - t0)
    except Exception as exc:  # an OOM is a result; anything else is re-raised
        if not is_out_of_memory(exc):
            raise
        failure = f"{type(exc).__name__}: {exc}"[:300]
    layer.zero_grad(set_to_none=True)
    release(device)
    ok = failure is None
    if sp:
        ok = all_ranks(ok, control)
    if not ok:
        return {"seq_len": T, "status": "oom", "error": failure or "out of memory on another rank"}
    seconds = statistics.median(times)
    if sp:  # the step is as slow as its slowest rank
        t = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=control)
        seconds = t.item()
    return {"seq_len": T, "status": "ok", "seconds_per_step": seconds, "tokens_per_second": T / seconds,
            "times": times}


def longest_sequence(layer, start_len: int, world_size: int, rank: int, args, device, control, clock) -> dict:
    """Doubles the global T until a step fails (anywhere) or a limit is reached; every trial is kept."""
    sp = layer.sequence_parallel_group is not None
    trials, longest, T, stopped = [], 0, start_len, None
    while stopped is None:
        last = trials[-1].get("seconds", 0.0) if trials else 0.0
        if T > args.max_len:
            stopped = "max_len"
        elif 2.2 * last > args.trial_cap_s:
            stopped = "trial cap"
        elif 2.2 * last > clock.left():
            stopped = "budget"
        go = stopped is None
        if sp:  # every rank takes the same decision, or one would wait in a collective for ever
            go = all_ranks(go, control)
            stopped = stopped or (None if go else "another rank's limit")
        if not go:
            break
        result = try_step(layer, local_len(layer, T, rank, world_size), device)
        ok = result["status"] == "ok"
        if sp:
            ok = all_ranks(ok, control)
            if not ok and result["status"] == "ok":
                result = {"status": "oom", "error": "out of memory on another rank"}
        trials.append({"seq_len": T, **result})
        if rank == 0 or not sp:
            peak = result.get("peak_memory_gib")
            print(f"rank {rank}, {world_size if sp else 1} GPU(s), T = {T}: {result['status']}, "
                  f"{result.get('seconds', 0):.2f} s, peak {'-' if peak is None else f'{peak:.1f} GiB'}", flush=True)
        if not ok:
            stopped = "oom"
        else:
            longest, T = T, 2 * T
    return {"longest_seq_len": longest, "stopped": stopped, "trials": trials}


def main(argv=None) -> int:
    args = parse_args(argv)
    clock = Clock(args.budget_s)
    rank, world_size, device = init_distributed(args.device, args.timeout_min)
    # CPU control plane (OOM flags, timing barriers): its own long timeout, since the one-GPU phases do not talk
    control = dist.new_group(backend="gloo", timeout=timedelta(minutes=max(args.timeout_min, 20.0)))
    writer = open_report("sp_scaling", args, rank, world_size, device)
    d_model = args.heads * args.dim

    def make_layer(group) -> TNLAttention:
        torch.manual_seed(0)  # the same weights on every rank
        layer = TNLAttention(d_model, d_model, args.heads, 0, NUM_LAYERS, sequence_parallel_group=group)
        return layer.to(device=device, dtype=DTYPES[args.dtype])

    writer.set(
        "layer",
        {"heads": args.heads, "dim_k": args.dim, "dim_v": args.dim, "d_model": d_model, "dtype": args.dtype,
         "batch": 1, "what": "lightning_attention.nn.tnl_attention.TNLAttention (TNL token mixer), fwd + bwd"},
    )
    single, sp = make_layer(None), make_layer(dist.group.WORLD)

    # 1. bytes per layer: the same at every T
    comm = communication(sp, world_size, rank, args, device)
    predicted = sp_communication_bytes(1, args.heads, args.dim, args.dim, world_size)
    sends = {row["send_bytes_per_layer"] for row in comm}
    writer.set(
        "communication",
        {
            "measured_rank0": comm,
            "predicted": {**predicted.__dict__, "total_send": predicted.total_send},
            "independent_of_seq_len": len(sends) == 1,
            "matches_prediction": sends == {predicted.total_send},
            "note": "bytes each rank hands to the state all-gathers of one fwd + bwd (the call header's "
            "check_bytes_per_layer apart); a ring all-gather puts (P - 1) x send on the wire per rank",
        },
    )

    # 2. tokens/s at fixed global lengths (one GPU: every rank alone, rank 0's number is reported)
    rates = []
    for T in (int(t) for t in args.fixed_lens.split(",")):
        if not all_ranks(clock.left() > 0, control):
            writer.skip(f"tokens/s at T = {T}", "--budget-s spent")
            continue
        one = tokens_per_second(single, T, world_size, rank, args, device, control)
        many = tokens_per_second(sp, T, world_size, rank, args, device, control)
        row = {"seq_len": T, "gpus_1": one, f"gpus_{world_size}": many}
        if one["status"] == many["status"] == "ok":
            row["speedup"] = many["tokens_per_second"] / one["tokens_per_second"]
            row["efficiency"] = row["speedup"] / world_size
        rates.append(row)
        writer.set("tokens_per_second", rates)

    # 3. longest sequence, one GPU then the group
    search = {"start_len": args.start_len, "max_len": args.max_len, "trial_cap_s": args.trial_cap_s,
              "note": "longest power-of-two multiple of start_len that trained (fwd + bwd); stopped: why it ended"}
    one_gpu = longest_sequence(single, args.start_len, world_size, rank, args, device, control, clock)
    per_rank = [None] * world_size
    dist.all_gather_object(per_rank, one_gpu["longest_seq_len"], group=control)
    search.update(gpus_1=one_gpu["longest_seq_len"], gpus_1_per_rank=per_rank, stopped_gpus_1=one_gpu["stopped"],
                  trials_gpus_1=one_gpu["trials"])
    writer.set("longest_seq_len", search)
    del single
    release(device)
    sp_start = max(args.start_len, min(per_rank) // 2)  # half the one-GPU result: the first step should fit
    many = longest_sequence(sp, sp_start, world_size, rank, args, device, control, clock)
    search.update({f"gpus_{world_size}": many["longest_seq_len"], f"stopped_gpus_{world_size}": many["stopped"],
                   f"trials_gpus_{world_size}": many["trials"], f"start_len_gpus_{world_size}": sp_start})
    writer.set("longest_seq_len", search)
    writer.set("elapsed_s", clock.elapsed())
    if rank == 0:
        print(f"communication per layer: {sorted(sends)} bytes sent (predicted {predicted.total_send})")
        for row in rates:
            print(f"T = {row['seq_len']}: speedup {row.get('speedup')}")
        print(f"longest T: 1 GPU {search['gpus_1']}, {world_size} GPUs {search[f'gpus_{world_size}']}")
        print(f"wrote {args.out / 'sp_scaling.json'} in {clock.elapsed():.1f} s", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
