"""The maintainers' GPU scripts in benchmarks/ without a GPU: each one's ``--help``, the settings they take on the
command line, and the launch programs ``chunk_profile.py`` and ``chunk_sweep.py`` read (under the interpreter), so
that a change of the package's internals breaks here rather than in a scarce GPU call."""

import pathlib
import runpy
import sys

import pytest
import torch

from lightning_attention import settings

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"
# recompute_smem_table.py is run by tests/ops/test_recompute_smem.py (it drops TRITON_INTERPRET at import)
SCRIPTS = ("host_overhead.py", "chunk_profile.py", "chunk_sweep.py", "ncu_profile.py", "host_trace.py",
           "recompute_timing.py", "guard.py")  # fmt: skip


@pytest.fixture
def scripts(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # the scripts import their siblings


@pytest.mark.parametrize("script", SCRIPTS)
def test_help(script, scripts, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [script, "--help"])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(BENCHMARKS / script), run_name="__main__")
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith("usage: ")


def test_settings_from_the_command_line(scripts):
    from timed_calls import settings_changes

    changes = settings_changes(["segment_len=0", "tma=0", "fused_dkdv=1", "prepass_len=none", "bf16_inter=tf32",
                                "kernel_config=BT=64,BV=32,num_warps=4,num_stages=3"])  # fmt: skip
    assert changes == {"segment_len": 0, "tma": False, "fused_dkdv": True, "prepass_len": None, "bf16_inter": "tf32",
                       "kernel_config": "BT=64,BV=32,num_warps=4,num_stages=3"}  # fmt: skip
    with settings.override(**changes) as now:
        assert now.kernel_config == settings.KernelPin(64, 32, 4, 3) and now.segment_len == 0 and not now.tma
    with pytest.raises(ValueError, match="'segment' is not a setting"):
        settings_changes(["segment=0"])


def test_profile_reads_the_programs_of_a_call(scripts):
    """A segmented fwd+bwd on CPU tensors (Triton's interpreter): the plan and one described row per launch, in the
    programs' order (the pre-pass, the scan and the walk forward; three passes more backward)."""
    import chunk_profile
    from timed_calls import Problem

    gen = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(1, 64, 2, 16, generator=gen) for _ in range(4))
    problem = Problem(q, k, v, do, torch.tensor([0.1, 0.3]), fwd=None, fwd_bwd=None)
    with settings.override(segment_len=32):
        programs = chunk_profile.call_programs(problem)
    assert programs["plan"] == {"segmented": True, "segments": 2, "per_seq": 2, "seg_len": 32}
    rows = {name: chunk_profile.launch_rows(programs[name]) for name in ("fwd", "bwd")}
    names = [row["launcher"] for row in rows["fwd"]]
    assert names == ["lightning_attn walk", "lightning_attn segment scan", "lightning_attn walk"]
    assert rows["fwd"][0]["config"]["STATE_ONLY"] and not rows["fwd"][2]["config"]["STATE_ONLY"]
    assert len(rows["bwd"]) == 5  # the dq walk reuses the forward's segment states: (pre-pass, scan) once, 3 walks
    line = chunk_profile.describe(rows["fwd"][2])
    assert line.startswith("lightning_attn walk grid ?: BT=") and "SEG_IN" in line


def test_sweep_pins_the_tuners_candidates(scripts):
    import chunk_sweep

    pins = chunk_sweep.tuner_candidates(1, 1024, 2, 64, device="cpu")
    assert pins and all(settings.KernelPin.parse(p) for p in pins)
