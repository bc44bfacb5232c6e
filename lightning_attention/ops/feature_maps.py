"""Kernel feature maps φ for linear attention (normalised and hybrid attention), and a registry of them by name.

Linear attention replaces the softmax weight ``exp(q·k)`` with ``φ(q)·φ(k)``. The feature map decides two things:

- the feature dimension K' of the state ``S = Σ φ(k_s) v_sᵀ`` (``[K', V]``): K' = K for the element-wise maps,
  K' = ``feature_dim`` for :class:`LearnedFeatureMap`;
- whether the normalised form ``φ(q)ᵀ S / (φ(q)ᵀ z + eps)`` (:mod:`lightning_attention.ops.normalized`) is defined.
  It is only for maps with **positive** outputs: then every weight ``φ(q)·φ(k)`` is positive and the denominator is
  a positive sum. identity and silu produce negative features (the denominator can cross zero) and are refused.

=============  ===================================  ========  ==========================================
name           φ(x)                                 positive  note
=============  ===================================  ========  ==========================================
``identity``   x                                    no        plain linear attention
``elu+1``      elu(x) + 1                           yes       Katharopoulos et al. 2020; always > 0
``relu2``      relu(x)² + ε  (ε = 1e-6)             yes       ε keeps a row of all-negative x from giving 0
``silu``       x · sigmoid(x)                       no        the TNL / MiniMax choice (unnormalised)
``learned``    relu(x W)² + ε  (:class:`LearnedFeatureMap`)  yes  the seed's LightningFeatureMap
=============  ===================================  ========  ==========================================

Every map takes ``x [..., K]`` (any leading dims, any float dtype) and returns ``[..., K']`` in the dtype of x.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

RELU2_EPS = 1e-6


def identity(x: torch.Tensor) -> torch.Tensor:
    """φ(x) = x. ``[..., K] -> [..., K]``."""
    return x


def elu_plus_one(x: torch.Tensor) -> torch.Tensor:
    """φ(x) = elu(x) + 1 ∈ (0, ∞). ``[..., K] -> [..., K]``.

    Written as ``x + 1`` for x > 0 and ``exp(x)`` otherwise: ``elu(x) + 1 = (exp(x) - 1) + 1`` cancels to exactly 0
    in floating point for x below about -17 (float32), which would make the normaliser 0. ``exp`` of the clamped x:
    the branch not taken must stay finite, or its zero gradient times inf is NaN.
    """
    return torch.where(x > 0, x + 1.0, torch.exp(x.clamp_max(0.0)))


def relu_squared(x: torch.Tensor, eps: float = RELU2_EPS) -> torch.Tensor:
    """φ(x) = relu(x)² + eps ∈ [eps, ∞). ``[..., K] -> [..., K]``.

    The square sharpens the weights (closer to softmax than elu+1); ``eps`` keeps φ strictly positive so
    the normaliser of a query whose features are all clipped to zero is not 0.
    """
    return F.relu(x).square() + eps


def silu(x: torch.Tensor) -> torch.Tensor:
    """φ(x) = x · sigmoid(x) (TNL). Not positive: unnormalised use only. ``[..., K] -> [..., K]``."""
    return F.silu(x)


@dataclass(frozen=True)
class FeatureMap:
    """An element-wise feature map with a name and whether its outputs are strictly positive."""

    name: str
    fn: Callable[[torch.Tensor], torch.Tensor]
    positive: bool

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


FEATURE_MAPS: dict[str, FeatureMap] = {
    "identity": FeatureMap("identity", identity, positive=False),
    "elu+1": FeatureMap("elu+1", elu_plus_one, positive=True),
    "relu2": FeatureMap("relu2", relu_squared, positive=True),
    "silu": FeatureMap("silu", silu, positive=False),
}


class LearnedFeatureMap(nn.Module):
    """Learned feature map: φ(x) = relu(x W)² + eps, a projection K -> K' then relu².

    Args:
        head_dim: K, the input head dimension.
        feature_dim: K' (default K), the feature dimension (the state becomes ``[K', V]``).
        num_heads: if given, one projection per head (``W [H, K, K']``, inputs must be ``[..., H, K]``);
            if None, one projection shared by all heads (``W [K, K']``), as in the seed's single-head module.
        eps: added after the square so that φ > 0 everywhere (required by the normaliser).
        init_std: standard deviation of the initial W (the seed uses 0.1).

    Shapes: ``x [..., K]`` (or ``[..., H, K]`` with ``num_heads``) -> ``[..., K']`` (``[..., H, K']``), dtype of x.
    """

    positive = True

    def __init__(
        self,
        head_dim: int,
        feature_dim: int | None = None,
        *,
        num_heads: int | None = None,
        eps: float = RELU2_EPS,
        init_std: float = 0.1,
    ):
        super().__init__()
        if head_dim < 1 or (feature_dim is not None and feature_dim < 1):
            raise ValueError(f"head_dim and feature_dim must be >= 1, got {head_dim}, {feature_dim}")
        if num_heads is not None and num_heads < 1:
            raise ValueError(f"num_heads must be >= 1 or None, got {num_heads}")
        if not (eps > 0 and eps < float("inf")):
            raise ValueError(f"eps must be a finite float > 0 (φ must be strictly positive), got {eps}")
        self.head_dim = head_dim
        self.feature_dim = feature_dim or head_dim
        self.num_heads = num_heads
        self.eps = float(eps)
        self.init_std = float(init_std)
        shape = (head_dim, self.feature_dim) if num_heads is None else (num_heads, head_dim, self.feature_dim)
        self.weight = nn.Parameter(torch.empty(shape))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight, std=self.init_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.head_dim:
            raise ValueError(f"LearnedFeatureMap expects [..., {self.head_dim}] inputs, got {tuple(x.shape)}")
        w = self.weight.to(x.dtype)  # matmul in the activation dtype (bf16 under mixed precision)
        if self.num_heads is None:
            projected = x @ w
        else:
            if x.ndim < 2 or x.shape[-2] != self.num_heads:
                raise ValueError(
                    f"LearnedFeatureMap expects [..., {self.num_heads}, {self.head_dim}], got {tuple(x.shape)}"
                )
            projected = torch.einsum("...hk,hkf->...hf", x, w)
        return F.relu(projected).square() + self.eps

    def extra_repr(self) -> str:
        heads = "shared" if self.num_heads is None else f"num_heads={self.num_heads}"
        return f"head_dim={self.head_dim}, feature_dim={self.feature_dim}, {heads}, eps={self.eps}"


FeatureMapLike = str | FeatureMap | nn.Module | Callable[[torch.Tensor], torch.Tensor]


def get_feature_map(feature_map: FeatureMapLike) -> Callable[[torch.Tensor], torch.Tensor]:
    """Resolves a name of :data:`FEATURE_MAPS` to its map; a FeatureMap, module or callable is returned as is."""
    if isinstance(feature_map, str):
        try:
            return FEATURE_MAPS[feature_map]
        except KeyError:
            raise ValueError(
                f"feature_map must be one of {sorted(FEATURE_MAPS)} or a module/callable, got {feature_map!r}"
            ) from None
    if not callable(feature_map):
        raise TypeError(
            f"feature_map must be a name, a FeatureMap, an nn.Module or a callable, got {type(feature_map).__name__}"
        )
    return feature_map


def is_positive(feature_map: FeatureMapLike) -> bool:
    """Whether the map's outputs are strictly positive (declared by a ``positive`` attribute, False if absent).

    A custom callable can opt in by being wrapped: ``FeatureMap("mine", fn, positive=True)``.
    """
    return bool(getattr(get_feature_map(feature_map), "positive", False))


def require_positive(feature_map: FeatureMapLike) -> Callable[[torch.Tensor], torch.Tensor]:
    """Resolves ``feature_map`` and raises ValueError unless it is positive (normalisation needs it)."""
    fn = get_feature_map(feature_map)
    if not getattr(fn, "positive", False):
        name = getattr(fn, "name", type(fn).__name__)
        raise ValueError(
            f"normalised linear attention needs a feature map with positive outputs "
            f"(elu+1, relu2, LearnedFeatureMap, or FeatureMap(..., positive=True)); got {name!r}, whose features can "
            f"be negative, so φ(q)ᵀz can be zero or negative. Use lightning_attn(φ(q), φ(k), v) for the "
            f"unnormalised form."
        )
    return fn
