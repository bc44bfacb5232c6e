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

import os

import torch
import triton
import triton.language as tl

ENV_TMA = "LIGHTNING_ATTENTION_TMA"
TMA_MIN_CAPABILITY = 9  # Hopper: the tensor memory accelerator
TMA_ALIGN = 16  # bytes: start address and every stride but the last


def tma_enabled(device: torch.device) -> bool:
    """An sm_90+ GPU, or the CPU (the interpreter), with a Triton that has in-kernel descriptors, unless turned off."""
    if not hasattr(tl, "make_tensor_descriptor") or os.environ.get(ENV_TMA, "1") == "0":
        return False
    return device.type != "cuda" or torch.cuda.get_device_capability(device)[0] >= TMA_MIN_CAPABILITY


def _aligned(x: torch.Tensor) -> bool:
    """``x`` [B, T, H, D] with a contiguous last dim: start and batch / token / head strides on 16-byte multiples."""
    elem = x.element_size()
    return (
        x.stride(-1) == 1
        and x.data_ptr() % TMA_ALIGN == 0
        and all(s * elem % TMA_ALIGN == 0 for s in x.stride()[:3])
    )


def tma_ready(*tensors: torch.Tensor) -> bool:
    """Whether the walk may load and store ``tensors`` (each [B, T, H, D]) through tensor descriptors."""
    return tma_enabled(tensors[0].device) and all(_aligned(x) for x in tensors)


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
