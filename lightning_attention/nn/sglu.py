"""Gated linear units used as channel mixers.

- :class:`SGLU` — TransNormerLLM's "simple GLU": ``W_o[(X W_v) ⊙ (X W_u)]`` with **no activation** (paper §3.3).
  Module names follow the released checkpoints: ``l1`` (W_v), ``l2`` (W_u), ``l3`` (W_o).
- :class:`SwiGLU` — LLaMA's ``W_down[SiLU(X W_gate) ⊙ (X W_up)]``, for the softmax baseline.
"""

import torch
import torch.nn.functional as F
from torch import nn


def gated_unit_projections(dim: int, hidden: int, bias: bool) -> tuple[nn.Linear, nn.Linear, nn.Linear]:
    """The three projections of a gated unit, in creation order: two ``dim -> hidden`` inputs and the
    ``hidden -> dim`` output, marked for the scaled residual init (models/transnormer/model.py::_init_weights)."""
    first, second = nn.Linear(dim, hidden, bias=bias), nn.Linear(dim, hidden, bias=bias)
    out = nn.Linear(hidden, dim, bias=bias)
    out._is_residual_projection = True
    return first, second, out


class SGLU(nn.Module):
    """``l3(l1(x) ⊙ l2(x))``; shapes ``x [..., dim]`` -> ``[..., dim]`` through a ``[..., hidden]`` product."""

    def __init__(self, dim: int, hidden: int, bias: bool = False):
        super().__init__()
        self.l1, self.l2, self.l3 = gated_unit_projections(dim, hidden, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l3(self.l1(x) * self.l2(x))


class SwiGLU(nn.Module):
    """``down(SiLU(gate(x)) ⊙ up(x))``; shapes ``x [..., dim]`` -> ``[..., dim]`` (LLaMA names)."""

    def __init__(self, dim: int, hidden: int, bias: bool = False):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = gated_unit_projections(dim, hidden, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
