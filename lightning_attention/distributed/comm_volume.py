"""Communication volume of sequence-parallel Lightning Attention: predicted and recorded.

LASP-2 exchanges per-rank *states*, never tokens: one all-gather of ``[B, H, K, V]`` per direction, so the bytes a
layer sends do not depend on the sequence length T. Calls that check the ranks' consistency add one all-gather of a
fixed-size header first (:mod:`lightning_attention.distributed.call_header`). Two tools make that visible:

- :func:`sp_communication_bytes` predicts the bytes of one call from the shapes (T is deliberately not an argument);
- :func:`record_communication` records the buffers :func:`~lightning_attention.distributed.lightning_attn_sp`
  actually hands to ``torch.distributed``, so a test or a benchmark can check the prediction at several T.
"""

import contextlib
import dataclasses

import torch
import torch.distributed as dist

# Two float slots carry a rank's slice length next to its state (see sequence_parallel._encode_length).
LENGTH_SLOTS = 2


@dataclasses.dataclass(frozen=True)
class CommVolume:
    """Bytes of one ``lightning_attn_sp`` call, per rank.

    ``*_send``: the buffer this rank contributes to the all-gather. ``*_recv``: the gathered buffer it receives
    (all ranks' contributions, its own included). With a ring all-gather each rank puts
    ``(world_size - 1) * send`` bytes on the wire. ``check_*``: the call header, 0 on calls that do not check it.
    """

    forward_send: int
    forward_recv: int
    backward_send: int
    backward_recv: int
    check_send: int = 0
    check_recv: int = 0

    @property
    def total_send(self) -> int:
        return self.check_send + self.forward_send + self.backward_send


def sp_communication_bytes(
    batch: int,
    num_heads: int,
    head_dim_k: int,
    head_dim_v: int,
    world_size: int,
    *,
    output_final_state: bool = False,
    state_dtype: torch.dtype = torch.float32,
    checked: bool = False,
) -> CommVolume:
    """Bytes that one ``lightning_attn_sp`` call (forward + backward) moves per rank; independent of T.

    Forward gathers every rank's local state ``[B, H, K, V]`` plus its slice length; backward gathers the gradient
    of every rank's incoming state (and, with ``output_final_state``, of the final state). ``checked``: the call
    also exchanges the call header (every call on CPU tensors or in debug mode, the first call of a signature on
    CUDA). A group of one rank runs the single-device op and communicates nothing.
    """
    # imported here: call_header records its collective through this module
    from lightning_attention.distributed.call_header import HEADER_BYTES

    if world_size <= 1:
        return CommVolume(0, 0, 0, 0)
    itemsize = torch.empty((), dtype=state_dtype).element_size()
    state = batch * num_heads * head_dim_k * head_dim_v
    fwd = (state + LENGTH_SLOTS) * itemsize
    bwd = (2 if output_final_state else 1) * state * itemsize
    check = HEADER_BYTES if checked else 0
    return CommVolume(fwd, world_size * fwd, bwd, world_size * bwd, check, world_size * check)


@dataclasses.dataclass
class CollectiveRecord:
    """One collective issued by ``lightning_attn_sp``: ``direction`` is ``"check"`` (the call header),
    ``"forward"`` or ``"backward"``."""

    direction: str
    send_bytes: int
    recv_bytes: int


_active_recorders: list[list[CollectiveRecord]] = []


@contextlib.contextmanager
def record_communication():
    """Records every collective that ``lightning_attn_sp`` issues inside the block (on this rank).

    Example::

        >>> with record_communication() as log:
        ...     o, _ = lightning_attn_sp(q, k, v, slope, group=g)
        ...     o.backward(do)
        >>> [(c.direction, c.send_bytes) for c in log]  # CPU tensors: the call header is checked on every call
        [('check', 136), ('forward', 262152), ('backward', 262144)]
    """
    log: list[CollectiveRecord] = []
    _active_recorders.append(log)
    try:
        yield log
    finally:
        _active_recorders.remove(log)


def _note_collective(direction: str, send: torch.Tensor, recv: torch.Tensor) -> None:
    """Appends one record to every active log; cheap when nothing records."""
    if not _active_recorders:
        return
    record = CollectiveRecord(
        direction, send.numel() * send.element_size(), recv.numel() * recv.element_size()
    )
    for log in _active_recorders:
        log.append(record)


# Recent torch (2.13 here) deprecates all_gather_into_tensor for all_gather_single (same semantics); the GPU
# machine's torch 2.11 has only the former. getattr also keeps builds without torch.distributed importable.
_all_gather_flat = getattr(dist, "all_gather_single", None) or getattr(dist, "all_gather_into_tensor", None)


def recorded_all_gather(send: torch.Tensor, world_size: int, group, direction: str) -> torch.Tensor:
    """Gathers a flat buffer from every rank of ``group``: returns ``[world_size, send.numel()]``.

    The one place where the sequence-parallel op issues a collective, so that :func:`record_communication` sees
    every one of them (``direction``: ``"check"``, ``"forward"`` or ``"backward"``).
    """
    recv = send.new_empty(world_size * send.numel())
    _note_collective(direction, send, recv)
    _all_gather_flat(recv, send, group=group)
    return recv.view(world_size, send.numel())
