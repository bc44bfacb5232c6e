"""Every launch configuration the kernels can run on this GPU, value-checked against float64 (``pytest -m gpu``).

The autotuner picks one of a shape class's candidates by timing, so any candidate can be the one a user's process
runs; the CPU suite's interpreter only ever runs the first (``ops/lightning/interpreter.py``). Here every candidate
of every tuned family (the walk, the segment pre-pass, the fused dk/dv walk), for every input dtype and precision,
head dim 64, 128 and 256, with and without tensor descriptors, runs pinned on an odd sequence length, forward and
backward, against the float64 PyTorch form. Each unit (family × dtype × precision × head dim × descriptors) runs in
a process of its own (``tests/ops/config_check.py``: a faulting configuration spoils only its own CUDA context), and
the units run side by side: their compiles take most of the time.
"""

import concurrent.futures
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

from lightning_attention.ops.lightning.kernels.configs import DKDV_MAX_DIM
from lightning_attention.utils.testing import tolerance
from tests.ops.config_check import DTYPES, FAMILIES, OUTPUTS, unit_candidates

pytestmark = pytest.mark.gpu

ROOT = pathlib.Path(__file__).resolve().parents[2]
# (dtype, precision): fp32 has one precision (three tf32 products per product); 16-bit inputs run both
PRECISIONS = (("float32", "input"), ("bfloat16", "input"), ("bfloat16", "split"), ("float16", "input"),
              ("float16", "split"))  # fmt: skip
HEAD_DIMS = (256, 128, 64)
# the units with the most to build start first: float32 (three products per product) and the widest head dim
# the fused dk/dv walk only where the plan can take it (plan.use_fused_dkdv): it holds the whole state (not above
# DKDV_MAX_DIM) and has no split products
UNITS = [(family, dtype, precision, D, tma) for dtype, precision in PRECISIONS for D in HEAD_DIMS
         for tma in (1, 0) for family in FAMILIES
         if family != "dkdv" or (D <= DKDV_MAX_DIM and precision == "input")]  # fmt: skip
UNIT_TIMEOUT_S = 540


def _unit_id(unit) -> str:
    family, dtype, precision, D, tma = unit
    return f"{family}-{dtype}-{precision}-K{D}-{'tma' if tma else 'pointers'}"


def _run_unit(unit) -> dict:
    """One unit's process: its return code, candidates, runs and the tail of its stderr."""
    family, dtype, precision, D, tma = unit
    cmd = [sys.executable, "-m", "tests.ops.config_check", "--family", family, "--dtype", dtype, "--head-dim", str(D),
           "--tma", str(tma), "--precision", precision]  # fmt: skip
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=UNIT_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as e:
        return {"rc": None, "stdout": e.stdout or "", "stderr": f"timed out after {UNIT_TIMEOUT_S} s"}
    return {"rc": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr[-2000:]}


@pytest.fixture(scope="module")
def unit_results(request) -> dict:
    """The result of every unit this pytest run selected, run once for the module, a process per spare CPU core."""
    selected = [item.callspec.params["unit"] for item in request.session.items
                if item.module.__name__ == __name__ and hasattr(item, "callspec")]  # fmt: skip
    workers = max(1, min(len(selected), (os.cpu_count() or 2) - 2))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        return dict(zip(selected, pool.map(_run_unit, selected), strict=True))


def _parse(stdout: str) -> tuple[list | None, list[dict]]:
    candidates, runs = None, []
    for line in stdout.splitlines():
        if line.startswith("CANDIDATES "):
            candidates = json.loads(line[len("CANDIDATES ") :])
        elif line.startswith("RUN "):
            runs.append(json.loads(line[len("RUN ") :]))
    return candidates, runs


@pytest.mark.parametrize("unit", UNITS, ids=[_unit_id(u) for u in UNITS])
def test_every_configuration_against_float64(unit, unit_results):
    family, dtype, precision, D, tma = unit
    result = unit_results[unit]
    candidates, runs = _parse(result["stdout"])
    expected = [list(c) for c in unit_candidates(family, DTYPES[dtype], D, bool(tma), precision, torch.device("cuda"))]
    assert candidates == expected, f"the unit saw other candidates than the selector gives here: {candidates}"
    ran = [run["config"] for run in runs]
    # a unit that stopped early (a fault, a timeout) names the configuration it died in: the first one not run
    assert result["rc"] == 0 and ran == expected, (
        f"rc {result['rc']}; ran {ran} of {expected}; next: {expected[len(ran) :][:1]}\n{result['stderr']}"
    )
    failed = [run for run in runs if not (run["ok"] and run["pinned_as_given"])]
    assert not failed, f"tolerance {tolerance(DTYPES[dtype]):g} on {OUTPUTS}: " + "\n".join(map(json.dumps, failed))
