"""Multi-process plumbing for the distributed tests: spawn gloo ranks on CPU, run a job, collect results.

The parent writes a job's inputs to a temporary directory, :func:`spawn` starts ``world_size`` processes that
rendezvous through a file store there (no TCP port to race for), each rank writes ``rank{r}.pt``, and the parent
compares. Children NaN-poison ``torch.empty*`` calls made inside the package exactly as tests/conftest.py does in
the parent, so an unwritten buffer (e.g. an all-gather output) shows up as NaN there too.

Entry points must live at module level (spawn pickles them by name).
"""

import os
import pathlib
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests import conftest


def install_nan_poison() -> None:
    """Child-side twin of the ``poison_empty`` fixture (a spawned process runs no pytest fixtures): importing
    tests.conftest wrapped the allocators; switch their poisoning on for the life of the child."""
    conftest._POISON_ACTIVE[0] = True


def _child(rank: int, world_size: int, workdir: str, job) -> None:
    torch.set_num_threads(1)  # 2 shared cores: one thread per rank
    install_nan_poison()
    dist.init_process_group(
        "gloo",
        init_method=f"file://{workdir}/store",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=60),  # a collective mismatch fails the test instead of hanging CI
    )
    try:
        result = job(rank, world_size, pathlib.Path(workdir))
        torch.save(result, os.path.join(workdir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def spawn(job, world_size: int, workdir: pathlib.Path) -> list:
    """Runs ``job(rank, world_size, workdir) -> picklable result`` on ``world_size`` gloo ranks; returns the results.

    An exception in any rank is re-raised here (``torch.multiprocessing.ProcessRaisedException``).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    mp.spawn(_child, args=(world_size, str(workdir), job), nprocs=world_size, join=True)
    return [torch.load(workdir / f"rank{r}.pt", weights_only=False) for r in range(world_size)]
