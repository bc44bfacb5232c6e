"""LLaMA-style softmax-attention baseline (PyTorch SDPA, RoPE, SwiGLU) for ``--arch llama``."""

from lightning_attention.models.llama.model import LlamaConfig, LlamaForCausalLM

__all__ = ["LlamaConfig", "LlamaForCausalLM"]
