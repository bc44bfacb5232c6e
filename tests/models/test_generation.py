"""transformers' generate() on the TNL cache: one new token per step after the prompt (no re-fed prefix) for greedy,
sampling, beam search and left padding, the same tokens as a full recompute, a cache handed in by the caller, and no
warnings. Runs on transformers 5 (CI) and 4.x (CI's second step)."""

import subprocess
import sys

import pytest
import torch
from transformers import GenerationConfig

from lightning_attention.models.transnormer import TransNormerCache, cache_of
from lightning_attention.models.transnormer.cache import CACHE_FIELD
from tests.models.helpers import VARIANTS, left_pad, tiny_tnl

MODES = {
    "greedy": dict(do_sample=False),
    "sampling": dict(do_sample=True, temperature=0.9, top_k=20, top_p=0.9),
    "beam": dict(do_sample=False, num_beams=3),
    "beam-sampling": dict(do_sample=True, num_beams=2, num_return_sequences=2),
}


def record_input_lengths(model) -> list[tuple[int, int]]:
    """Installs a hook that records ``input_ids.shape`` of every forward call of ``model``."""
    shapes = []

    def hook(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        shapes.append(tuple(ids.shape))

    model.register_forward_pre_hook(hook, with_kwargs=True)
    return shapes


def generate(model, ids, seed=0, **kwargs):
    torch.manual_seed(seed)
    return model.generate(ids, max_new_tokens=6, min_new_tokens=6, **kwargs)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left-padded"])
def test_one_new_token_per_step_and_equal_to_full_recompute(mode, padded):
    model = tiny_tnl(torch.float64)
    ids = torch.randint(1, 256, (2, 9))
    kwargs = dict(MODES[mode])
    if padded:
        ids, mask = left_pad([ids[0].tolist(), ids[1, 4:].tolist()])
        kwargs["attention_mask"] = mask
    shapes = record_input_lengths(model)
    cached = generate(model, ids, **kwargs)
    rows = ids.shape[0] * max(kwargs.get("num_beams", 1), kwargs.get("num_return_sequences", 1))
    assert shapes == [(rows, 9)] + [(rows, 1)] * 5  # the prompt once, then one token per step: nothing re-fed
    shapes.clear()
    recomputed = generate(model, ids, use_cache=False, **kwargs)
    assert shapes == [(rows, 9 + t) for t in range(6)]  # the reference really recomputes the whole prefix
    assert torch.equal(cached, recomputed)


def test_greedy_equals_a_hand_written_full_forward_loop():
    model = tiny_tnl(torch.float64, **VARIANTS["hybrid"])
    ids = torch.randint(1, 256, (2, 6))
    greedy = model.generate(ids, max_new_tokens=6, do_sample=False)
    manual = ids
    for _ in range(6):
        nxt = model(manual, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
        manual = torch.cat([manual, nxt], dim=1)
    assert torch.equal(greedy, manual)


def test_left_padded_rows_generate_as_they_would_alone():
    model = tiny_tnl(torch.float64)
    ids = torch.randint(1, 256, (2, 6))
    padded, mask = left_pad([ids[0].tolist(), ids[1, 3:].tolist()])
    out = model.generate(padded, attention_mask=mask, max_new_tokens=4, do_sample=False)
    for row, alone in ((0, ids[:1]), (1, ids[1:, 3:])):
        assert torch.equal(out[row, -4:], model.generate(alone, max_new_tokens=4, do_sample=False)[0, -4:])


def test_generate_continues_a_cache_handed_in():
    """A conversation's cache from an earlier call: generate() feeds only the tokens the cache has not seen."""
    model = tiny_tnl(torch.float64)
    ids = torch.randint(1, 256, (1, 12))
    cache = cache_of(model(ids[:, :8], use_cache=True))
    assert isinstance(cache, TransNormerCache) and cache.get_seq_length() == 8
    shapes = record_input_lengths(model)
    out = model.generate(ids, max_new_tokens=3, do_sample=False, **{CACHE_FIELD: cache})
    assert shapes == [(1, 4), (1, 1), (1, 1)]
    assert torch.equal(out, model.generate(ids, max_new_tokens=3, do_sample=False, use_cache=False))
    assert cache.get_seq_length() == 12 + 2


@pytest.mark.skipif(
    not hasattr(GenerationConfig(), "prefill_chunk_size"), reason="transformers without chunked prefill"
)
@pytest.mark.parametrize("variant", ["tnl", "hybrid"])
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left-padded"])
def test_prefill_in_chunks_fills_one_cache(variant, padded):
    """``prefill_chunk_size``: the prompt is read in pieces of 4 tokens into the cache generate() created, then one
    token per step, and the tokens and every step's scores equal a single prefill's (left-padded rows too: their LRPE
    positions count from their first real token however the prompt is read)."""
    model = tiny_tnl(torch.float64, **VARIANTS[variant])
    # transformers 4.x reads the prompt but its last token in chunks through forward() (no hook sees them), then
    # the last token as the first step
    legacy = hasattr(model, "_prefill_chunking")
    ids = torch.randint(1, 256, (2, 11))
    kwargs = dict(do_sample=False, output_scores=True, return_dict_in_generate=True)
    if padded:
        ids, mask = left_pad([ids[0].tolist(), ids[1, 5:].tolist()])
        kwargs["attention_mask"] = mask
    whole = generate(model, ids, **kwargs)
    shapes = record_input_lengths(model)
    chunked = generate(model, ids, prefill_chunk_size=4, **kwargs)
    assert shapes == ([(2, 1)] * 6 if legacy else [(2, 4), (2, 4), (2, 3)] + [(2, 1)] * 5)
    assert torch.equal(chunked.sequences, whole.sequences)
    assert model.config.linear_use_lrpe_list[0] == 1  # positions matter
    for step, (a, b) in enumerate(zip(chunked.scores, whole.scores)):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9, msg=lambda m, step=step: f"step {step}: {m}")


def test_assisted_decoding_is_refused_clearly():
    model = tiny_tnl(torch.float64)
    with pytest.raises(ValueError, match="stateful|rolled back"):
        model.generate(torch.randint(1, 256, (1, 5)), max_new_tokens=3, assistant_model=tiny_tnl(torch.float64))


def test_generation_prints_no_warnings(tmp_path):
    """Generated text on stdout and nothing else; transformers' deprecation notices never show (stderr is empty)."""
    from lightning_attention.train import TrainConfig, train

    out = tmp_path / "tnl"
    train(TrainConfig.smoke(out=str(out), steps=2, progress=False))
    code = ("import torch, lightning_attention\n"
            "from transformers import AutoModelForCausalLM\n"
            f"m = AutoModelForCausalLM.from_pretrained({str(out)!r})\n"
            "m.generate(torch.tensor([[100, 101]]), max_new_tokens=4, do_sample=False)\n"
            "m.generate(torch.tensor([[100, 101]]), max_new_tokens=4, num_beams=2)\n")
    api = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert api.returncode == 0, api.stderr[-3000:]
    assert "deprecat" not in api.stderr.lower() and "warn" not in api.stderr.lower(), api.stderr
    cli = subprocess.run([sys.executable, "-m", "lightning_attention", "generate", "--checkpoint", str(out),
                          "--prompt", "def ", "--max-new-tokens", "20"], capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0, cli.stderr[-3000:]
    assert cli.stdout.startswith("def ")
    assert cli.stderr.strip().startswith("[20 tokens in") and len(cli.stderr.strip().splitlines()) == 1, cli.stderr
