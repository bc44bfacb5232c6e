"""The benchmark CLI: ``--quick`` CPU smoke runs of every subcommand, and the formulas behind the numbers.

The smoke runs check the contract of an output folder (machine line first, JSON with the machine line, PNG figures,
missing baselines skipped with a message, a final JSON line), not timings: CPU times here mean nothing.
"""

import json
import math
import sys

import pytest
import torch

from lightning_attention import cli, settings
from lightning_attention.bench import external, kernels, metrics, progress, providers
from lightning_attention.bench.registry import Prepared, Provider, Shape, token_budget_shapes
from lightning_attention.bench.results import ResultWriter
from lightning_attention.utils.testing import relative_error, tolerance

FAST = ["--quick", "--warmup-ms", "1", "--rep-ms", "5"]
GRID_A_128 = Shape(batch=64, seqlen=1024, heads=16, k_dim=128, v_dim=128, dtype=torch.bfloat16)


def _run_cli(argv, capsys):
    assert cli.main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    return lines, json.loads(lines[-1])


def _check_output(out, name, lines, summary, figures):
    doc = json.loads((out / f"{name}.json").read_text())
    assert lines[0] == doc["machine_line"] == summary["machine"]  # the machine line heads stdout and the JSON
    assert "torch" in doc["machine_line"] and "triton" in doc["machine_line"]
    assert summary["bench"] == name and summary["json"] == str(out / f"{name}.json")
    for figure in figures:
        path = out / figure
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", figure
    return doc


def test_kernels_quick_smoke(tmp_path, capsys):
    lines, summary = _run_cli(["bench", "kernels", *FAST, "--out", str(tmp_path)], capsys)
    doc = _check_output(
        tmp_path,
        "kernels",
        lines,
        summary,
        ["kernels_runtime_d32.png", "kernels_memory_d32.png", "kernels_tokens_per_s_d32.png"],
    )
    skipped = {s["what"]: s["reason"] for s in doc["skipped"]}
    for name in ("ours-chunk", "ours-recompute", "fla", "official"):  # no GPU here: each says why
        assert skipped[f"provider {name}"]
        assert any(f"skipped provider {name}:" in line for line in lines)
    torch_rows = [r for r in doc["results"] if r["provider"] == "torch"]
    assert {r["grid"] for r in torch_rows} == {"quick-a-d32", "quick-b-d32"}
    for r in torch_rows:
        assert r["status"] == "ok", r
        assert r["batch"] * r["seqlen"] == (512 if r["grid"] == "quick-a-d32" else r["seqlen"])
        assert r["fwd_ms"] > 0 and r["fwdbwd_ms"] > 0 and r["floor_fwd_ms"] > 0
        assert r["tokens_per_s_fwdbwd"] == pytest.approx(r["tokens"] / (r["fwdbwd_ms"] * 1e-3))
    (acc,) = [a for a in doc["accuracy"] if a["provider"] == "torch"]
    assert acc["status"] == "ok" and acc["err_max"] <= tolerance(torch.bfloat16)
    # SDPA runs on CPU too, so the speedup table has rows: PyTorch path vs SDPA, measured in this run
    assert {(s["ours"], s["baseline"]) for s in doc["speedups"]} == {("torch", "sdpa")}
    assert doc["copy_bandwidth"]["bytes_per_s"] > 0

    # --replot redraws the figures of a saved run without measuring (the GPU machine may lack matplotlib)
    for figure in summary["figures"]:
        (tmp_path / figure).unlink()
    lines, again = _run_cli(["bench", "kernels", "--replot", str(tmp_path)], capsys)
    assert (
        lines[0] == doc["machine_line"] and again["replot"] and sorted(again["figures"]) == sorted(summary["figures"])
    )
    assert all((tmp_path / f).stat().st_size > 0 for f in again["figures"])


def test_decode_quick_smoke(tmp_path, capsys):
    argv = ["bench", "decode", *FAST, "--batches", "1,2", "--memory-tokens", "4,32", "--out", str(tmp_path)]
    lines, summary = _run_cli(argv, capsys)
    doc = _check_output(tmp_path, "decode", lines, summary, ["decode_latency.png", "decode_memory.png"])
    if external.find_function("lightning_attention.bench.decode_timing", ("time_decode_step",))[0] is None:
        assert any(s["what"] == "decode latency" for s in doc["skipped"])
        return
    assert [r["batch"] for r in doc["latency"]] == [1, 2]
    assert all(r["status"] == "ok" and r["result"]["ours_us"] > 0 for r in doc["latency"])
    assert any(s["what"] == "FLA decode baseline" for s in doc["skipped"])  # FLA needs CUDA: skipped, with a message
    assert doc["floor_us"]["2"] == pytest.approx(2 * doc["floor_us"]["1"])
    assert doc["memory"]["status"] == "ok"


