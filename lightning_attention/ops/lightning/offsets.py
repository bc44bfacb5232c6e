"""Which offsets of packed sequences a call computes with, and small host tables moved to the device without a sync.

The rule (docs/design.md, "Input checks"): when a call gives ``cu_seqlens_cpu``, both backends compute with its
offsets (checked on the host on every call) and the device ``cu_seqlens`` is only compared with it (on CPU tensors
always, on CUDA tensors in debug mode); without it they compute with ``cu_seqlens``, whose values are checked where
value checks run and which the kernels clamp to the tensors' bounds otherwise.

On CUDA the host offsets reach the kernels as a device copy made once per distinct offsets and kept
(:func:`device_offsets`): from pinned memory with a non-blocking copy, so no call waits for the GPU.
"""

import functools

import torch


def upload(data: tuple, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``data`` as a ``dtype`` tensor on ``device``; to a GPU through pinned memory, non-blocking (no host sync: a
    pageable copy would wait for the stream)."""
    table = torch.tensor(data, dtype=dtype)
    if device.type != "cuda":
        return table.to(device)
    return table.pin_memory().to(device, non_blocking=True)


@functools.lru_cache(maxsize=512)
def device_offsets(offsets: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """``[N + 1]`` int64 offsets on ``device``, made once per (offsets, device) and kept (read-only)."""
    return upload(offsets, torch.int64, device)


def offsets_for(cu_seqlens: torch.Tensor | None, cu_seqlens_cpu: torch.Tensor | None, device: torch.device):
    """The offsets a computation on ``device`` reads (module docstring): ``cu_seqlens_cpu``'s when given (itself on
    the CPU, its kept device copy on a GPU), else ``cu_seqlens``; None without packed sequences."""
    if cu_seqlens_cpu is None:
        return cu_seqlens
    if device.type == "cpu":
        return cu_seqlens_cpu
    if torch.compiler.is_compiling():  # a traced copy: reading the values on the host would break the graph
        return cu_seqlens_cpu.to(device)
    return device_offsets(tuple(cu_seqlens_cpu.tolist()), device)
