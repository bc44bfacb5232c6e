"""Layers built on the Lightning Attention ops: TransNormerLLM token and channel mixers, norms, positions."""

from lightning_attention.nn.hybrid_attention import HybridChunkAttention
from lightning_attention.nn.lrpe import LRPE
from lightning_attention.nn.rotary import apply_rotary
from lightning_attention.nn.sglu import SGLU, SwiGLU
from lightning_attention.nn.softmax_attention import SoftmaxAttention
from lightning_attention.nn.srmsnorm import RMSNorm, SRMSNorm
from lightning_attention.nn.tnl_attention import TNLAttention, decay_slopes

__all__ = [
    "HybridChunkAttention",
    "LRPE",
    "RMSNorm",
    "SGLU",
    "SRMSNorm",
    "SoftmaxAttention",
    "SwiGLU",
    "TNLAttention",
    "apply_rotary",
    "decay_slopes",
]
