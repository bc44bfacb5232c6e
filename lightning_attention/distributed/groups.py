"""Process groups for sequence parallelism composed with data parallelism, and sharding a batch along T.

With world size W = sp_size · dp_size, ranks are laid out as a grid ``rank = dp_index · sp_size + sp_rank``:

    sequence-parallel groups (contiguous):  {0, 1, …, sp-1}, {sp, …, 2sp-1}, …     one replica of the model each
    data-parallel groups (strided):         {0, sp, 2sp, …}, {1, sp+1, …}, …       same slice position, other data

Contiguous SP groups keep one sequence on neighbouring GPUs (the same node when sp_size ≤ GPUs per node), where the
per-layer state all-gather is cheapest; gradients are then averaged over the DP group, as DDP would.
"""

import torch
import torch.distributed as dist


def init_sequence_parallel(sp_size: int) -> tuple["dist.ProcessGroup", "dist.ProcessGroup"]:
    """Creates the sequence- and data-parallel groups of the default group; returns this rank's ``(sp, dp)`` pair.

    Must be called by every rank of the default group (``torch.distributed.new_group`` is collective), after
    ``init_process_group``. ``sp_size`` must divide the world size; ``sp_size == 1`` gives SP groups of one rank
    (then ``lightning_attn_sp`` is the single-device op) and one DP group of all ranks.
    """
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("init_sequence_parallel needs torch.distributed.init_process_group first")
    if isinstance(sp_size, bool) or not isinstance(sp_size, int) or sp_size < 1:
        raise ValueError(f"sp_size must be a positive int, got {sp_size!r}")
    world_size, rank = dist.get_world_size(), dist.get_rank()
    if world_size % sp_size != 0:
        raise ValueError(f"sp_size must divide the world size {world_size}, got {sp_size}")
    dp_size = world_size // sp_size

    sp_group = dp_group = None
    # new_group is collective: every rank creates every group, in the same order, and keeps its own.
    for dp_index in range(dp_size):
        ranks = list(range(dp_index * sp_size, (dp_index + 1) * sp_size))
        group = dist.new_group(ranks)
        if rank in ranks:
            sp_group = group
    for sp_rank in range(sp_size):
        ranks = list(range(sp_rank, world_size, sp_size))
        group = dist.new_group(ranks)
        if rank in ranks:
            dp_group = group
    return sp_group, dp_group


def sequence_bounds(length: int, rank: int, world_size: int) -> tuple[int, int]:
    """``(start, end)`` of rank ``rank``'s contiguous slice of ``length`` tokens split over ``world_size`` ranks.

    Balanced like ``torch.tensor_split``: the first ``length % world_size`` ranks get one token more. Any
    ``length >= 0`` works; a rank may get an empty slice when ``length < world_size``.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    if length < 0:
        raise ValueError(f"length must be >= 0, got {length}")
    base, extra = divmod(length, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def shard_sequence(x: torch.Tensor, group: "dist.ProcessGroup | None" = None, *, dim: int = 1) -> torch.Tensor:
    """This rank's contiguous slice of ``x`` along the sequence dimension ``dim`` (a view, no copy).

    ``x`` is the full batch, identical on every rank of ``group`` (e.g. ``[B, T]`` token ids or ``[B, T, D]``
    embeddings); slices follow :func:`sequence_bounds`, in rank order, as ``lightning_attn_sp`` expects. For
    language-model training shift the targets *before* sharding, so that each rank's labels line up with its inputs.
    ``group=None`` uses the default group; without torch.distributed initialised it returns ``x`` whole.
    """
    if not (dist.is_available() and dist.is_initialized()):
        if group is not None:
            raise RuntimeError("shard_sequence got a process group but torch.distributed is not initialised")
        return x
    start, end = sequence_bounds(x.shape[dim], dist.get_rank(group), dist.get_world_size(group))
    return x.narrow(dim, start, end - start)
