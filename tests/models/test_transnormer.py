"""TransNormerLLM model: cached decoding == full forward, padding, packing, HF round trip, compile, autocast
(transformers' generate() on the cache: test_generation.py)."""

import pytest
import torch

from lightning_attention import tnl_slopes
from lightning_attention.models.transnormer import (
    TransNormerCache,
    cache_of,
    TransNormerConfig,
    TransNormerForCausalLM,
    TransNormerModel,
)
from lightning_attention.utils.testing import assert_close
from tests.models.helpers import VARIANTS, left_pad, tiny_tnl


def step_by_step(model, ids: torch.Tensor, prefill: int, **kwargs) -> torch.Tensor:
    """Logits of ``ids [B, T]``: the first ``prefill`` tokens in one call, then one token per call."""
    out = model(ids[:, :prefill], use_cache=True, **kwargs)
    cache, logits = cache_of(out), [out.logits]
    for t in range(prefill, ids.shape[1]):
        logits.append(model(ids[:, t : t + 1], cache=cache, use_cache=True).logits)
    return torch.cat(logits, dim=1)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_teacher_forced_decode_equals_full_forward(variant):
    model = tiny_tnl(**VARIANTS[variant])
    ids = torch.randint(1, 256, (2, 13))
    full = model(ids, use_cache=False).logits
    assert_close("decode vs full", step_by_step(model, ids, prefill=5), full, torch.float64)
    assert_close("decode from one token", step_by_step(model, ids, prefill=1), full, torch.float64)


def test_float32_decode_against_float64_forward():
    model64 = tiny_tnl(torch.float64)
    model32 = tiny_tnl(torch.float32)
    ids = torch.randint(1, 256, (2, 20))
    ref = model64(ids, use_cache=False).logits
    out = model32(ids[:, :7], use_cache=True)
    cache = cache_of(out)
    assert all(s.dtype == torch.float32 for s in cache.states)
    assert cache.states[0].shape == (2, 2, 32, 16)  # LRPE layer: K = 2 · head_dim
    assert cache.states[1].shape == (2, 2, 16, 16)
    logits = step_by_step(model32, ids, prefill=7)
    assert_close("fp32 cached decode vs fp64", logits, ref, torch.float32)


@pytest.mark.parametrize("variant", ["tnl", "hybrid"])
def test_left_padded_batch_equals_sequences_alone(variant):
    model = tiny_tnl(**VARIANTS[variant])
    seqs = [torch.randint(1, 256, (n,)).tolist() for n in (7, 4, 1)]
    ids, mask = left_pad(seqs)
    out = model(ids, attention_mask=mask, use_cache=True)
    cache = cache_of(out)
    nxt = torch.randint(1, 256, (3, 3))
    steps = []
    for t in range(3):
        mask = torch.cat([mask, torch.ones(3, 1, dtype=mask.dtype)], dim=1)
        steps.append(model(nxt[:, t : t + 1], attention_mask=mask, cache=cache, use_cache=True).logits)
    steps = torch.cat(steps, dim=1)
    for b, seq in enumerate(seqs):
        alone = torch.tensor([seq + nxt[b].tolist()])
        ref = model(alone, use_cache=False).logits[0]
        n = len(seq)
        assert_close(f"prefill row {b}", out.logits[b, ids.shape[1] - n :], ref[:n], torch.float64)
        assert_close(f"decode row {b}", steps[b], ref[n:], torch.float64)


