"""Recurrent decoding: one token per sequence, the fp32 state of each sequence updated in place.

Linear attention needs no KV cache: one ``[H, K, V]`` float32 state per sequence replaces it, so memory stays
constant however many tokens are generated. States live in a pool ``[P, H, K, V]``; ``state_indices`` says which
row belongs to which sequence of the batch (``-1`` marks a padding slot).

Same semantics as :func:`lightning_attention.lightning_attn` (docs/design.md, "Semantics"), one step at a time::

    S = λ · S + kᵀ v        (inclusive: the token is added before it is read)
    o = scale · q · S

Hand-off from prefill: ``o, ht = lightning_attn(..., output_final_state=True)`` then ``pool[idx] = ht``; chunked
prefill continues from a pool row with ``initial_state=pool[idx]``. Prefill and decode share one state layout
(``[K, V]`` per head, float32) and one decay definition, so the state a prefill returns is exactly the state the
next decode step expects; ``docs/decode.md`` walks through a serving loop (pool, padding slots, CUDA graphs).

On the Triton backend the step is :func:`lightning_attention.ops.lightning.decode_triton.decode_step_triton`
(registered as ``torch.ops.lightning_attention.decode_step``); on CPU tensors by default, the PyTorch path below.
"""

import torch

from lightning_attention import settings
from lightning_attention.backend import triton_ops, use_triton
from lightning_attention.ops.lightning.naive import compute_dtype
from lightning_attention.ops.lightning.numerics import guarded_decode_step
from lightning_attention.ops.lightning.decode_validation import check_decode_inputs


def pool_rows(batch: int, num_heads: int, state_indices, slope, device, ct, num_rows: int | None = None) -> tuple:
    """The rows a decode step reads and writes on a slot-indexed pool, without shapes that depend on the indices'
    values (so torch.compile captures the step whole): ``(src [B], rows [B], active [B] bool, lam [H])``.

    Slot b reads and writes pool row ``rows[b]`` with the inputs of slot ``src[b]``: itself when it is active, else
    (a padding slot) the first active slot, so that every write to a row carries the same value. ``lam``: λ in
    ``ct`` (1 without slope). When no slot is active, ``rows`` is row 0 for every slot and the caller writes back
    what it read. ``num_rows`` (P): an index outside [-1, P), which only an unchecked call can pass (CUDA tensors
    outside debug mode), is a padding slot too, so no index ever leaves the pool."""
    indices = torch.arange(batch, device=device)
    rows = indices if state_indices is None else state_indices.long()
    active = rows >= 0
    if num_rows is not None:
        active = active & (rows < num_rows)
        rows = rows.clamp(max=max(num_rows - 1, 0))
    # argmax of an empty batch has no answer: B == 0 reads nothing anyway
    first = torch.argmax(active.to(torch.int8)) if batch else indices.new_zeros(())
    src = torch.where(active, indices, first)
    lam = torch.ones(num_heads, device=device, dtype=ct) if slope is None else torch.exp(-slope.to(ct))
    return src, rows[src].clamp(min=0), active, lam


def decode_step_torch(q, k, v, state, slope, scale, state_indices, out):
    """PyTorch decode step (CPU path and reference). Same contract as :func:`lightning_attn_decode`."""
    B, H, K = q.shape
    ct = compute_dtype(q.dtype)
    if state.shape[0] == 0:  # an empty pool: every slot is a padding slot
        o = q.new_zeros(B, H, v.shape[-1])
        return o if out is None else out.copy_(o)
    src, rows, active, lam = pool_rows(B, H, state_indices, slope, q.device, ct, state.shape[0])
    old = state[rows].to(ct)
    new = old * lam[None, :, None, None] + torch.einsum("bhk,bhv->bhkv", k[src].to(ct), v[src].to(ct))
    state[rows] = torch.where(active.any(), new, old).to(state.dtype)
    o = torch.where(active[:, None, None], scale * torch.einsum("bhk,bhkv->bhv", q.to(ct), new), 0.0).to(q.dtype)
    if out is None:
        return o
    out.copy_(o)
    return out


