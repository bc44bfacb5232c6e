"""``bench serving`` on CPU: every point of the grid recorded with real values, out of memory recorded as a result
(the run goes on), TNL's cache constant in the prompt length where LLaMA's KV cache grows, and the refusals."""

import json
import math

import pytest
import torch

from lightning_attention import cli
from lightning_attention.bench import serving_timing

QUICK = ["bench", "serving", "--quick", "--device", "cpu", "--repeats", "2"]  # float32, no allocator peaks
NEW_TOKENS = 12
POINTS = [(arch, batch, prompt) for arch in ("tnl", "tnl-graphs", "llama") for batch in (1, 2) for prompt in (16, 64)]


def _run(argv, capsys):
    assert cli.main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    return lines, json.loads(lines[-1])


def _positive(x) -> bool:
    return isinstance(x, float) and math.isfinite(x) and x > 0


def test_every_point_is_measured_and_the_caches_behave(tmp_path, capsys):
    lines, summary = _run([*QUICK, "--new-tokens", str(NEW_TOKENS), "--out", str(tmp_path)], capsys)
    doc = json.loads((tmp_path / "serving.json").read_text())
    assert lines[0] == doc["machine_line"] == summary["machine"]
    assert summary["points"] == 12 and summary["oom"] == [] and summary["errors"] == 0
    assert summary["figures"] == ["serving_decode.png", "serving_memory.png"]
    for figure in summary["figures"]:
        assert (tmp_path / figure).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert doc["serving"] == {"preset": "smoke", "batches": [1, 2], "prompts": [16, 64], "new_tokens": NEW_TOKENS,
                              "repeats": 2, "dtype": "float32", "decoding": "greedy"}
    assert doc["models"]["llama"]["attn_implementation"] == "sdpa"
    tnl_params, llama_params = doc["models"]["tnl"]["parameters"], doc["models"]["llama"]["parameters"]
    assert abs(tnl_params - llama_params) / tnl_params < 0.05  # equal size
    assert doc["models"]["tnl-graphs"]["parameters"] == tnl_params and doc["models"]["tnl-graphs"]["decode_cuda_graphs"]

    points = doc["points"]
    assert [(r["arch"], r["batch"], r["prompt"]) for r in points] == POINTS
    for r in points:
        assert r["status"] == "ok" and r["oom"] is False and r["stage"] == "done", r
        assert len(r["prefill_runs_s"]) == len(r["total_runs_s"]) == len(r["decode_runs_s"]) == 2
        assert r["prefill_s"] == min(r["prefill_runs_s"]) and r["total_s"] == min(r["total_runs_s"])
        assert r["decode_s"] == min(r["decode_runs_s"])
        for key in ("prefill_s", "total_s", "decode_s", "decode_tokens_per_s", "tokens_per_s", "first_token_in_run_s"):
            assert _positive(r[key]), (key, r)
        # the decode is timed inside one request: within it, never longer than the whole of it
        assert all(d < t for d, t in zip(r["decode_runs_s"], r["total_runs_s"]))
        decoded = r["batch"] * (NEW_TOKENS - 1)
        assert r["decode_tokens_per_s"] == pytest.approx(decoded / r["decode_s"])
        assert r["decode_s_from_calls"] == pytest.approx(r["total_s"] - r["prefill_s"])  # a cross-check, any sign
        assert r["tokens_per_s"] == pytest.approx(r["batch"] * NEW_TOKENS / r["total_s"])
        assert r["cache_tokens"] == r["prompt"] + NEW_TOKENS - 1  # the last token generated is never fed back
        assert r["peak_bytes"] is None  # no allocator statistics on CPU: not measured, not made up

    cache = {(r["arch"], r["batch"], r["prompt"]): r["cache_bytes"] for r in points}
    # TNL: one fp32 [B, H, K, V] state per layer (smoke: H = 2, head dim 16, K doubled by LRPE in layer 0)
    assert {r["cache_kind"] for r in points if r["arch"] == "tnl"} == {"recurrent states"}
    assert cache["tnl", 1, 16] == cache["tnl", 1, 64] == 2 * (32 * 16 + 16 * 16) * 4
    assert cache["tnl", 2, 16] == cache["tnl", 2, 64] == 2 * cache["tnl", 1, 16]
    assert all(cache["tnl-graphs", b, p] == cache["tnl", b, p] for b in (1, 2) for p in (16, 64))
    # LLaMA: keys and values of every token, every layer: 2 · layers · B · tokens · d · 4 bytes
    for r in points:
        if r["arch"] == "llama":
            assert r["cache_kind"] == "KV cache"
            assert r["cache_bytes"] == r["kv_cache_bytes_formula"] == 2 * 2 * r["batch"] * r["cache_tokens"] * 32 * 4
    assert cache["llama", 1, 64] > cache["llama", 1, 16] and cache["llama", 2, 64] > cache["llama", 2, 16]

    out = "\n".join(lines)
    assert "decode tok/s @ 16" in out and "decode tok/s @ 64" in out and "64 ÷ 16" in out

    for figure in summary["figures"]:  # --replot draws the same figures from the JSON alone
        (tmp_path / figure).unlink()
    lines, again = _run(["bench", "serving", "--replot", str(tmp_path)], capsys)
    assert again["replot"] and again["figures"] == summary["figures"]
    assert all((tmp_path / f).stat().st_size > 0 for f in again["figures"])


