"""The maintainers' GPU scripts in benchmarks/ without a GPU: each one's ``--help``, the settings they take on the
command line, the launch programs ``chunk_profile.py`` and ``chunk_sweep.py`` read (under the interpreter) and a whole
``cold_start.py`` run at a tiny float32 shape (under the interpreter), so that a change of the package's internals
breaks here rather than in a scarce GPU call."""

import json
import math
import os
import pathlib
import runpy
import statistics
import subprocess
import sys

import pytest
import torch

from lightning_attention import settings
from lightning_attention.ops.lightning import naive

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"
# recompute_smem_table.py is run by tests/ops/test_recompute_smem.py (it drops TRITON_INTERPRET at import)
SCRIPTS = ("host_overhead.py", "chunk_profile.py", "chunk_sweep.py", "ncu_profile.py", "host_trace.py",
           "recompute_timing.py", "guard.py", "cold_start.py", "tune_table.py", "fp32_products.py",
           "precision_model.py", "host_pair.py", "placement.py", "clocks.py", "settings_ab.py",
           "ncu_sass_summary.py", "energy_profile.py")  # fmt: skip


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
    assert settings_changes(["fused_dkdv=0"]) == {"fused_dkdv": False}
    assert settings_changes(["fused_dkdv=none"]) == settings_changes(["fused_dkdv=auto"]) == {"fused_dkdv": None}
    with pytest.raises(ValueError, match="fused_dkdv takes 0 or 1, auto or none"):
        settings_changes(["fused_dkdv=fused"])
    with pytest.raises(ValueError, match="tma takes 0 or 1"):
        settings_changes(["tma=auto"])
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


