"""flash-linear-attention's Lightning Attention API on this library's kernels: switching is an import change.

::

    # from fla.ops.lightning_attn import chunk_lightning_attn, fused_recurrent_lightning_attn
    from lightning_attention.compat.fla import chunk_lightning_attn, fused_recurrent_lightning_attn

    o, final_state = chunk_lightning_attn(q, k, v, layer_idx, num_layers, output_final_state=True)

Same names, argument order, defaults and return values as FLA's (``fla.ops.lightning_attn``, checked against
fla-core 0.6.0):

- layout ``[B, T, H, K]`` for q, k and ``[B, T, H, V]`` for v; states ``[N, H, K, V]`` float32, N = B, or the number of
  packed sequences with ``cu_seqlens`` (then B must be 1);
- the decay is FLA's reading of the TNL paper, ``λ_h = exp(-slope_h)`` with ``slope_h = 8h/H · (1 - l/L)``,
  h = 0..H-1 (head 0 never decays), l = ``layer_idx``, L = ``num_layers`` (:func:`fla_slopes`); it is not the
  recipe of the released TNL / MiniMax checkpoints (:func:`lightning_attention.tnl_slopes`);
- ``scale=None`` means ``K ** -0.5`` (this library's own ``lightning_attn`` defaults to 1.0);
- ``initial_state`` may be float32, float16 or bfloat16 (read as float32, like FLA; its gradient comes back in its
  own dtype); ``final_state`` is float32, or ``None`` without ``output_final_state``; ``o`` is in q.dtype;
- ``reverse=True`` (``fused_recurrent_lightning_attn``): the recurrence runs from the last token of each sequence to
  its first, ``S_t = λ S_{t+1} + k_tᵀ v_t``, ``o_t = scale · q_t S_t``, starting from ``initial_state``, and
  ``final_state`` is the state after the first token. Computed by reversing each sequence (packed ones too) around
  the forward op: it costs a copy of q, k, v and o.

Both names run the same op (:func:`lightning_attention.lightning_attn`, the chunked Triton kernels on CUDA, the
PyTorch path on CPU): FLA's token-by-token ``fused_recurrent`` kernel and its ``chunk`` kernel compute the same
function, and so do these two. Differences from FLA, all deliberate:

- unknown keyword arguments raise ``TypeError`` (FLA's ``chunk_lightning_attn`` drops them silently, ``reverse``
  included); ``head_first=True`` raises ``ValueError`` with the transpose to use (``head_first=False`` is the only
  layout and is accepted); ``chunk_size`` is checked like FLA (a power of two) but this library picks its own tiles,
  which changes nothing but rounding;
- ``cu_seqlens_cpu`` (a host copy of ``cu_seqlens``) is accepted by both functions and spares the launcher a
  device->host sync (FLA's ``chunk_lightning_attn`` ignores it); when given, its offsets are the ones computed with
  (the reverse mode's reversal too), as in :func:`lightning_attention.lightning_attn`;
- ``layer_idx`` and ``num_layers`` must be ints with ``0 <= layer_idx <= num_layers`` and ``num_layers >= 1``:
  outside that FLA's formula gives negative slopes (λ > 1, a state that grows without bound) or divides by zero;
- inputs are validated like :func:`lightning_attention.lightning_attn` (errors name the argument); float64 inputs
  work on the PyTorch path, for references.
"""

import torch

from lightning_attention.ops.lightning.interface import lightning_attn
from lightning_attention.ops.lightning.offsets import offsets_for
from lightning_attention.ops.lightning.validation import (
    check_lightning_attn_inputs,
    require_bool,
    require_int,
    require_ndim,
    require_tensor,
)

_HALF_STATE_DTYPES = (torch.float16, torch.bfloat16)


