"""Lightning Attention: causal linear attention computed in tiles.

Public API (names and shapes are a contract: docs/design.md, "Public API", and the README):

- :func:`lightning_attn` — prefill / training op, ``[B, T, H, K]`` layout, returns ``(o, final_state)``.
- :func:`lightning_attn_decode` — one token per sequence, fp32 state pool updated in place.
- :func:`lightning_attn_func` — drop-in for the official ``lightning_attn`` package (``[b, h, n, d]`` layout).
- :func:`tnl_slopes`, :func:`paper_slopes` — per-head decay recipes.
"""

__version__ = "0.1.0"

from lightning_attention.ops.decay import paper_slopes, tnl_slopes
from lightning_attention.ops.lightning.decode import lightning_attn_decode
from lightning_attention.ops.lightning.interface import lightning_attn, lightning_attn_func
from lightning_attention.models.registration import install as _register_with_transformers

_register_with_transformers()  # TransNormerLLM in transformers' Auto classes, once they are imported

__all__ = [
    "__version__",
    "lightning_attn",
    "lightning_attn_decode",
    "lightning_attn_func",
    "paper_slopes",
    "tnl_slopes",
]
