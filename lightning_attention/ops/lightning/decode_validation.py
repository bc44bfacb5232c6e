"""Input checks of the decode step (:func:`lightning_attention.lightning_attn_decode`), fast enough for every token.

A decode loop calls the step thousands of times with one structure, so the checks are split by what they depend on:

- structural (types, ranks, shapes, dtypes, devices, strides, option values): a function of the call's
  :func:`decode_signature`, remembered once it passed: later calls of the same signature pay one dict look-up;
- memory (``out`` and ``state`` are written: neither may share memory with q, k, v or with each other, nor have a
  stride-0 dimension, which would write one element from several places): the stride part is structural, the
  address ranges are compared on every call (a few integer comparisons);
- values (slope range after conversion to float32, state_indices range and duplicates): on every call where value
  checks run (CPU tensors; CUDA in debug mode: they need a device->host copy).

On CUDA without debug mode an invalid state_indices value cannot reach memory outside the pool: the kernel treats
an index outside [-1, P) as a padding slot (docs/design.md, "Input checks").
"""

import torch

from lightning_attention.backend import value_checks_enabled
from lightning_attention.ops.lightning.validation import (
    OFFSET_DTYPES,
    check_qkv,
    check_slope_structure,
    check_slope_values,
    require_device,
    require_float,
    require_tensor,
)

_NAMES = ("q", "k", "v", "state", "out")  # the order of the tensors in the memoised pairs


class PassedStructure:
    """A structure of decode calls (one :func:`decode_signature`) that passed the structural checks.

    ``pairs``: the ``(written, other, extent of written, extent of other)`` address ranges its calls compare
    (:func:`_overlap_pairs`); ``starts``: the data pointers of q, k, v, state and out of the last call that passed
    that comparison (the extents are fixed by the structure, so the same pointers pass again: a loop that reuses its
    buffers compares one tuple). Hashed by identity, so a backend can key what the structure fixes of its launch on it
    at the cost of a pointer hash (``decode_triton``)."""

    __slots__ = ("pairs", "starts")

    def __init__(self, pairs: tuple):
        self.pairs, self.starts = pairs, None


# Signatures that passed the structural checks (a bounded memo: see check_decode_inputs). A decode loop repeats one
# signature per batch size for thousands of steps.
_DECODE_PASSED: dict[tuple, PassedStructure] = {}
_DECODE_PASSED_MAX = 1024


def _opt(x) -> tuple | None:
    return None if x is None else (type(x), x.shape, x.dtype, x.device)


def decode_signature(q, k, v, state, slope, scale, state_indices, out) -> tuple | None:
    """Everything the structural checks of :func:`check_decode_inputs` look at, or ``None`` if it cannot be formed.

    Per argument its type, shape, dtype and device (``None`` stays ``None``), the strides of q, k, v, state and out,
    and the type of ``scale``: the checks are ``isinstance`` tests and comparisons of these, so two calls with equal
    signatures pass or fail alike (and q, k, v, state, out span the same number of bytes). Storage and values are
    not in it. An argument without these attributes (not a tensor) gives ``None``: the full checks run and raise the
    error that names it. (Spelled out flat: this runs on every decode step.)
    """
    try:
        return (
            type(q), q.shape, q.stride(), q.dtype, q.device,
            type(k), k.shape, k.stride(), k.dtype, k.device,
            type(v), v.shape, v.stride(), v.dtype, v.device,
            type(state), state.shape, state.stride(), state.dtype, state.device,
            _opt(slope), _opt(state_indices), None if out is None else (_opt(out), out.stride()), type(scale),
        )  # fmt: skip
    except (AttributeError, TypeError):
        return None


def check_decode_inputs(q, k, v, state, slope, *, scale, state_indices, out) -> PassedStructure:
    """Validates the arguments of :func:`lightning_attention.lightning_attn_decode` (module docstring) and returns
    the structure they passed as.

    The structural checks are remembered per :func:`decode_signature` (the cost per step: docs/design.md, "Input
    checks"). Nothing is remembered while torch.compile traces (the checks are traced as they are) or for an input
    that fails; a structure that is not remembered is returned all the same (a new object on every call).
    """
    compiling = torch.compiler.is_compiling()
    sig = None if compiling else decode_signature(q, k, v, state, slope, scale, state_indices, out)
    try:
        passed = None if sig is None else _DECODE_PASSED.get(sig)
    except TypeError:  # an unhashable (symbolic) size: check every time
        sig, passed = None, None
    if passed is None:
        _check_decode_structure(q, k, v, state, slope, scale, state_indices, out)
        passed = PassedStructure(_overlap_pairs(q, k, v, state, out))
        if sig is not None:
            if len(_DECODE_PASSED) >= _DECODE_PASSED_MAX:
                _DECODE_PASSED.clear()
            _DECODE_PASSED[sig] = passed
    if passed.pairs and not compiling:  # addresses cannot be traced (a fake tensor has none)
        starts = (q.data_ptr(), k.data_ptr(), v.data_ptr(), state.data_ptr(), None if out is None else out.data_ptr())
        if starts != passed.starts:
            for w, i, extent_w, extent_i in passed.pairs:
                if starts[i] < starts[w] + extent_w and starts[w] < starts[i] + extent_i:
                    raise _shared_memory_error(_NAMES[w], _NAMES[i])
            passed.starts = starts
    # every tensor is on q's device by now: one decision for both value checks
    if (slope is not None or state_indices is not None) and value_checks_enabled(q):
        if slope is not None:
            check_slope_values(slope)
        if state_indices is not None:
            check_state_indices_values(state_indices, state.shape[0])
    return passed