def _cold_start(out: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
    """``cold_start.py --device cpu`` at a tiny float32 shape (the Triton backend under the interpreter), as a
    separate process like on the GPU machine."""
    cmd = [sys.executable, str(BENCHMARKS / "cold_start.py"), "--device", "cpu", "--shape", "1x64x2",
           "--dtypes", "float32", "--head-dims", "16", "--out", str(out), *args]  # fmt: skip
    root = str(BENCHMARKS.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH")))))
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=False)


def test_cold_start_times_each_class_in_its_own_process(tmp_path):
    """A forward cell and a fwd+bwd cell, two at once: both finish with finite first- and second-call times and
    import times. The interpreter compiles nothing, so the kernel counts are there and 0 (on the GPU they count the
    cubins the first call left in the cell's cache)."""
    proc = _cold_start(tmp_path, "--classes", "forward,fwd+bwd", "--parallel", "2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads((tmp_path / "cold_start.json").read_text())
    assert doc["bench"] == "cold_start" and doc["machine_line"].startswith("CPU ")
    assert doc["machine"]["triton_interpret"] and doc["machine"]["backend"] == "triton"
    assert doc["config"]["parallel"] == 2 and doc["config"]["shape"] == {"B": 1, "T": 64, "H": 2}
    by_class = {r["class"]: r for r in doc["cells"]}
    assert sorted(by_class) == ["forward", "fwd+bwd"]
    for r in by_class.values():
        assert (r["dtype"], r["head_dim"], r["status"], r["rc"]) == ("float32", 16, "ok", 0)
        for key in ("cold_s", "warm_s", "import_s", "torch_import_s", "process_s"):
            assert math.isfinite(r[key]) and r[key] > 0, (key, r)
        assert r["cold_s"] < r["process_s"]
        assert r["compiled_kernels"] == r["compiled_kernels_after_warm"] == r["cache_entries"] == 0
    table = (tmp_path / "cold_start.md").read_text()
    assert "| dtype | class | K = 16 |" in table
    assert f"| float32 | fwd+bwd | {by_class['fwd+bwd']['cold_s']:.3g} ✓ |" in table
    assert doc["config"]["compile_ahead"] is True and "at once, in threads" in table


def test_cold_start_without_compiling_ahead(tmp_path):
    """``--compile-ahead off``: the cells run with LIGHTNING_ATTENTION_COMPILE_AHEAD=0, and the JSON and the table say
    so."""
    proc = _cold_start(tmp_path, "--classes", "forward", "--compile-ahead", "off")
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads((tmp_path / "cold_start.json").read_text())
    assert doc["config"]["compile_ahead"] is False and doc["cells"][0]["status"] == "ok"
    assert "compiled at its first launch, one after another" in (tmp_path / "cold_start.md").read_text()


def test_cold_start_records_a_cell_that_times_out(tmp_path):
    """A cell past --timeout-s is killed and recorded as timed out (no times); the script still writes its JSON and
    table, and exits with status 1."""
    proc = _cold_start(tmp_path, "--classes", "fwd+bwd", "--timeout-s", "0.2")
    assert proc.returncode == 1, proc.stderr[-2000:]
    (cell,) = json.loads((tmp_path / "cold_start.json").read_text())["cells"]
    assert (cell["status"], cell["rc"], cell["error"]) == ("timeout", None, "timed out after 0.2 s")
    assert "cold_s" not in cell and cell["process_s"] < 30
    assert "| float32 | fwd+bwd | timed out ✗ (> 0.2 s) |" in (tmp_path / "cold_start.md").read_text()


def test_cold_start_counts_the_kernels_triton_cached(tmp_path, scripts):
    """Triton's cache holds one folder per compiled kernel (its cubin beside IR and metadata) and one per launcher
    module: the kernels are the cubins, wherever they sit. The slowest cells start first."""
    import cold_start

    for folder, files in (("a1", ("walk.cubin", "walk.ptx", "walk.json")), ("b2", ("scan.cubin", "scan.ttir")),
                          ("c3", ("__triton_launcher.so",))):  # fmt: skip
        (tmp_path / folder).mkdir()
        for name in files:
            (tmp_path / folder / name).write_bytes(b"")
    assert cold_start.cache_contents(tmp_path) == {"compiled_kernels": 2, "cache_entries": 3}
    order = cold_start.cells(["bfloat16", "float32"], [64, 256], ["forward", "fwd+bwd"])
    assert order[:2] == [("float32", 256, "fwd+bwd"), ("float32", 64, "fwd+bwd")]
    assert order[-1] == ("bfloat16", 64, "forward") and len(order) == 8


def test_kernel_ms_adds_up_each_calls_kernels_and_takes_the_median(scripts, monkeypatch):
    import timed_calls

    calls = []
    per_call = [[{"kernel": "a", "us": 100.0}, {"kernel": "b", "us": 200.0}],  # 0.3 ms
                [{"kernel": "a", "us": 100.0}, {"kernel": "b", "us": 900.0}],  # 1.0 ms: an outlier
                [{"kernel": "a", "us": 150.0}, {"kernel": "b", "us": 250.0}]]  # 0.4 ms  # fmt: skip
    monkeypatch.setattr(timed_calls, "profiled_kernels", lambda fn, n: per_call[:n])
    assert timed_calls.kernel_ms(lambda: calls.append(1), calls=3) == pytest.approx(0.4)
    assert calls == [1]  # the warm-up call; the profiled ones run inside profiled_kernels


def test_precision_model_reproduces_the_measured_ratios(scripts):
    """The emulated walk: the default's error lands near the 1.6× of the rounding floor measured on GPUs, the split
    precision's at the floor; tf32 keeps 10 significand bits; the walk in exact arithmetic is the recurrence."""
    import precision_model as pm

    x = torch.tensor([1 + 2**-11, 1 + 2**-10 + 2**-12, -3.0], dtype=torch.float64)
    assert pm.round_to(x, "tf32").tolist() == [1 + 2**-10, 1 + 2**-10, -3.0]  # half away from zero; below half down
    q, k, v, slope = pm.inputs("tnl", 1, 2, 64, 16, 16)
    exact = pm.walk_output(q, k, v, slope, 16, "exact", "exact", "exact")
    ref, _ = naive.quadratic_lightning_attn(*(x.transpose(1, 2) for x in (q, k, v)), slope)
    torch.testing.assert_close(exact, ref.transpose(1, 2), rtol=1e-10, atol=1e-10)
    rows = {(r["scores"], r["state"], r["values"]): r for r in pm.model(32, 256, 2, 32, 32, "tnl", ("bf16", "split"))}
    assert 1.3 < rows["bf16", "bf16", "bf16"]["vs_floor"] < 1.9
    assert rows["split", "split", "split"]["vs_floor"] < 1.02
    assert rows["split", "split", "split"]["product_time"] == pytest.approx(7 / 4)  # 4 equal products, 3 doubled


def test_precision_model_fp16_with_power_of_two_scales(scripts):
    """fp16s: a power-of-two scale per row (or column) keeps any magnitude in fp16's range with its 11 significand bits
    (bf16 values pass exactly, zeros stay zeros, values far beyond 65504 come back finite), and fed so, the three
    intermediates land near the rounding floor at the default's product time."""
    import precision_model as pm

    big, small = 1.5 * 2**31, -(1 + 2**-11 + 2**-13) * 2**30
    x = torch.tensor([[big, small, 0.0], [0.0, 0.0, 0.0], [1e-30, 2e-30, -5e-31]], dtype=torch.float64)
    rows = pm.fp16_scaled(x, -1)
    assert torch.isfinite(rows).all() and rows[1].eq(0).all()
    torch.testing.assert_close(rows, x, rtol=2**-11, atol=0)  # within fp16's rounding, per row, at any magnitude
    assert rows[0, 1] == -(1 + 2**-10) * 2**30  # 11 significand bits, to nearest
    assert pm.fp16_scaled(x, -2)[2, 0] == 0  # per column: 1e-30 lies 2^130 below its column's largest
    bf16 = (torch.randn(8, 8, dtype=torch.float64) * 1e6).to(torch.bfloat16).double()
    assert torch.equal(pm.fp16_scaled(bf16, -1), bf16) and torch.equal(pm.fp16_scaled(bf16, -2), bf16)
    rows = {(r["scores"], r["state"], r["values"]): r for r in pm.model(32, 256, 2, 32, 32, "tnl", ("bf16", "fp16s"))}
    assert rows["fp16s", "fp16s", "fp16s"]["vs_floor"] < 1.05 < 1.3 < rows["bf16", "bf16", "bf16"]["vs_floor"]
    assert rows["fp16s", "fp16s", "fp16s"]["product_time"] == 1.0


def test_placement_records_offsets_and_tells_placement_from_process(scripts):
    """placement.py: where a problem's tensors lie (offsets from q), and its summary's two spreads on made-up times,
    where the placement sets the time and the processes agree within 2%."""
    import placement
    from timed_calls import Problem

    buffer = torch.empty(8 << 20, dtype=torch.uint8)  # one block: the offsets between its views are known
    q, k, v, do, o = (buffer[i * 2**20 :] for i in (2, 0, 3, 5, 6))
    row = placement.placement_of(Problem(q, k, v, do, None, None, None), o)
    assert row == {"q_mod_2mib": q.data_ptr() % (2 << 20), "k_minus_q_mib": -2.0, "v_minus_q_mib": 1.0,
                   "do_minus_q_mib": 3.0, "o_minus_q_mib": 4.0}  # fmt: skip

    fast, slow = 1.10, 1.40
    runs = [{"2x64x256": [{"fwd_ms": t * (1 + 0.02 * p / 3)} for t in (fast, slow, fast)]} for p in range(4)]
    summary = placement.summarise(runs)["2x64x256"]
    assert list(summary) == ["fwd_ms"]  # no fwd_bwd_ms measured: none summarised
    assert summary["fwd_ms"]["placement_spread"] == pytest.approx(slow / fast - 1, abs=1e-4)
    assert summary["fwd_ms"]["process_spread"] == pytest.approx(0.02, abs=1e-4)
    assert len(summary["fwd_ms"]["per_placement"]) == 3


def test_placement_shifts_move_one_tensor_and_keep_its_values(scripts):
    """placement.py --shift: q, k, v copied into one buffer, the moved tensor ``shift`` bytes past its slot and the
    others in theirs, values unchanged; the summary's per-offset medians over processes, spreads and extremes."""
    import placement
    from timed_calls import Problem

    q, k, v = (torch.randn(2, 8, 3, 4, dtype=torch.bfloat16) for _ in range(3))
    size, room = q.numel() * 2, 1 << 12
    x = placement.shifted_tensors(Problem(q, k, v, None, None, None, None), room, {"k": 512})
    assert x["k"].data_ptr() - x["q"].data_ptr() == size + room + 512
    assert x["v"].data_ptr() - x["q"].data_ptr() == 2 * (size + room)
    for name, t in (("q", q), ("k", k), ("v", v)):
        assert torch.equal(x[name], t) and x[name].is_contiguous()

    runs = [{"2x64x256": {"unshifted": [1.0, 1.01], "k": [1.0, 1.3 + 0.01 * p, 1.1]}} for p in range(3)]
    summary = placement.summarise_shifts(runs)["2x64x256"]
    assert summary["k"]["per_offset"] == [1.0, 1.31, 1.1]  # medians over the processes
    assert summary["k"]["spread"] == pytest.approx(0.31) and summary["unshifted"]["spread"] == pytest.approx(0.01)
    assert (summary["k"]["fastest_at"], summary["k"]["slowest_at"]) == (0, 1)


def test_clocks_scales_times_to_the_top_clock(scripts):
    """clocks.py's summary of made-up rows where the time follows the clock exactly (scaled to the top clock, the
    bursts agree), and of a sustained run alone."""
    import clocks

    def row(i, mhz):
        return {"shape": "2x64x256", "provider": "ours-chunk", "timer": "fwd_ms", "round": 0, "index": i,
                "ms": 1.98 / mhz * 1000, "samples": 3, "sm_mhz_mean": mhz,
                "capped_share": float(mhz < 1980)}  # fmt: skip

    summary = clocks.summarise([row(0, 1980.0), row(1, 1650.0), row(2, 1800.0), {**row(3, 1.0), "samples": 0}])
    per = summary["calls"]["2x64x256 ours-chunk fwd_ms"]
    assert summary["top_sm_mhz"] == 1980.0
    assert per["after_idle"] == {"ms": 1.0, "sm_mhz": 1980.0}
    assert per["bursts"]["sm_mhz"] == 1725.0 and per["bursts"]["capped_share"] == 1.0
    assert per["at_top_clock_ms"] == pytest.approx(1.0) and per["at_top_clock_spread"] == pytest.approx(0, abs=1e-4)
    assert per["spread"] == pytest.approx(1980 / 1650 - 1, abs=1e-4)  # the row without samples is left out
    assert "sustained" not in per

    held = [{**row(i, mhz), "round": "sustained", "second": 0.1 * i} for i, mhz in enumerate((1980.0, 1700.0, 1600.0))]
    per = clocks.summarise(held)["calls"]["2x64x256 ours-chunk fwd_ms"]
    assert list(per) == ["sustained"]  # no rounds: only the sustained run, its second half (from 0.1 s on)
    assert per["sustained"]["sm_mhz"] == 1650.0 and per["sustained"]["seconds"] == pytest.approx(0.2)
    assert per["sustained"]["ms"] == pytest.approx(statistics.median([1.98 / 1.7, 1.98 / 1.6]), abs=1e-4)


def test_child_runs_collect_each_process_last_json_line(scripts, tmp_path):
    """timed_calls.child_runs (host_pair.py's and placement.py's processes): ``--child`` and the arguments passed on,
    the environment given, one result per process from its last printed line."""
    from timed_calls import child_runs

    script = tmp_path / "child.py"
    script.write_text("import json, os, sys\nprint('a log line')\n"
                      "print(json.dumps({'argv': sys.argv[1:], 'mark': os.environ.get('CHILD_MARK')}))\n")  # fmt: skip
    runs = child_runs(str(script), ["--shapes", "2x64"], 2, env={**os.environ, "CHILD_MARK": "x"})
    assert runs == [{"argv": ["--child", "--shapes", "2x64"], "mark": "x"}] * 2


def test_settings_ab_reads_variants_and_divides_by_the_first(scripts, tmp_path):
    """Variants of settings and of code (``@TREE``: another package first on the variant's PYTHONPATH), their order
    over alternating rounds, and every variant's times over the first variant's of the same round."""
    from settings_ab import parse_variant, ratios, rounds_order, tree_env
    from timed_calls import settings_changes

    assert parse_variant("default") == ("default", [], None)
    name, items, tree = parse_variant("split-triton-walk:precision=split+gluon=0")
    assert name == "split-triton-walk" and settings_changes(items) == {"precision": "split", "gluon": False}
    pinned = parse_variant("pin:kernel_config=BT=64,BV=32,num_warps=4,num_stages=3")[1]
    assert settings_changes(pinned) == {"kernel_config": "BT=64,BV=32,num_warps=4,num_stages=3"}
    assert parse_variant("before:segment_len=0@/tmp/before") == ("before", ["segment_len=0"], "/tmp/before")
    with pytest.raises(ValueError, match="needs a name"):
        parse_variant(":precision=split")
    with pytest.raises(ValueError, match="a folder after @"):
        parse_variant("before@")

    assert tree_env(None) is None
    with pytest.raises(ValueError, match="no lightning_attention package"):
        tree_env(str(tmp_path))
    (tmp_path / "lightning_attention").mkdir()
    (tmp_path / "lightning_attention" / "__init__.py").write_text("")
    assert tree_env(str(tmp_path))["PYTHONPATH"].split(os.pathsep)[0] == str(tmp_path)

    assert rounds_order(3, 1) == [(1, 0), (1, 1), (1, 2)]
    assert rounds_order(2, 3) == [(1, 0), (1, 1), (2, 1), (2, 0), (3, 0), (3, 1)]

    def run(name, round_, fwd, fwdbwd):
        return {"name": name, "round": round_, "points": [{"shape": "8x8192", "fwd_graph_ms": fwd,
                                                            "fwdbwd_graph_ms": fwdbwd}]}  # fmt: skip

    rows = ratios([run("default", 1, 0.25, 1.0), run("split", 1, 0.5, None), run("split", 2, 0.6, 1.2),
                   run("default", 2, 0.3, 1.0)])  # fmt: skip
    assert rows == [
        {"variant": "split", "round": 1, "shape": "8x8192", "fwd_graph_ms": 2.0, "fwdbwd_graph_ms": None},
        {"variant": "split", "round": 2, "shape": "8x8192", "fwd_graph_ms": 0.6 / 0.3, "fwdbwd_graph_ms": 1.2},
    ]


def test_ncu_sass_summary_reads_each_launch_of_a_sass_page(scripts, tmp_path, capsys, monkeypatch):
    """Nsight Compute's SASS page (two launches of one kernel, one of another): each launch of the chosen kernel on its
    own, its stall samples by reason and its instructions with the most samples and the most excess shared
    wavefronts; a non-number counter ("-") counts as 0."""
    import ncu_sass_summary

    header = ('"Address","Source","Warp Stall Sampling (All Samples)","L1 Wavefronts Shared Excessive",'
              '"L1 Wavefronts Shared","L1 Wavefronts Shared Ideal","stall_barrier","stall_long_sb",'
              '"stall_barrier (Not Issued)"')  # fmt: skip

    def launch(name, rows):
        return f'"Kernel Name","{name}",\n{header}\n' + "\n".join(rows) + "\n"

    page = (
        launch("walk_kernel", ['"0x10","  NOP","30","0","0","0","30","0","30"',
                               '"0x20","  STS.64 [R7+0x20000], R24","10","4","8","4","2","8","1"',
                               '"0x30","  LDS.128 R28, [R0]","0","-","4","4","0","0","0"'])
        + launch("other_kernel", ['"0x10","  NOP","5","0","0","0","5","0","5"'])
        + launch("walk_kernel", ['"0x10","  NOP","1","0","0","0","1","0","1"'])
    )  # fmt: skip
    launches = ncu_sass_summary.read_launches(page)
    assert [name for name, _ in launches] == ["walk_kernel", "other_kernel", "walk_kernel"]
    s = ncu_sass_summary.summarise(launches[0][1], top=2)
    assert s["samples"] == 40 and s["reasons"] == {"barrier": 32, "long_sb": 8}
    assert [w["source"] for w in s["waits"]] == ["NOP", "STS.64 [R7+0x20000], R24"]
    assert s["waits"][1]["reason"] == "long_sb"
    assert (s["excess_wavefronts"], s["wavefronts"]) == (4, 12)
    assert [(c["excess"], c["wavefronts"], c["ideal"]) for c in s["conflicts"]] == [(4, 8, 4)]

    path = tmp_path / "sass.csv"
    path.write_text(page)
    monkeypatch.setattr(sys, "argv", ["ncu_sass_summary.py", str(path), "--kernel", "walk", "--json",
                                      str(tmp_path / "s.json")])  # fmt: skip
    assert ncu_sass_summary.main() == 0
    out = capsys.readouterr().out
    assert "== walk_kernel #1: 40 stall samples" in out and "== walk_kernel #2: 1 stall samples" in out
    assert "other_kernel" not in out
    assert [x["launch"] for x in json.loads((tmp_path / "s.json").read_text())] == [1, 2]
