"""benchmarks/train_memory.py (peak memory and tokens/s of DDP against FSDP2) under ``torchrun --nproc_per_node 2``
at tiny size on CPU (gloo): its GPU command runs on a 2-GPU machine only in a scarce device call, so its plumbing,
2-way FSDP2 and 2-way sequence parallelism included, is checked here."""

import json
import os
import subprocess
import sys

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_train_memory_quick_on_two_gloo_ranks(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           os.path.join(REPO, "benchmarks", "train_memory.py"), "--quick", "--device", "cpu", "--out", str(tmp_path),
           "--sequence-parallel", "1,2", "--strategies", "ddp,fsdp", "--checkpointing", "on", "--compile", "off",
           "--fsdp-unit-blocks", "1,2"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(cmd, check=False, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((tmp_path / "train_memory.json").read_text())
    assert doc["bench"] == "train_memory" and doc["config"]["world_size"] == 2 and doc["config"]["backend"] == "gloo"
    results = doc["results"]
    layouts = [(r["strategy"], r["fsdp_unit_blocks"], r["sequence_parallel"], r["data_parallel_ranks"])
               for r in results]
    assert layouts == [("ddp", None, 1, 2), ("fsdp", 1, 1, 2), ("fsdp", 2, 1, 2),
                       ("ddp", None, 2, 1), ("fsdp", 1, 2, 1), ("fsdp", 2, 2, 1)]
    for r in results:
        assert r["status"] == "ok" and r["checkpointing"] and not r["compile"], r
        assert r["tokens_per_s"] > 0 and r["tokens_per_step"] == 2 * 64 * r["data_parallel_ranks"]
        assert len(r["losses"]) == 3 and "peak_memory_gib" not in r  # 1 warmup + 2 timed steps; no CUDA allocator
    # same seed, same tokens: DDP and FSDP2 (one block per unit, or the smoke preset's two blocks as one unit) take
    # the same steps, with and without sequence parallelism
    for ddp, *fsdp in (results[:3], results[3:]):
        for sharded in fsdp:
            torch.testing.assert_close(torch.tensor(sharded["losses"]), torch.tensor(ddp["losses"]), rtol=1e-5, atol=0)
    assert "peak GiB/GPU" in proc.stdout and proc.stdout.count('"status": "ok"') == 6


def test_profile_splits_gpu_time_into_busy_nccl_and_exposed_nccl(monkeypatch):
    """The profile's arithmetic on kernel spans: overlaps merged, NCCL time counted exposed where no other kernel runs
    beside it; the host's waits for the GPU left out of its busy time."""
    monkeypatch.syspath_prepend(os.path.join(REPO, "benchmarks"))
    import train_memory

    assert train_memory._union([(5, 7), (0, 2), (1, 3), (7, 9)]) == [(0, 3), (5, 9)]
    assert train_memory._uncovered([(0, 10)], [(2, 3), (5, 6)]) == 8
    assert train_memory._uncovered([(0, 10), (20, 30)], [(8, 25)]) == 13
    assert train_memory._uncovered([(0, 10)], []) == 10 and train_memory._uncovered([(2, 4)], [(0, 10)]) == 0

    class Span:
        def __init__(self, start, end):
            self.start, self.end = start, end

    class Event:
        def __init__(self, name, start, end, cuda=True):
            self.name, self.time_range = name, Span(start, end)
            self.device_type = torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU

    class Average:
        def __init__(self, key, self_cpu_time_total):
            self.key, self.self_cpu_time_total = key, self_cpu_time_total

    class Profile:  # two steps: kernels 0-400 and 600-800 µs, NCCL 300-700 µs (exposed 400-600)
        def __init__(self, activities):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def events(self):
            return [Event("gemm", 0, 400), Event("gemm", 600, 800), Event("ncclDevKernel_AllGather", 300, 700),
                    Event("aten::mm", 0, 5000, cuda=False)]

        def key_averages(self):
            return [Average("aten::mm", 1000.0), Average("Command Buffer Full", 4000.0),
                    Average("cudaDeviceSynchronize", 2000.0)]

    monkeypatch.setattr(torch.profiler, "profile", Profile)
    steps = []
    got = train_memory.profile_steps(lambda: steps.append(1), 2, torch.device("cpu"))
    assert len(steps) == 2
    assert got == pytest.approx({"profiled_steps": 2, "gpu_busy_ms": 0.3, "nccl_ms": 0.2, "nccl_exposed_ms": 0.1,
                                 "host_busy_ms": 0.5})
