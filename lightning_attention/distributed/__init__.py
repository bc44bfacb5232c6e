"""Sequence parallelism (LASP-2 style) on ``torch.distributed``.

- :func:`lightning_attn_sp` — Lightning Attention over a sequence split across the ranks of a process group;
  ranks called inconsistently all raise the same error (:mod:`~lightning_attention.distributed.call_header`).
- :func:`init_training_mesh`, :func:`data_parallel_mesh`, :func:`init_sequence_parallel` — the ("dp", "sp")
  DeviceMesh of SP × DP, its flattened data-parallel dimension, its process groups;
  :func:`shard_sequence`, :func:`sequence_bounds` — slicing a batch along T.
- :func:`sp_communication_bytes`, :func:`record_communication` — bytes per call (independent of T), predicted and
  recorded.
"""

from lightning_attention.distributed.comm_volume import CommVolume, record_communication, sp_communication_bytes
from lightning_attention.distributed.groups import (
    data_parallel_mesh,
    init_sequence_parallel,
    init_training_mesh,
    sequence_bounds,
    shard_sequence,
)
from lightning_attention.distributed.sequence_parallel import lightning_attn_sp

__all__ = [
    "CommVolume",
    "data_parallel_mesh",
    "init_sequence_parallel",
    "init_training_mesh",
    "lightning_attn_sp",
    "record_communication",
    "sequence_bounds",
    "shard_sequence",
    "sp_communication_bytes",
]
