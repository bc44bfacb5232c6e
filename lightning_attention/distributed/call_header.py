"""The call header of sequence-parallel Lightning Attention: one small all-gather that makes every rank agree.

:func:`~lightning_attention.distributed.lightning_attn_sp` is collective: every rank of the group must call it with
the same batch, heads, head dims, dtype, scale, slope and flags, or the state exchange that follows pairs up
buffers of different sizes (gloo aborts the process inside the collective, NCCL may hang) or, worse, of equal size
and another meaning (a silently wrong answer). Before the state exchange each rank therefore sends a fixed-size
header of :data:`HEADER_SLOTS` int64 values (:data:`HEADER_BYTES` bytes) with one all-gather:

======================  =====================================================================================
slot                    content
======================  =====================================================================================
format                  a constant naming this header layout (a peer with another layout is reported as such)
status                  0, or 1 when this rank's own inputs failed validation (it re-raises its own error)
B, H, K, V              batch, heads, head dims of q/k and of v
T_r                     this rank's slice length (listed in the error, never compared: slices may differ)
dtype, device type      of q (k and v are checked against q on each rank)
output_final_state      the flag
initial_state given     whether h0 was passed
slope given             whether a decay was passed
runs backward           grad mode is on and an input requires grad: this rank will join the backward all-gather
debug mode              ``LIGHTNING_ATTENTION_DEBUG`` is on
checks every call       this rank exchanges the header on every call (see below)
scale                   the float64 bits of ``scale``
slope checksum          a 64-bit checksum of the slope's values (0 without slope), see :func:`checksum`
initial_state checksum  the same of h0's values, with ``LIGHTNING_ATTENTION_DEBUG=1`` only (else 0)
======================  =====================================================================================

Every rank receives every header, so every rank finds the same difference and raises the same ``ValueError``
(naming the field and each rank's value) before any state is exchanged; a rank whose own inputs were invalid
raises its own ``ValueError``/``TypeError`` and the others say which rank rejected its inputs. Nobody hangs and
the group stays usable.

When the header is exchanged:

- **CPU tensors (gloo), or LIGHTNING_ATTENTION_DEBUG=1: on every call.** Reading the gathered header costs no
  device sync there. Measured with ``benchmarks/sp_header_cost.py --device cpu`` (2 gloo ranks on a shared 2-core
  x86 VM under load, torch 2.13, H = 16 with slope, 3 runs): about 40 µs of host work per call (the header with
  its slope checksum 9-14 µs, the comparison 18 µs), plus one all-gather of 144 bytes per rank, 0.3-0.7 ms bare
  on that machine; the whole check took 0.8-1.3 ms per call, next to 12-29 ms for the forward of a 256-token slice
  (K = V = 64, float32), where the difference with and without the header was within the run-to-run noise.
- **CUDA tensors (NCCL): on the first call of each call signature** (group, B, H, K, V, dtype, flags, scale), then
  remembered: reading the header back is a device->host sync, which the steady-state path must not pay. A later
  call that differs from the others only in a way the signature does not see (another slope of the same shape, an
  h0 on one rank only after it was checked with h0 on all) is not caught there; ``LIGHTNING_ATTENTION_DEBUG=1``
  checks every call. Measure the cost of a checked call on NCCL (the first call of a signature, or every call in
  debug mode) with ``torchrun --standalone --nproc_per_node 2 benchmarks/sp_header_cost.py --device cuda``.

The decision must be the same on every rank: it depends on the tensors' device, the backend and the debug flag,
which the header itself carries, so a rank running with another ``LIGHTNING_ATTENTION_DEBUG`` is reported on the
first call. Limits: under NCCL, after a signature was checked, a rank whose own inputs are invalid raises at once
and the other ranks wait in the state exchange until the process group's timeout.
"""

import hashlib
import struct

import torch
import torch.distributed as dist

from lightning_attention import settings
from lightning_attention.distributed.comm_volume import recorded_all_gather

# "LASP" and the layout's version: a peer that sends anything else is reported instead of misread.
HEADER_FORMAT = 0x4C415350_0001

