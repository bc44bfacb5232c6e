"""Training options of both architectures: dropout, the released init, tied LLaMA embeddings, float32 LRPE."""

import pytest
import torch

from lightning_attention.models.presets import model_config, model_from_config, parameter_counts
from lightning_attention.nn.tnl_attention import TNLAttention

ARCHS = ("tnl", "llama")


def _model(arch, seed=0, **options):
    torch.manual_seed(seed)
    return model_from_config(arch, model_config(arch, "smoke", 256, **options))


@pytest.mark.parametrize("arch", ARCHS)
def test_dropout_acts_in_training_only(arch):
    ids = torch.randint(0, 256, (2, 24))
    model = _model(arch, dropout=0.1)
    plain = _model(arch)
    plain.load_state_dict(model.state_dict())
    model.train()
    first, second = (model(ids, use_cache=False).logits for _ in range(2))
    assert not torch.allclose(first, second)  # fresh masks each call
    model.eval()
    plain.eval()
    torch.testing.assert_close(model(ids, use_cache=False).logits, plain(ids, use_cache=False).logits)
    plain.train()  # without dropout, training mode is deterministic
    torch.testing.assert_close(plain(ids, use_cache=False).logits, plain(ids, use_cache=False).logits)


@pytest.mark.parametrize("arch", ARCHS)
def test_dropout_must_be_a_probability(arch):
    with pytest.raises(ValueError, match="dropout"):
        _model(arch, dropout=1.0)


@pytest.mark.parametrize("arch", ARCHS)
def test_official_init_leaves_residual_outputs_unscaled(arch):
    def residual_std(model):
        layer = model.model.layers[3]
        out = layer.token_mixer.out_proj if arch == "tnl" else layer.self_attn.o_proj
        return out.weight.std().item()

    size = dict(d_model=256, n_layers=8, n_heads=4, ffn_dim=512)
    torch.manual_seed(0)
    scaled = model_from_config(arch, model_config(arch, "smoke", 256, **size))
    torch.manual_seed(0)
    official = model_from_config(arch, model_config(arch, "smoke", 256, scale_residual_init=False, **size))
    assert residual_std(scaled) == pytest.approx(0.02 / 4, rel=0.05)  # 1/√(2L), L = 8
    assert residual_std(official) == pytest.approx(0.02, rel=0.05)


def test_llama_ties_its_embeddings_like_tnl():
    for arch in ARCHS:
        untied, tied = _model(arch), _model(arch, tie_word_embeddings=True)
        assert tied.lm_head.weight is tied.get_input_embeddings().weight
        a, b = parameter_counts(untied), parameter_counts(tied)
        assert a["embedding"] == 2 * 256 * 32 and b["embedding"] == 256 * 32
        assert a["non_embedding"] == b["non_embedding"] and a["total"] - b["total"] == 256 * 32


def test_llama_takes_shared_options_only():
    with pytest.raises(ValueError, match="apply to --arch tnl only"):
        model_config("llama", "smoke", decay_recipe="paper")
    with pytest.raises(ValueError, match="apply to --arch tnl only"):
        model_config("llama", "smoke", lrpe_float32=True)


def _theta_grad(dtype, autocast, lrpe_float32, seed):
    torch.manual_seed(seed)
    layer = TNLAttention(64, 64, 2, 0, 2, use_lrpe=True, lrpe_float32=lrpe_float32).to(dtype)
    x, weights = torch.randn(2, 512, 64).to(dtype), torch.randn(2, 512, 64).to(dtype)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = layer(x)
    (out.to(dtype) * weights).sum().backward()
    return layer.lrpe.theta.grad.double().flatten()


@pytest.mark.parametrize("seed", [0, 1])
def test_lrpe_float32_makes_the_angle_gradient_accurate_under_bf16(seed):
    """The LRPE angles' gradient sums position-weighted products over every token (t up to 511 here): from bf16 q, k
    gradients it is off by ~5%; with the LRPE layer's attention in float32, by well under 1%."""
    reference = _theta_grad(torch.float64, False, False, seed)
    error = {flag: ((_theta_grad(torch.float32, True, flag, seed) - reference).norm() / reference.norm()).item()
             for flag in (False, True)}
    assert error[True] < 0.25 * error[False], error
    assert error[True] < 0.015, error


def test_lrpe_float32_keeps_the_layer_output_in_the_autocast_dtype():
    layer = TNLAttention(64, 64, 2, 0, 2, use_lrpe=True, lrpe_float32=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert layer(torch.randn(1, 16, 64)).dtype == torch.bfloat16
