"""Input checks for the public ops (docs/design.md, "Input checks").

Two kinds of checks:

- structural (rank, shape, dtype, device, head counts, option values): always, no device sync;
- value checks that need the data on the host (slope sign and finiteness, cu_seqlens offsets, state_indices range
  and duplicates): always on CPU tensors, on CUDA tensors only with ``LIGHTNING_ATTENTION_DEBUG=1``
  (a host copy of cu_seqlens passed as ``cu_seqlens_cpu`` is always checked: it costs no sync).

Every error names the argument and gives the expected and the actual value.
"""

import torch

from lightning_attention.backend import value_checks_enabled

INPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
BACKWARD_CHOICES = ("auto", "chunk", "recompute")


def _require_tensor(name: str, x) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")


def _require_ndim(name: str, x: torch.Tensor, ndim: int, layout: str) -> None:
    if x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions {layout}, got shape {tuple(x.shape)}")


def _require_device(name: str, x: torch.Tensor, device: torch.device) -> None:
    if x.device != device:
        raise ValueError(f"{name} must be on {device} (the device of q), got {x.device}")


def _check_qkv(q, k, v, ndim: int, layout_qk: str, layout_v: str) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        _require_tensor(name, x)
    for name, x, layout in (("q", q, layout_qk), ("k", k, layout_qk), ("v", v, layout_v)):
        _require_ndim(name, x, ndim, layout)
    if q.dtype not in INPUT_DTYPES:
        raise TypeError(f"q must be float16, bfloat16 or float32 (float64 for references), got {q.dtype}")
    for name, x in (("k", k), ("v", v)):
        if x.dtype != q.dtype:
            raise TypeError(f"{name} must have the dtype of q ({q.dtype}), got {x.dtype}")
        _require_device(name, x, q.device)
    if k.shape != q.shape:
        raise ValueError(f"k must have the shape of q {tuple(q.shape)} {layout_qk}, got {tuple(k.shape)}")
    if v.shape[:-1] != q.shape[:-1]:
        raise ValueError(
            f"v must have shape {tuple(q.shape[:-1]) + ('V',)} {layout_v} (batch, length and heads of q), "
            f"got {tuple(v.shape)}"
        )
    if q.shape[-1] < 1 or v.shape[-1] < 1:
        raise ValueError(f"head dims must be >= 1, got K={q.shape[-1]}, V={v.shape[-1]}")


def check_slope(slope, num_heads: int, device: torch.device) -> None:
    """slope: None or a floating [H] tensor of finite values >= 0 (λ = exp(-slope) in (0, 1])."""
    if slope is None:
        return
    _check_slope_structure(slope, num_heads, device)
    if value_checks_enabled(slope):
        _check_slope_values(slope)


def _check_slope_structure(slope, num_heads: int, device: torch.device) -> None:
    _require_tensor("slope", slope)
    if not slope.is_floating_point():
        raise TypeError(f"slope must be a floating-point tensor (float32), got {slope.dtype}")
    if slope.shape != (num_heads,):
        raise ValueError(f"slope must have shape [H] = ({num_heads},), got {tuple(slope.shape)}")
    _require_device("slope", slope, device)


def _check_slope_values(slope: torch.Tensor) -> None:
    if not bool(torch.isfinite(slope).all()):
        raise ValueError(f"slope must be finite, got {slope.tolist()}")
    if bool((slope < 0).any()):
        raise ValueError(f"slope must be >= 0 (λ = exp(-slope) <= 1), got {slope.tolist()}")


def _check_state(name: str, state, shape: tuple, q: torch.Tensor) -> None:
    _require_tensor(name, state)
    allowed = (torch.float32, torch.float64) if q.dtype == torch.float64 else (torch.float32,)
    if state.dtype not in allowed:
        raise TypeError(f"{name} must be float32, got {state.dtype}")
    if tuple(state.shape) != shape:
        raise ValueError(f"{name} must have shape [N, H, K, V] = {shape}, got {tuple(state.shape)}")
    _require_device(name, state, q.device)


def _check_offsets(name: str, offsets: list[int], total: int) -> None:
    if offsets[0] != 0:
        raise ValueError(f"{name} must start at 0, got {offsets[0]}")
    if any(b < a for a, b in zip(offsets[:-1], offsets[1:])):
        raise ValueError(f"{name} must be non-decreasing, got {offsets}")
    if offsets[-1] != total:
        raise ValueError(f"{name} must end at T = {total} (the packed length), got {offsets[-1]}")