# (key, description) of each slot, in order.
_FIELDS = (
    ("format", "format"),
    ("status", "status"),
    ("B", "B (batch)"),
    ("H", "H (heads)"),
    ("K", "K (head dim of q and k)"),
    ("V", "V (head dim of v)"),
    ("T_r", "T_r (slice length)"),
    ("dtype", "dtype"),
    ("device", "device type"),
    ("output_final_state", "output_final_state"),
    ("has_initial_state", "initial_state given"),
    ("has_slope", "slope given"),
    ("runs_backward", "runs backward (grad mode on and an input requires grad)"),
    ("debug", "debug mode (LIGHTNING_ATTENTION_DEBUG)"),
    ("every_call", "checks every call (CPU tensors, gloo or debug mode)"),
    ("scale", "scale"),
    ("slope", "slope (checksum of its values)"),
    ("initial_state", "initial_state (checksum of its values, debug mode)"),
)
HEADER_SLOTS = len(_FIELDS)
HEADER_BYTES = 8 * HEADER_SLOTS
_SLOT = {key: i for i, (key, _) in enumerate(_FIELDS)}
# Compared across ranks: everything but the format and status (handled first) and the slice length (free per rank).
_COMPARED = [i for i, (key, _) in enumerate(_FIELDS) if key not in ("format", "status", "T_r")]
# Remembered by the first-call rule: the compared host-side values (the checksums need the data, hence a sync).
_SIGNATURE = [i for i in _COMPARED if _FIELDS[i][0] not in ("slope", "initial_state")]
_CHECKSUM_GUARDS = {"slope": ("has_slope",), "initial_state": ("has_initial_state", "debug")}
_FLAGS = ("output_final_state", "has_initial_state", "has_slope", "runs_backward", "debug", "every_call")

_STATUS_OK, _STATUS_INVALID = 0, 1
_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_DEVICE_TYPES = ("cpu", "cuda")

# Signatures already checked under the first-call rule (see the module docstring). Bounded: a process that cycles
# through more signatures clears it, on every rank alike (they see the same calls), and checks them again.
_CHECKED: dict[tuple, None] = {}
_CHECKED_MAX = 1024


