"""lightning_attention.bench.tables: the markdown tables and the targets check of a run folder (synthetic JSON written
the way the benchmarks write it; no GPU)."""

import os
import pathlib
import subprocess
import sys

import pytest

from lightning_attention.bench import tables, targets
from lightning_attention.bench.providers import GRID_A_SEQLENS, GRID_B_SEQLENS
from lightning_attention.bench.results import ResultWriter
from lightning_attention.bench.run_folder import load_run, merge_kernels

ROOT = pathlib.Path(__file__).resolve().parents[1]
LINE = "NVIDIA H200 | driver 1 | CUDA 13.0 | torch 2.11.0 | triton 3.6.0 | fla 0.6.0 | lightning_attn 0.0.5 | x | {}"


def _writer(folder: pathlib.Path, bench: str, date: str) -> ResultWriter:
    machine = {"torch": "2.11.0", "triton": "3.6.0", "gpu": "NVIDIA H200", "git": "abc1234"}
    return ResultWriter(folder / f"{bench}.json", bench, machine, LINE.format(date), {"argv": ["x", bench]})


def _record(grid, provider, T, batch, fwd, fwdbwd, *, k=128, status="ok", **extra):
    family = {"ours-chunk": "ours", "ours-recompute": "ours", "torch": "reference"}.get(provider, "baseline")
    r = {"grid": grid, "provider": provider, "family": family, "batch": batch, "seqlen": T, "heads": 16,
         "k_dim": k, "v_dim": k, "dtype": "bfloat16", "tokens": batch * T, "floor_fwd_ms": 0.36,
         "floor_fwdbwd_ms": 0.98, "status": status, **extra}
    if status == "ok":
        r.update(fwd_ms=fwd, fwdbwd_ms=fwdbwd, tokens_per_s_fwdbwd=batch * T / (fwdbwd * 1e-3),
                 floor_ratio_fwd=fwd / 0.36, floor_ratio_fwdbwd=fwdbwd / 0.98)
    return r


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A run: grid (a) K=128 with FLA, grid (b) (FLA too slow at 128K, OOM at 1M), K=64 at two T, decode, hybrid,
    and the two sequence-parallel reports."""
    folder = tmp_path_factory.mktemp("run")
    w = _writer(folder / "kernels", "kernels", "d1")
    w.set("copy_bandwidth", {"bytes_per_s": 4.3e12})
    w.set("grids", {"a-d128": {"description": "grid (a) K=128", "head_dim": 128}})
    for i, T in enumerate(GRID_A_SEQLENS):
        w.add("results", _record("a-d128", "ours-chunk", T, 65536 // T, 0.5, 2.0, workspace_ratio=0.05,
                                 **({"cold_start_s": 9.0} if i == 0 else {})))
        w.add("results", _record("a-d128", "fla", T, 65536 // T, 1.0, 4.0))
    w.add("accuracy", {"provider": "ours-chunk", "k_dim": 128, "dtype": "bfloat16", "err_o": 1e-3, "err_dq": 2e-3,
                       "err_dk": 2e-3, "err_dv": 1e-3, "err_max": 2e-3, "status": "ok"})
    w.add("accuracy", {"provider": "fla", "k_dim": 128, "dtype": "bfloat16", "err_o": 1e-3, "err_dq": 1.8e-3,
                       "err_dk": 1e-3, "err_dv": 1e-3, "err_max": 1.8e-3, "status": "ok"})
    w.set("elapsed_s", 1.0)

    w = _writer(folder / "kernels_b", "kernels", "d2")
    w.set("grids", {"b-d128": {"description": "grid (b)", "head_dim": 128}})
    for T, ms in zip(GRID_B_SEQLENS, (2.3, 9.0, 37.0, 74.0), strict=True):  # tokens/s 14.2 .. 14.5 M: flat
        w.add("results", _record("b-d128", "ours-chunk", T, 1, ms / 4, ms))
    w.add("results", _record("b-d128", "fla", 131072, 1, 3.0, 10.8))  # 1.2x: short of 1.5x
    w.add("results", _record("b-d128", "fla", 1048576, 1, None, None, status="oom", error="CUDA out of memory"))
    w.set("elapsed_s", 1.0)

    w = _writer(folder / "head_dims", "kernels", "d3")
    for T in (1024, 65536):
        w.add("results", _record("a-d64", "ours-chunk", T, 65536 // T, 0.3, 1.0, k=64))
        w.add("results", _record("a-d64", "fla", T, 65536 // T, 0.6, 2.0, k=64))
    # no "grids" and no "elapsed_s": a run stopped by its time limit

    w = _writer(folder / "decode", "decode", "d4")
    w.set("decode_shape", {"heads": 16, "k_dim": 128, "v_dim": 128, "dtype": "bfloat16"})
    for batch, speedup, vs_floor in ((1, 6.0, 9.0), (8, 5.5, 2.0), (64, 3.0, 1.2), (256, 1.0, 1.25)):
        w.add("latency", {"batch": batch, "status": "ok", "floor_run_us": 0.7 * batch, "result": {
            "ours_us": 10.0, "ours_gpu_us": 5.0, "ours_graph_us": 4.0, "fla_us": 10.0 * speedup, "fla_graph_us": 9.0,
            "speedup_vs_fla": speedup, "graph_speedup_vs_fla": 2.0, "floor_us": 0.7 * batch, "gpu_vs_floor": vs_floor,
            "device": "cuda:0"}})
    w.set("memory", {"status": "ok", "result": {"metric": "torch.cuda.max_memory_allocated", "flat": True, "runs": [
        {"tokens": 1024, "peak_bytes": 2**21, "start_bytes": 2**20, "kv_cache_bytes": 1}]}})

    w = _writer(folder / "hybrid", "hybrid", "d5")
    w.add("results", {"seqlen": 4096, "status": "ok", "result": {
        "batch": 1, "num_heads": 16, "head_dim": 128, "hybrid_fwd_ms": 1.0, "hybrid_fwdbwd_ms": 3.0,
        "sdpa_fwd_ms": 0.5, "sdpa_fwdbwd_ms": 2.0, "speedup_fwd": 0.5, "speedup_fwdbwd": 2 / 3}})

    w = _writer(folder / "sp", "sp_check", "d6")
    w.set("world_size", 2)
    w.set("backend", "nccl")
    w.set("shape", {"batch": 1, "seq_len": 262144, "heads": 8, "dim_k": 128, "dim_v": 128, "dtype": "bfloat16"})
    errors = {n: {"rel_l2": 2e-3, "non_finite": 0} for n in ("o", "dq", "dk", "dv", "final", "dh0")}
    w.add("cases", {"decay": "tnl", "errors": errors, "single_process_errors": errors, "tolerance": 5e-3,
                    "passed": True})
    w.set("passed", True)
    w = _writer(folder / "sp", "sp_scaling", "d7")
    w.set("world_size", 2)
    w.set("backend", "nccl")
    w.set("layer", {"what": "TNLAttention", "heads": 16, "dim_k": 128, "dtype": "bfloat16"})
    row = {"send_bytes_per_layer": 2097160, "collectives": []}
    w.set("communication", {"measured_rank0": [{"seq_len": 65536, **row}, {"seq_len": 1048576, **row}],
                            "predicted": {"total_send": 2097160}, "independent_of_seq_len": True,
                            "matches_prediction": True})
    w.set("tokens_per_second", [{"seq_len": 262144, "gpus_1": {"status": "ok", "tokens_per_second": 3e6},
                                 "gpus_2": {"status": "ok", "tokens_per_second": 5.7e6}, "speedup": 1.9,
                                 "efficiency": 0.95}])
    w.set("longest_seq_len", {"gpus_1": 1048576, "gpus_2": 2097152, "stopped_gpus_1": "oom", "stopped_gpus_2": "oom"})
    (folder / "notes.json").write_text("[1, 2]")  # not a benchmark document: listed, not read
    return folder


def _statuses(folder) -> dict[str, tuple[str, str]]:
    """target -> (status, detail) of the targets and the further goals of a run folder."""
    run = load_run(folder)
    kern = merge_kernels(run.of("kernels"))
    return {v.target: (v.status, v.detail) for v in [*targets.targets(run, kern), *targets.goals(kern)]}


# the targets and goals by name (what the tables print in their "target" column)
GRID_A_FWDBWD = "grid (a): fwd+bwd ≥ 1.8× FLA at every T"
GRID_A_FWD = "grid (a): fwd ≥ 1.8× FLA or ≤ 1.5× the HBM floor at every T"
FLAT = "grid (b): fwd+bwd tokens/s flat within ±10% from 32K to 1M"
GRID_B_FLA = "grid (b): fwd+bwd ≥ 1.5× FLA at 128K"
FITS_1M = "grid (b): T = 1M fits (fwd+bwd)"
WORKSPACE = "workspace ≤ 25% of one input (grid (a))"
K64 = "K = V = 64: fwd+bwd ≥ 1.5× FLA (grid (a))"
K256 = "K = V = 256: fwd+bwd ≥ 3× and fwd ≥ 2× FLA (grid (a))"
ACCURACY = "accuracy ≤ 1.25× FLA's error and within the bf16 tolerance"
COLD = "cold start ≤ 15 s (first fwd+bwd of a shape class)"
DECODE_FLA = "eager step ≥ 5× FLA at batch 1 and 8"
DECODE_FLOOR = "GPU time ≤ 1.3× the state floor at batch 64 and 256"
DECODE_GRAPH = "step capturable in a CUDA graph (out=)"
SP_VALUES = "== the single-process op at T = 256K (outputs, grads; vs float64)"
SP_COMM = "communication per layer independent of T (and = the prediction)"
GOAL_128 = "K = V = 128: fwd+bwd ≥ 2× and fwd ≥ 1.5× FLA at every T of grid (a)"
GOAL_64 = "K = V = 64: fwd+bwd ≥ 2× and fwd ≥ 1.5× FLA at every T of grid (a)"
GOAL_FLOOR = "K = V = 128: fwd ≤ 1.25× and fwd+bwd ≤ 1.7× the HBM floor at every T of grid (a)"


def test_targets_of_a_synthetic_run(run_dir):
    got = _statuses(run_dir)
    status = {what: s for what, (s, _) in got.items()}
    assert status[GRID_A_FWDBWD] == status[GRID_A_FWD] == status[FLAT] == status[FITS_1M] == "met"
    assert status[GRID_B_FLA] == "not met" and "1.20×" in got[GRID_B_FLA][1]
    assert status[WORKSPACE] == status[ACCURACY] == status[COLD] == "met"
    assert status[K64] == "met where measured" and "not measured at T=2048" in got[K64][1]
    assert status[K256] == "not measured"
    assert status[DECODE_FLA] == status[DECODE_FLOOR] == status[DECODE_GRAPH] == "met"
    assert status[SP_VALUES] == status[SP_COMM] == "met"
    # the further goals: K = 128 at 2.00× FLA both ways (fwd+bwd met, fwd met), 1.39× / 2.04× the floor (not met);
    # K = 64 at 2.00× fwd+bwd and 2.00× fwd where measured
    assert status[GOAL_128] == "met"
    assert status[GOAL_FLOOR] == "not met" and "1.39× / 2.04×" in got[GOAL_FLOOR][1]
    assert status[GOAL_64] == "met where measured" and "(fwd+bwd 2.00×, fwd 2.00×)" in got[GOAL_64][1]


def test_a_run_where_no_baseline_finished(tmp_path, capsys):
    """FLA failed at every point: the ratio targets are not measured (never met by default), the recompute backward
    gets its own column, and the decode targets still judge what was measured."""
    w = _writer(tmp_path / "kernels", "kernels", "d1")
    w.set("grids", {"a-d128": {"description": "grid (a) K=128", "head_dim": 128}})
    for T in (2048, 8192):
        w.add("results", _record("a-d128", "ours-chunk", T, 65536 // T, 0.6, 2.4, workspace_ratio=0.1))
        w.add("results", _record("a-d128", "ours-recompute", T, 65536 // T, 0.6, 2.9, workspace_ratio=0.0))
        w.add("results", _record("a-d128", "fla", T, 65536 // T, None, None, status="error", error="compile"))
    w.set("elapsed_s", 1.0)
    w = _writer(tmp_path / "decode", "decode", "d2")
    for batch, speedup in ((1, 3.2), (8, 5.5), (64, 1.0)):
        w.add("latency", {"batch": batch, "status": "ok", "result": {
            "ours_us": 10.0, "ours_gpu_us": 5.0, "speedup_vs_fla": speedup, "gpu_vs_floor": 1.1, "device": "cuda:0"}})
    got = _statuses(tmp_path)
    assert got[GRID_A_FWDBWD] == ("not measured", "no FLA result in grid a-d128 of the run")
    assert got[WORKSPACE][0] == "met where measured"
    assert got[DECODE_FLA][0] == "not met" and "short of the target at batch 1" in got[DECODE_FLA][1]
    assert got[DECODE_FLOOR][0] == "met where measured"
    assert got[DECODE_GRAPH][0] == "not met"  # measured on a GPU without a graph
    assert tables.main([str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "| T | batch | ours (chunk) | ours (recompute) | FLA | floor |" in text
    assert "| 2048 | 32 | 0.600 / 2.40 | 0.600 / 2.90 | ERROR | 0.360 / 0.980 | 1.67 / 2.45 | - | 0.100 |" in text
    assert "- fla a-d128 T=2048: error: compile" in text


def test_grid_b_flatness_from_graph_replays(tmp_path, capsys):
    """A run with --cuda-graphs: the plain calls are host-bound at 32K (not flat), the replays are flat; the target
    is judged on the replays and quotes the plain figure, and the table shows both."""
    w = _writer(tmp_path / "kernels_b", "kernels", "d2")
    w.set("grids", {"b-d128": {"description": "grid (b)", "head_dim": 128}})
    for T, ms, graph_ms in zip(GRID_B_SEQLENS, (1.4, 3.6, 13.6, 27.4), (0.95, 3.6, 13.5, 27.3), strict=True):
        w.add("results", _record("b-d128", "ours-chunk", T, 1, ms / 4, ms, fwdbwd_graph_ms=graph_ms,
                                 tokens_per_s_fwdbwd_graph=T / (graph_ms * 1e-3)))
    w.set("elapsed_s", 1.0)
    status, detail = _statuses(tmp_path)[FLAT]
    assert status == "met" and "as CUDA-graph replays (plain calls ±" in detail, detail
    assert tables.main([str(tmp_path)]) == 0
    assert "| 32768 | 23.4 M (1.40 ms); graph 34.5 M (0.950 ms) | - |" in capsys.readouterr().out


def test_further_goals_judge_the_fwd_bwd_on_graph_replays(tmp_path):
    """A run with --cuda-graphs: plain fwd+bwd calls at 1.80× FLA (host-bound), replays at 2.10×; the further goals
    (kernel targets) take the replays where both sides have them, and their floor ratio; the 1.8× target keeps the
    plain calls."""
    w = _writer(tmp_path / "kernels", "kernels", "d1")
    w.set("grids", {"a-d128": {"description": "grid (a) K=128", "head_dim": 128}})
    for T in GRID_A_SEQLENS:
        w.add("results", _record("a-d128", "ours-chunk", T, 65536 // T, 0.40, 2.0, fwdbwd_graph_ms=1.60,
                                 floor_ratio_fwdbwd_graph=1.60 / 0.98))  # fmt: skip
        w.add("results", _record("a-d128", "fla", T, 65536 // T, 0.80, 3.6, fwdbwd_graph_ms=3.36))
    w.set("elapsed_s", 1.0)
    got = _statuses(tmp_path)
    assert got[GOAL_128][0] == "met" and "(fwd+bwd replayed 2.10×, fwd 2.00×)" in got[GOAL_128][1], got[GOAL_128]
    assert got[GOAL_FLOOR][0] == "met" and "1.11× / 1.63× (fwd+bwd replayed)" in got[GOAL_FLOOR][1]  # plain: 2.04×
    assert got[GRID_A_FWDBWD][0] == "met" and "1.80×" in got[GRID_A_FWDBWD][1]


def test_clock_line_of_a_run_that_sampled_the_clock(tmp_path, capsys):
    """Records with the SM clock of their measurements: one line under the grid's table, per provider and timer the
    range of the per-T means and the mean share capped; a provider without clock fields is left out of it."""
    w = _writer(tmp_path / "kernels", "kernels", "d1")
    w.set("grids", {"a-d256": {"description": "grid (a) K=256", "head_dim": 256}})
    for T, mhz, capped in ((1024, 1980.0, 0.0), (2048, 1650.0, 1.0)):
        w.add("results", _record("a-d256", "ours-chunk", T, 65536 // T, 1.1, 5.0, k=256, fwd_sm_mhz=mhz,
                                 fwd_capped_share=capped, fwdbwd_sm_mhz=1640.0, fwdbwd_capped_share=1.0))
        w.add("results", _record("a-d256", "fla", T, 65536 // T, 2.3, 13.7, k=256))
    w.set("elapsed_s", 1.0)
    assert tables.main([str(tmp_path)]) == 0
    text = capsys.readouterr().out
    line = ("SM clock over each measurement (its mean; the share of samples under the power cap): ours (chunk) fwd "
            "1,650–1,980 MHz (50% capped) ; ours (chunk) fwd+bwd 1,640–1,640 MHz (100% capped).")
    assert line in text, text
    kern = merge_kernels(load_run(tmp_path).of("kernels"))
    assert tables.clock_line(kern, "a-d256") == line
    for r in kern.rows.values():  # the same run without clock fields: no line
        for key in [k for k in r if "_sm_mhz" in k or "_capped_share" in k]:
            del r[key]
    assert tables.clock_line(kern, "a-d256") is None


def test_accuracy_target_takes_the_measurement_beside_fla(tmp_path):
    """Two documents measure K = 128 (grid (a) with FLA, grid (b) ours only, in that order and the reverse): the
    target compares the one that has FLA's error beside it, never reporting K = 128 as not measured."""
    ours = {"provider": "ours-chunk", "k_dim": 128, "dtype": "bfloat16", "err_max": 2e-3, "status": "ok"}
    for order, names in enumerate((("a", "b"), ("b", "a"))):
        folder = tmp_path / str(order)
        for name in names:
            w = _writer(folder / f"kernels_{name}", "kernels", "d1")
            w.add("accuracy", ours)
            if name == "a":
                w.add("accuracy", {**ours, "provider": "fla", "err_max": 1.8e-3})
            w.set("elapsed_s", 1.0)
        status, detail = _statuses(folder)[ACCURACY]
        assert status == "met" and "1.11× FLA" in detail and "not measured" not in detail, detail