def lightning_attn_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    state: torch.Tensor,
    slope: torch.Tensor | None = None,
    *,
    scale: float = 1.0,
    state_indices: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One decoding step for a batch of sequences; updates ``state`` in place.

    Args:
        q, k: ``[B, H, K]``; v: ``[B, H, V]`` (float16 / bfloat16 / float32, one dtype).
        state: ``[P, H, K, V]`` float32 pool, read and written in place.
        slope: ``[H]`` float32 >= 0 (λ = exp(-slope)) or ``None`` (no decay).
        scale: output scale, default 1.0.
        state_indices: ``[B]`` int32/int64 row of ``state`` for each sequence; ``-1`` = padding slot (its row is
            not touched and its output is zeros). ``None`` means P == B and row b belongs to sequence b.
            Indices outside [-1, P) and duplicate non-negative indices are an error (checked on CPU tensors and with
            LIGHTNING_ATTENTION_DEBUG=1; on CUDA otherwise an index outside the pool is a padding slot).
        out: optional ``[B, H, V]`` output buffer in q.dtype (no allocation: CUDA-graph friendly).

    Input checks (docs/design.md, "Input checks"): structure (types, shapes, dtypes, devices), and that ``state`` and
    ``out`` are not expanded (stride-0) views and share no memory with q, k, v or each other, on every call; the
    slope's range (float32) and ``state_indices`` values on CPU tensors, on CUDA tensors in debug mode. A call that
    fails a check writes nothing. Debug mode also refuses non-finite q, k, v and reports a state that overflows at
    this step (docs/design.md, "Non-finite values and overflow").

    Returns:
        o ``[B, H, V]`` in q.dtype (``out`` when given).

    No host sync unless ``LIGHTNING_ATTENTION_DEBUG=1`` (CUDA tensors), no allocation when ``out`` is given: a step
    with ``out=`` can be captured in a CUDA graph and replayed with new q/k/v/state_indices copied into its inputs.

    Host overhead (a decode step at small batch is bound by it, not by the GPU): the structural checks are
    remembered per signature of shapes, strides, dtypes and devices (:func:`~lightning_attention.ops.lightning.
    decode_validation.check_decode_inputs`) and, in plain eager mode on CUDA, the compiled kernel is launched
    directly once Triton's own launch has been checked against it (:mod:`~lightning_attention.ops.lightning.launch`);
    docs/kernels.md, "Decode", gives the measured costs.

    Example (prefill, then decode from the pool)::

        >>> pool = torch.zeros(8, H, K, V)                     # room for 8 sequences
        >>> o, ht = lightning_attn(q, k, v, slope, output_final_state=True)   # B = 2 prompts
        >>> idx = torch.tensor([5, 2]); pool[idx] = ht
        >>> o_t = lightning_attn_decode(q_t, k_t, v_t, pool, slope, state_indices=idx)

    Pool recipe (packed prompts, chunked prefill, padded decode batch)::

        >>> # prompts of 3 requests packed into one row; request i lives in pool row rows[i]
        >>> rows = torch.tensor([4, 0, 6])
        >>> o, ht = lightning_attn(q, k, v, slope, cu_seqlens=cu, output_final_state=True)
        >>> pool[rows] = ht                                    # prefill -> pool
        >>> # the next chunk of the same prompts continues from the pool (chunked prefill)
        >>> o, ht = lightning_attn(q2, k2, v2, slope, initial_state=pool[rows], cu_seqlens=cu2,
        ...                        output_final_state=True)
        >>> pool[rows] = ht
        >>> # decode batch of 4 slots, one of them empty (-1): its row is untouched, its output zeros
        >>> idx = torch.tensor([4, -1, 0, 6])
        >>> o_t = lightning_attn_decode(q_t, k_t, v_t, pool, slope, state_indices=idx, out=o_buf)

    ``pool[rows]`` gathers a copy (advanced indexing), so prefill never writes the pool behind your back; the
    assignment ``pool[rows] = ht`` is the hand-off. Decode updates the named rows in place.
    """
    structure = check_decode_inputs(q, k, v, state, slope, scale=scale, state_indices=state_indices, out=out)
    if settings.current().debug and not torch.compiler.is_compiling():
        return guarded_decode_step(lambda: _step(q, k, v, state, slope, scale, state_indices, out, structure), q, k,
                                   v, state, state_indices)  # fmt: skip
    return _step(q, k, v, state, slope, scale, state_indices, out, structure)


def _step(q, k, v, state, slope, scale, state_indices, out, structure):
    """The validated step on the backend the settings pick (``structure``: what the inputs passed the checks as)."""
    if use_triton(q):
        return _triton_step()(q, k, v, state, slope, float(scale), state_indices, out, structure)
    with torch.no_grad():
        return decode_step_torch(q, k, v, state, slope, float(scale), state_indices, out)


_DECODE_STEP_TRITON = None


def _triton_step():
    """The Triton step, imported on first use (Triton stays unimported on the PyTorch path) and then kept: an import
    per step costs host time too. (A plain global rather than ``functools.cache``, which torch.compile warns
    about.)"""
    global _DECODE_STEP_TRITON
    if _DECODE_STEP_TRITON is None:
        _DECODE_STEP_TRITON = triton_ops().decode_step_triton
    return _DECODE_STEP_TRITON
