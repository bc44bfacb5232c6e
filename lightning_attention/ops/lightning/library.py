"""Registering a Triton launcher as a ``torch.library`` operator, with its fake and a shortcut for plain eager calls;
and the input preparation every Triton entry point shares.

Each Triton entry point of the library (chunk forward and backward, recompute backward, decode step) is a
``torch.library.custom_op`` with a ``register_fake`` shape function, so ``torch.compile(fullgraph=True)`` traces
through it and ``torch.library.opcheck`` passes (``triton_op`` is not used: its fake path runs the kernel, which the
CPU interpreter cannot do on fake tensors). In plain eager mode the dispatcher's round trip is skipped and the
implementation is called directly: it costs ~25 µs per call on a CPU host and more of a chunk call's host time than
its GPU time on an H100 host (docs/kernels.md, "Host overhead").
"""

import contextlib
import functools
from collections.abc import Callable

import torch

from lightning_attention.backend import plain_eager


def pointers(dummy: torch.Tensor, *tensors):
    """Kernel pointer arguments in order, each absent one (None) replaced by ``dummy``: a real tensor the kernel never
    reads (a flag tells it the tensor is absent), so every launch passes tensors in the same places."""
    return tuple(dummy if t is None else t for t in tensors)


def token_strides(*xs) -> tuple:
    """Each ``[B, T, H, D]`` tensor's strides (batch, token, head) as one kernel argument (a stride group) each; the
    last dim is contiguous (:func:`last_dim_contiguous`), so its stride is not passed."""
    return tuple(x.stride()[:3] for x in xs)


def last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    """Strided views are taken as they are (the kernels take strides); only a non-unit last stride is copied."""
    return x if x.stride(-1) == 1 else x.contiguous()


_SAME_DEVICE = contextlib.nullcontext()


def on_device_of(x: torch.Tensor):
    """Triton launches on the current CUDA device: a context that makes it ``x``'s (nothing to do, and no host time
    spent, when it already is)."""
    index = x.get_device()  # -1 for a CPU tensor
    if index < 0 or index == torch.cuda.current_device():
        return _SAME_DEVICE
    return torch.cuda.device(index)


class TritonOp:
    """``lightning_attention::name``: ``impl`` registered with its ``fake`` and ``schema``, the ``torch.library``
    schema text of its arguments and results (``"(Tensor q, float scale) -> Tensor"``; operators that share
    arguments build it from shared pieces, as ops.py does), or None to infer it from ``impl``'s annotations.
    Calling the object runs ``impl`` on the first tensor's device, directly in plain eager mode and through the
    registered operator otherwise (compiling, tracing, dispatch modes); :attr:`op` is the operator."""

    def __init__(
        self, name: str, impl: Callable, fake: Callable, mutates_args: tuple[str, ...] = (), schema: str | None = None
    ):
        @functools.wraps(impl)
        def on_device(*args, **kwargs):
            with on_device_of(args[0]):
                return impl(*args, **kwargs)

        self.direct = on_device
        self.op = torch.library.custom_op(
            f"lightning_attention::{name}", on_device, mutates_args=mutates_args, schema=schema
        )
        self.op.register_fake(fake)

    def __call__(self, *args):
        return self.direct(*args) if plain_eager() else self.op(*args)


def triton_op(
    name: str, fake: Callable, mutates_args: tuple[str, ...] = (), schema: str | None = None
) -> Callable[[Callable], TritonOp]:
    """Decorator form of :class:`TritonOp`: ``@triton_op("chunk_fwd", fake=..., schema=...)`` over the
    implementation."""

    def register(impl: Callable) -> TritonOp:
        return TritonOp(name, impl, fake, mutates_args, schema)

    return register
