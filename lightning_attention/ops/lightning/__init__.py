"""Lightning Attention op: references (naive), public API (interface), Triton kernels (chunk, kernels/), decode."""
