"""LLaMA-style softmax transformer, the baseline of ``lightning-attention train --arch llama``.

Pre-norm blocks of RMSNorm → causal softmax attention (PyTorch SDPA, RoPE on the full head) → RMSNorm → SwiGLU,
untied LM head; no √d embedding scale. Same forward signature, output type and cache class as
:class:`~lightning_attention.models.transnormer.TransNormerForCausalLM`, so the trainer, the sampler and the
benchmarks treat both architectures alike. Its cache holds keys and values of every token (memory grows with T),
which is the point of the comparison.
"""

import math
from dataclasses import asdict, dataclass

import torch
from torch import nn

from lightning_attention.models.transnormer.cache import TransNormerCache, step_key_mask, step_positions
from lightning_attention.models.transnormer.hf import CausalLMOutputWithPast
from lightning_attention.models.transnormer.model import causal_lm_loss
from lightning_attention.nn.sglu import SwiGLU
from lightning_attention.nn.softmax_attention import SoftmaxAttention
from lightning_attention.nn.srmsnorm import RMSNorm


@dataclass
class LlamaConfig:
    """Hyper-parameters of the baseline (names as transformers' LlamaConfig).

    ``intermediate_size`` is chosen by the presets so that a LLaMA and a TNL of the same width and depth have the same
    parameter count (a TNL token mixer has 5·d² weights, a LLaMA one 4·d²).
    """

    vocab_size: int = 256
    hidden_size: int = 512
    num_hidden_layers: int = 8
    num_attention_heads: int = 8
    intermediate_size: int = 1408
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    initializer_range: float = 0.02

    model_type = "llama-baseline"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "LlamaConfig":
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


class LlamaBlock(nn.Module):
    """``x [B, T, d] -> [B, T, d]``: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: LlamaConfig, layer_idx: int):
        super().__init__()
        d = config.hidden_size
        head_dim = d // config.num_attention_heads
        self.input_layernorm = RMSNorm(d, eps=config.rms_norm_eps)
        self.self_attn = SoftmaxAttention(
            d, config.num_attention_heads, head_dim, layer_idx, rope_base=config.rope_theta
        )
        self.post_attention_layernorm = RMSNorm(d, eps=config.rms_norm_eps)
        self.mlp = SwiGLU(d, config.intermediate_size)

    def forward(self, x, *, positions, key_mask, cache, cu_seqlens) -> torch.Tensor:
        x = x + self.self_attn(
            self.input_layernorm(x), positions=positions, key_mask=key_mask, cache=cache, cu_seqlens=cu_seqlens
        )
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaForCausalLM(nn.Module):
    """``input_ids [B, T]`` -> ``CausalLMOutputWithPast(loss, logits [B, T, vocab], past_key_values)``."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        if config.hidden_size % config.num_attention_heads:
            raise ValueError("hidden_size must be divisible by num_attention_heads")
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaBlock(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """Linear and embedding weights N(0, initializer_range); residual outputs (o_proj, down_proj) scaled by
        1/√(2L) as GPT-2 (same rule as TNL, so the comparison differs only in the token mixer); norms 1."""
        std = self.config.initializer_range
        for module in self.modules():
            if isinstance(module, nn.Linear):
                scale = 1 / math.sqrt(2 * self.config.num_hidden_layers) if getattr(
                    module, "_is_residual_projection", False) else 1.0
                nn.init.normal_(module.weight, 0.0, std * scale)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, 0.0, std)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        past_key_values: TransNormerCache | None = None,
        labels: torch.Tensor | None = None,
        use_cache: bool = False,
        cu_seqlens: torch.Tensor | None = None,
        logits_to_keep: int = 0,
        **kwargs,
    ):
        """Arguments as :meth:`TransNormerForCausalLM.forward` (``attention_mask`` 1 = token, 0 = left padding)."""
        B, T = input_ids.shape
        cache = past_key_values
        if cache is None and use_cache:
            cache = TransNormerCache(len(self.layers))
        token_mask = None
        if attention_mask is not None:
            current = attention_mask[:, -T:].bool()
            if not bool(current.all()):
                token_mask = current
        positions = step_positions(B, T, input_ids.device, None, token_mask, cache, cu_seqlens)
        key_mask = step_key_mask(B, T, input_ids.device, token_mask, cache)
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x, positions=positions, key_mask=key_mask, cache=cache, cu_seqlens=cu_seqlens)
        x = self.norm(x)
        if cache is not None:
            cache.seen_tokens += T
        if logits_to_keep:
            x = x[:, -logits_to_keep:]
        logits = self.lm_head(x)
        loss = causal_lm_loss(logits, labels, cu_seqlens) if labels is not None else None
        return CausalLMOutputWithPast(loss=loss, logits=logits, past_key_values=cache)