def fla_slopes(num_heads: int, layer_idx: int, num_layers: int, device=None) -> torch.Tensor:
    """FLA's lightning-attention decay: ``slope_h = 8h/H · (1 - l/L)``, h = 0..H-1, as a float32 ``[H]`` tensor.

    Bit for bit what ``fla.ops.lightning_attn`` computes (its ``g_gamma`` is ``-slope``): the factor
    ``8/H · (1 - l/L)`` in Python floats, rounded to float32 and multiplied by the head index in float32. The same
    formula as :func:`lightning_attention.paper_slopes`, which rounds the exact product once: the two differ by at
    most 2 ulp (about 2e-7 relative). Head 0 has slope 0 (no decay); ``layer_idx == num_layers`` gives no decay
    on any head.
    """
    num_heads = require_int("num_heads", num_heads, minimum=1)
    layer_idx = require_int("layer_idx", layer_idx)
    num_layers = require_int("num_layers", num_layers, minimum=1)
    if not 0 <= layer_idx <= num_layers:
        raise ValueError(
            f"layer_idx must be in [0, num_layers] = [0, {num_layers}], got {layer_idx} "
            "(beyond num_layers the slopes are negative: a decay > 1, a state that grows without bound)"
        )
    factor = 8 / num_heads * (1 - layer_idx / num_layers)
    return factor * torch.arange(num_heads, dtype=torch.float32, device=device)


def _check_chunk_options(chunk_size, kwargs: dict) -> None:
    """FLA's extra keyword arguments of ``chunk_lightning_attn``: the ones a user passes, and nothing else."""
    head_first = kwargs.pop("head_first", False)
    if head_first:
        raise ValueError(
            "head_first=True is not supported (FLA removed it too): inputs must be [B, T, H, K]; "
            "pass q.transpose(1, 2) etc. and transpose o back"
        )
    if kwargs:
        names = ", ".join(sorted(kwargs))
        hint = " (reverse=True: use fused_recurrent_lightning_attn)" if "reverse" in kwargs else ""
        raise TypeError(f"chunk_lightning_attn() got unexpected keyword arguments: {names}{hint}")
    if chunk_size is not None:
        chunk_size = require_int("chunk_size", chunk_size)
        if chunk_size < 1 or chunk_size & (chunk_size - 1):
            raise ValueError(f"chunk_size must be a power of 2, got {chunk_size}")


def _sequence_reversal(cu_seqlens: torch.Tensor | None, length: int, device) -> torch.Tensor | None:
    """``[T]`` index that reverses every packed sequence in place (its own inverse); ``None`` without varlen.

    Position p of sequence n = [bos, eos) maps to bos + eos - 1 - p. Built on the device of ``cu_seqlens``
    (no host sync); empty sequences own no position.
    """
    if cu_seqlens is None:
        return None
    # clamped: offsets whose values were not checked (CUDA outside debug mode) still index inside the row
    cu = cu_seqlens.clamp(0, length)
    position = torch.arange(length, device=device, dtype=cu.dtype)
    sequence = torch.searchsorted(cu[1:].contiguous(), position, right=True).clamp(max=max(cu.numel() - 2, 0))
    return (cu[sequence] + cu[sequence + 1] - 1 - position).clamp(0, max(length - 1, 0))


def _reverse_time(x: torch.Tensor, order: torch.Tensor | None) -> torch.Tensor:
    """``x`` ``[B, T, ...]`` with every sequence reversed along T (``order``: a packed batch's reversal index)."""
    return x.flip(1) if order is None else x.index_select(1, order)


def _fla_lightning_attn(
    q, k, v, layer_idx, num_layers, scale, initial_state, output_final_state, reverse, cu_seqlens, cu_seqlens_cpu
):
    """The shared body of both entry points (shapes in their docstrings)."""
    require_tensor("q", q)
    require_ndim("q", q, 4, "[B, T, H, K]")
    require_bool("reverse", reverse)
    slope = fla_slopes(q.shape[2], layer_idx, num_layers, device=q.device)
    if scale is None and isinstance(k, torch.Tensor):  # a k that is not a tensor is named by the op's checks
        scale = k.shape[-1] ** -0.5
    if isinstance(initial_state, torch.Tensor) and initial_state.dtype in _HALF_STATE_DTYPES:
        initial_state = initial_state.float()  # FLA reads h0 in float32; autograd returns dh0 in h0's dtype
    options = dict(
        scale=scale,
        initial_state=initial_state,
        output_final_state=output_final_state,
        cu_seqlens=cu_seqlens,
        cu_seqlens_cpu=cu_seqlens_cpu,
    )
    if not reverse:
        return lightning_attn(q, k, v, slope, **options)
    # the reversal index reads cu_seqlens: validate first, so a bad argument is named rather than failing in there
    check_lightning_attn_inputs(q, k, v, slope, backward="auto", **options)
    order = _sequence_reversal(offsets_for(cu_seqlens, cu_seqlens_cpu, q.device), q.shape[1], q.device)
    q, k, v = (_reverse_time(x, order) for x in (q, k, v))
    o, final_state = lightning_attn(q, k, v, slope, **options)
    return _reverse_time(o, order), final_state


