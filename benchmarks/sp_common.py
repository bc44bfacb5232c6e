"""What the two sequence-parallel scripts share: the torchrun set-up and the JSON report of rank 0.

``benchmarks/sp_check_gpu.py`` and ``benchmarks/sp_scaling.py`` import this as a sibling module (a script's own
folder is first on ``sys.path``, under ``torchrun`` too). The report is a
:class:`lightning_attention.bench.results.ResultWriter` document, ``<out>/<name>.json`` headed by the machine line
like every ``lightning-attention bench`` output, rewritten after every measurement: a run stopped by its time limit
still leaves what it measured. Only rank 0 writes; the other ranks get a writer that discards.

NVLink multicast stays off: ``NCCL_NVLS_ENABLE`` is never set to 1 (it is only filled in with 0 when unset).
"""

import argparse
import os
import pathlib
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from lightning_attention.bench.machine import machine_info, machine_line
from lightning_attention.bench.results import ResultWriter

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def add_common_arguments(p: argparse.ArgumentParser) -> None:
    default_device = "cuda" if torch.cuda.is_available() else "cpu"
    p.add_argument("--device", choices=("cuda", "cpu"), default=default_device, help="cuda: NCCL; cpu: gloo")
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test of the script (CPU, gloo)")
    p.add_argument("--timeout-min", type=float, default=10.0, help="collective timeout (turns a hang into an error)")
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("runs/sp"), help="folder of the JSON report")


def fill_defaults(args: argparse.Namespace, full: dict, quick: dict) -> None:
    """Options left at ``None`` take the ``--quick`` value or the full-size one."""
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)


def init_distributed(device: str, timeout_min: float) -> tuple[int, int, torch.device]:
    """torchrun environment -> (rank, world size, this rank's device); NCCL on CUDA, gloo on CPU."""
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # never enable NVLink multicast (only fills in a missing value)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = timedelta(minutes=timeout_min)
    if device == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
        dist.init_process_group("nccl", timeout=timeout, device_id=dev)
    else:
        dev = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timeout)
    return rank, world_size, dev


class _Discard:
    """The writer of ranks other than 0."""

    def set(self, key, value) -> None:
        pass

    def add(self, section, record) -> None:
        pass

    def skip(self, what, reason) -> None:
        pass


def open_report(name: str, args: argparse.Namespace, rank: int, world_size: int, device: torch.device):
    """``<args.out>/<name>.json`` on rank 0 (machine line printed first, as in the bench CLI); a no-op elsewhere."""
    if rank != 0:
        return _Discard()
    info = machine_info(device)
    info["gpu_count"] = torch.cuda.device_count() if device.type == "cuda" else 0
    line = machine_line(info)
    print(line, flush=True)
    config = {k: (str(v) if isinstance(v, pathlib.Path) else v) for k, v in vars(args).items()}
    config["argv"] = sys.argv
    writer = ResultWriter(pathlib.Path(args.out) / f"{name}.json", name, info, line, config)
    writer.set("world_size", world_size)
    writer.set("backend", dist.get_backend())
    writer.set("lightning_attention_backend", os.environ.get("LIGHTNING_ATTENTION_BACKEND", "auto"))
    writer.set("NCCL_NVLS_ENABLE", os.environ.get("NCCL_NVLS_ENABLE"))
    return writer