def checksum(x: torch.Tensor) -> int:
    """A 64-bit checksum (BLAKE2b) of the values of ``x`` (any float tensor) as a signed int64.

    Values are hashed as their exact float64 bit patterns, in order (``-0.0`` counts as ``0.0``), so equal values
    in float32 and float64 agree and any other difference shows (collisions: about 2^-64). Runs on the host
    (hashlib): a slope of H values costs a few µs; on CUDA reading the values syncs.
    """
    values = [float(value) + 0.0 for value in x.detach().reshape(-1).tolist()]
    digest = hashlib.blake2b(struct.pack(f"<{len(values)}d", *values), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def _float_bits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", float(x)))[0]


def _collective_device(q, group) -> torch.device:
    """Where the header travels: q's device, or (q not a tensor) the CPU unless the group is NCCL-only."""
    if isinstance(q, torch.Tensor):
        return q.device
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def checks_every_call(device: torch.device, group) -> bool:
    """Whether the header is exchanged on every call here (CPU tensors, a gloo group, or debug mode)."""
    return device.type == "cpu" or settings.current().debug or dist.get_backend(group) == "gloo"


def _header(q, k, v, slope, scale, initial_state, output_final_state, every_call: bool) -> list[int]:
    """This rank's header of valid inputs (q, k, v ``[B, T_r, H, K|V]``, slope ``[H]``, h0 ``[B, H, K, V]``),
    with the checksum slots still 0: they read tensor data (a sync on CUDA), see :func:`_add_checksums`."""
    B, T, H, K = q.shape
    inputs = [x for x in (q, k, v, slope, initial_state) if x is not None]
    runs_backward = torch.is_grad_enabled() and any(x.requires_grad for x in inputs)
    return [
        HEADER_FORMAT,
        _STATUS_OK,
        B,
        H,
        K,
        v.shape[-1],
        T,
        _DTYPES.index(q.dtype),
        _DEVICE_TYPES.index(q.device.type) if q.device.type in _DEVICE_TYPES else len(_DEVICE_TYPES),
        int(output_final_state),
        int(initial_state is not None),
        int(slope is not None),
        int(runs_backward),
        int(settings.current().debug),
        int(every_call),
        _float_bits(scale),
        0,
        0,
    ]


def _add_checksums(header: list[int], slope, initial_state) -> None:
    """Fills the checksum slots of ``header``: the slope's always, h0's in debug mode."""
    if slope is not None:
        header[_SLOT["slope"]] = checksum(slope)
    if header[_SLOT["debug"]] and initial_state is not None:
        header[_SLOT["initial_state"]] = checksum(initial_state)


def _signature(group, header: list[int]) -> tuple:
    """What the first-call rule remembers: the group and every compared host-side value (no checksums)."""
    return (group, *(header[i] for i in _SIGNATURE))


def _describe(field: int, value: int) -> str:
    name = _FIELDS[field][0]
    if name == "dtype":
        return str(_DTYPES[value]) if 0 <= value < len(_DTYPES) else f"code {value}"
    if name == "device":
        return _DEVICE_TYPES[value] if 0 <= value < len(_DEVICE_TYPES) else "other"
    if name == "scale":
        return repr(struct.unpack("<d", struct.pack("<q", value))[0])
    if name in ("slope", "initial_state"):
        return f"{value & 0xFFFFFFFFFFFFFFFF:016x}"
    if name in _FLAGS:
        return str(bool(value))
    return str(value)


def _compare(headers: list[list[int]]) -> str | None:
    """The message describing how the gathered headers disagree, or ``None`` when they agree."""
    formats = [h[_SLOT["format"]] for h in headers]
    if any(f != HEADER_FORMAT for f in formats):
        other = [r for r, f in enumerate(formats) if f != HEADER_FORMAT]
        return (
            f"rank(s) {other} of the group sent a call header of another format: they run another version of "
            "lightning_attention, or another collective is in flight on this group"
        )
    invalid = [r for r, h in enumerate(headers) if h[_SLOT["status"]] != _STATUS_OK]
    if invalid:
        return f"rank(s) {invalid} of the group rejected their own inputs (the error raised there names the argument)"
    lines = []
    for field in _COMPARED:
        values = [h[field] for h in headers]
        # a checksum is compared only where what it covers is present, and checked, on every rank
        guards = _CHECKSUM_GUARDS.get(_FIELDS[field][0], ())
        if any(len({h[_SLOT[g]] for h in headers}) > 1 for g in guards):
            continue
        if len(set(values)) > 1:
            per_rank = ", ".join(f"rank {r}: {_describe(field, x)}" for r, x in enumerate(values))
            lines.append(f"  {_FIELDS[field][1]} differs: {per_rank}")
    if not lines:
        return None
    lengths = [h[_SLOT["T_r"]] for h in headers]
    return (
        "the ranks of the group called it inconsistently (every rank must pass the same B, H, K, V, dtype, scale, "
        "slope, flags and h0, with grad mode and requires-grad alike):\n"
        + "\n".join(lines)
        + f"\n  (slice lengths T_r per rank: {lengths})"
    )


def check_call_consistency(
    group, world_size: int, q, k, v, slope, scale, initial_state, output_final_state, local_error: Exception | None
) -> None:
    """Exchanges this rank's call header and raises on every rank if the ranks disagree (see the module docstring).

    ``local_error`` is this rank's own validation error (or ``None``); it is re-raised here after the exchange, so
    the other ranks learn of it instead of waiting in a collective. Raises ``ValueError`` on inconsistent calls.
    """
    device = _collective_device(q, group)
    every_call = checks_every_call(device, group)
    if local_error is not None:
        if not every_call:  # the others may not exchange a header now (first-call rule): do not wait for them
            raise local_error
        header = [HEADER_FORMAT, _STATUS_INVALID] + [0] * (HEADER_SLOTS - 2)
    else:
        header = _header(q, k, v, slope, scale, initial_state, output_final_state, every_call)
        signature = None if every_call else _signature(group, header)
        if signature is not None and signature in _CHECKED:
            return
        _add_checksums(header, slope, initial_state)

    gathered = recorded_all_gather(torch.tensor(header, dtype=torch.int64).to(device), world_size, group, "check")
    problem = _compare(gathered.tolist())
    if local_error is not None:
        raise local_error
    if problem is not None:
        raise ValueError(f"lightning_attn_sp: {problem}")
    if not every_call:
        if len(_CHECKED) >= _CHECKED_MAX:
            _CHECKED.clear()
        _CHECKED[signature] = None
