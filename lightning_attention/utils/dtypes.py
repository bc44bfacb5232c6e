"""The short name of a torch dtype, as tuned-table keys, messages and benchmark records spell it."""

import torch


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"`` (torch has no public attribute for it)."""
    return str(dtype).removeprefix("torch.")
