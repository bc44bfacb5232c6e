"""Feature maps: values, positivity, the registry, and the learned map's gradients."""

import pytest
import torch

from lightning_attention.ops import feature_naive
from lightning_attention.ops.feature_maps import (
    FEATURE_MAPS,
    FeatureMap,
    LearnedFeatureMap,
    get_feature_map,
    is_positive,
    require_positive,
)
from lightning_attention.ops.normalized import normalized_linear_attn
from lightning_attention.utils.testing import assert_close


def test_registry_values():
    x = torch.tensor([-30.0, -1.0, 0.0, 0.5, 2.0], dtype=torch.float64)
    torch.testing.assert_close(FEATURE_MAPS["identity"](x), x)
    torch.testing.assert_close(FEATURE_MAPS["elu+1"](x), torch.where(x > 0, x + 1, torch.exp(x)))
    torch.testing.assert_close(FEATURE_MAPS["relu2"](x), x.clamp_min(0) ** 2 + 1e-6)
    torch.testing.assert_close(FEATURE_MAPS["silu"](x), x * torch.sigmoid(x))
    assert sorted(FEATURE_MAPS) == ["elu+1", "identity", "relu2", "silu"]


@pytest.mark.parametrize("name", ["elu+1", "relu2"])
def test_positive_maps_are_strictly_positive(name):
    # all-negative inputs are the hard case: relu² alone would give exact zeros, elu+1 values near 0
    x = torch.full((4, 16), -50.0)
    assert bool((FEATURE_MAPS[name](x) > 0).all())
    assert is_positive(name)


@pytest.mark.parametrize("name", ["identity", "silu"])
def test_signed_maps_refuse_normalisation(name):
    assert not is_positive(name)
    with pytest.raises(ValueError, match="positive"):
        require_positive(name)
    q = torch.randn(1, 4, 1, 16)
    with pytest.raises(ValueError, match="positive"):
        normalized_linear_attn(q, q, q, feature_map=name)


def test_custom_maps():
    with pytest.raises(ValueError, match="feature_map must be one of"):
        get_feature_map("softmax")
    with pytest.raises(TypeError):
        get_feature_map(3)
    plain = lambda x: x.exp()  # noqa: E731 - positive in fact, but undeclared: refused
    with pytest.raises(ValueError):
        require_positive(plain)
    assert require_positive(FeatureMap("exp", plain, positive=True))(torch.zeros(2)).eq(1).all()


@pytest.mark.parametrize("num_heads", [None, 3])
def test_learned_map_shapes_and_positivity(num_heads):
    fm = LearnedFeatureMap(16, 24, num_heads=num_heads)
    x = torch.randn(2, 5, 3, 16)
    y = fm(x)
    assert y.shape == (2, 5, 3, 24) and y.dtype == x.dtype
    assert bool((y > 0).all())
    assert is_positive(fm)
    with pytest.raises(ValueError):
        fm(torch.randn(2, 5, 3, 8))


def test_learned_map_bad_args():
    with pytest.raises(ValueError):
        LearnedFeatureMap(16, eps=0.0)
    with pytest.raises(ValueError):
        LearnedFeatureMap(0)


@pytest.mark.parametrize("num_heads", [None, 2])
def test_learned_map_gradcheck(num_heads):
    fm = LearnedFeatureMap(5, 7, num_heads=num_heads).double()
    # keep projections away from relu's kink, where finite differences are not a gradient
    x = torch.randn(3, 2, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: torch.nn.functional.relu(
        x @ w if num_heads is None else torch.einsum("...hk,hkf->...hf", x, w)).square() + fm.eps,
        (x, fm.weight), atol=1e-6)
    # the module computes the same function
    w = fm.weight
    ref = torch.nn.functional.relu(x @ w if num_heads is None else torch.einsum("...hk,hkf->...hf", x, w)).square()
    torch.testing.assert_close(fm(x), ref + fm.eps)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_learned_map_gradients_through_normalized_attention(dtype):
    """Gradient of the learned projection W through the fast path equals the float64 recurrent reference's."""
    torch.manual_seed(0)
    B, T, H, K, Kf, V = 1, 37, 2, 16, 24, 16
    fm = LearnedFeatureMap(K, Kf, num_heads=H, init_std=0.3)
    q, k, v = (torch.randn(B, T, H, d).to(dtype) for d in (K, K, V))
    do = torch.randn(B, T, H, V)
    slope = torch.tensor([0.0, 0.2])

    fm.zero_grad()
    o, _ = normalized_linear_attn(q, k, v, slope, feature_map=fm)
    (o.float() * do).sum().backward()
    grad = fm.weight.grad.clone()

    fm64 = LearnedFeatureMap(K, Kf, num_heads=H).double()
    fm64.weight.data.copy_(fm.weight.data.double())
    o_ref, _ = feature_naive.recurrent_normalized_linear_attn(q.double(), k.double(), v.double(), slope.double(),
                                                              feature_map=fm64)
    (o_ref * do.double()).sum().backward()
    assert_close("o", o, o_ref, dtype)
    # bf16: W's gradient sums many rounded products; the forward tolerance is the bar for the float32 run only
    assert_close("dW", grad, fm64.weight.grad, 1e-5 if dtype == torch.float32 else 2e-2)
