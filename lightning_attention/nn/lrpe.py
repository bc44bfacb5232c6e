"""LRPE-d: linearised relative positional encoding with learnable angles (TransNormerLLM paper §3.1).

Each head dimension d gets a learnable angle θ_d; a token at position t is mapped to ``[x cos(θ t), x sin(θ t)]``,
which **doubles** the head dimension. For a query at t and a key at s the product only depends on t - s::

    [q cos θt, q sin θt] · [k cos θs, k sin θs] = Σ_d q_d k_d cos(θ_d (t - s))

so the encoding is relative and commutes with the linear-attention state (it is applied to q and k before the op).
Because only t - s matters, every sequence of a batch may use its own position origin (left padding, packed
sequences, a decode step continuing from a cached offset) as long as queries and keys of one sequence share it.

The parameter name and shape follow the released TNL checkpoints: ``theta [H, 1, D]``, initialised to
``10000^(-2 i / (H·D))`` for i = 0..H·D-1 (one frequency ladder across all heads).
"""

import torch
from torch import nn


def lrpe_theta_init(num_heads: int, head_dim: int) -> torch.Tensor:
    """The released TNL initial angles: ``[H, 1, D]`` float32, ``10000^(-2 i / (H·D))``."""
    d = num_heads * head_dim
    return (10000.0 ** (-2.0 / d * torch.arange(d, dtype=torch.float64))).reshape(num_heads, 1, head_dim).float()


class LRPE(nn.Module):
    """``x [B, T, H, D]``, ``positions [B, T]`` (int) -> ``[B, T, H, 2D]`` in ``x.dtype``.

    The angles ``θ t`` are computed in float32 for every low-precision input (a bf16 angle at t = 1000 is off by
    ~4 rad), in float64 for float64 inputs (references).
    """

    def __init__(self, num_heads: int, head_dim: int):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.theta = nn.Parameter(lrpe_theta_init(num_heads, head_dim))

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.theta.copy_(lrpe_theta_init(self.num_heads, self.head_dim))

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        ct = torch.float64 if x.dtype == torch.float64 else torch.float32
        angle = positions.to(ct)[:, :, None, None] * self.theta.to(ct).view(self.num_heads, self.head_dim)
        xf = x.to(ct)
        return torch.cat([xf * torch.cos(angle), xf * torch.sin(angle)], dim=-1).to(x.dtype)
