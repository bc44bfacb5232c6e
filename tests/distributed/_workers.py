"""Multi-process plumbing for the distributed tests: spawn gloo ranks on CPU, run a job, collect results.

The parent writes a job's inputs to a temporary directory, :func:`spawn` starts ``world_size`` processes that
rendezvous through a file store there (no TCP port to race for), each rank writes ``rank{r}.pt``, and the parent
compares. A job that outlives its deadline is killed and fails the test: a hang never blocks CI. Children NaN-poison
``torch.empty*`` calls made inside the package exactly as tests/conftest.py does in the parent, so an unwritten buffer
(e.g. an all-gather output) shows up as NaN there too.

Entry points must live at module level (spawn pickles them by name).
"""

import os
import pathlib
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests import conftest


def install_nan_poison() -> None:
    """Child-side twin of the ``poison_empty`` fixture (a spawned process runs no pytest fixtures): importing
    tests.conftest wrapped the allocators; switch their poisoning on for the life of the child."""
    conftest._POISON_ACTIVE[0] = True


def _child(rank: int, world_size: int, workdir: str, job, collective_timeout_s: float) -> None:
    torch.set_num_threads(1)  # 2 shared cores: one thread per rank
    install_nan_poison()
    dist.init_process_group(
        "gloo",
        init_method=f"file://{workdir}/store",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=collective_timeout_s),  # a collective mismatch fails the test instead of hanging
    )
    try:
        result = job(rank, world_size, pathlib.Path(workdir))
        torch.save(result, os.path.join(workdir, f"rank{rank}.pt"))
        # every rank past its last collective before any tears the group down: a peer's teardown while a collective is
        # in flight aborts gloo's worker threads at exit ("terminate called without an active exception")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def spawn(
    job, world_size: int, workdir: pathlib.Path, *, timeout_s: float = 240.0, collective_timeout_s: float = 60.0
) -> list:
    """Runs ``job(rank, world_size, workdir) -> picklable result`` on ``world_size`` gloo ranks; returns the results.

    An exception in any rank is re-raised here (``torch.multiprocessing.ProcessRaisedException``). A collective
    that waits longer than ``collective_timeout_s`` raises in its rank; ranks still running after ``timeout_s``
    (start-up included) are killed and ``TimeoutError`` is raised.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    context = mp.start_processes(
        _child,
        args=(world_size, str(workdir), job, collective_timeout_s),
        nprocs=world_size,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + timeout_s
    while not context.join(timeout=max(0.1, deadline - time.monotonic())):  # raises if a rank failed
        if time.monotonic() >= deadline:
            alive = [p.pid for p in context.processes if p.is_alive()]
            for p in context.processes:
                if p.is_alive():
                    p.kill()
                    p.join()
            raise TimeoutError(f"distributed job {job.__name__} still running after {timeout_s} s (pids {alive})")
    return [torch.load(workdir / f"rank{r}.pt", weights_only=False) for r in range(world_size)]
