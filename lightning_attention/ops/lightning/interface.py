"""Public entry points: :func:`lightning_attn` and the drop-in :func:`lightning_attn_func`.

This layer validates, picks the backend (the ``backend`` setting, :mod:`lightning_attention.backend`) and calls
either the Triton kernels (:mod:`lightning_attention.ops.lightning.ops`) or the PyTorch chunked path
(:func:`lightning_attention.ops.lightning.naive.chunk_lightning_attn`).
"""

import torch

from lightning_attention.backend import triton_ops, use_triton
from lightning_attention.ops.lightning import naive
from lightning_attention.ops.lightning.numerics import debug_checks_enabled, guarded, host_offsets
from lightning_attention.ops.lightning.offsets import offsets_for
from lightning_attention.ops.lightning.validation import (
    check_lightning_attn_inputs,
    check_qkv,
    check_slope,
    require_tensor,
)


def lightning_attn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slope: torch.Tensor | None = None,
    *,
    scale: float = 1.0,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    cu_seqlens_cpu: torch.Tensor | None = None,
    backward: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Causal linear attention with per-head exponential decay (Lightning Attention-1/-2).

    Per head, with λ = exp(-slope) (``slope=None``: λ = 1) and S₋₁ = ``initial_state`` (zeros if None)::

        S_t = λ · S_{t-1} + k_tᵀ v_t          (S is [K, V], float32)
        o_t = scale · q_t · S_t               (causal, inclusive)
        final_state = S_{T-1}

    Args:
        q: ``[B, T, H, K]`` float16 / bfloat16 / float32 (float64 on the PyTorch path, for references).
        k: ``[B, T, H, K]``, dtype of q.
        v: ``[B, T, H, V]``, dtype of q. K ≠ V is allowed.
        slope: ``[H]`` float32 >= 0 or ``None`` (no decay). Differentiable on every backend (a learned decay).
        scale: multiplies every output; default 1.0 (TNL / paper). FLA's default is ``K ** -0.5``.
        initial_state: ``[N, H, K, V]`` float32, N = B, or N = len(cu_seqlens) - 1 with ``cu_seqlens``.
        output_final_state: return the final state ``[N, H, K, V]`` float32 (else ``None``).
        cu_seqlens: ``[N + 1]`` int32/int64 offsets of N sequences packed along T; requires B == 1.
            Every sequence starts from its own initial state and never sees another.
        cu_seqlens_cpu: optional host copy of ``cu_seqlens``; lets the launcher avoid a device->host sync.
        backward: ``"auto"`` | ``"chunk"`` (parallel over chunks) | ``"recompute"`` (SRAM-bounded).

    Returns:
        ``(o, final_state)``: o ``[B, T, H, V]`` in q.dtype; final_state ``[N, H, K, V]`` float32 or ``None``.

    Gradients flow to q, k, v, slope and initial_state, and through final_state (the slope's, on the Triton path,
    from a float32 backward for 16-bit inputs: docs/design.md, "Gradients").

    Input checks (docs/design.md, "Input checks"), each a ValueError / TypeError naming the argument before anything
    runs: the structure of every argument always; the slope's range in float32, the offsets of ``cu_seqlens`` and
    their agreement with ``cu_seqlens_cpu`` on CPU tensors always and on CUDA tensors in debug mode
    (``LIGHTNING_ATTENTION_DEBUG=1``; outside it the CUDA path never syncs, and an invalid value may give a wrong
    answer but no access outside the tensors); the offsets of ``cu_seqlens_cpu`` always. When ``cu_seqlens_cpu`` is
    given, both backends compute with its offsets. In debug mode also non-finite inputs (and a non-finite gradient
    of o) are refused and an overflow of the float32 state is reported with its tokens.

    Non-finite values: a NaN or inf in q or k at token t reaches no output before t; one in v may reach the outputs
    of the earlier tokens of its chunk (docs/design.md, "Non-finite values and overflow", gives the chunk of each
    path and the overflow bound).

    Example::

        >>> B, T, H, D = 2, 1000, 4, 64
        >>> q, k, v = (torch.randn(B, T, H, D) for _ in range(3))
        >>> o, _ = lightning_attn(q, k, v, tnl_slopes(H, 0, 12))
        >>> # varlen: three sequences of lengths 5, 0 and 995 packed into one row
        >>> cu = torch.tensor([0, 5, 5, 1000])
        >>> o, ht = lightning_attn(q[:1], k[:1], v[:1], cu_seqlens=cu, output_final_state=True)
        >>> ht.shape
        torch.Size([3, 4, 64, 64])
    """
    options = dict(scale=scale, initial_state=initial_state, output_final_state=output_final_state,
                   cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu, backward=backward)  # fmt: skip
    check_lightning_attn_inputs(q, k, v, slope, **options)
    options["scale"] = float(scale)
    if debug_checks_enabled():
        offsets = host_offsets(cu_seqlens, cu_seqlens_cpu)
        return guarded("lightning_attn", lambda: _dispatch(q, k, v, slope, **options), dict(q=q, k=k, v=v), offsets,
                       initial_state)  # fmt: skip
    return _dispatch(q, k, v, slope, **options)


def _dispatch(q, k, v, slope, **options):
    """The validated call (``options``: :func:`lightning_attn`'s keywords) on the backend the settings pick:
    ``(o, final_state or None)``."""
    if use_triton(q):
        return triton_ops().chunk_lightning_attn_triton(q, k, v, slope, **options)
    initial_state = options["initial_state"]
    # The PyTorch path computes in float32 on purpose: keep autocast from lowering its einsums to bf16.
    with torch.autocast(device_type=q.device.type, enabled=False):
        o, final_state = naive.chunk_lightning_attn(
            q, k, v, slope, scale=options["scale"], initial_state=initial_state,
            cu_seqlens=offsets_for(options["cu_seqlens"], options["cu_seqlens_cpu"], q.device),
        )  # fmt: skip
    if not options["output_final_state"]:
        return o, None
    if final_state is initial_state:  # T == 0 returns h0: never hand the caller's tensor back aliased
        final_state = final_state.clone()
    return o, final_state


def lightning_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    s: torch.Tensor | None = None,
    variant: str = "chunk_loop",
) -> torch.Tensor:
    """Drop-in replacement for the official ``lightning_attn.ops.lightning_attn_func``.

    Layout ``[b, h, n, d]`` for q and k, ``[b, h, n, e]`` for v; ``s`` is the per-head slope of shape ``[h]`` or
    ``[h, 1, 1]`` (λ = exp(-s)) or ``None`` for no decay; no scale (1.0). ``variant`` is accepted for compatibility
    and ignored: one implementation serves every variant. Unlike the official package, d = 16, head dims that are
    not powers of two, and the no-decay path all work. Inputs are checked in this layout (errors name q, k, v and s)
    and then as :func:`lightning_attn` checks them; ``s`` must be a floating tensor.

    Returns:
        o ``[b, h, n, e]`` in q.dtype (contiguous, like the official package).
    """
    del variant
    check_qkv(q, k, v, 4, "[b, h, n, d]", "[b, h, n, e]")
    slope = None
    if s is not None:
        require_tensor("s", s)
        h = q.shape[1]
        if tuple(s.shape) not in ((h,), (h, 1, 1)):
            raise ValueError(f"s must have shape [h] or [h, 1, 1] with h = {h}, got {tuple(s.shape)}")
        check_slope(s.reshape(h), h, q.device, name="s")
        slope = s.reshape(h).to(torch.float32)
    o, _ = lightning_attn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), slope)
    return o.transpose(1, 2).contiguous()
