"""The sequence-parallel GPU scripts (benchmarks/sp_check_gpu.py, sp_scaling.py, sp_header_cost.py) at tiny sizes
on CPU (gloo).

They run on a 2-GPU machine only in a short, scarce device call, so their plumbing is checked here: torchrun start,
the JSON report under ``--out``, and the longest-sequence search stopping at the first out-of-memory or the time cap.
"""

import importlib
import json
import os
import subprocess
import sys
import types

import pytest
import torch

from lightning_attention.bench import tables
from lightning_attention.distributed.call_header import HEADER_BYTES

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCHMARKS = os.path.join(REPO, "benchmarks")


def _torchrun(script: str, out, *options: str) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cmd += [os.path.join(BENCHMARKS, script), "--quick", "--device", "cpu", "--out", str(out), *options]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(cmd, check=False, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_sp_scripts_quick_on_cpu(tmp_path):
    _torchrun("sp_check_gpu.py", tmp_path)
    check = json.loads((tmp_path / "sp_check.json").read_text())
    assert check["bench"] == "sp_check" and check["world_size"] == 2 and check["backend"] == "gloo"
    assert check["passed"] and [c["decay"] for c in check["cases"]] == ["none", "tnl"]
    assert set(check["cases"][0]["single_process_errors"]) == {"o", "dq", "dk", "dv", "final", "dh0"}

    _torchrun("sp_scaling.py", tmp_path)
    scaling = json.loads((tmp_path / "sp_scaling.json").read_text())
    comm = scaling["communication"]
    assert comm["independent_of_seq_len"] and comm["matches_prediction"]
    # CPU tensors: the call header travels on every call, next to (not inside) the state exchange's bytes
    assert {row["check_bytes_per_layer"] for row in comm["measured_rank0"]} == {HEADER_BYTES}
    assert [r["seq_len"] for r in comm["measured_rank0"]] == [64, 128]
    (rate,) = scaling["tokens_per_second"]
    assert rate["gpus_1"]["status"] == rate["gpus_2"]["status"] == "ok" and rate["speedup"] > 0
    longest = scaling["longest_seq_len"]
    assert longest["gpus_1"] == longest["gpus_2"] == 256  # --quick's --max-len: CPU memory never runs out here
    assert longest["stopped_gpus_1"] == longest["stopped_gpus_2"] == "max_len"
    assert "machine_line" in scaling and scaling["elapsed_s"] > 0

    # the run's tables read both reports; a gloo run is a smoke test, never counted as the GPU measurement
    text = tables.render(tables.load_run(tmp_path))
    assert "T = 300, B = 1, H = 2, K = V = 32, float32, 2 ranks (gloo): passed = True" in text
    comm = "communication per layer independent of T (and = the prediction)"
    assert f"| sequence parallel | {comm} | not measured |" in text


def test_header_cost_script_quick_on_cpu(tmp_path):
    _torchrun("sp_header_cost.py", tmp_path, "--calls", "3", "--repeats", "1")
    cost = json.loads((tmp_path / "sp_header_cost.json").read_text())
    assert cost["header_bytes_per_rank"] == HEADER_BYTES and cost["backend"] == "gloo"
    timed = ("build_us", "check_us", "all_gather_us", "forward_checked_us", "forward_cached_us")
    assert all(cost[key] > 0 for key in timed), cost


@pytest.fixture
def sp_scaling(monkeypatch):
    monkeypatch.syspath_prepend(BENCHMARKS)  # the script imports its sibling sp_common
    return importlib.import_module("sp_scaling")


def test_longest_search_stops_at_first_oom_and_at_the_time_cap(sp_scaling, monkeypatch):
    layer = types.SimpleNamespace(sequence_parallel_group=None)  # one device: no collective is issued
    args = types.SimpleNamespace(max_len=2**20, trial_cap_s=10.0)
    seconds = {}

    def fake_step(layer, tokens, device):
        if tokens >= 1024:
            return {"status": "oom", "error": "OutOfMemoryError"}
        return {"status": "ok", "seconds": seconds.get(tokens, 0.1), "peak_memory_gib": None}

    monkeypatch.setattr(sp_scaling, "try_step", fake_step)
    clock = sp_scaling.Clock(0)
    found = sp_scaling.longest_sequence(layer, 64, 1, 0, args, torch.device("cpu"), None, clock)
    assert found["longest_seq_len"] == 512 and found["stopped"] == "oom"
    assert [t["seq_len"] for t in found["trials"]] == [64, 128, 256, 512, 1024]

    seconds[256] = 6.0  # the next step would take about 12 s > --trial-cap-s
    found = sp_scaling.longest_sequence(layer, 64, 1, 0, args, torch.device("cpu"), None, clock)
    assert found["longest_seq_len"] == 256 and found["stopped"] == "trial cap"
    # a 0.15 s budget: the first step runs, the next (about 2.2 × 0.1 s) would not fit
    found = sp_scaling.longest_sequence(layer, 64, 1, 0, args, torch.device("cpu"), None, sp_scaling.Clock(0.15))
    assert found["stopped"] == "budget" and found["longest_seq_len"] == 64


def test_try_step_records_an_out_of_memory(sp_scaling, monkeypatch):
    def boom(layer, tokens, device):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB")

    monkeypatch.setattr(sp_scaling, "train_step", boom)
    layer = torch.nn.Linear(2, 2)
    result = sp_scaling.try_step(layer, 16, torch.device("cpu"))
    assert result["status"] == "oom" and "out of memory" in result["error"]

    def broken(layer, tokens, device):
        raise ValueError("a bug, not a memory limit")

    monkeypatch.setattr(sp_scaling, "train_step", broken)
    with pytest.raises(ValueError):
        sp_scaling.try_step(layer, 16, torch.device("cpu"))
