"""FSDP2 on one GPU (NCCL, a process group of one): the smoke run trains like DDP's unwrapped single-GPU run, resumes
from its checkpoint, and compiles (inductor, each block) with activation checkpointing. CPU CI covers the same code
on gloo (tests/distributed/test_fsdp_training.py, tests/train/test_compile.py); this checks the CUDA side: the
Triton kernels under FSDP2's all-gathers, bf16 autocast, DCP writing CUDA shards."""

import pytest
import torch

from lightning_attention.train import TrainConfig, train

pytestmark = pytest.mark.gpu

BF16 = {"rtol": 2e-2, "atol": 2e-2}  # bf16 autocast: runs of different reduction orders agree to bf16 rounding


def _run(out, **options):
    return train(TrainConfig.smoke(out=str(out), steps=4, save_every=2, progress=False, device="cuda", **options))


def test_fsdp_on_one_gpu_trains_resumes_and_compiles(tmp_path):
    plain = _run(tmp_path / "plain")
    fsdp = _run(tmp_path / "fsdp", data_parallel="fsdp")
    torch.testing.assert_close(torch.tensor(fsdp.train_losses), torch.tensor(plain.train_losses), **BF16)
    resumed = _run(tmp_path / "resumed", data_parallel="fsdp", resume=str(tmp_path / "fsdp" / "previous"))
    torch.testing.assert_close(torch.tensor(resumed.train_losses), torch.tensor(fsdp.train_losses), **BF16)
    compiled = _run(tmp_path / "compiled", data_parallel="fsdp", gradient_checkpointing=True, compile=True)
    torch.testing.assert_close(torch.tensor(compiled.train_losses), torch.tensor(plain.train_losses), **BF16)
    assert not torch.distributed.is_initialized()  # the group of one is the trainer's, and gone
