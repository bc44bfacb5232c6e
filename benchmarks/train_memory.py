"""Peak memory per GPU and tokens/s of the trainer's step: DDP against FSDP2, with and without activation
checkpointing, eager and ``torch.compile``d, with and without sequence parallelism.

One GPU, the paper's smallest TNL (the ``400m`` preset with the released 64000-token vocabulary, 465M parameters),
every combination of ``--strategies`` x ``--checkpointing`` x ``--compile``, FSDP2 once per ``--fsdp-unit-blocks``
value (decoder blocks per ``fully_shard`` unit; about 3 minutes on an H100)::

    python benchmarks/train_memory.py --out benchmarks/results/<run>/train_memory

On one rank FSDP2 has nothing to shard: its memory is DDP's minus DDP's gradient buckets plus the block being
all-gathered; the saving per GPU appears with the ranks. Two GPUs (2-way FSDP2, 2-way sequence parallelism, both)::

    torchrun --standalone --nproc_per_node 2 benchmarks/train_memory.py --sequence-parallel 1,2 --compile off \\
        --out benchmarks/results/<run>/train_memory_2gpu

Each configuration builds the model from the same seed as the trainer does
(:func:`lightning_attention.train.trainer.build_model`: whole on every GPU for DDP; for FSDP2 on the meta device,
whole only on rank 0's CPU), applies the trainer's own set-up (:func:`~lightning_attention.train.trainer.prepare_model`:
activation checkpointing, per-block compile, then DDP or ``fully_shard`` on the ("dp", "sp") mesh, then the shards
filled from rank 0) and its step (:func:`~lightning_attention.train.trainer.train_step`: bf16
autocast, gradient clipping, AdamW) on random tokens, ``--warmup`` untimed steps (compilation, autotuning) then
``--steps`` timed ones. Reported per configuration, as a JSON line and in ``<out>/train_memory.json``:
``peak_memory_gib`` (``torch.cuda.max_memory_allocated`` from before the model was built, the largest over the
ranks, and per rank), ``steady_memory_gib`` (allocated between steps: weights, optimizer state, what the strategy
keeps), ``tokens_per_s`` (global tokens per step / step time) and the step losses (equal across configurations up to
bf16 rounding: same weights, same tokens). An out-of-memory configuration is recorded as such and the next one runs.
``--budget-s`` stops starting new configurations once passed.

``--profile-steps N`` then runs N more steps of each configuration under ``torch.profiler`` and adds, per rank and per
step: ``gpu_busy_ms`` (time some kernel other than NCCL's ran), ``nccl_ms`` (time an NCCL kernel ran: transfer, or
waiting for the other ranks to reach the collective), ``nccl_exposed_ms`` (NCCL time with no other kernel beside it) and
``host_busy_ms`` (the host's CPU time in PyTorch, the runtime and the driver, summed over its threads, less its waits
for the GPU). Under the profiler the steps run slower; compare ranks and strategies, not these times with ``step_ms``.
On more than one GPU the run first measures the interconnect (``interconnect`` in the JSON): an all-gather of one rank's
share of the model's float32 parameters (FSDP2 makes two such all-gathers and a reduce-scatter of that size a step)
and an all-reduce of all of them (DDP's gradients).

CPU smoke test (gloo, the smoke preset, ``aot_eager`` in place of inductor)::

    torchrun --standalone --nproc_per_node 2 benchmarks/train_memory.py --quick --device cpu --out /tmp/train_memory
"""

import argparse
import gc
import itertools
import json
import os
import pathlib
import sys
import time

import torch
import torch.distributed as dist

from lightning_attention.bench.machine import machine_info, machine_line
from lightning_attention.bench.results import ResultWriter, format_table
from lightning_attention.bench.timing import record_failure
from lightning_attention.models.presets import PRESETS, model_config, model_from_config, parameter_count
from lightning_attention.train import distributed as dist_utils
from lightning_attention.train import parallel
from lightning_attention.train.config import TrainConfig
from lightning_attention.train.trainer import autocast_context, build_model, make_optimizer, prepare_model, train_step

FULL = {"preset": "400m", "vocab_size": 64000, "context": 2048, "batch_size": 8, "steps": 10, "warmup": 3,
        "compile_backend": "inductor"}
