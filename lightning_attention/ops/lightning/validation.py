"""Input checks for the public ops (docs/design.md, "Input checks").

Three kinds of checks, by what they cost:

- structural (types, ranks, shapes, dtypes, devices, strides, option values, Python numbers): always, no device
  sync, before anything runs;
- value checks that need the data on the host (slope range after conversion to float32, cu_seqlens offsets and
  their agreement with cu_seqlens_cpu, state_indices range and duplicates): always on CPU tensors, on CUDA tensors
  only in debug mode (``LIGHTNING_ATTENTION_DEBUG=1``, :func:`lightning_attention.backend.value_checks_enabled`).
  A host copy passed as ``cu_seqlens_cpu`` is always checked: it costs no sync;
- numeric checks of the data itself (non-finite inputs and overflow): debug mode only
  (:mod:`~lightning_attention.ops.lightning.numerics`).

Nothing here reads a value on the host while torch.compile traces (no graph break). Every error names the argument
and gives the expected and the actual value. The decode step's checks live in
:mod:`~lightning_attention.ops.lightning.decode_validation`.
"""

import operator

import torch

from lightning_attention.backend import value_checks_enabled

INPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
BACKWARD_CHOICES = ("auto", "chunk", "recompute")
OFFSET_DTYPES = (torch.int32, torch.int64)
# Largest slope accepted. λ = exp(-slope) is already 0 in float32 above ~104; the kernels compute the decay in log2
# space as slope·log2(e)·x, which must stay finite in float32 (3.4e38), or the exponent 0 of a token's own term
# becomes inf·0 = NaN.
MAX_SLOPE = 1e38


def require_tensor(name: str, x) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")


def require_ndim(name: str, x: torch.Tensor, ndim: int, layout: str) -> None:
    if x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions {layout}, got shape {tuple(x.shape)}")


def require_device(name: str, x: torch.Tensor, device: torch.device) -> None:
    if x.device != device:
        raise ValueError(f"{name} must be on {device} (the device of q), got {x.device}")


def require_int(name: str, value, minimum: int | None = None) -> int:
    """``value`` as a Python int: an int, or anything with ``__index__`` (a NumPy integer, a 0-d integer tensor), but
    not a bool; ``minimum``: the smallest value allowed. TypeError / ValueError naming ``name`` otherwise."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got bool {value!r}")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}") from None
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def require_float(name: str, value, *, positive: bool = False) -> float:
    """``value`` as a finite Python float (an int or a float, not a bool or a tensor); ``positive``: also > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a Python float, got {type(value).__name__}")
    value = float(value)
    if not -float("inf") < value < float("inf"):
        raise ValueError(f"{name} must be finite, got {value}")
    if positive and not value > 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    return value


def require_bool(name: str, value) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")


