"""A TNL model that learns its decay (``learn_decay``): the slopes as a parameter, from the recipe's, trained by the
op's slope gradient on both backends, saved and loaded with the weights, refused with sequence parallelism."""

import pytest
import torch

from lightning_attention.models.transnormer import TransNormerForCausalLM
from lightning_attention.nn.tnl_attention import TNLAttention
from lightning_attention.ops.decay import tnl_slopes
from lightning_attention.ops.lightning import naive
from lightning_attention.train import TrainConfig, train
from tests.models.helpers import tiny_tnl


def test_learned_slopes_start_from_the_recipe_and_compute_the_same():
    fixed, learned = tiny_tnl(), tiny_tnl(learn_decay=True)
    missing, unexpected = learned.load_state_dict(fixed.state_dict(), strict=False)
    assert unexpected == [] and sorted(missing) == [f"model.layers.{i}.token_mixer.log_slope" for i in range(2)]
    for i, layer in enumerate(learned.model.layers):
        mixer = layer.token_mixer
        assert "slope" not in dict(mixer.named_buffers()) and mixer.log_slope.requires_grad
        torch.testing.assert_close(mixer.decay_slope(), tnl_slopes(2, i, 2), rtol=1e-6, atol=0)
    ids = torch.randint(1, 256, (2, 40))
    torch.testing.assert_close(learned(ids).logits, fixed(ids).logits, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_log_slope_gradient_matches_float64_autograd(backend, configure):
    """The layer's log_slope gradient against float64 autograd through the quadratic form (the executable
    specification), on both backends (the Triton backward computes d slope from the other gradients)."""
    configure(backend=backend)
    torch.manual_seed(0)
    B, T, H, D = 2, 37, 2, 16
    layer = TNLAttention(H * D, H * D, H, layer_idx=0, num_layers=4, learn_decay=True).float()
    with torch.no_grad():
        layer.log_slope.copy_(torch.tensor([-1.3, -3.1]))
    q, k, v = (torch.randn(B, T, H, D) for _ in range(3))
    do = torch.randn(B, T, H, D)
    o = layer._attend(q, k, v, token_mask=None, cache=None, cu_seqlens=None)
    (o * do).sum().backward()

    log64 = layer.log_slope.detach().double().requires_grad_()
    ref, _ = naive.quadratic_lightning_attn(q.double(), k.double(), v.double(), log64.exp())
    (ref * do.double()).sum().backward()
    torch.testing.assert_close(layer.log_slope.grad.double(), log64.grad, rtol=1e-4, atol=1e-5)


def test_a_training_run_learns_and_saves_the_decay(tmp_path):
    out = tmp_path / "run"
    train(TrainConfig.smoke(out=str(out), progress=False, learn_decay=True, steps=3))
    model = TransNormerForCausalLM.from_pretrained(out)
    assert model.config.learn_decay
    for i, layer in enumerate(model.model.layers):
        start = tnl_slopes(model.config.decoder_attention_heads, i, model.config.decoder_layers)
        moved = (layer.token_mixer.decay_slope() - start).abs().max()
        assert 0 < moved < 0.5 * start.max()  # trained a little, from the recipe's values


def test_learned_decay_is_refused_with_sequence_parallelism():
    with pytest.raises(ValueError, match="learn_decay is not supported with sequence parallelism"):
        TNLAttention(32, 32, 2, 0, 2, learn_decay=True, sequence_parallel_group=object())
