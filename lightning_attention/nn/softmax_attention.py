"""Causal softmax attention with RoPE (PyTorch SDPA), for hybrid TNL models.

MiniMax-01 interleaves one softmax layer after every 7 lightning layers; ``TransNormerConfig.softmax_attention_every``
reproduces that. Unlike a lightning layer, this layer's cache grows with the sequence (keys and values of every past
token).

Unpadded, unpacked training takes SDPA's ``is_causal`` path (FlashAttention on a GPU). Padding, packed sequences and
cached keys use an explicit boolean mask; every query may always attend to itself, so no row of the mask is empty
(an empty row gives NaN in SDPA, and a NaN at a padded position would leak through ``0 · NaN`` elsewhere).
"""

import torch
import torch.nn.functional as F
from torch import nn

from lightning_attention.nn.rotary import apply_rotary


class SoftmaxAttention(nn.Module):
    """``x [B, T, d_model]`` -> ``[B, T, d_model]``; LLaMA names ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``.

    Args:
        d_model: model width; num_heads: H; head_dim: D (the projections are ``d_model -> H·D``).
        layer_idx: cache slot.
        rotary_dim: channels of each head that RoPE rotates (LLaMA: D, MiniMax-01: D/2); rope_base: RoPE base.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        head_dim: int,
        layer_idx: int,
        *,
        rotary_dim: int | None = None,
        rope_base: float = 10000.0,
        bias: bool = False,
    ):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.layer_idx = layer_idx
        self.rotary_dim = head_dim if rotary_dim is None else rotary_dim
        if self.rotary_dim % 2 or not 0 <= self.rotary_dim <= head_dim:
            raise ValueError(f"rotary_dim must be even and in [0, {head_dim}], got {self.rotary_dim}")
        self.rope_base = rope_base
        width = num_heads * head_dim
        self.q_proj = nn.Linear(d_model, width, bias=bias)
        self.k_proj = nn.Linear(d_model, width, bias=bias)
        self.v_proj = nn.Linear(d_model, width, bias=bias)
        self.o_proj = nn.Linear(width, d_model, bias=bias)
        self.o_proj._is_residual_projection = True

    def forward(
        self,
        x: torch.Tensor,
        *,
        positions: torch.Tensor | None = None,
        key_mask: torch.Tensor | None = None,
        cache=None,
        cu_seqlens: torch.Tensor | None = None,
        token_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Args:
            x: ``[B, T, d_model]``; positions: ``[B, T]`` RoPE positions (default ``arange(T)``).
            key_mask: ``[B, S]`` bool over all keys (cached then new; S = past + T), False at padding; or ``None``.
            cache: a transformers ``Cache``; this layer appends its keys and values (``[B, H, S, D]``) with
                ``cache.update(k, v, layer_idx)``.
            cu_seqlens: ``[N + 1]`` offsets of packed sequences (B == 1, no cache): attention stays inside each.
            token_mask: ignored (padding reaches this layer through ``key_mask``, which also covers cached keys).
        """
        B, T, _ = x.shape
        H, D = self.num_heads, self.head_dim
        if positions is None:
            positions = torch.arange(T, device=x.device).expand(B, T)
        q = apply_rotary(self.q_proj(x).view(B, T, H, D), positions, self.rotary_dim, self.rope_base)
        k = apply_rotary(self.k_proj(x).view(B, T, H, D), positions, self.rotary_dim, self.rope_base)
        v = self.v_proj(x).view(B, T, H, D)
        qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, H, T, D]
        past = 0
        if cache is not None:
            past = cache.layers[self.layer_idx].get_seq_length()
            kh, vh = cache.update(kh, vh, self.layer_idx)  # [B, H, past + T, D]
        if past == 0 and key_mask is None and cu_seqlens is None:
            o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)
        else:
            mask = self._mask(T, past, key_mask, cu_seqlens, x.device)
            o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask)
        return self.o_proj(o.transpose(1, 2).reshape(B, T, H * D))

    @staticmethod
    def _mask(T: int, past: int, key_mask, cu_seqlens, device) -> torch.Tensor:
        """``[B or 1, 1, T, S]`` bool: causal, real keys only, same packed sequence, and always the diagonal."""
        qi = past + torch.arange(T, device=device)  # absolute index of each query
        kj = torch.arange(past + T, device=device)
        allowed = kj[None, :] <= qi[:, None]  # [T, S]
        if cu_seqlens is not None:
            bounds = cu_seqlens[1:-1].to(device)
            seg = torch.bucketize(kj, bounds, right=True)  # sequence id of every position
            allowed = allowed & (seg[qi][:, None] == seg[None, :])
        allowed = allowed[None, None]
        if key_mask is not None:
            allowed = allowed & key_mask[:, None, None, :]
        return allowed | (kj[None, :] == qi[:, None])[None, None]
