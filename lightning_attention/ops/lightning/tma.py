"""When the chunk walk moves its tiles with tensor descriptors (Hopper's tensor memory accelerator, TMA).

With ``USE_TMA`` the walk (``kernels/walk.py``) makes one descriptor per tensor in the kernel
(``tl.make_tensor_descriptor``) and loads and stores whole [BT, BK] / [BT, BV] tiles through it: the copy engine
computes the addresses and fills rows past the segment's end and columns past the head dim with zeros, which takes
the per-element address arithmetic, masks and the spilled registers out of the walk's chunk loop (sm_90 SASS: 1,022
→ 789 instructions per chunk at K = V = 128, 255 registers with a 16-byte stack → 248 and none;
``benchmarks/NOTES-kernels.md``, session 7).

The hardware's rules decide where it applies: a [B, T, H, D] tensor needs a 16-byte aligned start and its batch,
token and head strides in multiples of 16 bytes (with a contiguous last dim, which the op guarantees); otherwise the
walk keeps its pointer loads. Descriptors made in a kernel live in Triton's global scratch (128 bytes per descriptor
and program), which Triton asks of the allocator set with ``triton.set_allocator``: :func:`ensure_allocator` sets
one on PyTorch's caching allocator where none is set.

``LIGHTNING_ATTENTION_TMA=0`` turns descriptors off (the pointer path everywhere: comparisons, older Triton).
Under ``TRITON_INTERPRET=1`` (CPU tensors) the same rules apply as on an sm_90 GPU, so the CPU tests run the path
the H100 runs.
"""

import functools
import os

import torch
import triton
import triton.language as tl

ENV_TMA = "LIGHTNING_ATTENTION_TMA"
TMA_MIN_CAPABILITY = 9  # Hopper: the tensor memory accelerator
TMA_ALIGN = 16  # bytes: start address and every stride but the last


@functools.lru_cache(maxsize=None)
def _capability_major(index: int) -> int:
    return torch.cuda.get_device_capability(index)[0]


_HAS_DESCRIPTORS = hasattr(tl, "make_tensor_descriptor")


def tma_enabled(device: torch.device) -> bool:
    """An sm_90+ GPU, or the CPU (the interpreter), with a Triton that has in-kernel descriptors, unless turned off."""
    if not _HAS_DESCRIPTORS or os.environ.get(ENV_TMA, "1") == "0":
        return False
    if device.type != "cuda":
        return True
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _capability_major(index) >= TMA_MIN_CAPABILITY


def tma_ready(*tensors: torch.Tensor) -> bool:
    """Whether the walk may load and store ``tensors`` (each [B, T, H, D], contiguous last dim) through tensor
    descriptors: start and batch / token / head strides on 16-byte multiples. Called on every walk launch, so kept to
    a few integer operations per tensor (the element size is a power of two: the OR of the strides times it is a
    multiple of 16 exactly when each stride times it is)."""
    if not tma_enabled(tensors[0].device):
        return False
    for x in tensors:
        s = x.stride()
        if s[-1] != 1 or (x.data_ptr() | (s[0] | s[1] | s[2]) * x.element_size()) % TMA_ALIGN:
            return False
    return True


def _torch_scratch(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    """Triton's global scratch from PyTorch's caching allocator (its blocks are 512-byte aligned)."""
    del alignment, stream  # the caching allocator aligns to 512 bytes and allocates on the current stream
    return torch.empty(size, dtype=torch.int8, device="cuda")


def ensure_allocator() -> None:
    """Sets Triton's allocator to :func:`_torch_scratch` unless one is set (a per-context setting: checked on every
    launch, so a new thread gets one too). A user's allocator is left in place."""
    from triton.runtime import _allocation  # private: the only way to read the current allocator

    current = getattr(_allocation, "_allocator", None)
    if current is None or isinstance(current.get(), _allocation.NullAllocator):
        triton.set_allocator(_torch_scratch)
