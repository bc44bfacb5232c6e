"""How a training run spreads over its processes: the ("dp", "sp") DeviceMesh, data parallelism by DDP or FSDP2, and
activation checkpointing and ``torch.compile`` applied in the order PyTorch documents.

With W processes and ``sequence_parallel = sp`` (see :func:`lightning_attention.distributed.init_training_mesh`):

- ``mesh["sp"]``: each group of sp consecutive ranks shares one slice of the global batch and splits its sequences
  along T (the TNL lightning layers run ``lightning_attn_sp`` over this group);
- ``mesh["dp"]``: the W / sp replicas, each with its own slice of the global batch;
- gradients are averaged over all W ranks (each saw different tokens), on the flattened ("dp", "sp") mesh:
  ``ddp`` all-reduces them there and keeps a full replica of the model and optimizer per rank; ``fsdp``
  (``fully_shard``) reduce-scatters them there, so parameters, gradients and AdamW state are sharded W ways. Sharding
  over "dp" alone would keep sp identical copies of every shard and need a second all-reduce over "sp"; sharding
  over both is how PyTorch composes FSDP2 with context parallelism (TorchTitan's ``dp_shard_cp``).

Order (FSDP2's documentation): activation checkpointing (``trainer.prepare_model`` enables it), then ``torch.compile``
of each decoder block, then ``fully_shard`` of each run of ``unit_blocks`` consecutive blocks
(:data:`DEFAULT_UNIT_BLOCKS` by default; 1 gives a unit per block) and of the root (embeddings, final norm, LM head).
The blocks are the modules the model names in ``_no_split_modules`` (transformers' own list of units not to split, what
accelerate's FSDP wrapping uses). Compiling per block (``Module.compile``, in place) captures each block's forward and
backward whole with FSDP2's all-gather hooks left to run eagerly (no graph break: tests/train/test_compile.py), compiles
one graph that every block of the same structure reuses, and leaves parameter names (and so the checkpoint) unchanged;
the same is done under DDP, so ``--compile`` means one thing.

Both strategies run the same arithmetic (bf16 autocast on CUDA, float32 parameters, gradients averaged in float32),
so a run may switch between them, and between world sizes, on ``--resume``.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from lightning_attention.train.distributed import DistInfo
from lightning_attention.train.errors import UserError

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from torch.distributed.device_mesh import DeviceMesh

# decoder blocks per FSDP2 unit by default: three matched DDP's tokens/s where one per unit trailed it by 20%, and
# gained 10-23% under activation checkpointing and sequence parallelism, at the same peak memory (the 400m preset on
# 2 × H200: docs/performance.md, "Units of several blocks")
DEFAULT_UNIT_BLOCKS = 3

STRATEGIES = ("ddp", "fsdp")


@dataclass
class Layout:
    """This process's place in the mesh.

    ``mesh``: the ("dp", "sp") mesh (None in a plain single process without a process group); ``data_mesh``: its
    flattened 1-D mesh of all ranks; ``sp_group``: the sequence-parallel group (None when sp == 1);
    ``dp_rank`` / ``dp_world``: this rank's replica and the number of replicas (slices of the global batch).
    """

    mesh: "DeviceMesh | None" = None
    data_mesh: "DeviceMesh | None" = None
    sp_group: "ProcessGroup | None" = None
    dp_rank: int = 0
    dp_world: int = 1


def build_layout(info: DistInfo, sequence_parallel: int, device: torch.device, *, sp_capable: bool) -> Layout:
    """The mesh of the run's process group (every rank must call it: creating groups is collective).

    ``sp_capable``: the model can run sequence parallel (TNL without softmax layers or learned decay); checked when
    sp > 1.
    """
    sp = sequence_parallel
    if sp != 1 and not sp_capable:
        raise UserError("--sequence-parallel needs --arch tnl without softmax layers (--softmax-attention-every) "
                        "and without --learn-decay")
    if sp < 1 or info.world_size % sp != 0:
        raise UserError(f"--sequence-parallel must divide the number of processes {info.world_size}, got {sp}")
    if not info.initialized:
        return Layout()
    from lightning_attention.distributed import data_parallel_mesh, init_training_mesh

    mesh = init_training_mesh(sp, device.type)
    return Layout(mesh=mesh, data_mesh=data_parallel_mesh(mesh), sp_group=mesh["sp"].get_group() if sp > 1 else None,
                  dp_rank=mesh.get_local_rank("dp"), dp_world=mesh.size(0))


def decoder_blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks of a transformers model: the modules whose class it lists in ``_no_split_modules``."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    if not blocks:
        raise ValueError(f"{type(model).__name__} names no decoder block class in _no_split_modules")
    return blocks


def parallelize(model: nn.Module, layout: Layout, strategy: str, device: torch.device, *,
                compile: bool = False, compile_backend: str = "inductor",
                unit_blocks: int = DEFAULT_UNIT_BLOCKS) -> nn.Module:
    """Prepares ``model`` (on ``device``, activation checkpointing already enabled if wanted) for training; returns
    the module to call in the training loop.

    ``fsdp`` shards ``model`` in place (its parameters become DTensors on ``layout.data_mesh``) and returns it;
    ``ddp`` returns a ``DistributedDataParallel`` around it. Without a mesh (a plain single process) ``model`` is
    returned as it is. Build the optimizer afterwards, from ``model.parameters()``.

    ``unit_blocks`` (``fsdp``): consecutive decoder blocks sharded as one unit, gathered and reduce-scattered
    together (:data:`DEFAULT_UNIT_BLOCKS`; 1 is the unit PyTorch's documentation shows). FSDP2's host work per step
    grows with its units, and with few tokens per rank it can outlast the GPU's work; fewer, larger units hold more
    unsharded parameters at once (docs/performance.md, "Training at 400M parameters: DDP against FSDP2").
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    if unit_blocks < 1:
        raise ValueError(f"unit_blocks must be at least 1, got {unit_blocks}")
    blocks = decoder_blocks(model)
    if compile:
        for block in blocks:
            block.compile(backend=compile_backend)
    if layout.mesh is None:
        return model
    if strategy == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for start in range(0, len(blocks), unit_blocks):
            unit = blocks[start : start + unit_blocks]
            fully_shard(unit if len(unit) > 1 else unit[0], mesh=layout.data_mesh)  # a list: one unit of them all
        fully_shard(model, mesh=layout.data_mesh)
        return model
    return nn.parallel.DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None, device_mesh=layout.data_mesh
    )


