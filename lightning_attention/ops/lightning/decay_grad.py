"""The gradient of the decay slopes, from the other gradients: no kernel computes it.

With g = log λ = -slope, every term of the output and of the final state is a pair (t, u) of a reading token t and
a written token u (u = -1 for the initial state: k_{-1}ᵀ v_{-1} := h0) with weight e^{(t-u) g}::

    o_t       = scale Σ_{u ≤ t} e^{(t-u) g} (q_t·k_u) v_u           (over the pairs the mode reads: all u ≤ t, or
                                                                   u before t's chunk in the inter-only mode)
    S_{T-1}   =       Σ_{u ≤ T-1} e^{(T-1-u) g} k_uᵀ v_u            (the final state's terms: t = T - 1)

so dL/dg = Σ_pairs (t - u) · term. Summed over u the terms of a reading token t give q_t·dq_t (t ≥ 0; the final
state's row is ⟨S_{T-1}, dS_{T-1}⟩), summed over t those of a written token give k_u·dk_u (u ≥ 0) or ⟨h0, dh0⟩
(u = -1). Every term is in exactly one row and one column, so Σ_t q_t·dq_t + ⟨S_{T-1}, dS_{T-1}⟩ =
Σ_u k_u·dk_u + ⟨h0, dh0⟩, and weighing rows by t - (T - 1) and columns by u - (T - 1) leaves, per head::

    dL/dg = Σ_t (t - (T - 1)) (q_t·dq_t - k_t·dk_t) + T ⟨h0, dh0⟩

with t the position within its sequence and T its length (per packed sequence with ``cu_seqlens``; an empty
sequence contributes nothing): the final state is not needed. dL/dslope = -dL/dg. The identity holds in every mode
because every pair's exponent is its distance t - u. Cost: one read of q, k, dq, dk, only when the slope requires
grad.

Precision: the sum weighs every token by up to T, so any rounding in dq and dk is multiplied by the length. Exact
float64 gradients merely rounded to bf16 gave a slope gradient 4% off at T = 8K and 60% at 32K (H = 4, K = 64, TNL
slopes, against float64 autograd); the bf16 walks, which also round the operands of their products, were 1.3% off
at T = 256 and 3.2% at 1K. So when the slope requires grad, the Triton path runs the backward in float32 for 16-bit
inputs (float32's accuracy: the price of a learned decay is a slower backward), and the products and sums here run
in float64 (tests/ops/test_decay_grad.py).
"""

import torch

_TOKENS_PER_STEP = 8192  # tokens whose float64 products are formed at once (bounds the temporary memory)


def _dot_per_token(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``[B, T, H]`` float64: Σ_d a·b of ``[B, T, H, D]`` tensors, in float64, a slice of T at a time."""
    parts = [
        torch.einsum("bthd,bthd->bth", a[:, t : t + _TOKENS_PER_STEP].double(), b[:, t : t + _TOKENS_PER_STEP].double())
        for t in range(0, a.shape[1], _TOKENS_PER_STEP)
    ]
    return torch.cat(parts, dim=1) if parts else a.new_zeros(a.shape[:3], dtype=torch.float64)


def slope_gradient(q, k, dq, dk, h0, dh0, cu_seqlens) -> torch.Tensor:
    """dL/dslope ``[H]`` float32 (module docstring).

    Args:
        q, k, dq, dk: ``[B, T, H, K]`` the inputs and their gradients (dq, dk including the scale).
        h0, dh0: ``[N, H, K, V]`` the initial state and its gradient, or None (no initial state).
        cu_seqlens: ``[N + 1]`` offsets of packed sequences (B == 1), or None.
    """
    B, T, H, _ = q.shape
    per_token = _dot_per_token(q, dq) - _dot_per_token(k, dk)  # [B, T, H]
    t = torch.arange(T, device=q.device)
    if cu_seqlens is None:
        last = torch.full_like(t, T - 1)
        length = torch.full((B,), T, device=q.device)
    else:
        cu = cu_seqlens.to(device=q.device, dtype=torch.long)
        seq = torch.bucketize(t, cu[1:], right=True).clamp(max=cu.numel() - 2)
        last = cu[seq + 1] - 1 - cu[seq]  # T - 1 of t's sequence, in its own positions
        t = t - cu[seq]
        length = cu[1:] - cu[:-1]
    dg = torch.einsum("bth,t->h", per_token, (t - last).double())
    if h0 is not None and dh0 is not None:
        dg = dg + torch.einsum("nhkv,nhkv,n->h", h0.double(), dh0.double(), length.double())
    return (-dg).float()