def test_tables_of_a_synthetic_run(run_dir, tmp_path, capsys):
    out = tmp_path / "tables.md"
    assert tables.main([str(run_dir), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert out.read_text() == text
    assert text.count("- Machine line:") == 1  # the same machine in every document, dates aside
    expected = (
        "| T | batch | ours (chunk) | FLA | floor | ours ÷ floor | vs FLA | workspace ÷ q |",
        "| 1024 | 64 | 0.500 / 2.00 | 1.00 / 4.00 | 0.360 / 0.980 | 1.39 / 2.04 | 2.00× / 2.00× | 0.0500 |",
        "| 131072 | 14.6 M (9.00 ms) | 12.1 M (10.8 ms) | 1.20× |",
        "| 1048576 | 14.2 M (74.0 ms) | OOM | - |",
        "Flatness (max deviation from the mean, 32K → 1M): ours (chunk) ±",
        "| 1 | 10.0 | 5.00 | 4.00 | 60.0 | 9.00 | 6.00× | 2.00× | 0.700 | 0.700 | 9.00 |",
        "| 4096 | 1.00 / 3.00 | 0.500 / 2.00 | 0.50× / 0.67× |",
        "T = 262144, B = 1, H = 8, K = V = 128, bfloat16, 2 ranks (nccl): passed = True",
        "| 262144 | 3.00 M | 5.70 M | 1.90× | 0.950 |",
        "ignored notes.json (not a benchmark document)",
        "head_dims/kernels.json: no elapsed_s",
        "Copy bandwidth: 4.30 TB/s (kernels/kernels.json)",
    )
    missing = [line for line in expected if line not in text]
    assert not missing, missing


def test_empty_folder(tmp_path, capsys):
    assert tables.main([str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "JSON: none found" in text and "| not measured |" in text
    assert tables.main([str(tmp_path / "missing")]) == 2


def test_runs_as_a_module(run_dir):
    """``python -m lightning_attention.bench.tables DIR``, the command the docs and the GPU suite give."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "lightning_attention.bench.tables", str(run_dir)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith(f"### {run_dir.name}") and "Further goals" in proc.stdout
