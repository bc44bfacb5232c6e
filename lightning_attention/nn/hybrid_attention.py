"""HybridChunkAttention: hybrid chunk attention (ChunkedLightningAttention) as a layer over projected q, k, v.

Causal softmax attention inside chunks of ``chunk_size`` tokens plus normalised linear attention over all previous
chunks, added (see :mod:`lightning_attention.ops.hybrid` for the equations). Like the seed's module it takes
already-projected heads and owns only the feature map (learned by default: relu(x W)² + eps); the projections,
norms and gates belong to the block that uses it.
"""

import torch
from torch import nn

from lightning_attention.ops.feature_maps import LearnedFeatureMap, get_feature_map, require_positive
from lightning_attention.ops.hybrid import HybridDecodeState, hybrid_chunk_attn, hybrid_chunk_attn_decode
from lightning_attention.ops.lightning.validation import check_slope
from lightning_attention.ops.normalized import check_eps


class HybridChunkAttention(nn.Module):
    """Softmax inside chunks + normalised linear attention across chunks.

    Args:
        head_dim: K, the q/k head dimension.
        num_heads: H.
        chunk_size: C, tokens per softmax chunk (the seed uses 256).
        feature_map: ``"learned"`` (a :class:`LearnedFeatureMap`), or a positive map name
            (``"elu+1"``, ``"relu2"``), or a positive module/FeatureMap. ``"identity"``/``"silu"`` raise ValueError.
        feature_dim: K' of the learned map (default K).
        per_head_feature_map: one learned projection per head (``[H, K, K']``) instead of one shared ``[K, K']``.
        slope: ``[H]`` decay of the linear state (λ = exp(-slope)), validated once here; None = no decay (the seed).
        eps: finite float > 0 added to the linear denominator.
        softmax_scale: softmax logit scale, default ``K ** -0.5``.

    Shapes: ``forward(q [B, T, H, K], k [B, T, H, K], v [B, T, H, V]) -> [B, T, H, V]`` in q.dtype.
    """

    def __init__(
        self,
        head_dim: int,
        num_heads: int,
        *,
        chunk_size: int = 256,
        feature_map="learned",
        feature_dim: int | None = None,
        per_head_feature_map: bool = False,
        slope: torch.Tensor | None = None,
        eps: float = 1e-6,
        softmax_scale: float | None = None,
    ):
        super().__init__()
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"chunk_size must be an int >= 1, got {chunk_size!r}")
        self.head_dim, self.num_heads, self.chunk_size = head_dim, num_heads, chunk_size
        self.eps = check_eps(eps)
        self.softmax_scale = head_dim**-0.5 if softmax_scale is None else float(softmax_scale)
        if isinstance(feature_map, str) and feature_map == "learned":
            heads = num_heads if per_head_feature_map else None
            feature_map = LearnedFeatureMap(head_dim, feature_dim, num_heads=heads)
        require_positive(feature_map)  # ValueError now, not at the first forward
        if isinstance(feature_map, nn.Module):
            self.feature_map = feature_map  # registered: its parameters train with the layer
        else:
            self._feature_fn = get_feature_map(feature_map)
        if slope is not None:
            slope = slope.detach().to(torch.float32)
            check_slope(slope, num_heads, slope.device)
        self.register_buffer("slope", slope, persistent=False)

    @property
    def phi(self):
        return self.feature_map if "feature_map" in self._modules else self._feature_fn

    @property
    def feature_dim(self) -> int:
        return getattr(self.phi, "feature_dim", self.head_dim)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor | None = None):
        return hybrid_chunk_attn(
            q, k, v, self.slope, chunk_size=self.chunk_size, feature_map=self.phi, eps=self.eps,
            softmax_scale=self.softmax_scale, cu_seqlens=cu_seqlens,
        )

    def init_state(self, batch: int, v_dim: int, *, device=None, dtype=torch.float32) -> HybridDecodeState:
        """An empty decoding state for ``batch`` sequences with value head dim ``v_dim``."""
        return HybridDecodeState.empty(
            batch, self.num_heads, self.head_dim, v_dim, self.feature_dim, chunk_size=self.chunk_size,
            device=device, dtype=dtype,
        )

    def step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: HybridDecodeState) -> torch.Tensor:
        """One token per sequence: q, k ``[B, H, K]``, v ``[B, H, V]`` -> ``[B, H, V]``; ``state`` updated in place."""
        return hybrid_chunk_attn_decode(
            q, k, v, state, self.slope, feature_map=self.phi, eps=self.eps, softmax_scale=self.softmax_scale
        )

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, num_heads={self.num_heads}, chunk_size={self.chunk_size}, "
            f"eps={self.eps}, decay={'none' if self.slope is None else 'per-head'}"
        )