def check_cu_seqlens(cu_seqlens, cu_seqlens_cpu, q: torch.Tensor) -> int:
    """Checks the varlen offsets and returns N, the number of sequences."""
    _require_tensor("cu_seqlens", cu_seqlens)
    if cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"cu_seqlens must be int32 or int64, got {cu_seqlens.dtype}")
    if cu_seqlens.ndim != 1 or cu_seqlens.numel() < 1:
        raise ValueError(f"cu_seqlens must have shape [N + 1] with N >= 0, got {tuple(cu_seqlens.shape)}")
    _require_device("cu_seqlens", cu_seqlens, q.device)
    if q.shape[0] != 1:
        raise ValueError(f"cu_seqlens requires a packed batch: q must have B == 1, got B = {q.shape[0]}")
    T = q.shape[1]
    if cu_seqlens_cpu is not None:
        _require_tensor("cu_seqlens_cpu", cu_seqlens_cpu)
        if cu_seqlens_cpu.device.type != "cpu" or cu_seqlens_cpu.shape != cu_seqlens.shape:
            raise ValueError(
                f"cu_seqlens_cpu must be a CPU copy of cu_seqlens with shape {tuple(cu_seqlens.shape)}, "
                f"got {tuple(cu_seqlens_cpu.shape)} on {cu_seqlens_cpu.device}"
            )
        if not torch.compiler.is_compiling():  # host data, but still no tracing through .tolist()
            _check_offsets("cu_seqlens_cpu", [int(x) for x in cu_seqlens_cpu.tolist()], T)
    elif value_checks_enabled(cu_seqlens):
        _check_offsets("cu_seqlens", [int(x) for x in cu_seqlens.tolist()], T)
    return cu_seqlens.numel() - 1


def check_lightning_attn_inputs(
    q, k, v, slope, *, scale, initial_state, output_final_state, cu_seqlens, cu_seqlens_cpu, backward
) -> int:
    """Validates the arguments of :func:`lightning_attention.lightning_attn`; returns N (number of sequences)."""
    _check_qkv(q, k, v, 4, "[B, T, H, K]", "[B, T, H, V]")
    B, T, H, K = q.shape
    V = v.shape[-1]
    check_slope(slope, H, q.device)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a Python float, got {type(scale).__name__}")
    if not isinstance(output_final_state, bool):
        raise TypeError(f"output_final_state must be a bool, got {type(output_final_state).__name__}")
    if backward not in BACKWARD_CHOICES:
        raise ValueError(f"backward must be one of {BACKWARD_CHOICES}, got {backward!r}")
    if cu_seqlens is None:
        if cu_seqlens_cpu is not None:
            raise ValueError("cu_seqlens_cpu was given without cu_seqlens")
        N = B
    else:
        N = check_cu_seqlens(cu_seqlens, cu_seqlens_cpu, q)
    if initial_state is not None:
        _check_state("initial_state", initial_state, (N, H, K, V), q)
    return N


# Structural signatures of lightning_attn_decode calls that passed the structural checks (a bounded memo: see
# check_decode_inputs). A decode loop repeats one signature per batch size for thousands of steps.
_DECODE_PASSED: dict[tuple, None] = {}
_DECODE_PASSED_MAX = 1024


def _tensor_signature(x) -> tuple | None:
    return None if x is None else (type(x), x.shape, x.dtype, x.device)


def decode_signature(q, k, v, state, slope, scale, state_indices, out) -> tuple | None:
    """Everything the structural checks of :func:`check_decode_inputs` look at, or ``None`` if it cannot be formed.

    Per argument its type, shape, dtype and device (``None`` stays ``None``), and the type of ``scale``: the checks
    are ``isinstance`` tests and comparisons of these, so two calls with equal signatures pass or fail alike.
    Strides, storage and values are not in it (no structural check reads them). An argument without these
    attributes (not a tensor) gives ``None``: the full checks run and raise the error that names it.
    """
    try:
        return (
            type(q),
            q.shape,
            q.dtype,
            q.device,
            type(k),
            k.shape,
            k.dtype,
            k.device,
            type(v),
            v.shape,
            v.dtype,
            v.device,
            type(state),
            state.shape,
            state.dtype,
            state.device,
            _tensor_signature(slope),
            _tensor_signature(state_indices),
            _tensor_signature(out),
            type(scale),
        )
    except AttributeError:
        return None


