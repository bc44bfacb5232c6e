"""LLaMA baseline: cached decode == full forward, left padding, and equal size with TNL presets."""

import pytest
import torch

from lightning_attention.models.presets import PRESETS, model_config, model_from_config, parameter_count
from lightning_attention.utils.testing import assert_close
from tests.models.helpers import left_pad, tiny_llama


def test_llama_cached_decode_and_left_padding():
    model = tiny_llama()
    ids = torch.randint(1, 256, (2, 11))
    full = model(ids).logits
    out = model(ids[:, :4], use_cache=True)
    steps = [out.logits] + [
        model(ids[:, t : t + 1], past_key_values=out.past_key_values, use_cache=True).logits for t in range(4, 11)
    ]
    assert_close("llama decode vs full", torch.cat(steps, dim=1), full, torch.float64)
    padded, mask = left_pad([ids[0].tolist(), ids[1, 6:].tolist()])
    logits = model(padded, attention_mask=mask).logits
    assert_close("llama left padding", logits[1, 6:], model(ids[1:, 6:]).logits[0], torch.float64)


@pytest.mark.parametrize("preset", list(PRESETS))
def test_presets_have_equal_parameter_counts(preset):
    with torch.device("meta"):
        tnl = model_from_config("tnl", model_config("tnl", preset))
        llama = model_from_config("llama", model_config("llama", preset))
    n_tnl, n_llama = parameter_count(tnl), parameter_count(llama)
    assert abs(n_tnl - n_llama) / n_tnl < 0.01, (n_tnl, n_llama)
    if preset == "40m":
        assert 38e6 < n_tnl < 44e6
