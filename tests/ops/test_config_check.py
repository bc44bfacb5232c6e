"""The configuration check's unit program (``tests/ops/config_check.py``, run per unit by the GPU test
``test_configs_gpu.py``) on the CPU: under the interpreter it runs a family's candidates pinned and reports errors
against float64, so the GPU suite does not find it broken."""

import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

from lightning_attention.utils.testing import tolerance

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's run of the unit program")
@pytest.mark.parametrize(
    "family, dtype, head_dim, tma, segment_lens",
    [("walk", "float32", 64, 1, [0]), ("prepass", "float32", 32, 0, [256]), ("dkdv", "float32", 32, 1, [0]),
     ("walk", "float16", 64, 1, [0, 256])],
)  # fmt: skip
def test_unit_program_runs_every_candidate_on_the_interpreter(family, dtype, head_dim, tma, segment_lens):
    """Each candidate pinned, at every segment length of the unit: the fp16 walk at K = 64 also in segments, where
    the dq walk computes the reverse local states."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    cmd = [sys.executable, "-m", "tests.ops.config_check", "--family", family, "--dtype", dtype,
           "--head-dim", str(head_dim), "--tma", str(tma), "--shape", "1x300x1"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    candidates = json.loads(next(line for line in lines if line.startswith("CANDIDATES "))[len("CANDIDATES ") :])
    runs = [json.loads(line[len("RUN ") :]) for line in lines if line.startswith("RUN ")]
    # the interpreter knows no shared-memory limit: float32 takes the first configuration of the space, 16-bit inputs
    # the first two
    assert len(candidates) == (1 if dtype == "float32" else 2) and [run["config"] for run in runs] == candidates
    for run in runs:
        assert run["pinned_as_given"] and run["ok"], run
        assert [r["segment_len"] for r in run["runs"]] == segment_lens
        for r in run["runs"]:
            assert r["finite"] and set(r["errors"]) == {"o", "final_state", "dq", "dk", "dv", "dh0"}
            assert 0 < max(r["errors"].values()) <= tolerance(getattr(torch, dtype))
