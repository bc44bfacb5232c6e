"""Rotary position embedding (RoPE, Su et al. 2021) for the softmax-attention layers.

Rotate-half convention (as LLaMA in transformers): the first ``rotary_dim`` channels of a head are split into two
halves (x1, x2) and rotated by angle ``p · base^(-2i/rotary_dim)``; the remaining channels pass through (MiniMax-01
rotates half of each head, LLaMA all of it). Angles are computed from the positions on the fly, in float32, so there
is no buffer to keep in sync with a checkpoint or a device (float32, or float64 for float64 inputs).
"""

import torch


def apply_rotary(x: torch.Tensor, positions: torch.Tensor, rotary_dim: int, base: float) -> torch.Tensor:
    """Rotates ``x [B, T, H, D]`` at ``positions [B, T]``; returns ``[B, T, H, D]`` in ``x.dtype``.

    ``rotary_dim`` (even, <= D) channels are rotated, the rest are unchanged.
    """
    if rotary_dim == 0:
        return x
    half = rotary_dim // 2
    ct = torch.float64 if x.dtype == torch.float64 else torch.float32
    inv_freq = base ** (-torch.arange(half, device=x.device, dtype=ct) * 2.0 / rotary_dim)  # [half]
    angle = positions.to(ct)[:, :, None, None] * inv_freq  # [B, T, 1, half]
    cos, sin = torch.cos(angle), torch.sin(angle)
    xf = x[..., :rotary_dim].to(ct)
    x1, x2 = xf[..., :half], xf[..., half:]
    rotated = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
    if rotary_dim == x.shape[-1]:
        return rotated
    return torch.cat([rotated, x[..., rotary_dim:]], dim=-1)