def check_qkv(q, k, v, ndim: int, layout_qk: str, layout_v: str) -> None:
    """q, k, v: tensors of rank ``ndim``, one floating dtype and device, k shaped like q, v like q but its last dim."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        require_tensor(name, x)
    for name, x, layout in (("q", q, layout_qk), ("k", k, layout_qk), ("v", v, layout_v)):
        require_ndim(name, x, ndim, layout)
    if q.dtype not in INPUT_DTYPES:
        raise TypeError(f"q must be float16, bfloat16 or float32 (float64 for references), got {q.dtype}")
    for name, x in (("k", k), ("v", v)):
        if x.dtype != q.dtype:
            raise TypeError(f"{name} must have the dtype of q ({q.dtype}), got {x.dtype}")
        require_device(name, x, q.device)
    if k.shape != q.shape:
        raise ValueError(f"k must have the shape of q {tuple(q.shape)} {layout_qk}, got {tuple(k.shape)}")
    if v.shape[:-1] != q.shape[:-1]:
        raise ValueError(
            f"v must have shape {tuple(q.shape[:-1]) + ('V',)} {layout_v} (batch, length and heads of q), "
            f"got {tuple(v.shape)}"
        )
    if q.shape[-1] < 1 or v.shape[-1] < 1:
        raise ValueError(f"head dims must be >= 1, got K={q.shape[-1]}, V={v.shape[-1]}")


# slopes


def check_slope(slope, num_heads: int, device: torch.device, name: str = "slope") -> None:
    """slope: None or a floating [H] tensor on ``device`` whose float32 values lie in [0, MAX_SLOPE] (λ = exp(-slope)
    in (0, 1]). The range is a value check: CPU tensors always, CUDA in debug mode."""
    if slope is None:
        return
    check_slope_structure(slope, num_heads, device, name)
    if value_checks_enabled(slope):
        check_slope_values(slope, name)


def check_slope_structure(slope, num_heads: int, device: torch.device, name: str = "slope") -> None:
    require_tensor(name, slope)
    if not slope.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor (float32), got {slope.dtype}")
    if slope.shape != (num_heads,):
        raise ValueError(f"{name} must have shape [H] = ({num_heads},), got {tuple(slope.shape)}")
    require_device(name, slope, device)


def check_slope_values(slope: torch.Tensor, name: str = "slope") -> None:
    """The values the kernels read (float32: a float64 1e300 is inf there) in [0, MAX_SLOPE]; NaN fails both bounds.
    One reduction and two scalars read back."""
    if slope.numel() == 0:
        return
    low, high = torch.aminmax(slope.detach().to(torch.float32))
    if float(low) >= 0 and float(high) <= MAX_SLOPE:
        return
    values = slope.tolist()
    as_float32 = slope.detach().to(torch.float32)
    if not bool(torch.isfinite(as_float32).all()):
        raise ValueError(f"{name} must be finite in float32 (what the kernels read), got {values}")
    if float(low) < 0:
        raise ValueError(f"{name} must be >= 0 (λ = exp(-slope) <= 1), got {values}")
    raise ValueError(f"{name} must be <= {MAX_SLOPE:g} (λ is 0 in float32 above ~104 already), got {values}")


# states


def check_state(name: str, state, shape: tuple, q: torch.Tensor) -> None:
    require_tensor(name, state)
    allowed = (torch.float32, torch.float64) if q.dtype == torch.float64 else (torch.float32,)
    if state.dtype not in allowed:
        raise TypeError(f"{name} must be float32, got {state.dtype}")
    if tuple(state.shape) != shape:
        raise ValueError(f"{name} must have shape [N, H, K, V] = {shape}, got {tuple(state.shape)}")
    require_device(name, state, q.device)


# packed sequences


def check_offsets(name: str, offsets: list[int], total: int) -> None:
    if offsets[0] != 0:
        raise ValueError(f"{name} must start at 0, got {offsets[0]}")
    if any(b < a for a, b in zip(offsets[:-1], offsets[1:])):
        raise ValueError(f"{name} must be non-decreasing, got {offsets}")
    if offsets[-1] != total:
        raise ValueError(f"{name} must end at T = {total} (the packed length), got {offsets[-1]}")


def _check_offsets_structure(name: str, offsets, shape: tuple | None = None) -> None:
    require_tensor(name, offsets)
    if offsets.dtype not in OFFSET_DTYPES:
        raise TypeError(f"{name} must be int32 or int64, got {offsets.dtype}")
    if shape is not None and tuple(offsets.shape) != shape:
        raise ValueError(f"{name} must have the shape of cu_seqlens {shape}, got {tuple(offsets.shape)}")
    if offsets.ndim != 1 or offsets.numel() < 1:
        raise ValueError(f"{name} must have shape [N + 1] with N >= 0, got {tuple(offsets.shape)}")


def check_cu_seqlens(cu_seqlens, cu_seqlens_cpu, q: torch.Tensor) -> int:
    """Checks the varlen offsets and returns N, the number of sequences.

    Structure always; the values of ``cu_seqlens_cpu`` always (host data); those of ``cu_seqlens``, and that it
    equals ``cu_seqlens_cpu``, where value checks run (CPU tensors; CUDA in debug mode). When ``cu_seqlens_cpu`` is
    given, it is what both backends compute with (docs/design.md, "Input checks").
    """
    _check_offsets_structure("cu_seqlens", cu_seqlens)
    require_device("cu_seqlens", cu_seqlens, q.device)
    if q.shape[0] != 1:
        raise ValueError(f"cu_seqlens requires a packed batch: q must have B == 1, got B = {q.shape[0]}")
    T = q.shape[1]
    host = None
    if cu_seqlens_cpu is not None:
        _check_offsets_structure("cu_seqlens_cpu", cu_seqlens_cpu, tuple(cu_seqlens.shape))
        if cu_seqlens_cpu.device.type != "cpu":
            raise ValueError(
                f"cu_seqlens_cpu must be a CPU tensor (a host copy of cu_seqlens), got {cu_seqlens_cpu.device}"
            )
        if torch.compiler.is_compiling():  # host data, but still no tracing through .tolist()
            return cu_seqlens.numel() - 1
        host = cu_seqlens_cpu.tolist()
        check_offsets("cu_seqlens_cpu", host, T)
    if value_checks_enabled(cu_seqlens):
        device = cu_seqlens.tolist()
        if host is None:
            check_offsets("cu_seqlens", device, T)
        elif device != host:
            raise ValueError(f"cu_seqlens must equal cu_seqlens_cpu (its host copy), got {device} and {host}")
    return cu_seqlens.numel() - 1


def check_lightning_attn_inputs(
    q, k, v, slope, *, scale, initial_state, output_final_state, cu_seqlens, cu_seqlens_cpu, backward
) -> int:
    """Validates the arguments of :func:`lightning_attention.lightning_attn`; returns N (number of sequences).

    Structural checks always; the slope's range and the offsets' values as :func:`check_slope` and
    :func:`check_cu_seqlens` say."""
    check_qkv(q, k, v, 4, "[B, T, H, K]", "[B, T, H, V]")
    B, T, H, K = q.shape
    V = v.shape[-1]
    check_slope(slope, H, q.device)
    require_float("scale", scale)
    require_bool("output_final_state", output_final_state)
    if not isinstance(backward, str) or backward not in BACKWARD_CHOICES:
        raise ValueError(f"backward must be one of {BACKWARD_CHOICES}, got {backward!r}")
    if cu_seqlens is None:
        if cu_seqlens_cpu is not None:
            raise ValueError("cu_seqlens_cpu was given without cu_seqlens")
        N = B
    else:
        N = check_cu_seqlens(cu_seqlens, cu_seqlens_cpu, q)
    if initial_state is not None:
        check_state("initial_state", initial_state, (N, H, K, V), q)
    return N