def chunk_lightning_attn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layer_idx: int,
    num_layers: int,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    *,
    cu_seqlens_cpu: torch.Tensor | None = None,
    chunk_size: int | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """FLA's ``chunk_lightning_attn``: causal linear attention with the TNL paper's per-layer decay.

    Per head h, with λ_h = exp(-slope_h), slope_h = 8h/H · (1 - layer_idx/num_layers) (:func:`fla_slopes`) and
    S₋₁ = ``initial_state`` (zeros if None)::

        S_t = λ_h S_{t-1} + k_tᵀ v_t,    o_t = scale · q_t S_t,    final_state = S_{T-1}

    Args:
        q: ``[B, T, H, K]`` float16 / bfloat16 / float32.
        k: ``[B, T, H, K]``, dtype of q.
        v: ``[B, T, H, V]``, dtype of q.
        layer_idx: index l of this layer, ``0 <= l <= num_layers``.
        num_layers: number of layers L (>= 1); with ``layer_idx`` it sets the decay.
        scale: output scale; ``None`` means ``K ** -0.5``.
        initial_state: ``[N, H, K, V]`` (float32, or float16 / bfloat16 read as float32); N = B, or the number of
            sequences with ``cu_seqlens``.
        output_final_state: also return the final state.
        cu_seqlens: ``[N + 1]`` int32 / int64 offsets of N sequences packed along T (B must be 1).
        cu_seqlens_cpu: optional host copy of ``cu_seqlens`` (saves a device->host sync; not in FLA).
        chunk_size: accepted for FLA compatibility (a power of 2) and not used: this library picks its own tiles.
        **kwargs: ``head_first=False`` only; anything else is a ``TypeError``.

    Returns:
        ``(o, final_state)``: o ``[B, T, H, V]`` in q.dtype; final_state ``[N, H, K, V]`` float32, or ``None``
        unless ``output_final_state``.
    """
    _check_chunk_options(chunk_size, kwargs)
    return _fla_lightning_attn(
        q, k, v, layer_idx, num_layers, scale, initial_state, output_final_state, False, cu_seqlens, cu_seqlens_cpu
    )


def fused_recurrent_lightning_attn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layer_idx: int,
    num_layers: int,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    reverse: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    *,
    cu_seqlens_cpu: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """FLA's ``fused_recurrent_lightning_attn``: the same function as :func:`chunk_lightning_attn`, plus ``reverse``.

    Forward time (``reverse=False``): ``S_t = λ_h S_{t-1} + k_tᵀ v_t``, ``o_t = scale · q_t S_t``,
    ``final_state = S_{T-1}``. Reverse time (``reverse=True``), per sequence: ``S_t = λ_h S_{t+1} + k_tᵀ v_t`` from
    ``S_T = initial_state``, ``o_t = scale · q_t S_t``, ``final_state = S_0`` (each token sees itself and the tokens
    after it in its own sequence).

    Args:
        q: ``[B, T, H, K]`` float16 / bfloat16 / float32.
        k: ``[B, T, H, K]``, dtype of q.
        v: ``[B, T, H, V]``, dtype of q.
        layer_idx: index l of this layer, ``0 <= l <= num_layers``.
        num_layers: number of layers L (>= 1); slope_h = 8h/H · (1 - l/L) (:func:`fla_slopes`).
        scale: output scale; ``None`` means ``K ** -0.5``.
        initial_state: ``[N, H, K, V]`` (float32, or float16 / bfloat16 read as float32).
        output_final_state: also return the final state.
        reverse: run each sequence's recurrence from its last token to its first.
        cu_seqlens: ``[N + 1]`` int32 / int64 offsets of N sequences packed along T (B must be 1).
        cu_seqlens_cpu: optional host copy of ``cu_seqlens`` (saves a device->host sync; not in FLA).

    Returns:
        ``(o, final_state)``: o ``[B, T, H, V]`` in q.dtype; final_state ``[N, H, K, V]`` float32, or ``None``
        unless ``output_final_state``.
    """
    return _fla_lightning_attn(
        q, k, v, layer_idx, num_layers, scale, initial_state, output_final_state, reverse, cu_seqlens, cu_seqlens_cpu
    )
