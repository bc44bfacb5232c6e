"""The LLaMA softmax-attention baseline of ``lightning-attention train --arch llama``: transformers' own
``LlamaForCausalLM`` (SDPA, RoPE, SwiGLU, RMSNorm, untied head), initialised by the same rule as TNL.

Being transformers' model, its checkpoint folder loads anywhere with ``AutoModelForCausalLM.from_pretrained`` and its
cache is transformers' growing ``DynamicCache`` (keys and values of every token) — the point of the comparison.
"""

import math

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM


def llama_baseline(config: dict) -> LlamaForCausalLM:
    """A freshly initialised baseline from a config dict (``vocab_size``, ``hidden_size``, ``num_hidden_layers``,
    ``num_attention_heads``, ``intermediate_size``; anything else of ``LlamaConfig`` may be given too).

    Defaults that differ from ``LlamaConfig``'s: ``rms_norm_eps`` 1e-6, ``tie_word_embeddings`` False (as TNL), no
    special tokens. Init: every linear and embedding weight N(0, initializer_range), and the residual-branch outputs
    (``o_proj``, ``down_proj``) scaled by 1/√(2L) as GPT-2 — the rule TNL uses, so the two differ only in the token
    mixer.

    The training options of TNL's config, with the same meaning (stored in the config, both off by default):
    ``dropout`` (on the embedding output and every residual-branch output, see :func:`add_dropout`) and
    ``scale_residual_init`` (False: transformers' own init, every weight N(0, initializer_range)).
    """
    options = dict(rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
                   pad_token_id=None, dropout=0.0, scale_residual_init=True)
    options.update(config)
    if not 0.0 <= options["dropout"] < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {options['dropout']}")
    model = LlamaForCausalLM(LlamaConfig(**options))
    if model.config.scale_residual_init:
        scale_residual_outputs(model)
    if model.config.dropout:
        add_dropout(model, model.config.dropout)
    return model


def add_dropout(model: LlamaForCausalLM, p: float) -> None:
    """Dropout ``p`` on the outputs of ``embed_tokens``, ``o_proj`` and ``down_proj`` in training mode (forward hooks:
    transformers' LLaMA has attention-probability dropout only, where TNL has no probabilities to drop)."""

    def drop(module, inputs, output):
        return nn.functional.dropout(output, p, module.training)

    model.model.embed_tokens.register_forward_hook(drop)
    for layer in model.model.layers:
        layer.self_attn.o_proj.register_forward_hook(drop)
        layer.mlp.down_proj.register_forward_hook(drop)


@torch.no_grad()
def scale_residual_outputs(model: LlamaForCausalLM) -> None:
    """Re-draws ``o_proj`` and ``down_proj`` weights from N(0, initializer_range / √(2L)) (GPT-2's scaled init)."""
    config = model.config
    std = config.initializer_range / math.sqrt(2 * config.num_hidden_layers)
    for layer in model.model.layers:
        for linear in (layer.self_attn.o_proj, layer.mlp.down_proj):
            if linear.weight.device.type != "meta":
                nn.init.normal_(linear.weight, 0.0, std)


__all__ = ["LlamaConfig", "LlamaForCausalLM", "add_dropout", "llama_baseline", "scale_residual_outputs"]