def test_padding_after_a_cached_prefix_is_exact():
    """Padded positions in a chunk that continues a cache must not even decay the state (packed path)."""
    model = tiny_tnl()
    prefix = torch.randint(1, 256, (2, 3))
    chunk = torch.randint(1, 256, (2, 4))
    cache = cache_of(model(prefix, use_cache=True))
    mask = torch.tensor([[1, 1, 1, 0, 0, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
    out = model(chunk, attention_mask=mask, cache=cache, use_cache=True)
    follow = torch.randint(1, 256, (2, 1))
    last = model(follow, cache=cache, use_cache=True).logits
    alone0 = torch.cat([prefix[0], chunk[0, 2:], follow[0]])[None]
    ref0 = model(alone0, use_cache=False).logits[0]
    assert_close("real tokens after padding", out.logits[0, 2:], ref0[3:5], torch.float64)
    assert_close("next step after padding", last[0], ref0[5:], torch.float64)
    assert bool((out.logits[0, :2] == out.logits[0, :2]).all())  # padded rows finite, not NaN


@pytest.mark.parametrize("variant", ["tnl", "minimax", "hybrid"])
def test_packed_varlen_equals_padded(variant):
    model = tiny_tnl(**VARIANTS[variant])
    lengths = [5, 0, 1, 9]
    seqs = [torch.randint(1, 256, (n,)).tolist() for n in lengths]
    packed = torch.tensor([sum(seqs, [])])
    cu = torch.tensor([0, 5, 5, 6, 15])
    out = model(packed, labels=packed, cu_seqlens=cu, use_cache=False)
    real = [s for s in seqs if s]
    ids, mask = left_pad(real)
    padded = model(ids, attention_mask=mask, use_cache=False).logits
    pieces = [padded[b, ids.shape[1] - len(s) :] for b, s in enumerate(real)]
    assert_close("packed vs padded logits", out.logits[0], torch.cat(pieces), torch.float64)
    # the loss never asks the last token of one sequence to predict the first of the next
    ce = torch.nn.functional.cross_entropy
    total = sum(ce(p[:-1].float(), torch.tensor(s[1:]), reduction="sum") for p, s in zip(pieces, real) if len(s) > 1)
    count = sum(len(s) - 1 for s in real)
    assert_close("packed loss", out.loss, total / count, 1e-6)


def test_hf_round_trip(tmp_path):
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    model = tiny_tnl(torch.float32)
    model.save_pretrained(tmp_path)
    assert isinstance(AutoConfig.from_pretrained(tmp_path), TransNormerConfig)
    assert isinstance(AutoModel.from_pretrained(tmp_path), TransNormerModel)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert isinstance(loaded, TransNormerForCausalLM)
    ours, theirs = model.state_dict(), loaded.state_dict()
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert torch.equal(ours[name], theirs[name]), name
    for a, b in zip(model.model.layers, loaded.model.layers):
        assert torch.equal(a.token_mixer.slope, b.token_mixer.slope)
    ids = torch.randint(1, 256, (2, 9))
    assert torch.equal(model(ids).logits, loaded(ids).logits)


def test_cache_batch_select_and_repeat():
    model = tiny_tnl(**VARIANTS["hybrid"])
    ids = torch.randint(1, 256, (2, 5))
    cache = cache_of(model(ids, use_cache=True))
    cache.batch_repeat_interleave(2)  # rows: 0, 0, 1, 1
    cache.reorder_cache(torch.tensor([3, 0]))  # rows: 1, 0
    nxt = torch.randint(1, 256, (2, 1))
    logits = model(nxt, cache=cache, use_cache=True).logits
    ref = model(torch.cat([ids[[1, 0]], nxt], dim=1), use_cache=False).logits[:, -1:]
    assert_close("after select/repeat", logits, ref, torch.float64)
    assert cache.get_seq_length() == 6 and len(cache) == 2


def test_generation_memory_is_constant():
    model = tiny_tnl(torch.float32)
    cache = cache_of(model(torch.randint(1, 256, (1, 4)), use_cache=True))
    before = cache.memory_bytes()
    for _ in range(20):
        model(torch.randint(1, 256, (1, 1)), cache=cache, use_cache=True)
    assert cache.memory_bytes() == before
    assert isinstance(cache, TransNormerCache) and cache.positions.tolist() == [24]


def test_torch_compile_matches_eager():
    model = tiny_tnl(torch.float32).train()
    ids = torch.randint(1, 256, (2, 40))
    compiled = torch.compile(model, backend="aot_eager")
    out = compiled(ids, labels=ids)
    ref = model(ids, labels=ids)
    assert_close("compiled logits", out.logits, ref.logits, torch.float32)
    out.loss.backward()
    assert all(p.grad is not None and bool(torch.isfinite(p.grad).all()) for p in model.parameters())


def test_autocast_bf16_against_float64():
    model64 = tiny_tnl(torch.float64)
    model32 = tiny_tnl(torch.float32)
    ids = torch.randint(1, 256, (2, 30))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model32(ids, use_cache=True)
    assert out.logits.dtype == torch.bfloat16
    assert all(s.dtype == torch.float32 for s in cache_of(out).states)  # the state never goes to bf16
    # a whole model in bf16 (every matmul rounded) is held to 4x the single-op bf16 tolerance
    assert_close("autocast bf16 logits", out.logits, model64(ids, use_cache=False).logits, 2e-2)


def test_slopes_stay_float32_after_a_dtype_cast():
    model = tiny_tnl(torch.float32, decoder_layers=3, linear_use_lrpe_list=[1, 0, 0]).to(torch.bfloat16)
    for i, layer in enumerate(model.model.layers):
        assert layer.token_mixer.slope.dtype == torch.float32
        assert torch.equal(layer.token_mixer.slope, tnl_slopes(2, i, 3))


def test_init_weights_follow_the_table():
    torch.manual_seed(0)
    config = TransNormerConfig(vocab_size=256, decoder_embed_dim=256, decoder_layers=8, decoder_attention_heads=4,
                               glu_dim=512, init_std=0.02)
    model = TransNormerForCausalLM(config)
    layer = model.model.layers[3]
    assert abs(layer.token_mixer.qkvu_proj.weight.std().item() / 0.02 - 1) < 0.05
    assert abs(layer.channel_mixer.l3.weight.std().item() / (0.02 / 4) - 1) < 0.05  # 1/√(2L) = 1/4
    assert abs(layer.token_mixer.out_proj.weight.std().item() / (0.02 / 4) - 1) < 0.05
    theta = model.model.layers[0].token_mixer.lrpe.theta
    expected = 10000.0 ** (-2.0 / 256 * torch.arange(256, dtype=torch.float64))
    assert theta.shape == (4, 1, 64) and torch.allclose(theta.flatten().double(), expected, rtol=1e-6)
    assert model.model.layers[1].token_mixer.lrpe is None


@pytest.mark.parametrize("tied", [False, True])
def test_embedding_accessors_and_resize(tied):
    """transformers' own accessors find the embeddings and head, so resize_token_embeddings works, tied or not."""
    model = tiny_tnl(tie_word_embeddings=tied)
    assert model.get_input_embeddings() is model.model.embed_tokens is model.model.get_input_embeddings()
    assert model.get_output_embeddings() is model.lm_head
    model.resize_token_embeddings(300, mean_resizing=False)
    assert model.model.embed_tokens.weight.shape == model.lm_head.weight.shape == (300, 32)
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    assert model.config.vocab_size == 300
    assert model(torch.randint(0, 300, (1, 9))).logits.shape == (1, 9, 300)
    new = torch.nn.Embedding(300, 32, dtype=torch.float64)
    model.set_input_embeddings(new)
    assert model.model.embed_tokens is new
