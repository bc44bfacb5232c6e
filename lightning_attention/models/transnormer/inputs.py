"""Input checks of the TransNormer model's forward: a malformed argument is a ValueError / TypeError naming it, raised
before any layer runs.

Structure (types, ranks, shapes, dtypes, devices) always; values (token ids inside the vocabulary, a 0/1 attention
mask) where value checks run: on CPU tensors always, on CUDA tensors in debug mode (``LIGHTNING_ATTENTION_DEBUG=1``:
reading them on the host syncs). The packed offsets ``cu_seqlens`` are checked like the op's
(:func:`~lightning_attention.ops.lightning.validation.check_cu_seqlens`).
"""

import torch

from lightning_attention.backend import value_checks_enabled
from lightning_attention.ops.lightning.validation import check_cu_seqlens, require_device, require_ndim, require_tensor


def _require_integer(name: str, x: torch.Tensor) -> None:
    if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor, got {x.dtype}")


def check_model_inputs(config, input_ids, inputs_embeds, attention_mask, position_ids, cu_seqlens) -> None:
    """The arguments of ``TransNormerModel.forward`` (its docstring gives the shapes)."""
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError("pass exactly one of input_ids and inputs_embeds")
    if input_ids is not None:
        require_tensor("input_ids", input_ids)
        require_ndim("input_ids", input_ids, 2, "[B, T]")
        _require_integer("input_ids", input_ids)
        x = input_ids
        if input_ids.numel() and value_checks_enabled(input_ids):
            low, high = (int(t) for t in torch.aminmax(input_ids))
            if low < 0 or high >= config.vocab_size:
                raise ValueError(
                    f"input_ids must be in [0, vocab_size) = [0, {config.vocab_size}), got values in [{low}, {high}]"
                )
    else:
        require_tensor("inputs_embeds", inputs_embeds)
        require_ndim("inputs_embeds", inputs_embeds, 3, "[B, T, d_model]")
        if not inputs_embeds.is_floating_point():
            raise TypeError(f"inputs_embeds must be a floating-point tensor, got {inputs_embeds.dtype}")
        if inputs_embeds.shape[-1] != config.decoder_embed_dim:
            raise ValueError(
                f"inputs_embeds must have d_model = {config.decoder_embed_dim} features, got {inputs_embeds.shape[-1]}"
            )
        x = inputs_embeds
    B, T = x.shape[:2]
    if attention_mask is not None:
        require_tensor("attention_mask", attention_mask)
        if attention_mask.ndim != 2 or attention_mask.shape[0] != B or attention_mask.shape[1] < T:
            raise ValueError(
                f"attention_mask must have shape [B, T] or [B, past + T] with B = {B}, T = {T}, "
                f"got {tuple(attention_mask.shape)}"
            )
        require_device("attention_mask", attention_mask, x.device)
        if attention_mask.numel() and value_checks_enabled(attention_mask):
            if not bool(((attention_mask == 0) | (attention_mask == 1)).all()):
                raise ValueError("attention_mask must hold 0 (padding) and 1 (token) only")
    if position_ids is not None:
        require_tensor("position_ids", position_ids)
        _require_integer("position_ids", position_ids)
        if position_ids.ndim not in (1, 2) or position_ids.shape[-1] != T or position_ids.ndim == 2 and (
            position_ids.shape[0] not in (1, B)
        ):
            raise ValueError(f"position_ids must have shape [B, T] = {(B, T)} (or [1, T]), got "
                             f"{tuple(position_ids.shape)}")  # fmt: skip
    if cu_seqlens is not None:
        if B != 1 or attention_mask is not None:
            raise ValueError("cu_seqlens packs sequences into one row: B must be 1 and attention_mask None")
        check_cu_seqlens(cu_seqlens, None, x)  # x [1, T, ...] stands for q: offsets from 0 to T


def check_labels(labels, inputs) -> None:
    """``labels [B, T]``: integer targets aligned with ``inputs`` (input_ids ``[B, T]`` or inputs_embeds
    ``[B, T, d]``; when they are malformed, the model's own check names them)."""
    require_tensor("labels", labels)
    _require_integer("labels", labels)
    if isinstance(inputs, torch.Tensor) and inputs.ndim >= 2 and tuple(labels.shape) != tuple(inputs.shape[:2]):
        raise ValueError(f"labels must have the shape of the inputs [B, T] = {tuple(inputs.shape[:2])}, got "
                         f"{tuple(labels.shape)}")  # fmt: skip
