"""Root-mean-square normalisations over the last dimension.

- :class:`SRMSNorm` — TransNormerLLM's "simple RMSNorm": ``x · rsqrt(mean(x²) + eps)``, **no weight**. The released
  TNL code uses ``eps = 1e-6``; the eps inside the square root is what keeps an all-zero row (a padded position, or
  the output of an empty state) finite: it maps to zeros instead of 0/0 = NaN.
- :class:`RMSNorm` — the weighted form used by LLaMA and by MiniMax-01's lightning layers (over all heads jointly).

Both compute the statistic in float32 whatever the input dtype (bf16 sums of squares lose about 3 digits over a
1024-wide row) and return the input dtype.
"""

import torch
from torch import nn


def _rms_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)


class SRMSNorm(nn.Module):
    """``y = x · rsqrt(mean(x²) + eps)`` over the last dimension; no learnable parameter.

    Args:
        dim: size of the normalised (last) dimension; kept for ``repr`` and shape checks.
        eps: added to the mean square (released TNL value: 1e-6).

    Shapes: ``x [..., dim]`` -> ``y [..., dim]`` in ``x.dtype``.
    """

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.dim = dim
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _rms_normalize(x, self.eps).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}"


class RMSNorm(nn.Module):
    """``y = weight ⊙ x · rsqrt(mean(x²) + eps)`` over the last dimension (LLaMA / MiniMax-01).

    Shapes: ``x [..., dim]`` -> ``y [..., dim]`` in ``x.dtype``; ``weight [dim]`` (initialised to ones).
    """

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.weight.float() * _rms_normalize(x, self.eps)).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}"
