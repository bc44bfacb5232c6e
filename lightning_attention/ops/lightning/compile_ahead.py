"""Every kernel of a call's programs compiled before the first launch, all at once, in threads.

Why. Triton compiles a kernel at its first launch, so a first call builds its kernels one after another: the forward
walk, then in the backward the reverse walk (and, segmented or autotuned, the pre-pass, the scan and each candidate
configuration), 1-5 s each on a GPU host, longest in float32 and at K = 256. Most of a build runs with Python's lock
released (LLVM's passes, ``ptxas`` in a process of its own), so builds in threads overlap: two float32 K = 256 walks
built for sm_90 on a 2-core CPU took 9.3 s one after the other and 5.2 s in two threads.

How. Triton's ``AsyncCompileMode`` (triton >= 3.4) sends each ``warmup`` compile to an executor and waits for all of
them when its block ends. :func:`compile_together` opens such a block over this module's thread pool and has each
program's launches warmed up (:meth:`~lightning_attention.ops.lightning.program.Program.compile_ahead`: stand-in
tensors with the slots' dtypes and alignments, so the builds are exactly the kernels the launches will take); then the
call runs and its launches find their kernels built. A forward whose inputs need gradients is handed its backward's
program as well (``run.chunk_forward``), so the backward's kernels build while the forward's do.

Only the first call of a problem does this (``Program.compiled_ahead``), and a launch whose kernel a launcher already
holds adds nothing to the block. An autotuned launch builds every candidate, also where it will reuse the tuning of
an earlier launch with the same tuning key (which then launches only the winner): a few builds more than needed, in
threads that would otherwise wait. A build that fails in a thread is left to fail again, the same way, at its launch.
The ``compile_ahead`` setting off (``LIGHTNING_ATTENTION_COMPILE_AHEAD=0``), an older Triton, CPU tensors (the
interpreter compiles nothing), CUDA-graph capture and a block of the caller's own leave every build to its first
launch, as Triton does.
"""

import concurrent.futures
import os
import threading

import torch

from lightning_attention import settings
from lightning_attention.ops.lightning.program import Program

try:
    from triton.runtime._async_compile import AsyncCompileMode, active_mode
except ImportError:  # Triton before 3.4: builds happen at first launches, one by one
    AsyncCompileMode = active_mode = None

# a program's builds at once: up to a dozen (every candidate of every launch of a segmented fwd+bwd)
MAX_THREADS = 8

_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            workers = max(1, min(MAX_THREADS, os.cpu_count() or 1))
            _pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="lightning_attn-build")
    return _pool


def enabled(device: torch.device) -> bool:
    """Whether :func:`compile_together` builds anything for programs on ``device`` now."""
    return (
        device.type == "cuda"
        and AsyncCompileMode is not None
        and settings.current().compile_ahead
        and active_mode.get() is None
        and not torch.cuda.is_current_stream_capturing()
    )


def compile_together(programs: list[Program], device: torch.device) -> None:
    """Builds every kernel the launches of ``programs`` (on ``device``) need that is not built yet, in threads, and
    returns when all are built (module docstring); marks each program ``compiled_ahead`` either way."""
    for program in programs:
        program.compiled_ahead = True
    if not enabled(device):
        return
    # a failed build stays in Triton's cache as its failure, raised where the launch asks for the kernel
    with AsyncCompileMode(_executor(), ignore_errors=True):
        for program in programs:
            program.compile_ahead(device)
