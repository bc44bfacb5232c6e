"""Models built on Lightning Attention (TransNormerLLM) and the LLaMA baseline they are compared with."""
