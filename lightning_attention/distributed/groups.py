"""The ("dp", "sp") device mesh of sequence parallelism composed with data parallelism, and sharding a batch along T.

With world size W = dp_size · sp_size, ranks are laid out as a grid ``rank = dp_index · sp_size + sp_rank``, one
:class:`torch.distributed.device_mesh.DeviceMesh` with named dimensions:

    "sp" (inner, contiguous):  {0, 1, …, sp-1}, {sp, …, 2sp-1}, …     one model replica each, its sequences split
    "dp" (outer, strided):     {0, sp, 2sp, …}, {1, sp+1, …}, …       same slice position, other data

Contiguous SP groups keep one sequence on neighbouring GPUs (the same node when sp_size ≤ GPUs per node), where the
per-layer state all-gather is cheapest. Every rank computes its loss on different tokens, so gradients are averaged
over all W ranks: over the flattened ("dp", "sp") dimension, which is where data parallelism (DDP or FSDP2) runs.
"""

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

MESH_DIMS = ("dp", "sp")
DATA_PARALLEL_DIM = "dp_sp"  # the flattened ("dp", "sp") dimension: every rank, in rank order


def _check_initialised(name: str) -> None:
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(f"{name} needs torch.distributed.init_process_group first")


def init_training_mesh(sp_size: int, device_type: str | None = None) -> DeviceMesh:
    """The 2-D ``("dp", "sp")`` mesh of every rank of the default group, ``sp_size`` ranks per sequence.

    Must be called by every rank (creating the groups is collective), after ``init_process_group``. ``sp_size`` must
    divide the world size; ``sp_size == 1`` gives SP groups of one rank and one DP group of all ranks.
    ``device_type``: the mesh's device type ("cuda" or "cpu"; default "cuda" when the default group runs NCCL).

    Use ``mesh["sp"].get_group()`` as the ``sequence_parallel_group`` of the TNL layers, ``mesh["dp"]`` for this
    rank's data-parallel index, and :func:`data_parallel_mesh` for the 1-D mesh that DDP or FSDP2 reduces over.
    """
    _check_initialised("init_training_mesh")
    if isinstance(sp_size, bool) or not isinstance(sp_size, int) or sp_size < 1:
        raise ValueError(f"sp_size must be a positive int, got {sp_size!r}")
    world_size = dist.get_world_size()
    if world_size % sp_size != 0:
        raise ValueError(f"sp_size must divide the world size {world_size}, got {sp_size}")
    if device_type is None:
        device_type = "cuda" if "nccl" in str(dist.get_backend()).lower() else "cpu"
    return init_device_mesh(device_type, (world_size // sp_size, sp_size), mesh_dim_names=MESH_DIMS)


def data_parallel_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The 1-D mesh of all ranks of a :func:`init_training_mesh` mesh, the ``("dp", "sp")`` dimensions flattened.

    DeviceMesh's ``_flatten`` is the way PyTorch composes context parallelism with FSDP2 (TorchTitan's
    ``dp_shard_cp``): a view of the same mesh, so DTensors on it and on the 2-D mesh share one root.
    """
    return mesh[MESH_DIMS]._flatten(DATA_PARALLEL_DIM)


def init_sequence_parallel(sp_size: int) -> tuple["dist.ProcessGroup", "dist.ProcessGroup"]:
    """This rank's ``(sp, dp)`` process groups of :func:`init_training_mesh`'s mesh.

    Must be called by every rank of the default group (collective), after ``init_process_group``. ``sp_size`` must
    divide the world size; ``sp_size == 1`` gives SP groups of one rank (then ``lightning_attn_sp`` is the
    single-device op) and one DP group of all ranks.
    """
    _check_initialised("init_sequence_parallel")
    mesh = init_training_mesh(sp_size)
    return mesh["sp"].get_group(), mesh["dp"].get_group()


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
