"""``bench model-quality``: the protocol runs whole on CPU (``--quick``), stops and continues, and reports honestly."""

import itertools
import json
import math

import pytest

from lightning_attention.bench import cli
from lightning_attention.bench.model_quality_protocol import (
    ModelOptions,
    Protocol,
    best_learning_rates,
    final_runs,
    quick_protocol,
    settings_key,
    sweep_runs,
)
from lightning_attention.bench.model_quality_report import compare, render_markdown, stats

FIGURES = ["model_quality_curves.png", "model_quality_sweep.png", "model_quality_positions.png",
           "model_quality_copy.png"]


def _run(argv, capsys):
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """One ``--quick`` run (the whole protocol at toy size, ~25 s on one core)."""
    out = tmp_path_factory.mktemp("quick")
    assert cli.main(["model-quality", "--quick", "--out", str(out)]) == 0
    return out, json.loads((out / "model-quality.json").read_text())


def test_quick_run_records_every_run_of_the_protocol(quick):
    out, doc = quick
    protocol = quick_protocol()
    assert Protocol.from_json(doc["protocol"]) == protocol and doc["complete"] and doc["remaining"] == []
    assert doc["corpus"]["sha256"]["train.txt"] and doc["tokenizer"]["vocab_size"] == 512
    assert doc["tokenizer"]["train_bytes_per_token"] > 1.5  # a BPE, not bytes
    counts = doc["parameters"]
    assert set(counts) == set(protocol.archs)
    reference = counts["llama"]["non_embedding"]
    assert all(abs(c["non_embedding"] / reference - 1) < 0.02 for c in counts.values()), counts  # equal size

    runs = {r["id"]: r for r in doc["runs"]}
    sweep = [r for r in doc["runs"] if r["spec"]["stage"] == "sweep"]
    # two rates: every best is an edge, so each architecture added one rate past it
    assert {(r["spec"]["arch"], r["spec"]["lr"]) for r in sweep} == {(s.arch, s.lr) for s in sweep_runs(protocol, runs)}
    assert len(sweep) == len(protocol.archs) * (len(protocol.lrs) + 1)
    assert set(itertools.product(protocol.archs, protocol.lrs)) < {(r["spec"]["arch"], r["spec"]["lr"]) for r in sweep}
    for arch in protocol.archs:  # the best rate is the sweep's lowest validation loss
        mine = [r for r in sweep if r["spec"]["arch"] == arch]
        assert doc["best_lr"][arch] == min(mine, key=lambda r: r["final"]["bpb"])["spec"]["lr"]
    final = [r for r in doc["runs"] if r["spec"]["stage"] == "final"]
    assert sorted((r["spec"]["context"], r["spec"]["arch"], r["spec"]["seed"]) for r in final) == sorted(
        itertools.product(protocol.contexts, protocol.archs, protocol.seeds))
    assert all(r["spec"]["lr"] == doc["best_lr"][r["spec"]["arch"]] for r in final)
    assert set(runs) == {s.id for s in sweep_runs(protocol, runs) + final_runs(protocol, doc["best_lr"])}

    for r in doc["runs"]:
        assert r["status"] == "ok" and r["steps_done"] == r["steps"] == len(r["train"]["loss"])
        assert all(math.isfinite(x) for x in r["train"]["loss"] + r["train"]["bpb"] + r["curve"]["bpb"])
        assert r["curve"]["bpb"][-1] < r["curve"]["bpb"][0]  # it learns
        assert sum(r["train"]["loss"][-3:]) < sum(r["train"]["loss"][:3])
        assert r["final"]["loss"] < math.log(512)  # better than uniform over the vocabulary
        assert r["machine_line"] == doc["machine_line"] and r["tokens_per_s"] > 0
    for (context, seed), group in itertools.groupby(sorted(final, key=lambda r: (r["spec"]["context"],
                                                                                   r["spec"]["seed"])),
                                                    key=lambda r: (r["spec"]["context"], r["spec"]["seed"])):
        assert len({r["train_bytes"] for r in group}) == 1  # every arch of a seed saw the same batches

    for r in final:
        context = r["spec"]["context"]
        assert set(r["lengths"]) == {str(context), "128"}  # its own context and beyond it
        for length, ev in r["lengths"].items():
            edges = [b["start"] for b in ev["buckets"]] + [ev["buckets"][-1]["end"]]
            assert edges[0] == 0 and edges[-1] == int(length) and edges == sorted(edges)
            assert context in edges or int(length) == context  # no bucket straddles the training context
            assert ev["windows"] >= 1 and math.isfinite(ev["bpb"])
        assert set(r["copy"]) == {str(context // 4), str(context)}
        assert all(math.isfinite(p[h]["bpb"]) for p in r["copy"].values() for h in ("first_half", "second_half"))


def test_quick_run_writes_the_docs_section_and_figures_and_replots(quick, capsys):
    out, doc = quick
    text = (out / "model_quality.md").read_text()
    assert text == render_markdown(doc)
    for part in ("## Model quality", "### Learning-rate sweep (context 32", "### Context 32", "### Context 64",
                 "By position of the target", "Copy probe", "Every run:", "lightning-attention bench model-quality"):
        assert part in text, part
    assert text.count("\n| final |") == len(quick_protocol().contexts) * 4 * 2  # every final run has its row
    for name in FIGURES:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        (out / name).unlink()
    (out / "model_quality.md").unlink()
    code, stdout, _ = _run(["model-quality", "--replot", str(out)], capsys)
    assert code == 0 and json.loads(stdout.strip().splitlines()[-1])["figures"] == FIGURES
    assert all((out / name).stat().st_size > 0 for name in FIGURES) and (out / "model_quality.md").is_file()


def test_a_time_limit_stops_between_runs_and_resume_finishes(tmp_path, capsys):
    small = ["model-quality", "--quick", "--out", str(tmp_path), "--archs", "tnl,llama", "--lrs", "8e-3",
             "--contexts", "32"]
    code, stdout, _ = _run([*small, "--time-limit", "0.001"], capsys)
    summary = json.loads(stdout.strip().splitlines()[-1])
    # nothing measured yet: the first run of each arch goes ahead, then nothing fits
    assert code == 0 and not summary["complete"] and summary["remaining"] == 4
    folder = tmp_path / "model_quality_runs"
    first = {p.name: p.read_text() for p in folder.glob("*.json")}
    assert sorted(first) == ["sweep-llama-ctx32-lr0.008-seed0.json", "sweep-tnl-ctx32-lr0.008-seed0.json"]

    code, _, err = _run(small, capsys)
    assert code == 2 and "pass --resume" in err
    code, _, err = _run([*small, "--resume", "--dropout", "0.1"], capsys)
    assert code == 2 and "recorded under other settings" in err

    code, stdout, _ = _run([*small, "--resume"], capsys)
    assert code == 0 and json.loads(stdout.strip().splitlines()[-1])["complete"]
    assert all((folder / name).read_text() == text for name, text in first.items())  # kept, not rerun
    # the two sweep runs, each arch's one rate below its single-rate grid (its best is an edge), two final runs each
    assert len(list(folder.glob("*.json"))) == 2 + 2 + 2 * 2


def test_cpu_without_quick_or_sizes_is_refused(capsys):
    code, _, err = _run(["model-quality", "--device", "cpu"], capsys)
    assert code == 2 and "--quick" in err


def test_verdicts_use_twice_the_pooled_std():
    ref = stats([1.00, 1.10, 0.90])  # std 0.1
    assert compare(stats([0.95, 1.05, 0.85]), ref)["verdict"] == "matches"  # -0.05, within 2 × 0.1
    worse = compare(stats([1.25, 1.35, 1.15]), ref)
    assert worse["verdict"] == "worse" and worse["difference"] == pytest.approx(0.25)
    assert worse["pooled_std"] == pytest.approx(0.1)
    assert compare(stats([0.70, 0.80, 0.60]), ref)["verdict"] == "better"
    assert compare(stats([0.9]), ref)["verdict"] == "fewer than 2 seeds"


def test_the_default_protocol_is_the_budgeted_one():
    protocol = Protocol()
    assert protocol.archs == ("tnl", "minimax", "hybrid", "llama") and protocol.n_layers == 8
    assert protocol.steps(protocol.sweep_tokens) == 128 and protocol.steps(protocol.tokens) == 512
    assert protocol.batch_size(512) == 64 and protocol.batch_size(2048) == 16
    sweep = sweep_runs(protocol)
    final = final_runs(protocol, {arch: 1e-3 for arch in protocol.archs})
    assert len(sweep) == 16 and len(final) == 24
    assert sum(s.tokens for s in sweep + final) == 448 * 2**20  # the arithmetic in model_quality.py


def _finish(protocol: Protocol, bpb: dict[str, dict[float, float]]) -> dict[str, dict]:
    """Records of the whole sweep, every run's final bits per byte taken from ``bpb[arch][lr]``."""
    records = {}
    while pending := [s for s in sweep_runs(protocol, records) if s.id not in records]:
        for spec in pending:
            records[spec.id] = {"spec": {"lr": spec.lr}, "status": "ok", "final": {"bpb": bpb[spec.arch][spec.lr]}}
    return records


def test_a_best_rate_at_the_edge_of_the_grid_extends_the_sweep():
    protocol = Protocol(archs=("tnl", "minimax", "llama"), lrs=(1e-3, 2e-3), lr_extensions=2)
    bpb = {"tnl": {1e-3: 1.5, 2e-3: 1.4, 4e-3: 1.3, 8e-3: 1.6},  # the optimum found one step up
           "minimax": {5e-4: 1.7, 1e-3: 1.6, 2e-3: 1.65},  # bracketed by one step down
           "llama": {2.5e-4: 1.6, 5e-4: 1.7, 1e-3: 1.8, 2e-3: 1.9}}  # still the lowest after both extensions
    records = _finish(protocol, bpb)
    tried = {arch: sorted(s.lr for s in sweep_runs(protocol, records) if s.arch == arch) for arch in protocol.archs}
    assert tried == {"tnl": [1e-3, 2e-3, 4e-3, 8e-3], "minimax": [5e-4, 1e-3, 2e-3],
                     "llama": [2.5e-4, 5e-4, 1e-3, 2e-3]}
    assert best_learning_rates(protocol, records) == {"tnl": 4e-3, "minimax": 1e-3, "llama": 2.5e-4}
    # while an extension has not run, its architecture has no best rate yet (nor final runs)
    del records[sweep_runs(protocol, records)[-1].id]
    assert "llama" not in best_learning_rates(protocol, records)
    # a bracketed optimum adds nothing
    inside = Protocol(archs=("tnl",), lrs=(1e-3, 2e-3, 4e-3))
    assert len(sweep_runs(inside, _finish(inside, {"tnl": {1e-3: 1.5, 2e-3: 1.4, 4e-3: 1.45}}))) == 3


def test_settings_key_separates_settings_not_run_choices():
    base = Protocol()
    sha = {"train.txt": "a", "val.txt": "b"}
    key = settings_key(base, sha, "t")
    assert settings_key(Protocol(contexts=(512,), seeds=(0, 1, 2, 3), lrs=(1e-3,)), sha, "t") == key
    assert settings_key(Protocol(options=ModelOptions(dropout=0.1)), sha, "t") != key
    assert settings_key(base, {**sha, "val.txt": "c"}, "t") != key
    assert settings_key(base, sha, "other tokenizer") != key


@pytest.mark.gpu
def test_quick_protocol_on_cuda(tmp_path):
    """The CUDA path of a toy protocol: bf16 autocast, the Triton kernels, dropout, float32 LRPE through the kernels."""
    argv = ["model-quality", "--quick", "--device", "cuda", "--dropout", "0.1", "--lrpe-float32", "--out",
            str(tmp_path)]
    assert cli.main(argv) == 0
    doc = json.loads((tmp_path / "model-quality.json").read_text())
    assert doc["complete"] and doc["options"] == ["dropout=0.1", "lrpe_float32=True"]
    for r in doc["runs"]:
        assert r["status"] == "ok" and r["curve"]["bpb"][-1] < r["curve"]["bpb"][0]
