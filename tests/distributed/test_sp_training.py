"""`lightning-attention train --sequence-parallel 2` under torchrun (gloo, CPU) trains exactly like one process."""

import os
import shutil
import socket
import subprocess
import sys

import pytest
import torch

from lightning_attention.train.checkpoint import load_training_state


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _history(out_dir) -> dict:
    return load_training_state(str(out_dir))["history"]


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is not on PATH")
def test_sequence_parallel_training_matches_single_process(tmp_path):
    common = ["train", "--smoke", "--no-progress", "--device", "cpu"]
    sp_out, single_out = tmp_path / "sp", tmp_path / "single"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    sp = subprocess.run(
        ["torchrun", "--nproc-per-node", "2", "--master-port", str(_free_port()), "-m", "lightning_attention",
         *common, "--sequence-parallel", "2", "--out", str(sp_out)],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert sp.returncode == 0, sp.stdout[-2000:] + sp.stderr[-4000:]
    assert "sequence parallel over 2 ranks" in sp.stdout
    single = subprocess.run(
        [sys.executable, "-m", "lightning_attention", *common, "--out", str(single_out)],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert single.returncode == 0, single.stderr[-4000:]
    a, b = _history(sp_out), _history(single_out)
    # same batches, same init: the losses of every step and every validation agree to float32 rounding
    torch.testing.assert_close(torch.tensor(a["train"]), torch.tensor(b["train"]), rtol=1e-5, atol=0)
    torch.testing.assert_close(torch.tensor(a["val"]), torch.tensor(b["val"]), rtol=1e-5, atol=0)


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is not on PATH")
def test_sequence_parallel_composes_with_data_parallel(tmp_path):
    """4 ranks = 2 data-parallel replicas × 2 sequence-parallel ranks train exactly like 2 data-parallel ranks
    without sequence parallelism (same replica batches; each replica's two ranks hold the halves of its sequences)."""
    common = ["train", "--smoke", "--no-progress", "--device", "cpu"]
    env = dict(os.environ, OMP_NUM_THREADS="1")

    def torchrun(nproc, out, *extra):
        proc = subprocess.run(
            ["torchrun", "--nproc-per-node", str(nproc), "--master-port", str(_free_port()), "-m",
             "lightning_attention", *common, *extra, "--out", str(out)],
            capture_output=True, text=True, timeout=600, env=env,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
        return proc.stdout

    assert "sequence parallel over 2 ranks" in torchrun(4, tmp_path / "sp2dp2", "--sequence-parallel", "2")
    torchrun(2, tmp_path / "dp2")
    a, b = _history(tmp_path / "sp2dp2"), _history(tmp_path / "dp2")
    torch.testing.assert_close(torch.tensor(a["train"]), torch.tensor(b["train"]), rtol=1e-5, atol=0)
    torch.testing.assert_close(torch.tensor(a["val"]), torch.tensor(b["val"]), rtol=1e-5, atol=0)
