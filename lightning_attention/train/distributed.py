"""The process group of a training run: joined from torchrun's environment, taken over from the caller, or a group of
one process where FSDP2 needs one; and the few collectives the training loop itself issues."""

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    initialized: bool = False  # a process group exists (world_size may still be 1)
    owned: bool = False  # the trainer created it and destroys it at the end

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup(device: str, *, need_group: bool = False) -> DistInfo:
    """This process's place in the run.

    - A process group that already exists (the caller's) is used as it is and left to the caller.
    - Under torchrun (``WORLD_SIZE > 1``) the process joins the group: NCCL on CUDA, gloo on CPU.
    - A single process gets a group of one when ``need_group`` (FSDP2 shards over a DeviceMesh, which needs one); it
      rendezvous through an in-memory store, so no port or environment is needed.
    """
    if dist.is_available() and dist.is_initialized():
        rank = dist.get_rank()
        return DistInfo(rank, dist.get_world_size(), int(os.environ.get("LOCAL_RANK", rank)), initialized=True)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if world > 1:
        info = DistInfo(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")), True, True)
        if device.startswith("cuda"):
            torch.cuda.set_device(info.local_rank)
        dist.init_process_group(backend)
        return info
    if need_group:
        if device.startswith("cuda"):
            torch.cuda.set_device(0)
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        return DistInfo(initialized=True, owned=True)
    return DistInfo()


def teardown(info: DistInfo, *, completed: bool) -> None:
    """Destroys the group this process created. After a run that ``completed`` on this rank, the ranks first meet at a
    barrier: a rank that tears down while a peer's last collective is still in flight can abort gloo's worker threads
    at exit ("terminate called without an active exception"). After a failure there is no barrier (a peer may never
    reach it)."""
    if info.owned and dist.is_initialized():
        if completed and info.enabled:
            dist.barrier()
        dist.destroy_process_group()


def all_reduce_sum(values: torch.Tensor, info: DistInfo) -> torch.Tensor:
    if info.enabled:
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def all_reduce_max(value: int, info: DistInfo, device: torch.device) -> int:
    """The largest ``value`` over the ranks."""
    if not info.enabled:
        return value
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def broadcast_object(value, info: DistInfo):
    """Rank 0's ``value`` on every rank."""
    if not info.enabled:
        return value
    payload = [value]
    dist.broadcast_object_list(payload, src=0)
    return payload[0]


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()
