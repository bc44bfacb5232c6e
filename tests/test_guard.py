"""benchmarks/guard.py without a GPU: the verdicts of ``report`` on synthetic runs (launch- against device-bound
points, paired points, PASS, FAIL, INCOMPLETE), the processes ``run`` plans, a whole ``run`` with the GPU processes
replaced by fakes, the renamed copy of the older package imported beside the current one, and ``measure`` refusing
to run on a CPU."""

import importlib
import json
import os
import pathlib
import subprocess
import sys
import types

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def guard():
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(ROOT / "benchmarks"))  # the script imports its siblings
        yield importlib.import_module("guard")


def _raw(folder: pathlib.Path, label: str, rep: int, values: dict, group: str = "all") -> None:
    """One process's file; ``label`` "pair": ``values`` is {"old": {...}, "new": {...}}."""
    raw = folder / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    doc = {"group": group, "label": label, "rep": rep, "package": {"file": f"/{label}/lightning_attention/__init__.py"},
           "machine": {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11.0", "triton": "3.6.0", "cuda": "13.0"},
           "points": values}  # fmt: skip
    (raw / f"{label}-{group}-rep{rep}.json").write_text(json.dumps(doc))


def _every_point(guard, value=1.0, device=1.0, host=0.1) -> dict[str, dict]:
    return {p.name: {"value": value, "device": device, "host": host} for p in guard.POINTS}


def _write_run(guard, folder, changes: dict[str, tuple[dict, dict]], reps: int = 3) -> None:
    """Every point at 1.0 (device-bound) in both packages, except ``changes``: name -> (old, new) medians' inputs, or
    a list of such pairs, one per repetition. The paired groups' points go to "pair" files, the others to one file
    per package."""
    (folder / "plan.json").parent.mkdir(parents=True, exist_ok=True)
    (folder / "plan.json").write_text(
        json.dumps(
            {
                "reps": 3,
                "gpu": "NVIDIA H100 80GB HBM3, 580.159.04, 81559 MiB",
                "packages": {"old": {"commit": "d032eca"}, "new": {"commit": "abc"}},
            }
        )
    )
    group_of = {p.name: p.group for p in guard.POINTS}
    for rep in range(1, reps + 1):
        sides = {}
        for i, label in enumerate(("old", "new")):
            values = _every_point(guard)
            for name, change in changes.items():
                values[name] = dict((change[rep - 1] if isinstance(change, list) else change)[i])
            sides[label] = values
            _raw(folder, label, rep, {k: v for k, v in values.items() if group_of[k] not in guard.PAIRED_GROUPS})
        for group in sorted(guard.PAIRED_GROUPS):  # one process per paired group, both packages in it
            _raw(folder, "pair", rep, {label: {k: v for k, v in values.items() if group_of[k] == group}
                                       for label, values in sides.items()}, group=group)  # fmt: skip


def _points(folder) -> dict[str, dict]:
    return {p["name"]: p for p in json.loads((folder / "guard.json").read_text())["points"]}


def test_report_judges_device_and_launch_bound_points(guard, tmp_path):
    changes = {
        # device-bound (host below device): 2.9% slower passes, 3.5% fails
        "a128-T2048-fwd": ({"value": 0.500, "device": 0.500, "host": 0.05},
                           {"value": 0.5145, "device": 0.5145, "host": 0.05}),
        "a128-T8192-fwd": ({"value": 0.500, "device": 0.500, "host": 0.05},
                           {"value": 0.5175, "device": 0.5175, "host": 0.05}),
        # launch-bound (host above device): 4.5% passes; 20% slower but 0.4 µs passes; 10% and 1 µs fails
        "host-T1024-fwd": ({"value": 40.0, "device": 12.0, "host": 40.0},
                           {"value": 41.8, "device": 12.0, "host": 41.8}),
        "decode-b1-step": ({"value": 2.0, "device": 1.0, "host": 2.0}, {"value": 2.4, "device": 1.0, "host": 2.4}),
        "decode-b1-wall": ({"value": 10.0, "device": 1.0, "host": 3.0}, {"value": 11.0, "device": 1.0, "host": 3.0}),
        # launch-bound in the old package only (the new one moved below its device time): the looser rule applies
        "host-T1024-fwdbwd": ({"value": 100.0, "device": 60.0, "host": 100.0},
                              {"value": 104.0, "device": 110.0, "host": 104.0}),
        # throughput: 2% fewer tokens/s passes; faster always passes
        "tnl40m-train": ({"value": 500e3, "device": None, "host": None},
                         {"value": 490e3, "device": None, "host": None}),
        "a256-T4096-fwdbwd": ({"value": 8.0, "device": 8.0, "host": 1.0}, {"value": 6.0, "device": 6.0, "host": 1.0}),
    }  # fmt: skip
    _write_run(guard, tmp_path, changes)
    assert guard.report_folder(tmp_path, quiet=True) == 1
    got = _points(tmp_path)
    verdict = {name: (p["bound"], p["verdict"]) for name, p in got.items()}
    assert verdict["a128-T2048-fwd"] == ("device", "PASS")
    assert verdict["a128-T8192-fwd"] == ("device", "FAIL")
    assert verdict["host-T1024-fwd"] == ("launch", "PASS")
    assert verdict["decode-b1-step"] == ("launch", "PASS")  # 0.4 µs slower
    assert verdict["decode-b1-wall"] == ("launch", "FAIL")  # 10% and 1 µs slower
    assert verdict["host-T1024-fwdbwd"] == ("launch", "PASS")
    assert verdict["tnl40m-train"] == ("device", "PASS")
    assert verdict["a256-T4096-fwdbwd"] == ("device", "PASS")
    assert got["a128-T8192-fwd"]["change"] == pytest.approx(0.035)
    assert got["tnl40m-train"]["change"] == pytest.approx(500 / 490 - 1)
    assert len(got["a128-T2048-fwd"]["old"]["runs"]) == 3
    summary = json.loads((tmp_path / "guard.json").read_text())
    assert summary["verdict"] == "FAIL" and summary["machine"]["triton"] == "3.6.0"
    assert summary["packages"]["old"]["commit"] == "d032eca"
    assert len(summary["runs"]) == 3 * (2 + len(guard.PAIRED_GROUPS))  # per rep: old, new, one pair per paired group
    table = (tmp_path / "guard.md").read_text()
    assert table.startswith("# Guard: FAIL")
    assert (
        "| a128-T8192-fwd: grid (a) K = V = 128, T = 8192, B = 8: forward, do_bench median "
        "| ms | 0.5 | 0.5175 | 1.035 |" in table
    )
    assert "| launch (41.8 / 12) | PASS (3 paired runs: 1.045, 1.045, 1.045) |" in table
    assert "| launch (2.4 / 1) | PASS (3/3 runs) |" in table  # decode-b1-step: unpaired


def _host(us: float, device: float = 30.0) -> dict:
    return {"value": us, "device": device, "host": us}


def test_paired_points_are_judged_by_the_median_of_their_processes_ratios(guard, tmp_path):
    """A process that runs slow slows both packages in it: the ratio of the two packages' medians can mix processes
    (here 145 ÷ 120 = 1.21, a FAIL), the median of the per-process ratios (1.04) cannot."""
    changes = {
        "host-T1024-fwd": [(_host(100), _host(104)), (_host(140), _host(145)), (_host(120), _host(150))],
        "host-T1024-fwdbwd": [(_host(400), _host(440)), (_host(500), _host(560)), (_host(300), _host(320))],
    }
    _write_run(guard, tmp_path, changes)
    assert guard.report_folder(tmp_path, quiet=True) == 1
    got = _points(tmp_path)
    fwd, fwdbwd = got["host-T1024-fwd"], got["host-T1024-fwdbwd"]
    assert (fwd["old"]["value"], fwd["new"]["value"]) == (120, 145)
    assert fwd["process_ratios"] == pytest.approx([1.04, 145 / 140, 1.25])
    assert fwd["ratio"] == pytest.approx(1.04) and (fwd["bound"], fwd["verdict"]) == ("launch", "PASS")
    # 1.10, 1.12 and 1.067: the median 1.10 fails the 5% rule, and 0.5 µs is far exceeded
    assert fwdbwd["ratio"] == pytest.approx(1.10) and fwdbwd["verdict"] == "FAIL"
    assert "| FAIL (3 paired runs: 1.100, 1.120, 1.067) |" in (tmp_path / "guard.md").read_text()


def test_report_passes_only_with_every_point_and_run(guard, tmp_path):
    _write_run(guard, tmp_path / "all", {})
    assert guard.report_folder(tmp_path / "all", quiet=True) == 0
    assert json.loads((tmp_path / "all" / "guard.json").read_text())["verdict"] == "PASS"
    # two runs of three: incomplete, even though every point is within its tolerance
    _write_run(guard, tmp_path / "short", {}, reps=2)
    assert guard.report_folder(tmp_path / "short", quiet=True) == 1
    assert json.loads((tmp_path / "short" / "guard.json").read_text())["verdict"] == "INCOMPLETE"
    # a point the new package did not measure (its process failed)
    _write_run(guard, tmp_path / "missing", {})
    for file in (tmp_path / "missing" / "raw").glob("new-*.json"):
        doc = json.loads(file.read_text())
        del doc["points"]["tnl40m-train"]
        file.write_text(json.dumps(doc))
    assert guard.report_folder(tmp_path / "missing", quiet=True) == 1
    assert _points(tmp_path / "missing")["tnl40m-train"]["verdict"] == "MISSING"


def _roots(tmp_path) -> tuple[pathlib.Path, pathlib.Path]:
    old, new = tmp_path / "old", tmp_path / "new"
    for root in (old, new):
        (root / "lightning_attention").mkdir(parents=True)
        (root / "lightning_attention" / "__init__.py").write_text("")
    return old, new


def test_dry_run_prints_the_planned_processes(guard, tmp_path, capsys, monkeypatch):
    old, new = _roots(tmp_path)
    monkeypatch.setenv("LIGHTNING_ATTENTION_SEGMENT_LEN", "0")  # a setting of this shell never reaches a process
    monkeypatch.setenv("PYTHONPATH", f"{new}:/baseline/site")  # the new root inherited: never ahead of the old one
    assert guard.main(["run", "--old", str(old), "--new", str(new), "--reps", "3", "--out", str(tmp_path / "g"),
                       "--dry-run"]) == 0  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("guard: 24 processes (3 repetitions x (3 groups x 2 packages + 2 paired)); about ")
    commands = lines[1:]
    assert len(commands) == 24 and not (tmp_path / "g").exists()
    pin = "LIGHTNING_ATTENTION_KERNEL_CONFIG=BT=64,BV=64,num_warps=4,num_stages=4"
    assert commands[0].startswith(f"PYTHONPATH={old}:/baseline/site {pin} ")
    assert commands[1].startswith(f"PYTHONPATH={new}:/baseline/site {pin} ")
    assert " -P " in commands[0] and "guard.py measure --group k128 --label old --rep 1" in commands[0]
    assert f"--expect-root {old} --out {tmp_path / 'g' / 'raw' / 'old-k128-rep1.json'}" in commands[0]
    order = [(c.split("--group ")[1].split()[0], c.split("--label ")[1].split()[0]) for c in commands[:8]]
    assert order == [(g, label) for g in ("k128", "k64") for label in ("old", "new")] + [("k256", "pair")] + [
        ("decode", "old"),
        ("decode", "new"),
        ("host", "pair"),
    ]
    assert "KERNEL_CONFIG" not in commands[5] and "--rep 3" in commands[-1]
    # the paired processes: the new package first, the renamed copy of the old one beside it, the group's pin
    renamed = tmp_path / "g" / "renamed"
    assert commands[7].startswith(f"PYTHONPATH={new}:{renamed}:/baseline/site {pin} ")
    assert (
        f"--expect-root {new} --expect-old-root {renamed} --out {tmp_path / 'g' / 'raw' / 'pair-host-rep1.json'}"
        in (commands[7])
    )
    k256_pin = "LIGHTNING_ATTENTION_KERNEL_CONFIG=BT=64,BV=32,num_warps=4,num_stages=3"
    assert commands[4].startswith(f"PYTHONPATH={new}:{renamed}:/baseline/site {k256_pin} ")
    assert not any("SEGMENT_LEN" in c for c in commands)


def test_run_with_fake_processes(guard, tmp_path, monkeypatch):
    """The whole run: every process's file lands in raw/, the report follows, and a budget stops it early."""
    old, new = _roots(tmp_path)
    calls = []

    def fake_run(cmd, env, **kwargs):
        args = dict(zip(cmd[4::2], cmd[5::2]))  # python -P guard.py measure --group G --label L ...
        calls.append((args["--group"], args["--label"], env.get("LIGHTNING_ATTENTION_KERNEL_CONFIG")))
        values = {
            p.name: {"value": 1.0, "device": 1.0, "host": 0.1} for p in guard.POINTS if p.group == args["--group"]
        }
        if args["--label"] == "pair":
            values = {"old": values, "new": values}
        _raw(pathlib.Path(args["--out"]).parents[1], args["--label"], int(args["--rep"]), values, args["--group"])
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(guard.subprocess, "run", fake_run)
    out = tmp_path / "g"
    assert guard.main(["run", "--old", str(old), "--new", str(new), "--out", str(out), "--new-commit", "abc"]) == 0
    assert len(calls) == 24 and calls[0] == ("k128", "old", "BT=64,BV=64,num_warps=4,num_stages=4")
    assert calls[4] == ("k256", "pair", "BT=64,BV=32,num_warps=4,num_stages=3")
    assert calls[7] == ("host", "pair", "BT=64,BV=64,num_warps=4,num_stages=4")
    assert (out / "renamed" / "lightning_attention_old" / "__init__.py").is_file()
    summary = json.loads((out / "guard.json").read_text())
    assert summary["verdict"] == "PASS" and summary["packages"]["new"]["commit"] == "abc"
    assert all(len(p["old"]["runs"]) == len(p["new"]["runs"]) == 3 for p in summary["points"])

    calls.clear()
    clock = iter(range(0, 10_000, 30))  # every process "takes" 30 s: a 200 s budget stops the run early
    monkeypatch.setattr(guard.time, "perf_counter", lambda: next(clock))
    assert guard.main(["run", "--old", str(old), "--new", str(new), "--out", str(tmp_path / "b"), "--budget-s",
                       "200"]) == 1  # fmt: skip
    assert 0 < len(calls) < 24
    summary = json.loads((tmp_path / "b" / "guard.json").read_text())
    assert summary["verdict"] == "INCOMPLETE" and summary["stopped"].startswith("budget:")


def test_measured_points_are_the_declared_ones(guard, monkeypatch):
    """Each group's measurement returns exactly the points the report expects of it (timers replaced by fakes)."""
    import guard_points
    import timed_calls

    def fake_problem(*args, **kwargs):
        return timed_calls.Problem(*(None,) * 5, fwd=lambda: None, fwd_bwd=lambda: None)

    monkeypatch.setattr(timed_calls, "make_problem", fake_problem)
    monkeypatch.setattr(timed_calls, "device_ms", lambda fn, **kw: 1.0)
    monkeypatch.setattr(timed_calls, "host_ms", lambda fn, **kw: 0.1)
    monkeypatch.setattr(timed_calls, "graph_ms", lambda fn, **kw: 0.5)
    monkeypatch.setattr(guard_points, "_model_tokens_per_s", lambda: {"value": 1.0, "device": None, "host": None})
    for group in ("k128", "k64"):
        got = guard_points.measure_group(group)
        assert sorted(got) == sorted(p.name for p in guard.POINTS if p.group == group)
    # the paired groups: both packages, the older one under its other name
    monkeypatch.setitem(sys.modules, guard.OLD_PACKAGE, types.ModuleType(guard.OLD_PACKAGE))
    for group in ("host", "k256"):
        pair = guard_points.measure_pair(group)
        names = sorted(p.name for p in guard.POINTS if p.group == group)
        assert sorted(pair) == ["new", "old"] and sorted(pair["old"]) == sorted(pair["new"]) == names
    assert guard_points.measure_pair("host")["old"]["host-T1024-fwd"] == {
        "value": 100.0,
        "device": 500.0,
        "host": 100.0,
    }
    assert pair["old"]["a256-T4096-fwd"] == {"value": 1.0, "device": 1.0, "host": 0.1}
    with pytest.raises(ValueError, match="not a paired group"):
        guard_points.measure_pair("k128")
    decode = [p.name for p in guard.POINTS if p.group == "decode"]
    assert decode == ["decode-b1-step", "decode-b1-wall", "decode-b64-step", "decode-b64-wall"]


def test_renamed_copy_imports_beside_the_package(guard, tmp_path):
    """The older package's renamed copy (here: a copy of this one) imports in the same process as the package, with
    its own modules and operator namespace, and computes what the package computes."""
    dest = guard.renamed_copy(ROOT, tmp_path / "renamed")
    copied = dest / guard.OLD_PACKAGE
    assert (copied / "__init__.py").is_file() and not list(copied.rglob("__pycache__"))
    text = (copied / "ops" / "lightning" / "library.py").read_text()
    assert f'f"{guard.OLD_PACKAGE}::{{name}}"' in text and "LIGHTNING_ATTENTION" in (copied / "settings.py").read_text()
    script = f"""
import sys, torch
import lightning_attention as new, {guard.OLD_PACKAGE} as old
import lightning_attention.ops.lightning.ops, {guard.OLD_PACKAGE}.ops.lightning.ops
for name, module in list(sys.modules.items()):  # each package's modules from its own folder only
    file = getattr(module, "__file__", None) or ""
    if name.split(".")[0] in ("lightning_attention", "{guard.OLD_PACKAGE}") and file:
        assert file.startswith({str(dest)!r}) == name.startswith("{guard.OLD_PACKAGE}"), (name, file)
assert hasattr(torch.ops.{guard.OLD_PACKAGE}, "chunk_fwd") and hasattr(torch.ops.lightning_attention, "chunk_fwd")
torch.manual_seed(0)
q, k, v = (torch.randn(1, 19, 2, 16, dtype=torch.float64) for _ in range(3))
slope = new.tnl_slopes(2, 0, 12).double()
o_new, _ = new.lightning_attn(q, k, v, slope)
o_old, _ = old.lightning_attn(q, k, v, slope)
assert torch.equal(o_new, o_old) and o_new.isfinite().all()
print("ok")
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(dest)])}
    proc = subprocess.run(
        [sys.executable, "-P", "-c", script], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the command measures")
def test_measure_refuses_without_a_gpu(guard, tmp_path, capsys):
    assert guard.main(["measure", "--group", "k128", "--out", str(tmp_path / "x.json")]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err and not (tmp_path / "x.json").exists()
