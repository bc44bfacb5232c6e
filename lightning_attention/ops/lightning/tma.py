"""Triton's allocator for the global scratch of in-kernel tensor descriptors.

With tensor descriptors (Hopper's tensor memory accelerator: when a walk uses them is decided by
:func:`lightning_attention.ops.lightning.plan.tma_ready`) the walk makes one descriptor per tensor in the kernel;
descriptors made in a kernel live in Triton's global scratch (128 bytes per descriptor and program), which Triton asks
of the allocator set with ``triton.set_allocator``. :func:`ensure_allocator` sets one on PyTorch's caching allocator
where none is set.
"""

import torch
import triton


def _torch_scratch(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    """Triton's global scratch from PyTorch's caching allocator (its blocks are 512-byte aligned)."""
    del alignment, stream  # the caching allocator aligns to 512 bytes and allocates on the current stream
    return torch.empty(size, dtype=torch.int8, device="cuda")


def ensure_allocator() -> None:
    """Sets Triton's allocator to :func:`_torch_scratch` unless one is set (a per-context setting: checked before the
    launches of every program that uses descriptors, so a new thread gets one too). A user's allocator is left in
    place."""
    from triton.runtime import _allocation  # private: the only way to read the current allocator

    current = getattr(_allocation, "_allocator", None)
    if current is None or isinstance(current.get(), _allocation.NullAllocator):
        triton.set_allocator(_torch_scratch)
