"""The optimizer state of a checkpoint: written by every rank in parallel, readable at any world size, never pickled.

Layout of ``<checkpoint>/optimizer/``: ``shard-<i>-model-00001-of-00001.safetensors``, one file per rank that holds
state (PyTorch Distributed Checkpoint's ``HuggingFaceStorageWriter``). Each file holds this rank's slice of every
AdamW tensor under the name ``state.<parameter name>.<exp_avg | exp_avg_sq | step>`` and, in its safetensors
metadata, where each slice sits in the whole tensor; a tensor that every rank holds whole (DDP, a single process)
is written once. Reading (``HuggingFaceStorageReader``) builds the map of slices from those headers and lets every
rank read the parts of its own shards, whatever the world size, sharding or strategy that wrote them: a run saved by
FSDP2 on 4 ranks resumes under FSDP2 on 2, under DDP or in one process, and the other way round.

Keys are parameter names (``torch.distributed.checkpoint.state_dict``), not positions in the optimizer, so they do
not depend on how the model was wrapped. The hyperparameters of each parameter (lr, betas, weight decay, ...) are
plain numbers: they travel in ``training_state.pt``, returned by :func:`save_optimizer_state`. Nothing here goes
through pickle: DCP's default file format pickles its metadata, safetensors does not.
"""

import contextlib
import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict, set_optimizer_state_dict

FOLDER = "optimizer"
_FLAT = StateDictOptions(flatten_optimizer_state_dict=True)  # "state.<name>.<key>" and "param_groups.<name>.<key>"


def _split(flat: dict) -> tuple[dict[str, torch.Tensor], dict]:
    tensors = {k: v for k, v in flat.items() if isinstance(v, torch.Tensor)}
    return tensors, {k: v for k, v in flat.items() if k not in tensors}


@contextlib.contextmanager
def _single_process_quiet():
    """DCP warns that it assumes a single process when there is no process group: that is the intent here."""
    with warnings.catch_warnings():
        if not dist.is_initialized():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield


def save_optimizer_state(folder: str, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Writes this rank's share of ``optimizer``'s tensors to ``folder``; returns the hyperparameters (plain data).

    Collective: every rank of the default process group (if there is one) must call it with the same ``folder``.
    ``model`` is the module whose parameters ``optimizer`` updates (unwrapped, or sharded in place by FSDP2).
    """
    tensors, hyperparameters = _split(get_optimizer_state_dict(model, optimizer, options=_FLAT))
    tensors = {k: v.detach() for k, v in tensors.items()}
    with _single_process_quiet():
        dcp.save(tensors, storage_writer=dcp.HuggingFaceStorageWriter(folder, save_distributed=True))
    return hyperparameters


def load_optimizer_state(folder: str, model: nn.Module, optimizer: torch.optim.Optimizer,
                         hyperparameters: dict) -> None:
    """Loads what :func:`save_optimizer_state` wrote (at any world size) into ``optimizer``, resharded to this run.

    Collective like the save. ``folder`` must hold the files of one save only (verify the checkpoint first: its
    manifest covers every file in the folder).
    """
    # a template with this run's shapes and shards (DCP's state-dict API fills a fresh optimizer's state with a
    # zero-learning-rate step first), filled in place from the files
    tensors, _ = _split(get_optimizer_state_dict(model, optimizer, options=_FLAT))
    with _single_process_quiet():
        dcp.load(tensors, storage_reader=dcp.HuggingFaceStorageReader(folder))
    set_optimizer_state_dict(model, optimizer, {**tensors, **hyperparameters}, options=_FLAT)