def check_decode_inputs(q, k, v, state, slope, *, scale, state_indices, out) -> None:
    """Validates the arguments of :func:`lightning_attention.lightning_attn_decode`.

    The structural checks (types, ranks, shapes, dtypes, devices) depend only on :func:`decode_signature`, so a
    signature that passed once is remembered and a decode loop pays one dict look-up per step instead of the checks
    (measured on CPU, torch 2.13, 2-core x86 VM, B = 1, H = 16, K = V = 128, with slope and state_indices: ~2.3 µs
    instead of ~6 µs). Nothing is remembered while torch.compile traces (the checks are traced as they are) or for
    an input that fails. The value checks (slope sign and finiteness, state_indices range and duplicates) are not
    remembered: they run on every call where enabled (CPU tensors; CUDA with ``LIGHTNING_ATTENTION_DEBUG=1``).
    """
    sig = None if torch.compiler.is_compiling() else decode_signature(q, k, v, state, slope, scale, state_indices, out)
    try:
        passed = sig is not None and sig in _DECODE_PASSED
    except TypeError:  # an unhashable (symbolic) size: check every time
        sig, passed = None, False
    if not passed:
        _check_decode_structure(q, k, v, state, slope, scale, state_indices, out)
        if sig is not None:
            if len(_DECODE_PASSED) >= _DECODE_PASSED_MAX:
                _DECODE_PASSED.clear()
            _DECODE_PASSED[sig] = None
    # every tensor is on q's device by now: one decision for both value checks
    if (slope is not None or state_indices is not None) and value_checks_enabled(q):
        if slope is not None:
            _check_slope_values(slope)
        if state_indices is not None:
            _check_state_indices_values(state_indices, state.shape[0])


def _check_decode_structure(q, k, v, state, slope, scale, state_indices, out) -> None:
    _check_qkv(q, k, v, 3, "[B, H, K]", "[B, H, V]")
    B, H, K = q.shape
    V = v.shape[-1]
    _require_tensor("state", state)
    if state.dtype != torch.float32 and not (q.dtype == torch.float64 and state.dtype == torch.float64):
        raise TypeError(f"state must be float32, got {state.dtype}")
    if state.ndim != 4 or tuple(state.shape[1:]) != (H, K, V):
        raise ValueError(f"state must have shape [P, H, K, V] = [P, {H}, {K}, {V}], got {tuple(state.shape)}")
    _require_device("state", state, q.device)
    if slope is not None:
        _check_slope_structure(slope, H, q.device)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a Python float, got {type(scale).__name__}")
    P = state.shape[0]
    if state_indices is None:
        if P != B:
            raise ValueError(f"state must have P == B = {B} rows when state_indices is None, got P = {P}")
    else:
        _require_tensor("state_indices", state_indices)
        if state_indices.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"state_indices must be int32 or int64, got {state_indices.dtype}")
        if tuple(state_indices.shape) != (B,):
            raise ValueError(f"state_indices must have shape [B] = ({B},), got {tuple(state_indices.shape)}")
        _require_device("state_indices", state_indices, q.device)
    if out is not None:
        _require_tensor("out", out)
        if out.dtype != q.dtype:
            raise TypeError(f"out must have the dtype of q ({q.dtype}), got {out.dtype}")
        if tuple(out.shape) != (B, H, V):
            raise ValueError(f"out must have shape [B, H, V] = ({B}, {H}, {V}), got {tuple(out.shape)}")
        _require_device("out", out, q.device)


def _check_state_indices_values(state_indices: torch.Tensor, num_rows: int) -> None:
    idx = [int(i) for i in state_indices.tolist()]
    bad = [i for i in idx if not -1 <= i < num_rows]
    if bad:
        raise ValueError(f"state_indices must be in [-1, {num_rows}) (-1 = padding slot), got {bad}")
    used = [i for i in idx if i >= 0]
    if len(used) != len(set(used)):
        raise ValueError(f"state_indices must not repeat a non-negative row, got {idx}")