QUICK = {"preset": "smoke", "vocab_size": 256, "context": 64, "batch_size": 2, "steps": 2, "warmup": 1,
         "compile_backend": "aot_eager"}
GIB = 2**30


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", choices=("tnl", "llama"), default="tnl")
    p.add_argument("--preset", choices=tuple(PRESETS), default=None, help="model size (400m)")
    p.add_argument("--vocab-size", type=int, default=None, help="64000: the released TNL tokenizer's")
    p.add_argument("--context", type=int, default=None, help="tokens per sequence (2048)")
    p.add_argument("--batch-size", type=int, default=None, help="sequences per data-parallel replica (8)")
    p.add_argument("--steps", type=int, default=None, help="timed steps (10)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps first (3)")
    p.add_argument("--strategies", default="ddp,fsdp", help="data-parallel strategies to compare")
    p.add_argument("--checkpointing", default="off,on", help="activation checkpointing: off, on or both")
    p.add_argument("--compile", default="off,on", help="per-block torch.compile: off, on or both")
    p.add_argument("--compile-backend", default=None, help="torch.compile backend (inductor)")
    p.add_argument("--sequence-parallel", default="1", help="ranks per sequence-parallel group, e.g. 1,2")
    p.add_argument("--fsdp-unit-blocks", default=str(parallel.DEFAULT_UNIT_BLOCKS),
                   help="FSDP2: decoder blocks per fully_shard unit, e.g. 1,3 (each value a configuration; "
                        f"default {parallel.DEFAULT_UNIT_BLOCKS}, the trainer's)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--budget-s", type=float, default=270.0, help="start no configuration after this many seconds")
    p.add_argument("--profile-steps", type=int, default=0,
                   help="then profile this many more steps per configuration: GPU, NCCL and host time per rank")
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test of the script (CPU, gloo)")
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("runs/train_memory"), help="folder of the JSON")
    args = p.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def _switch(text: str) -> list[bool]:
    values = {"off": False, "on": True}
    return [values[v.strip()] for v in text.split(",")]


def configurations(args, world_size: int) -> list[dict]:
    """Every combination asked for, sequence-parallel sizes that do not divide the world size left out; FSDP2 once per
    ``--fsdp-unit-blocks`` value (``fsdp_unit_blocks`` None under DDP)."""
    units = [int(u) for u in args.fsdp_unit_blocks.split(",")]
    grid = itertools.product([int(s) for s in args.sequence_parallel.split(",")], _switch(args.compile),
                             _switch(args.checkpointing), [s.strip() for s in args.strategies.split(",")])
    return [{"strategy": strategy, "checkpointing": ckpt, "compile": comp, "sequence_parallel": sp,
             "fsdp_unit_blocks": unit}
            for sp, comp, ckpt, strategy in grid if world_size % sp == 0
            for unit in (units if strategy == "fsdp" else [None])]


def _release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(conf: dict, args, info: dist_utils.DistInfo, device: torch.device, layout: parallel.Layout) -> dict:
    """Builds, prepares and trains one configuration; returns this rank's measurements."""
    torch._dynamo.reset()  # no compiled graph of an earlier configuration is reused (or kept alive)
    _release(device)
    cfg = TrainConfig(arch=args.arch, preset=args.preset, device=device.type)
    torch.manual_seed(0)
    config = model_config(args.arch, args.preset, args.vocab_size)
    model, fill = build_model(lambda: model_from_config(args.arch, config, sequence_parallel_group=layout.sp_group),
                              layout, info, device, conf["strategy"])
    record = {"parameters": parameter_count(model)}
    net = prepare_model(model, layout, device, data_parallel=conf["strategy"],
                        gradient_checkpointing=conf["checkpointing"], compile=conf["compile"],
                        compile_backend=args.compile_backend,
                        fsdp_unit_blocks=conf["fsdp_unit_blocks"] or parallel.DEFAULT_UNIT_BLOCKS)
    if fill is not None:
        fill()
        del fill
    optimizer = make_optimizer(model, cfg)
    autocast = autocast_context(cfg, device)
    generator = torch.Generator().manual_seed(1 + layout.dp_rank)  # each replica its own tokens; an SP group shares
    batch = torch.randint(0, args.vocab_size, (args.batch_size, args.context + 1), generator=generator).to(device)
    losses = []

    def step() -> None:
        losses.append(train_step(net, model, optimizer, batch, autocast, sp_group=layout.sp_group,
                                 grad_clip=cfg.grad_clip))

    started = time.perf_counter()
    for _ in range(args.warmup):
        step()
    _synchronize(device)
    record["warmup_s"] = time.perf_counter() - started
    if device.type == "cuda":
        record["steady_memory_gib"] = torch.cuda.memory_allocated(device) / GIB
    started = time.perf_counter()
    for _ in range(args.steps):
        step()
    _synchronize(device)
    elapsed = (time.perf_counter() - started) / max(args.steps, 1)
    record["step_ms"] = elapsed * 1e3
    record["tokens_per_s"] = args.batch_size * args.context * layout.dp_world / elapsed
    record["losses"] = [float(x) for x in losses]
    if device.type == "cuda":
        record["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / GIB
        if args.profile_steps > 0:
            record.update(profile_steps(step, args.profile_steps, device))
    return record  # the model, its optimizer and graphs go with this frame; the next configuration frees them


# host events that wait for the GPU rather than work: the profiler's closing synchronize, a full launch queue
_HOST_WAITS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "Command Buffer Full")


