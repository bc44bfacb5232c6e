"""Communication volume of sequence-parallel Lightning Attention: predicted and recorded.

LASP-2 exchanges per-rank *states*, never tokens: one all-gather of ``[B, H, K, V]`` per direction, so the bytes a
layer sends do not depend on the sequence length T. Two tools make that visible:

- :func:`sp_communication_bytes` predicts the bytes of one call from the shapes (T is deliberately not an argument);
- :func:`record_communication` records the buffers :func:`~lightning_attention.distributed.lightning_attn_sp`
  actually hands to ``torch.distributed``, so a test or a benchmark can check the prediction at several T.
"""

import contextlib
import dataclasses

import torch

# Two float slots carry a rank's slice length next to its state (see sequence_parallel._encode_length).
LENGTH_SLOTS = 2


@dataclasses.dataclass(frozen=True)
class CommVolume:
    """Bytes of one ``lightning_attn_sp`` call, per rank.

    ``*_send``: the buffer this rank contributes to the all-gather. ``*_recv``: the gathered buffer it receives
    (all ranks' contributions, its own included). With a ring all-gather each rank puts
    ``(world_size - 1) * send`` bytes on the wire.
    """

    forward_send: int
    forward_recv: int
    backward_send: int
    backward_recv: int

    @property
    def total_send(self) -> int:
        return self.forward_send + self.backward_send


def sp_communication_bytes(
    batch: int,
    num_heads: int,
    head_dim_k: int,
    head_dim_v: int,
    world_size: int,
    *,
    output_final_state: bool = False,
    state_dtype: torch.dtype = torch.float32,
) -> CommVolume:
    """Bytes that one ``lightning_attn_sp`` call (forward + backward) moves per rank; independent of T.

    Forward gathers every rank's local state ``[B, H, K, V]`` plus its slice length; backward gathers the gradient
    of every rank's incoming state (and, with ``output_final_state``, of the final state). A group of one rank runs
    the single-device op and communicates nothing.
    """
    if world_size <= 1:
        return CommVolume(0, 0, 0, 0)
    itemsize = torch.empty((), dtype=state_dtype).element_size()
    state = batch * num_heads * head_dim_k * head_dim_v
    fwd = (state + LENGTH_SLOTS) * itemsize
    bwd = (2 if output_final_state else 1) * state * itemsize
    return CommVolume(fwd, world_size * fwd, bwd, world_size * bwd)


@dataclasses.dataclass
class CollectiveRecord:
    """One collective issued by ``lightning_attn_sp``: ``direction`` is ``"forward"`` or ``"backward"``."""

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
        >>> [(c.direction, c.send_bytes) for c in log]
        [('forward', 262152), ('backward', 262144)]
    """
    log: list[CollectiveRecord] = []
    _active_recorders.append(log)
    try:
        yield log
    finally:
        _active_recorders.remove(log)


def note_collective(direction: str, send: torch.Tensor, recv: torch.Tensor) -> None:
    """Called by the sequence-parallel op next to each collective; cheap when nothing records."""
    if not _active_recorders:
        return
    record = CollectiveRecord(
        direction, send.numel() * send.element_size(), recv.numel() * recv.element_size()
    )
    for log in _active_recorders:
        log.append(record)
