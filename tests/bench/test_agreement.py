"""lightning_attention.bench.agreement: two recorded runs compared point by point (synthetic JSON written the way
``bench kernels`` writes it; no GPU)."""

import pytest

from lightning_attention.bench import agreement
from lightning_attention.bench.results import ResultWriter
from lightning_attention.bench.run_folder import load_run, merge_kernels

LINE = "NVIDIA H200 | driver 1 | CUDA 13.0 | torch 2.11.0 | triton 3.6.0 | fla 0.6.0 | x | {}"


def _run(folder, times: dict, argv: list[str]):
    """A run folder whose grid (a) holds, per (provider, T), ``(fwd, fwd p20, fwd+bwd, replay, MHz)`` (replay None:
    not timed as a graph)."""
    w = ResultWriter(folder / "kernels.json", "kernels", {"git": "abc"}, LINE.format(folder.name), {"argv": argv})
    w.set("grids", {"a-d128": {"description": "grid (a) K=128", "head_dim": 128}})
    for (provider, T), (fwd, fwd_p20, fwdbwd, graph, mhz) in times.items():
        family = "ours" if provider.startswith("ours") else "baseline"
        r = {
            "grid": "a-d128",
            "provider": provider,
            "family": family,
            "seqlen": T,
            "batch": 65536 // T,
            "status": "ok",
            "fwd_ms": fwd,
            "fwd_p20_ms": fwd_p20,
            "fwdbwd_ms": fwdbwd,
            "fwdbwd_p20_ms": fwdbwd,
            "fwd_sm_mhz": mhz,
        }
        if graph is not None:
            r.update(fwdbwd_graph_ms=graph, fwdbwd_graph_p20_ms=graph)
        w.add("results", r)
    w.add(
        "results",
        {"grid": "a-d128", "provider": "fla", "family": "baseline", "seqlen": 4096, "batch": 16, "status": "oom"},
    )
    return folder


@pytest.fixture
def two_runs(tmp_path):
    first = _run(tmp_path / "first", {
        ("ours-chunk", 1024): (0.30, 0.29, 1.00, 0.98, 1980.0),
        ("ours-chunk", 2048): (0.40, 0.40, 1.20, None, 1900.0),
        ("fla", 1024): (1.00, 1.00, 3.00, 3.00, 1980.0),
    }, ["lightning_attention/bench/__main__.py", "kernels"])  # fmt: skip
    second = _run(tmp_path / "second", {
        ("ours-chunk", 1024): (0.33, 0.29, 1.02, 0.98, 1700.0),  # the median 10% slower, the 20th percentile equal
        ("ours-chunk", 2048): (0.40, 0.40, 1.146, 1.10, 1900.0),  # the first run timed no replay at 2K
        ("ours-chunk", 8192): (0.50, 0.50, 1.50, 1.50, 1900.0),  # only in the second run
        ("fla", 1024): (1.01, 1.01, 3.03, 3.00, 1980.0),
    }, ["lightning_attention/bench/__main__.py", "kernels", "--settle-s", "1"])  # fmt: skip
    return first, second


def test_points_are_the_second_run_against_the_first(two_runs):
    first, second = (merge_kernels(load_run(f).of("kernels")) for f in two_runs)
    points = {(p.provider, p.seqlen, p.timer): p for p in agreement.compare(first, second)}
    # only what both measured: no 8K (one run), no replay at 2K (one run), no failed FLA point
    assert set(points) == {
        ("ours-chunk", 1024, "fwd"), ("ours-chunk", 1024, "fwdbwd"), ("ours-chunk", 1024, "fwdbwd_graph"),
        ("ours-chunk", 2048, "fwd"), ("ours-chunk", 2048, "fwdbwd"),
        ("fla", 1024, "fwd"), ("fla", 1024, "fwdbwd"), ("fla", 1024, "fwdbwd_graph"),
    }  # fmt: skip
    p = points[("ours-chunk", 1024, "fwd")]
    assert p.median_pct == pytest.approx(10.0) and p.p20_pct == pytest.approx(0.0)
    assert (p.mhz_a, p.mhz_b) == (1980.0, 1700.0)
    assert points[("ours-chunk", 2048, "fwdbwd")].median_pct == pytest.approx(-4.5)
    assert points[("ours-chunk", 1024, "fwdbwd")].mhz_a is None  # no clock sampled for that timer

    by_key = {(v.provider, v.timer): v for v in agreement.verdicts(list(points.values()), bound_pct=5.0)}
    fwd = by_key[("ours-chunk", "fwd")]
    assert (fwd.points, fwd.within, fwd.met) == (2, 1, False) and fwd.largest_pct == pytest.approx(10.0)
    assert by_key[("ours-chunk", "fwdbwd")].met
    assert by_key[("fla", "fwdbwd")].met and by_key[("fla", "fwdbwd")].largest_pct == pytest.approx(1.0)
    # the tables' order: ours before FLA, timers in the order the kernels benchmark times them
    order = [(v.provider, v.timer) for v in agreement.verdicts(list(points.values()))]
    assert order[:3] == [("ours-chunk", "fwd"), ("ours-chunk", "fwdbwd"), ("ours-chunk", "fwdbwd_graph")]


def test_report_names_both_commands_and_the_points_past_the_bound(two_runs, tmp_path, capsys):
    first, second = two_runs
    out = tmp_path / "agreement.md"
    assert agreement.main([str(first), str(second), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert out.read_text() == text
    assert "`python -m lightning_attention.bench kernels --settle-s 1`" in text  # how each run was timed
    assert "| 1024 | +10.0% (+0.0%) | +2.0% (+2.0%) | +0.0% (+0.0%) |" in text
    assert "ours (chunk) fwd: not met, 1 of 2 points, largest +10.0%" in text
    assert "ours (chunk) fwd+bwd: met, 2 of 2 points, largest -4.5%" in text
    assert "T=1024: +10.0% (20th percentile +0.0%), 1980 against 1700 MHz" in text
    assert agreement.main([str(first), str(second), "--bound", "12"]) == 0
    assert "Past the bound" not in capsys.readouterr().out


def test_runs_without_common_points_and_missing_folders(tmp_path, capsys):
    a = _run(tmp_path / "a", {("ours-chunk", 1024): (0.3, 0.3, 1.0, None, None)}, ["x"])
    b = _run(tmp_path / "b", {("ours-chunk", 2048): (0.3, 0.3, 1.0, None, None)}, ["x"])
    assert "No point was measured in both runs." in agreement.render(a, b)
    assert agreement.main([str(a), str(tmp_path / "absent")]) == 2
    assert "is not a folder" in capsys.readouterr().err