def _union(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Overlapping [start, end) intervals merged, sorted."""
    merged: list[list[int]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def _uncovered(intervals: list[tuple[int, int]], cover: list[tuple[int, int]]) -> int:
    """Total length of ``intervals`` that no interval of ``cover`` overlaps (both merged first)."""
    cover, total = _union(cover), 0
    for start, end in _union(intervals):
        cursor = start
        for a, b in cover:
            if b <= cursor or a >= end:
                continue
            total += max(0, a - cursor)
            cursor = max(cursor, b)
            if cursor >= end:
                break
        total += max(0, end - cursor)
    return total


def profile_steps(step, steps: int, device: torch.device) -> dict:
    """``steps`` calls of ``step`` under ``torch.profiler``: this rank's GPU, NCCL and host time per step (module
    docstring), in ms."""
    from torch.profiler import ProfilerActivity, profile

    _synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        _synchronize(device)
    nccl, other = [], []
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            span = (event.time_range.start, event.time_range.end)  # µs
            (nccl if "nccl" in event.name.lower() else other).append(span)
    host = sum(e.self_cpu_time_total for e in prof.key_averages() if e.key not in _HOST_WAITS)  # µs
    per_step = 1e-3 / steps  # µs -> ms per step
    return {"profiled_steps": steps,
            "gpu_busy_ms": sum(b - a for a, b in _union(other)) * per_step,
            "nccl_ms": sum(b - a for a, b in _union(nccl)) * per_step,
            "nccl_exposed_ms": _uncovered(nccl, other) * per_step,
            "host_busy_ms": host * per_step}


def interconnect(parameters: int, info: dist_utils.DistInfo, device: torch.device) -> dict:
    """Seconds and GB/s of an all-gather of one rank's share of ``parameters`` float32 values and of an all-reduce of
    all of them (the second of two rounds: the first sets NCCL's channels up)."""
    share = torch.randn(-(-parameters // info.world_size), device=device)
    whole = torch.empty(share.numel() * info.world_size, device=device)
    result = {}
    for _ in range(2):
        _synchronize(device)
        started = time.perf_counter()
        dist.all_gather_into_tensor(whole, share)
        _synchronize(device)
        gathered = time.perf_counter()
        dist.all_reduce(whole)
        _synchronize(device)
        reduced = time.perf_counter()
        result = {"floats": whole.numel(), "all_gather_s": gathered - started, "all_reduce_s": reduced - gathered,
                  # bus bandwidth (NCCL's measure): bytes each rank sends and receives over the link, per second
                  "all_gather_busbw_gbps": whole.numel() * 4 * (info.world_size - 1) / info.world_size
                  / (gathered - started) / 1e9,
                  "all_reduce_busbw_gbps": whole.numel() * 4 * 2 * (info.world_size - 1) / info.world_size
                  / (reduced - gathered) / 1e9}
    del share, whole
    _release(device)
    return result


def _gather(record: dict, info: dist_utils.DistInfo) -> list[dict]:
    if not info.enabled:
        return [record]
    records = [None] * info.world_size
    dist.all_gather_object(records, record)
    return records


def _combine(conf: dict, per_rank: list[dict], args, world_size: int) -> dict:
    """One record of the configuration: rank 0's numbers, memory and profiled times as the largest over the ranks
    and per rank."""
    failed = [r for r in per_rank if r.get("status") not in (None, "ok")]
    out = {**conf, "world_size": world_size, "data_parallel_ranks": world_size // conf["sequence_parallel"],
           "batch_per_replica": args.batch_size, "context": args.context, **per_rank[0]}
    if failed:
        return {**out, **{k: failed[0][k] for k in ("status", "error")}}
    out["status"] = "ok"
    out["tokens_per_step"] = args.batch_size * args.context * out["data_parallel_ranks"]
    for key in ("peak_memory_gib", "steady_memory_gib", "gpu_busy_ms", "nccl_ms", "nccl_exposed_ms", "host_busy_ms"):
        if key in per_rank[0]:
            out[f"{key}_per_rank"] = [r[key] for r in per_rank]
            out[key] = max(out[f"{key}_per_rank"])
    return out


def _row(r: dict) -> list[str]:
    memory = f"{r['peak_memory_gib']:.2f}" if "peak_memory_gib" in r else "n/a"
    rate = f"{r['tokens_per_s']:,.0f}" if "tokens_per_s" in r else r["status"]
    return [r["strategy"], str(r["fsdp_unit_blocks"] or ""), str(r["sequence_parallel"]),
            "on" if r["checkpointing"] else "off", "on" if r["compile"] else "off", memory, rate]


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # never enable NVLink multicast (only fills in a missing value)
    info = dist_utils.setup(args.device, need_group=True)  # a group of one on one GPU: DDP and FSDP2 both wrap
    completed = False
    try:
        device = torch.device(f"cuda:{info.local_rank}" if args.device == "cuda" else "cpu")
        if device.type == "cpu":
            torch.set_num_threads(1)
        writer = None
        if info.is_main:
            machine = machine_info(device)
            line = machine_line(machine)
            print(line, flush=True)
            config = {k: (str(v) if isinstance(v, pathlib.Path) else v) for k, v in vars(args).items()}
            writer = ResultWriter(args.out / "train_memory.json", "train_memory", machine, line,
                                  {**config, "argv": sys.argv, "world_size": info.world_size,
                                   "backend": dist.get_backend()})
        if info.world_size > 1 and device.type == "cuda":
            with torch.device("meta"):  # the parameter count only: nothing allocated
                parameters = parameter_count(model_from_config(args.arch, model_config(args.arch, args.preset,
                                                                                      args.vocab_size)))
            link = interconnect(parameters, info, device)
            if writer:
                writer.add("interconnect", link)
                print(json.dumps({"interconnect": link}), flush=True)
        start, layouts, records = time.perf_counter(), {}, []
        for conf in configurations(args, info.world_size):
            if time.perf_counter() - start > args.budget_s:
                if writer:
                    writer.skip(json.dumps(conf), f"--budget-s {args.budget_s} passed")
                continue
            sp = conf["sequence_parallel"]
            if sp not in layouts:
                layouts[sp] = parallel.build_layout(info, sp, device, sp_capable=args.arch == "tnl")
            try:
                mine = measure(conf, args, info, device, layouts[sp])
            except Exception as exc:  # noqa: BLE001 - an OOM (or a failure) of one configuration ends only it
                mine = record_failure({}, exc)
                _release(device)
            record = _combine(conf, _gather(mine, info), args, info.world_size)
            records.append(record)
            if writer:
                writer.add("results", record)
                print(json.dumps(record), flush=True)
        if writer:
            print(format_table(["strategy", "unit blocks", "sp", "act. ckpt", "compile", "peak GiB/GPU", "tokens/s"],
                               [_row(r) for r in records]), flush=True)
        completed = True
    finally:
        dist_utils.teardown(info, completed=completed)
    return 0


if __name__ == "__main__":
    code = main()
    # on CPU, gloo's worker threads outlive destroy_process_group (no Python object holds their groups any more) and go
    # down with the interpreter's static objects, which now and then aborted a rank whose results were written
    # ("terminate called without an active exception"): leave without that teardown
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