def fill_shards(model: nn.Module, whole: nn.Module | None, device: torch.device) -> None:
    """Gives ``model``, built on the meta device and sharded in place by FSDP2 (:func:`parallelize`), its values:
    those of ``whole``, the same model built (and resumed) on rank 0's CPU. Collective: every rank calls it, the others
    with ``whole=None``. Each rank allocates only its shards, so no GPU ever holds the whole model; the parameters and
    persistent buffers go out from rank 0 one tensor at a time (``set_model_state_dict``), then the buffers a state
    dict leaves out (computed at build: TNL's decay slopes, rotary frequencies). Last, every rank takes rank 0's CPU
    random state, which building ``whole`` advanced, as if each rank had built the model itself."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    model.to_empty(device=device)
    set_model_state_dict(model, whole.state_dict() if whole is not None else {},
                         options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    saved = set(model.state_dict())
    for name, buffer in model.named_buffers():
        if name not in saved:
            if whole is not None:
                buffer.copy_(whole.get_buffer(name))
            dist.broadcast(buffer, src=0)
    rng = [torch.get_rng_state()]
    dist.broadcast_object_list(rng, src=0)
    torch.set_rng_state(rng[0])


def reshard(model: nn.Module) -> None:
    """Frees the unsharded parameters FSDP2's root keeps after a forward (it expects the backward to need them at
    once; the blocks reshard after their own forward): after an evaluation, which has no backward, the parameters are
    the shards again, as the optimizer and the state-dict functions expect. Nothing to do for other models."""
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule):
        model.reshard()


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's weights as plain CPU tensors on rank 0 (an empty dict on the other ranks).

    Collective under FSDP2 (every rank must call it: the shards are all-gathered); names are those of the
    unwrapped model, as ``save_pretrained`` writes them.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
