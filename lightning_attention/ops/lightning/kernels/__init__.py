"""Triton kernels of the Lightning Attention op (one role per file)."""
