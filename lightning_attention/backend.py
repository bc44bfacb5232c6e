"""Which implementation runs a call: the Triton kernels or the PyTorch path, and which checks run with it.

The choice follows :func:`lightning_attention.settings.current` (``backend``, ``debug``); nothing here reads the
environment itself.
"""

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from lightning_attention import settings


def use_triton(x: torch.Tensor) -> bool:
    """Whether a call on tensors living where ``x`` lives runs the Triton kernels: the ``triton`` backend always,
    ``auto`` on CUDA tensors, ``torch`` never."""
    name = settings.current().backend
    if name == "auto":
        return x.is_cuda
    return name == "triton"


def triton_ops():
    """The Triton path's entry points (:mod:`lightning_attention.ops.lightning.ops`), imported on first use (Triton
    stays unimported on the PyTorch path), or NotImplementedError saying how to run without them when Triton cannot
    be imported here. (An import statement, which torch.compile traces, rather than ``importlib``.)"""
    try:
        from lightning_attention.ops.lightning import ops
    except ImportError as e:  # triton missing (e.g. not Linux)
        raise NotImplementedError(
            f"The Triton backend is not available here ({e}); set LIGHTNING_ATTENTION_BACKEND=torch to use the "
            "PyTorch path"
        ) from e
    return ops


def value_checks_enabled(x: torch.Tensor) -> bool:
    """Value checks that would sync a device run always on CPU tensors, on CUDA only in debug mode.

    Never while torch.compile traces: reading tensor values on the host would break the graph, and the eager
    call of the same code (or the debug run) is where such checks belong.
    """
    if torch.compiler.is_compiling():
        return False
    return (not x.is_cuda) or settings.current().debug


def plain_eager() -> bool:
    """True when nothing would observe a ``torch.library`` op: not tracing/compiling, no dispatch or torch-function
    mode. Then launchers may skip the op's dispatcher round trip and call its implementation directly (the round
    trip costs ~25 µs per decode step on a CPU host and ~1 ms of a chunk call's host time on an H100 host:
    docs/kernels.md, "Host overhead")."""
    return not (
        torch.compiler.is_compiling()
        or _get_current_dispatch_mode() is not None
        or torch.overrides._is_torch_function_mode_enabled()
    )
