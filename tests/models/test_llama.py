"""LLaMA baseline (transformers' LlamaForCausalLM): cached decode == full forward, left padding, scaled residual
init, and equal size with TNL presets."""

import pytest
import torch

from lightning_attention.models.presets import PRESETS, model_config, model_from_config, parameter_count
from lightning_attention.models.transnormer.cache import CACHE_FIELD, cache_of
from lightning_attention.utils.testing import assert_close
from tests.models.helpers import left_pad, tiny_llama


def test_llama_cached_decode_and_left_padding():
    model = tiny_llama()
    ids = torch.randint(1, 256, (2, 11))
    full = model(ids).logits
    out = model(ids[:, :4], use_cache=True)
    cache = {CACHE_FIELD: cache_of(out)}
    steps = [out.logits] + [model(ids[:, t : t + 1], use_cache=True, **cache).logits for t in range(4, 11)]
    assert_close("llama decode vs full", torch.cat(steps, dim=1), full, torch.float64)
    padded, mask = left_pad([ids[0].tolist(), ids[1, 6:].tolist()])
    logits = model(padded, attention_mask=mask).logits
    # left padding shifts the row's positions; transformers computes the RoPE angles in float32
    assert_close("llama left padding", logits[1, 6:], model(ids[1:, 6:]).logits[0], torch.float32)


@pytest.mark.parametrize("preset", list(PRESETS))
def test_presets_have_equal_parameter_counts(preset):
    with torch.device("meta"):
        tnl = model_from_config("tnl", model_config("tnl", preset))
        llama = model_from_config("llama", model_config("llama", preset))
    n_tnl, n_llama = parameter_count(tnl), parameter_count(llama)
    assert abs(n_tnl - n_llama) / n_tnl < 0.01, (n_tnl, n_llama)
    if preset == "40m":
        assert 38e6 < n_tnl < 44e6


def test_llama_residual_outputs_get_the_scaled_init():
    torch.manual_seed(0)
    config = model_config("llama", "40m")
    model = model_from_config("llama", config)
    layer = model.model.layers[5]
    scaled = 0.02 / (2 * config["num_hidden_layers"]) ** 0.5
    assert abs(layer.self_attn.q_proj.weight.std().item() / 0.02 - 1) < 0.05
    assert abs(layer.self_attn.o_proj.weight.std().item() / scaled - 1) < 0.05
    assert abs(layer.mlp.down_proj.weight.std().item() / scaled - 1) < 0.05
