"""Shared memory of the recompute-backward kernels on every GPU class, compiled ahead of time (no GPU needed).

Runs ``benchmarks/recompute_smem_table.py`` in a subprocess (ahead-of-time compilation needs real ``@triton.jit``
functions, and this test process runs under ``TRITON_INTERPRET=1``), prints its table and fails if any kernel
exceeds its target's per-block limit. It compiles the kernel (one launch runs the dq, dk and dv sweeps) for fp16,
bf16 and fp32, for sm_80, sm_86, sm_89, sm_90 and sm_120, at the two largest tile classes the launcher picks,
K = V = 128 and 256, up to LLVM IR (``--fast``), where shared memory is fixed; a second test checks that against a
full compile. Shared memory is not monotone in the head dims, so this is a sample, chosen where the tiles are
largest; the table over more shape classes (full compiles) is ``benchmarks/results/recompute_smem_triton-3.8.0.md``
(``--dims all`` covers all 25).
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from lightning_attention.ops.lightning.recompute_smem import SMEM_LIMITS

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "recompute_smem_table.py"

pytest.importorskip("triton.backends.nvidia", reason="ahead-of-time CUDA compilation needs triton's NVIDIA backend")


def test_recompute_kernels_fit_shared_memory_of_every_target():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    ccs = ",".join(str(c) for c in SMEM_LIMITS)
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--dims", "128x128,256x256", "--ccs", ccs, "--jobs", "2", "--fast"],
        check=False,  # the exit status is asserted below, after the table is printed
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    print(proc.stdout)
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith('{"kernel"')]
    assert proc.returncode in (0, 1), f"table script crashed (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
    expected = 2 * 3 * len(SMEM_LIMITS)  # shapes x dtypes x targets
    assert len(rows) == expected, f"expected {expected} compiled kernels, got {len(rows)}"
    over = [r for r in rows if r["shared"] > SMEM_LIMITS[r["cc"]]]
    assert not over, "configurations over the shared-memory limit of their target:\n" + "\n".join(
        json.dumps(r) for r in over
    )
    assert proc.returncode == 0, proc.stdout[-2000:]


def test_fast_measurement_matches_full_compile():
    """The CI table stops compiling after LLVM IR (``--fast``); shared memory is fixed there. One configuration is
    compiled both ways, to a cubin and to LLVM IR only, and must agree."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = (
        "import torch, json; from lightning_attention.ops.lightning.recompute_smem import measure; "
        "full = measure(torch.bfloat16, 128, 128, 90); fast = measure(torch.bfloat16, 128, 128, 90, fast=True); "
        "print(json.dumps([full.as_dict(), fast.as_dict()]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    full, fast = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (full["method"], fast["method"]) == ("cubin", "llir"), "the LLVM-IR-only path fell back to a full compile"
    assert fast["shared"] == full["shared"], f"LLVM-IR-only {fast['shared']} B != full compile {full['shared']} B"