def test_model_quick_smoke(tmp_path, capsys):
    lines, summary = _run_cli(["bench", "model", *FAST, "--contexts", "32", "--out", str(tmp_path)], capsys)
    doc = _check_output(tmp_path, "model", lines, summary, ["model_throughput.png", "model_loss.png"])
    if external.find_function("lightning_attention.bench.model_timing", ("time_training_step",))[0] is None:
        assert any(s["what"] == "model throughput" for s in doc["skipped"])
        assert any("skipped model throughput" in line for line in lines)
    else:
        assert all(r["status"] == "ok" for r in doc["throughput"]), doc["throughput"]
        assert doc["loss_curves"]["status"] == "ok", doc["loss_curves"]


def test_hybrid_quick_smoke(tmp_path, capsys):
    lines, summary = _run_cli(["bench", "hybrid", *FAST, "--seqlens", "48", "--out", str(tmp_path)], capsys)
    doc = _check_output(tmp_path, "hybrid", lines, summary, ["hybrid_runtime.png"])
    if external.find_function("lightning_attention.bench.hybrid_timing", ("time_hybrid",))[0] is not None:
        (r,) = doc["results"]
        assert r["status"] == "ok" and r["result"]["hybrid_fwd_ms"] > 0


def test_without_matplotlib_json_then_replot(tmp_path, capsys, monkeypatch):
    """The GPU image may lack matplotlib: the run still writes its JSON, says so, and --replot draws later."""
    import lightning_attention.bench
    from lightning_attention.bench import cli as bench_cli

    # the plotting module fails to import as it would without matplotlib (matplotlib itself stays loaded: other
    # tests' figures hold references into it)
    monkeypatch.setitem(sys.modules, "lightning_attention.bench.plots", None)
    monkeypatch.delattr(lightning_attention.bench, "plots", raising=False)
    assert bench_cli.main(["hybrid", *FAST, "--seqlens", "48", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "skipped figures: matplotlib is not installed" in out
    assert json.loads(out.strip().splitlines()[-1])["figures"] == []
    monkeypatch.undo()
    assert bench_cli.main(["hybrid", "--replot", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["figures"] == ["hybrid_runtime.png"]
    assert (tmp_path / "hybrid_runtime.png").stat().st_size > 0


def test_io_bytes_and_floor_match_design():
    """docs/design.md, "Benchmark grids": grid (a) at K = V = 128 moves 1.07 GB forward, 2.95 GB fwd+bwd: 0.36 / 0.98 ms
    at 3.02 TB/s."""
    fwd, fwdbwd = metrics.attention_io_bytes(GRID_A_128)
    assert fwd == 4 * 65536 * 16 * 128 * 2
    assert fwdbwd == 11 * 65536 * 16 * 128 * 2
    assert metrics.floor_ms(fwd, 3.02e12) == pytest.approx(0.356, abs=1e-3)
    assert metrics.floor_ms(fwdbwd, 3.02e12) == pytest.approx(0.978, abs=1e-3)
    # K != V: fwd reads q, k (K) and v (V), writes o (V); bwd reads q, k, v, do, writes dq, dk (K), dv (V)
    odd = Shape(2, 10, 3, 48, 100, torch.float32)
    n = 2 * 10 * 3 * 4
    assert metrics.attention_io_bytes(odd) == (n * (2 * 48 + 2 * 100), n * (6 * 48 + 5 * 100))
    assert metrics.input_bytes(odd) == n * 48
    assert metrics.output_bytes(odd) == n * 100
    assert metrics.gradient_bytes(odd) == n * (2 * 48 + 100)


def test_flop_formulas():
    fwd, fwdbwd = metrics.lightning_flops(GRID_A_128)
    per_token_head = 2 * 64 * 256 + 4 * 128 * 128  # notes/kernel-design.md: ≈ 98 KFLOP per token-head
    assert fwd == 65536 * 16 * per_token_head == 65536 * 16 * 98304
    assert 2.0 <= (fwdbwd - fwd) / fwd <= 2.5  # "backward ≈ 2–2.5x the forward"
    sfwd, sfwdbwd = metrics.softmax_attention_flops(Shape(2, 1024, 16, 128, 128, torch.bfloat16))
    assert sfwd == 2 * 16 * 1024**2 * 256  # half of the dense 2·T²·(K+V): causal
    assert sfwdbwd == pytest.approx(3.5 * sfwd)
    assert metrics.tflops(1e12, 1000.0) == pytest.approx(1.0)


def test_decode_floor_matches_design():
    """The decode target's state-bytes floor is 44 µs at batch 64 and 178 µs at batch 256 (H16, K=V=128)."""
    for batch, floor_us in ((64, 44), (256, 178)):
        nbytes = metrics.decode_step_bytes(batch, 16, 128, 128, torch.bfloat16)
        assert nbytes >= 2 * batch * 16 * 128 * 128 * 4
        assert 1e3 * metrics.floor_ms(nbytes, 3.02e12) == pytest.approx(floor_us, rel=0.02)


def test_copy_bandwidth_speedup_flatness_tokens():
    assert metrics.copy_bandwidth(2**30, 1.0) == pytest.approx(2 * 2**30 / 1e-3)  # a copy reads and writes
    assert metrics.speedup(4.0, 2.0) == 2.0
    assert metrics.speedup(None, 2.0) is None and metrics.speedup(4.0, None) is None
    assert metrics.flatness([10.0, 10.0, 10.0]) == 0.0
    assert metrics.flatness([9.0, 11.0, None]) == pytest.approx(0.1)
    assert metrics.tokens_per_s(65536, 2.0) == pytest.approx(32_768_000)


def test_token_budget_sets_batch():
    shapes = token_budget_shapes(65536, (1024, 65536), 16, 128, 128, torch.bfloat16)
    assert [(s.batch, s.seqlen) for s in shapes] == [(64, 1024), (1, 65536)]
    assert all(s.tokens == 65536 for s in shapes)
    with pytest.raises(ValueError, match="does not divide"):
        token_budget_shapes(65536, (3000,), 16, 128, 128, torch.bfloat16)
    assert [s.seqlen for s in providers.grid_a(128).shapes] == list(providers.GRID_A_SEQLENS)
    assert [s.seqlen for s in providers.grid_b(128).shapes] == [32768, 131072, 524288, 1048576]
    assert all(s.batch == 1 for s in providers.grid_b(64).shapes)


def _fake_provider(prepare, **kw):
    return Provider("fake", "fake", "ours", prepare, lambda device: None, **kw)


def _prepare_scaled(inputs):
    q, k, v = (inputs[n].detach().requires_grad_() for n in ("q", "k", "v"))
    return Prepared(lambda: (q * k).sum(-1, keepdim=True) * v, inputs["do"], [q, k, v], lambda x: x)


def test_workspace_accounting(monkeypatch):
    """workspace = peak during fwd+bwd - memory before the call - outputs - gradients, as a fraction of q."""
    assert metrics.workspace_bytes(peak=1000, baseline=100, outputs=200, gradients=300) == 400
    shape = Shape(2, 16, 2, 8, 8, torch.float32)
    unit = metrics.input_bytes(shape)  # 1 KiB
    before, workspace = 10 * unit, unit // 4
    unavoidable = metrics.output_bytes(shape) + metrics.gradient_bytes(shape)
    monkeypatch.setattr(
        kernels, "peak_memory", lambda fn, device: (fn(), (before, before + unavoidable + workspace))[1]
    )
    r = kernels.measure_case(
        _fake_provider(_prepare_scaled), shape, "g", torch.device("cpu"), 1e9, cold=True, warmup_ms=0, rep_ms=0, seed=0
    )
    assert r["status"] == "ok", r
    assert r["workspace_bytes"] == workspace
    assert r["workspace_ratio"] == pytest.approx(0.25)
    # peak = what the caller holds (q, k, v, do) + everything allocated during the call
    assert r["peak_bytes"] == 3 * unit + metrics.output_bytes(shape) + unavoidable + workspace
    assert r["cold_start_s"] >= 0


def test_provider_failures_are_recorded():
    shape = Shape(1, 8, 1, 16, 16, torch.float32)

    def raiser(exc):
        def prepare(inputs):
            raise exc

        return prepare

    cpu = torch.device("cpu")
    kw = dict(cold=False, warmup_ms=0, rep_ms=0, seed=0)
    oom = kernels.measure_case(
        _fake_provider(raiser(torch.OutOfMemoryError("CUDA out of memory"))), shape, "g", cpu, 1e9, **kw
    )
    assert oom["status"] == "oom" and "OutOfMemoryError" in oom["error"]
    err = kernels.measure_case(_fake_provider(raiser(RuntimeError("compile failed"))), shape, "g", cpu, 1e9, **kw)
    assert err["status"] == "error" and "compile failed" in err["error"]
    far = kernels.measure_case(_fake_provider(_prepare_scaled, max_seqlen=4), shape, "g", cpu, 1e9, **kw)
    assert far["status"] == "skipped"


def test_unavailable_providers_say_why(tmp_path):
    writer = ResultWriter(tmp_path / "k.json", "kernels", {}, "machine", {})
    chosen = kernels.select_providers(["chunk", "torch"], ["fla", "official", "sdpa"], torch.device("cpu"), writer)
    assert [p.name for p in chosen] == ["torch", "sdpa"]  # Triton providers need CUDA (or are not installed)
    reasons = {s["what"]: s["reason"] for s in writer.doc["skipped"]}
    assert set(reasons) == {"provider ours-chunk", "provider fla", "provider official"}
    assert all(("CUDA" in r) or ("not installed" in r) for r in reasons.values())


def test_accuracy_of_torch_path_vs_float64():
    shape = Shape(1, 37, 2, 16, 24, torch.float32)
    r = kernels.measure_accuracy(providers.LIGHTNING_ATTN.providers["torch"], shape, torch.device("cpu"), seed=1)
    assert r["status"] == "ok", r
    assert 0 < r["err_max"] <= tolerance(torch.float32)
    sdpa = kernels.measure_accuracy(providers.LIGHTNING_ATTN.providers["sdpa"], shape, torch.device("cpu"), seed=1)
    assert sdpa["status"] == "skipped"  # softmax attention is a different function: no error against this op


@pytest.mark.parametrize("name", ["ours-chunk", "ours-recompute"])
def test_ours_providers_call_the_kernels(name):
    """Our providers run on any CUDA GPU and reach the Triton kernels through the public API (here under the
    interpreter, tiny shape)."""
    assert providers.LIGHTNING_ATTN.providers[name].available(torch.device("cuda")) is None
    shape = Shape(1, 40, 1, 16, 16, torch.float32)
    with settings.override(backend="triton"):
        r = kernels.measure_accuracy(providers.LIGHTNING_ATTN.providers[name], shape, torch.device("cpu"), seed=2)
    assert r["status"] == "ok", r
    assert r["err_max"] <= tolerance(torch.float32)


def test_progress_without_tqdm(capsys):
    bar = progress._Lines(["a", "b"], desc="cases", unit="case")
    assert list(bar) == ["a", "b"]
    assert capsys.readouterr().err.splitlines() == ["cases: 1/2 case ", "cases: 2/2 case "]


def test_speedups_pair_ours_with_every_other_provider():
    def rec(provider, family, ms):
        return {
            "provider": provider,
            "family": family,
            "grid": "a",
            "seqlen": 1024,
            "batch": 64,
            "status": "ok",
            "fwd_ms": ms,
            "fwdbwd_ms": 3 * ms,
        }

    rows = kernels.compute_speedups(
        [
            rec("ours-chunk", "ours", 1.0),
            rec("fla", "baseline", 2.0),
            rec("torch", "reference", 10.0),
            {**rec("sdpa", "baseline", 1.0), "status": "oom"},
        ]
    )
    assert {(r["ours"], r["baseline"]): r["fwdbwd"] for r in rows} == {
        ("ours-chunk", "fla"): 2.0,
        ("ours-chunk", "torch"): 10.0,
    }
    # no Triton provider ran (CPU): the PyTorch path stands in as 'ours'
    rows = kernels.compute_speedups([rec("torch", "reference", 4.0), rec("sdpa", "baseline", 2.0)])
    assert [(r["ours"], r["baseline"], r["fwd"]) for r in rows] == [("torch", "sdpa", 0.5)]


def test_tokens_table_shows_graph_replays_where_timed():
    """--cuda-graphs adds a '(graph)' row with its own flatness; providers without replays keep one row."""

    def rec(provider, T, tps, graph_tps=None):
        r = {"provider": provider, "grid": "b", "seqlen": T, "status": "ok", "tokens_per_s_fwdbwd": tps}
        return r if graph_tps is None else {**r, "tokens_per_s_fwdbwd_graph": graph_tps}

    results = [rec("ours-chunk", 32768, 2.0e7, 3.5e7), rec("ours-chunk", 131072, 3.6e7, 3.6e7), rec("fla", 32768, 1e7)]
    table = kernels.tokens_table(results, "b").splitlines()
    assert [line.split()[0] for line in table[2:]] == ["ours-chunk", "ours-chunk", "fla"]
    assert "(graph)" in table[3] and "(graph)" not in table[2] + table[4]
    assert table[3].split()[-1] == "0.0141"  # replays 3.5e7 and 3.6e7: ±0.05e7 around 3.55e7


def test_writer_keeps_valid_json_and_helpers(tmp_path):
    writer = ResultWriter(tmp_path / "x.json", "kernels", {"gpu": None}, "machine", {"a": 1})
    writer.add("results", {"err": math.nan, "ms": 1.5})
    doc = json.loads((tmp_path / "x.json").read_text())
    assert doc["results"] == [{"err": None, "ms": 1.5}] and doc["machine_line"] == "machine"
    assert not (tmp_path / "x.json.tmp").exists()

    def fn(a, b=0, *, c=0):
        return a + b + c

    assert external.call_with_supported(fn, 1, b=2, c=3, unknown=4) == 6
    assert external.find_function("lightning_attention.bench.not_there", ("f",)) == (
        None,
        "lightning_attention.bench.not_there does not exist yet",
    )
    assert external.numbers({"a": 1, "b": {"c": 2.5, "d": "x"}, "e": True}) == {"a": 1.0, "b.c": 2.5}


@pytest.mark.skipif(torch.cuda.is_available(), reason="what a CPU-only machine does")
@pytest.mark.parametrize("bench", ["kernels", "decode", "model", "hybrid"])
def test_full_grid_on_a_cpu_is_refused_with_a_pointer_to_quick(bench, tmp_path, capsys):
    assert cli.main(["bench", bench, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"lightning-attention bench {bench} --quick" in err
    assert not (tmp_path / f"{bench}.json").exists()  # nothing started


def test_cpu_throughput_is_not_labelled_per_gpu(tmp_path, capsys):
    from lightning_attention.bench import model

    records = [{"arch": "tnl", "context": 64, "tokens_per_s": 1234.0, "status": "ok"}]
    for gpu, unit in ((None, "tokens/s "), ("NVIDIA H100", "tokens/s/GPU")):
        doc = {"machine": {"gpu": gpu}, "machine_line": "m", "throughput": records, "skipped": []}
        model.report(doc, tmp_path)
        table = capsys.readouterr().out
        assert unit in table
        assert ("tokens/s/GPU" in table) == (gpu is not None)


def test_cpu_timer_is_torch_utils_benchmark(monkeypatch):
    from torch.utils import benchmark

    from lightning_attention.bench import timing

    used = []
    real = benchmark.Timer

    def spy(*args, **kwargs):
        used.append(kwargs.get("num_threads"))
        return real(*args, **kwargs)

    monkeypatch.setattr(benchmark, "Timer", spy)
    x = torch.randn(64, 64, requires_grad=True)
    x.grad = torch.ones_like(x)
    result = timing.bench(lambda: x @ x, torch.device("cpu"), warmup_ms=1, rep_ms=20, grad_to_none=[x])
    assert used == [torch.get_num_threads()]  # the caller's threads, not the Timer's default of one
    assert 0 < result.p20_ms <= result.median_ms <= result.p80_ms and x.grad is None


def test_settle_runs_the_call_back_to_back_before_a_cuda_measurement(monkeypatch):
    """``--settle-s``: on CUDA each measurement follows that many seconds of the same call (gradients cleared as in
    the measurement, the queue drained every few calls); nothing on CPU or at 0 s. The CUDA path runs here with the
    device's synchronisation stubbed (no GPU)."""
    from lightning_attention.bench import timing

    synced = []
    monkeypatch.setattr(timing, "synchronize", lambda device: synced.append(device.type))
    x = torch.randn(4, requires_grad=True)
    calls = []

    def fn():
        calls.append(x.grad)
        x.grad = torch.ones_like(x)

    made = timing.settle(fn, torch.device("cuda"), 0.05, grad_to_none=[x])
    assert made == len(calls)  # it counts its calls (energy_profile.py times them)
    assert len(calls) >= timing._SETTLE_BATCH and len(calls) % timing._SETTLE_BATCH == 0
    assert all(g is None for g in calls)  # each call found its gradient cleared
    assert len(synced) == 1 + len(calls) // timing._SETTLE_BATCH
    calls.clear()
    assert timing.settle(fn, torch.device("cuda"), 0.0) == 0
    assert timing.settle(fn, torch.device("cpu"), 1.0) == 0
    assert calls == []

    # the kernels benchmark passes it to every timed measurement
    seen = []

    def spy(fn, device, **kw):
        seen.append(kw["settle_s"])
        return timing.Timing(1.0, 1.0, 1.0)

    monkeypatch.setattr(kernels, "bench", spy)
    shape = Shape(1, 8, 1, 16, 16, torch.float32)
    r = kernels.measure_case(_fake_provider(_prepare_scaled), shape, "g", torch.device("cpu"), 1e9, cold=False,
                             warmup_ms=0, rep_ms=0, seed=0, settle_s=2.5)  # fmt: skip
    assert r["status"] == "ok" and seen == [2.5, 2.5]


def test_varlen_point_packs_sequences(tmp_path, capsys):
    """``--grid varlen``: one call of packed sequences of mixed lengths; providers that take no offsets skip it."""
    lines, summary = _run_cli(["bench", "kernels", *FAST, "--grid", "varlen", "--out", str(tmp_path)], capsys)
    doc = _check_output(tmp_path, "kernels", lines, summary, [])
    rows = {r["provider"]: r for r in doc["results"]}
    lengths = list(providers.QUICK_VARLEN_LENGTHS)
    assert rows["torch"]["status"] == "ok" and rows["torch"]["lengths"] == lengths
    assert rows["torch"]["batch"] == 1 and rows["torch"]["seqlen"] == sum(lengths)
    assert rows["sdpa"]["status"] == "skipped" and "packed" in rows["sdpa"]["error"]
    assert any("4 packed sequences of 1 to 118 tokens, 256 in all" in line for line in lines)


@pytest.mark.parametrize("name", ["torch", "ours-chunk"])
def test_varlen_providers_keep_sequences_apart(name):
    """A provider's packed call equals the float64 reference that restarts at every offset, and that reference is
    not the unpacked one (so offsets that were dropped would fail here)."""
    shape = providers.quick_varlen_grid(16).shapes[0]
    shape = Shape(1, shape.seqlen, 1, 16, 16, torch.float32, lengths=shape.lengths)
    inputs = providers.make_inputs(shape, torch.device("cpu"), seed=3)
    assert inputs["cu_seqlens_cpu"].tolist() == [0, 100, 101, 138, 256]
    o_ref, grads_ref = providers.reference(inputs)
    unpacked = {k: v for k, v in inputs.items() if not k.startswith("cu_seqlens")}
    assert relative_error(providers.reference(unpacked)[0], o_ref) > 0.1
    with settings.override(backend="triton"):
        prepared = providers.LIGHTNING_ATTN.providers[name].prepare(inputs)
        with prepared.context():
            o = prepared.forward()
            o.backward(prepared.grad_output)
    for got, exact in zip([o, *prepared.gradients()], [o_ref, *grads_ref]):
        assert relative_error(got, exact) <= tolerance(torch.float32)


def test_packed_shape_rules():
    with pytest.raises(ValueError, match="batch 1"):
        Shape(2, 10, 1, 16, 16, torch.float32, lengths=(5, 5))
    with pytest.raises(ValueError, match="sum"):
        Shape(1, 11, 1, 16, 16, torch.float32, lengths=(5, 5))
    packed = Shape(1, 10, 1, 16, 16, torch.float32, lengths=(5, 5))
    assert packed.head_class.endswith("-varlen") and packed.to_json()["lengths"] == [5, 5]
    assert "lengths" not in Shape(1, 10, 1, 16, 16, torch.float32).to_json()
