"""Backend selection and debug switches, read from the environment at call time.

``LIGHTNING_ATTENTION_BACKEND``
    ``auto`` (default): Triton kernels on CUDA tensors, the PyTorch chunked path on CPU tensors.
    ``triton``: always the Triton kernels; on CPU tensors they run under Triton's interpreter, which needs
    ``TRITON_INTERPRET=1`` set before ``lightning_attention`` is imported (this is how CI tests the kernels).
    ``torch``: always the PyTorch path (reference speed, any device).
``LIGHTNING_ATTENTION_DEBUG=1``
    Run the value checks that need a device->host copy (slope sign/finiteness, cu_seqlens monotonicity,
    state_indices range/duplicates) on CUDA tensors too. They always run on CPU tensors.
"""

import os

import torch

BACKENDS = ("auto", "triton", "torch")


def backend_name() -> str:
    """The requested backend, validated: one of :data:`BACKENDS`."""
    name = os.environ.get("LIGHTNING_ATTENTION_BACKEND", "auto").strip().lower() or "auto"
    if name not in BACKENDS:
        raise ValueError(f"LIGHTNING_ATTENTION_BACKEND must be one of {BACKENDS}, got {name!r}")
    return name


def use_triton(x: torch.Tensor) -> bool:
    """Whether a call on tensors living where ``x`` lives runs the Triton kernels."""
    name = backend_name()
    if name == "torch":
        return False
    if name == "triton":
        return True
    return x.is_cuda


def debug_checks_enabled() -> bool:
    return os.environ.get("LIGHTNING_ATTENTION_DEBUG", "0") not in ("", "0", "false", "False")


def value_checks_enabled(x: torch.Tensor) -> bool:
    """Value checks that would sync a device run always on CPU tensors, on CUDA only in debug mode.

    Never while torch.compile traces: reading tensor values on the host would break the graph, and the eager
    call of the same code (or the debug run) is where such checks belong.
    """
    if torch.compiler.is_compiling():
        return False
    return (not x.is_cuda) or debug_checks_enabled()


def interpreter_active() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def plain_eager() -> bool:
    """True when nothing would observe a ``torch.library`` op: not tracing/compiling, no dispatch or torch-function
    mode. Then launchers may skip the op's dispatcher round trip and call its implementation directly.

    The round trip is not free: ~25 µs per decode step (torch 2.13, CPU), and for ``chunk_fwd``/``chunk_bwd`` on
    an H100 host (torch 2.11) ~1 ms per call of own time in ``custom_ops.backend_impl`` under cProfile
    (benchmarks/results/h100-2026-11-22e/host_profile.txt) — more than the GPU time of small calls.
    """
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    return not (
        torch.compiler.is_compiling()
        or _get_current_dispatch_mode() is not None
        or torch.overrides._is_torch_function_mode_enabled()
    )
