"""Tiny models for the model tests (d_model 32, 2 layers, vocab 256), built in float64 unless told otherwise."""

import torch

from lightning_attention.models.llama import LlamaForCausalLM, llama_baseline
from lightning_attention.models.transnormer import TransNormerConfig, TransNormerForCausalLM

VARIANTS = {
    "tnl": {},
    "tnl-paper-decay": {"decay_recipe": "paper"},
    "minimax": {"attention_variant": "minimax"},
    "hybrid": {"softmax_attention_every": 2, "decoder_layers": 2},
}


def tiny_tnl(dtype=torch.float64, seed=0, **overrides) -> TransNormerForCausalLM:
    torch.manual_seed(seed)
    kwargs = dict(vocab_size=256, decoder_embed_dim=32, decoder_layers=2, decoder_attention_heads=2, glu_dim=64,
                  pad_token_id=0)
    kwargs.update(overrides)
    model = TransNormerForCausalLM(TransNormerConfig(**kwargs)).to(dtype).eval()
    return model


def tiny_llama(dtype=torch.float64, seed=0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = dict(vocab_size=256, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    return llama_baseline(config).to(dtype).eval()


def left_pad(seqs: list[list[int]], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids [B, T], attention_mask [B, T])`` with each sequence right-aligned."""
    T = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), T), pad, dtype=torch.long)
    mask = torch.zeros(len(seqs), T, dtype=torch.long)
    for b, s in enumerate(seqs):
        if s:
            ids[b, T - len(s):] = torch.tensor(s)
            mask[b, T - len(s):] = 1
    return ids, mask
