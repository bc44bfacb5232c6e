"""Gated linear units used as channel mixers.

- :class:`SGLU` — TransNormerLLM's "simple GLU": ``W_o[(X W_v) ⊙ (X W_u)]`` with **no activation** (paper §3.3).
  Module names follow the released checkpoints: ``l1`` (W_v), ``l2`` (W_u), ``l3`` (W_o).
- :class:`SwiGLU` — LLaMA's ``W_down[SiLU(X W_gate) ⊙ (X W_up)]``, for the softmax baseline.
"""

import torch
import torch.nn.functional as F
from torch import nn


class SGLU(nn.Module):
    """``l3(l1(x) ⊙ l2(x))``; shapes ``x [..., dim]`` -> ``[..., dim]`` through a ``[..., hidden]`` product."""

    def __init__(self, dim: int, hidden: int, bias: bool = False):
        super().__init__()
        self.l1 = nn.Linear(dim, hidden, bias=bias)
        self.l2 = nn.Linear(dim, hidden, bias=bias)
        self.l3 = nn.Linear(hidden, dim, bias=bias)
        self.l3._is_residual_projection = True  # scaled init, see models/transnormer/model.py::_init_weights

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l3(self.l1(x) * self.l2(x))


class SwiGLU(nn.Module):
    """``down(SiLU(gate(x)) ⊙ up(x))``; shapes ``x [..., dim]`` -> ``[..., dim]`` (LLaMA names)."""

    def __init__(self, dim: int, hidden: int, bias: bool = False):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=bias)
        self.up_proj = nn.Linear(dim, hidden, bias=bias)
        self.down_proj = nn.Linear(hidden, dim, bias=bias)
        self.down_proj._is_residual_projection = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