def test_out_of_memory_is_a_result_and_the_run_goes_on(tmp_path, capsys, monkeypatch):
    """LLaMA at batch 1, prompt 64 runs out of memory in its whole request (after the warm-up and the prefill): the
    point says so and keeps its prefill time, and the points after it are measured."""
    real = serving_timing.generate
    calls = []

    def generate(model, ids, new_tokens, **kwargs):
        calls.append((type(model).__name__, tuple(ids.shape), new_tokens))
        if type(model).__name__ == "LlamaForCausalLM" and tuple(ids.shape) == (1, 64) and new_tokens == 4:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 40.00 GiB")
        return real(model, ids, new_tokens, **kwargs)

    monkeypatch.setattr(serving_timing, "generate", generate)
    lines, summary = _run([*QUICK, "--new-tokens", "4", "--out", str(tmp_path)], capsys)
    doc = json.loads((tmp_path / "serving.json").read_text())
    points = {(r["arch"], r["batch"], r["prompt"]): r for r in doc["points"]}
    assert list(points) == POINTS  # every point recorded, in order: the run went on after the failure

    oom = points["llama", 1, 64]
    assert oom["status"] == "oom" and oom["oom"] is True and oom["stage"] == "generate"
    assert oom["error"].startswith("OutOfMemoryError: CUDA out of memory")
    assert _positive(oom["prefill_s"]) and _positive(oom["warmup_s"])  # what it measured before running out
    assert "total_s" not in oom and "decode_tokens_per_s" not in oom and "cache_bytes" not in oom
    for key, r in points.items():
        if key != ("llama", 1, 64):
            assert r["status"] == "ok" and r["oom"] is False and _positive(r["decode_tokens_per_s"]), r
    assert ("LlamaForCausalLM", (2, 16), 2) in calls[calls.index(("LlamaForCausalLM", (1, 64), 4)):]

    assert summary["oom"] == ["llama batch 1 prompt 64"] and summary["errors"] == 0
    out = "\n".join(lines)
    assert "llama batch 1 prompt 64: OOM in generate" in out
    (flat_row,) = [line for line in lines if line.split()[:2] == ["llama", "1"] and "OOM" in line]
    assert flat_row.split()[-2:] == ["OOM", "-"]  # no ratio without the long prompt's number


def test_new_tokens_below_two_and_a_full_cpu_grid_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main([*QUICK, "--new-tokens", "1", "--out", str(tmp_path)])
    assert "at least 2" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert cli.main(["bench", "serving", "--out", str(tmp_path)]) == 2
        assert "lightning-attention bench serving --quick" in capsys.readouterr().err
        assert not (tmp_path / "serving.json").exists()
