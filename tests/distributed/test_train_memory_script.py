"""benchmarks/train_memory.py (peak memory and tokens/s of DDP against FSDP2) under ``torchrun --nproc_per_node 2``
at tiny size on CPU (gloo): its GPU command runs on a 2-GPU machine only in a scarce device call, so its plumbing,
2-way FSDP2 and 2-way sequence parallelism included, is checked here."""

import json
import os
import subprocess
import sys

import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_train_memory_quick_on_two_gloo_ranks(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           os.path.join(REPO, "benchmarks", "train_memory.py"), "--quick", "--device", "cpu", "--out", str(tmp_path),
           "--sequence-parallel", "1,2", "--strategies", "ddp,fsdp", "--checkpointing", "on", "--compile", "off"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(cmd, check=False, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((tmp_path / "train_memory.json").read_text())
    assert doc["bench"] == "train_memory" and doc["config"]["world_size"] == 2 and doc["config"]["backend"] == "gloo"
    results = doc["results"]
    layouts = [(r["strategy"], r["sequence_parallel"], r["data_parallel_ranks"]) for r in results]
    assert layouts == [("ddp", 1, 2), ("fsdp", 1, 2), ("ddp", 2, 1), ("fsdp", 2, 1)]
    for r in results:
        assert r["status"] == "ok" and r["checkpointing"] and not r["compile"], r
        assert r["tokens_per_s"] > 0 and r["tokens_per_step"] == 2 * 64 * r["data_parallel_ranks"]
        assert len(r["losses"]) == 3 and "peak_memory_gib" not in r  # 1 warmup + 2 timed steps; no CUDA allocator
    # same seed, same tokens: DDP and FSDP2 take the same steps, with and without sequence parallelism
    for ddp, fsdp in ((results[0], results[1]), (results[2], results[3])):
        torch.testing.assert_close(torch.tensor(fsdp["losses"]), torch.tensor(ddp["losses"]), rtol=1e-5, atol=0)
    assert "peak GiB/GPU" in proc.stdout and proc.stdout.count('"status": "ok"') == 4