def memory_extent(x: torch.Tensor | None) -> int:
    """Bytes from ``x.data_ptr()`` to one past its last element (0 for None or an empty tensor)."""
    if x is None or x.numel() == 0:
        return 0
    return (1 + sum((n - 1) * s for n, s in zip(x.shape, x.stride()))) * x.element_size()


def _overlap_pairs(q, k, v, state, out) -> tuple:
    """``(written, other, extent of written, extent of other)`` (indices into (q, k, v, state, out)) for state
    against q, k, v and out against q, k, v, state, where both are non-empty: the address ranges a call compares.
    Extents depend on shapes and strides only, so they are remembered with the signature. (slope and state_indices,
    a few bytes of other dtypes, are left out: this runs on every step.)"""
    extents = [memory_extent(x) for x in (q, k, v, state, out)]
    candidates = [(3, i) for i in range(3)] + [(4, i) for i in range(4)]
    return tuple((w, i, extents[w], extents[i]) for w, i in candidates if extents[w] and extents[i])


def _shared_memory_error(written: str, other: str) -> ValueError:
    return ValueError(
        f"{written} must not share memory with {other}: {written} is written in place while {other} is in use "
        f"(pass separate tensors; two interleaved views of one buffer count as sharing it)"
    )


def check_no_shared_memory(written: dict, others: dict) -> None:
    """Each tensor of ``written`` (name -> tensor or None) overlaps none of ``others`` nor another written one
    (address ranges, as in the decode step's check; for callers off its memoised path)."""
    items = [(name, x.data_ptr(), memory_extent(x)) for name, x in {**written, **others}.items() if x is not None]
    for a, (name_a, start_a, ext_a) in enumerate(items):
        if name_a not in written:
            continue
        for b, (name_b, start_b, ext_b) in enumerate(items):
            if b != a and (b > a or name_b not in written) and ext_a and ext_b:
                if start_b < start_a + ext_a and start_a < start_b + ext_b:
                    raise _shared_memory_error(name_a, name_b)


def require_no_broadcast(name: str, x: torch.Tensor) -> None:
    """A written tensor must not have a stride-0 dimension of size > 1 (an expanded view): its rows would share
    memory, and each write would land in every row."""
    if any(s == 0 and n > 1 for n, s in zip(x.shape, x.stride())):
        raise ValueError(
            f"{name} must not be an expanded (stride-0) view: it is written in place, got shape {tuple(x.shape)} "
            f"with strides {x.stride()}"
        )


def _check_decode_structure(q, k, v, state, slope, scale, state_indices, out) -> None:
    check_qkv(q, k, v, 3, "[B, H, K]", "[B, H, V]")
    B, H, K = q.shape
    V = v.shape[-1]
    require_tensor("state", state)
    if state.dtype != torch.float32 and not (q.dtype == torch.float64 and state.dtype == torch.float64):
        raise TypeError(f"state must be float32, got {state.dtype}")
    if state.ndim != 4 or tuple(state.shape[1:]) != (H, K, V):
        raise ValueError(f"state must have shape [P, H, K, V] = [P, {H}, {K}, {V}], got {tuple(state.shape)}")
    require_device("state", state, q.device)
    require_no_broadcast("state", state)
    if slope is not None:
        check_slope_structure(slope, H, q.device)
    require_float("scale", scale)
    P = state.shape[0]
    if state_indices is None:
        if P != B:
            raise ValueError(f"state must have P == B = {B} rows when state_indices is None, got P = {P}")
    else:
        check_state_indices_structure(state_indices, B, q.device)
    if out is not None:
        check_out(out, (B, H, V), q)


def check_state_indices_structure(state_indices, batch: int, device: torch.device) -> None:
    require_tensor("state_indices", state_indices)
    if state_indices.dtype not in OFFSET_DTYPES:
        raise TypeError(f"state_indices must be int32 or int64, got {state_indices.dtype}")
    if tuple(state_indices.shape) != (batch,):
        raise ValueError(f"state_indices must have shape [B] = ({batch},), got {tuple(state_indices.shape)}")
    require_device("state_indices", state_indices, device)


def check_out(out, shape: tuple, q: torch.Tensor) -> None:
    """``out``: a ``shape`` tensor in q's dtype on q's device, without stride-0 dimensions."""
    require_tensor("out", out)
    if out.dtype != q.dtype:
        raise TypeError(f"out must have the dtype of q ({q.dtype}), got {out.dtype}")
    if tuple(out.shape) != shape:
        raise ValueError(f"out must have shape [B, H, V] = {shape}, got {tuple(out.shape)}")
    require_device("out", out, q.device)
    require_no_broadcast("out", out)


def check_state_indices_values(state_indices: torch.Tensor, num_rows: int) -> None:
    idx = [int(i) for i in state_indices.tolist()]
    bad = [i for i in idx if not -1 <= i < num_rows]
    if bad:
        raise ValueError(f"state_indices must be in [-1, {num_rows}) (-1 = padding slot), got {bad}")
    used = [i for i in idx if i >= 0]
    if len(used) != len(set(used)):
        raise ValueError(f"state_indices must not repeat a non-negative row, got {idx}")
