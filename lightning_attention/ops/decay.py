"""Per-head decay recipes (slopes). λ_h = exp(-slope_h); slope 0 means no decay.

Two recipes exist in the literature and they are **not** the same:

``tnl_slopes`` (what the released TransNormerLLM-385M/1B/7B and MiniMax-Text-01 / MiniMax-VL-01 checkpoints use):
    slope[h] = 2^(-8(h+1)/H) · (1 - l/(L-1) + 1e-5),   h = 0..H-1, l = 0..L-1
    The per-head base is the ALiBi slope sequence (with ALiBi's interleave for H not a power of two).
    The first layer decays the most and the last layer almost not at all (factor 1e-5). L = 1 uses factor 1.

``paper_slopes`` (TransNormerLLM paper eq. 10, as flash-linear-attention's ``chunk_lightning_attn`` reads it):
    slope[h] = 8h/H · (1 - l/L),   h = 0..H-1, l = 0..L-1
    Head 0 has no decay in every layer.

Example (H = 8, layer 0 of 2): tnl_slopes → [0.5, 0.25, ..., 0.0039] ; paper_slopes → [0, 1, 2, ..., 7].
"""

import math

import torch

from lightning_attention.ops.lightning.validation import require_int


def _alibi_power_of_2(n: int) -> list[float]:
    start = 2.0 ** (-8.0 / n)
    return [start ** (i + 1) for i in range(n)]


def alibi_slopes(num_heads: int) -> list[float]:
    """ALiBi head slopes 2^(-8(h+1)/H); for H not a power of two, the ALiBi interleave (Press et al. 2022)."""
    num_heads = require_int("num_heads", num_heads, minimum=1)
    if math.log2(num_heads).is_integer():
        return _alibi_power_of_2(num_heads)
    closest = 2 ** math.floor(math.log2(num_heads))
    return _alibi_power_of_2(closest) + alibi_slopes(2 * closest)[0::2][: num_heads - closest]


def _check_recipe_args(num_heads, layer_idx, num_layers) -> tuple[int, int, int]:
    """The three arguments of a recipe as ints (an int or anything with ``__index__``, never a bool or a float):
    ``num_heads >= 1``, ``num_layers >= 1``, ``0 <= layer_idx < num_layers``. TypeError / ValueError naming the
    argument otherwise."""
    num_heads = require_int("num_heads", num_heads, minimum=1)
    layer_idx = require_int("layer_idx", layer_idx)
    num_layers = require_int("num_layers", num_layers, minimum=1)
    if not 0 <= layer_idx < num_layers:
        raise ValueError(f"layer_idx must be in [0, num_layers) = [0, {num_layers}), got {layer_idx}")
    return num_heads, layer_idx, num_layers


def tnl_slopes(num_heads: int, layer_idx: int, num_layers: int) -> torch.Tensor:
    """Slopes of the released TNL / MiniMax checkpoints: ``2^(-8(h+1)/H) · (1 - l/(L-1) + 1e-5)``.

    Returns a float32 tensor of shape [H] (CPU). L = 1 uses the factor 1. The arguments are ints (TypeError for a
    float, a bool or a string; ValueError naming the argument out of range).
    """
    num_heads, layer_idx, num_layers = _check_recipe_args(num_heads, layer_idx, num_layers)
    factor = 1.0 if num_layers == 1 else 1.0 - layer_idx / (num_layers - 1) + 1e-5
    return torch.tensor([s * factor for s in alibi_slopes(num_heads)], dtype=torch.float32)


def paper_slopes(num_heads: int, layer_idx: int, num_layers: int) -> torch.Tensor:
    """Slopes of the TNL paper, eq. (10): ``8h/H · (1 - l/L)``; head 0 has no decay.

    Returns a float32 tensor of shape [H] (CPU). The arguments are checked as in :func:`tnl_slopes`.
    """
    num_heads, layer_idx, num_layers = _check_recipe_args(num_heads, layer_idx, num_layers)
    factor = 1.0 - layer_idx / num_layers
    return torch.tensor([8.0 * h / num_heads * factor for h in range(num_heads)], dtype=torch.float32)
