"""Root-mean-square normalisations over the last dimension, on ``torch.nn.RMSNorm``.

- :class:`SRMSNorm` — TransNormerLLM's "simple RMSNorm": ``x · rsqrt(mean(x²) + eps)``, **no weight**. The released
  TNL code uses ``eps = 1e-6`` inside the square root (so does ``torch.nn.functional.rms_norm``); it is what keeps an
  all-zero row (a padded position, or the output of an empty state) finite: it maps to zeros instead of 0/0 = NaN.
- :class:`RMSNorm` — the weighted form used by MiniMax-01's lightning layers (over all heads jointly).

PyTorch's kernel computes the statistic in float32 for bf16/fp16 inputs and returns the input dtype, as the released
code does by hand (bf16 sums of squares lose about 3 digits over a 1024-wide row).
"""

import torch
from torch import nn


class SRMSNorm(nn.RMSNorm):
    """``y = x · rsqrt(mean(x²) + eps)`` over the last dimension; no learnable parameter.

    Args:
        dim: size of the normalised (last) dimension.
        eps: added to the mean square (released TNL value: 1e-6).

    Shapes: ``x [..., dim]`` -> ``y [..., dim]`` in ``x.dtype``.
    """

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__(dim, eps=eps, elementwise_affine=False)


class RMSNorm(nn.RMSNorm):
    """``y = weight ⊙ x · rsqrt(mean(x²) + eps)`` over the last dimension (MiniMax-01).

    Shapes: ``x [..., dim]`` -> ``y [..., dim]`` in ``x.dtype``; ``weight [dim]`` (initialised to ones).

    Kept apart from ``nn.RMSNorm`` for one reason: under autocast the weight stays float32 while ``x`` is bf16, a
    mix ``nn.RMSNorm`` runs unfused with a warning; here both go through the fused kernel in float32.
    """

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__(dim, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = torch.promote_types(x.dtype, torch.float32)  # float32, or float64 for float64 inputs
        y = nn.functional.rms_norm(x.to(dtype), self.normalized_shape, self.weight.to(dtype), self.eps)
        return y.to(x.dtype)
