"""Public API on the PyTorch path: contract, accuracy per dtype, gradients, the drop-in shim, slope recipes."""

import math

import pytest
import torch

import lightning_attention as la
from lightning_attention.ops.lightning import naive
from lightning_attention.utils.testing import assert_close
from tests.ops.test_naive import make_inputs, make_slope


@pytest.fixture(autouse=True)
def torch_backend(configure):
    configure(backend="torch")


def test_public_api_is_pinned():
    assert sorted(la.__all__) == sorted(
        ["__version__", "lightning_attn", "lightning_attn_decode", "lightning_attn_func", "paper_slopes", "tnl_slopes"]
    )
    for name in la.__all__:
        assert hasattr(la, name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("decay", ["none", "weak", "strong", "mixed"])
def test_forward_matches_float64(dtype, decay):
    B, T, H, K, V = 2, 100, 4, 32, 48
    q, k, v = (x.to(dtype) for x in make_inputs(B, T, H, K, V))
    slope = make_slope(decay, H, torch.float32)
    h0 = torch.randn(B, H, K, V)
    o, ht = la.lightning_attn(q, k, v, slope, scale=0.5, initial_state=h0, output_final_state=True)
    assert o.dtype == dtype and o.shape == (B, T, H, V)
    assert ht.dtype == torch.float32 and ht.shape == (B, H, K, V)
    # reference from the same rounded inputs, in float64
    s64 = None if slope is None else slope.double()
    o_ref, ht_ref = naive.quadratic_lightning_attn(
        q.double(), k.double(), v.double(), s64, scale=0.5, initial_state=h0.double()
    )
    assert_close("o", o, o_ref, dtype)
    assert_close("final_state", ht, ht_ref, torch.float32)


def test_return_contract():
    q, k, v = (x.float() for x in make_inputs(1, 10, 2, 16, 16))
    out = la.lightning_attn(q, k, v)
    assert isinstance(out, tuple) and len(out) == 2 and out[1] is None


def test_empty_sequence_returns_initial_state():
    q, k, v = (x.float() for x in make_inputs(2, 0, 2, 16, 24))
    o, ht = la.lightning_attn(q, k, v, output_final_state=True)
    assert o.shape == (2, 0, 2, 24) and torch.equal(ht, torch.zeros(2, 2, 16, 24))
    h0 = torch.randn(2, 2, 16, 24)
    o, ht = la.lightning_attn(q, k, v, initial_state=h0, output_final_state=True)
    assert torch.equal(ht, h0) and ht.data_ptr() != h0.data_ptr()


def test_gradcheck_float64_with_states():
    """Gradients to q, k, v and initial_state, and through the final state, are exact (float64 gradcheck)."""
    B, T, H, K, V = 1, 37, 2, 16, 16
    q, k, v = (x.requires_grad_() for x in make_inputs(B, T, H, K, V))
    h0 = torch.randn(B, H, K, V, dtype=torch.float64, requires_grad=True)
    slope = torch.tensor([0.0, 0.3], dtype=torch.float64)

    def f(q, k, v, h0):
        o, ht = la.lightning_attn(q, k, v, slope, scale=0.7, initial_state=h0, output_final_state=True)
        return o, ht

    assert torch.autograd.gradcheck(f, (q, k, v, h0), fast_mode=True)


def test_second_derivatives_float64():
    """The PyTorch path is differentiable twice (a gradient penalty through the op); the Triton path raises instead
    (tests/ops/test_chunk.py)."""
    q, k, v = (x.requires_grad_() for x in make_inputs(1, 9, 2, 4, 4))
    slope = torch.tensor([0.0, 0.3], dtype=torch.float64)
    assert torch.autograd.gradgradcheck(lambda q, k, v: la.lightning_attn(q, k, v, slope)[0], (q, k, v))


def test_gradients_match_float64_reference_varlen():
    H, K, V = 2, 16, 24
    lengths = [0, 1, 15, 30]
    cu = torch.tensor([0, 0, 1, 16, 46])
    q, k, v = (x.float().requires_grad_() for x in make_inputs(1, sum(lengths), H, K, V))
    h0 = torch.randn(len(lengths), H, K, V, requires_grad=True)
    slope = make_slope("mixed", H, torch.float32)
    do = torch.randn(1, sum(lengths), H, V)
    dht = torch.randn(len(lengths), H, K, V)

    def loss_of(q, k, v, h0, fn):
        o, ht = fn(q, k, v, h0)
        return (o * do.to(o.dtype)).sum() + (ht * dht.to(ht.dtype)).sum()

    ours = lambda q, k, v, h0: la.lightning_attn(  # noqa: E731
        q, k, v, slope, initial_state=h0, cu_seqlens=cu, output_final_state=True
    )
    grads = torch.autograd.grad(loss_of(q, k, v, h0, ours), (q, k, v, h0))
    leaves = [x.detach().double().requires_grad_() for x in (q, k, v, h0)]
    ref = lambda q, k, v, h0: naive.recurrent_lightning_attn(  # noqa: E731
        q, k, v, slope.double(), initial_state=h0, cu_seqlens=cu
    )
    ref_grads = torch.autograd.grad(loss_of(*leaves, ref), leaves)
    for name, g, r in zip(("dq", "dk", "dv", "dh0"), grads, ref_grads):
        assert_close(name, g, r, torch.float32)


def test_strided_views_from_fused_projection():
    """q, k, v split from one fused projection (non-contiguous views) give the same result as contiguous copies."""
    B, T, H, D = 2, 50, 3, 16
    fused = torch.randn(B, T, H, 3 * D)
    q, k, v = fused.split(D, dim=-1)
    assert not q.is_contiguous()
    o, _ = la.lightning_attn(q, k, v, make_slope("mixed", H, torch.float32))
    o_ref, _ = la.lightning_attn(q.contiguous(), k.contiguous(), v.contiguous(), make_slope("mixed", H, torch.float32))
    torch.testing.assert_close(o, o_ref)


def test_autocast_keeps_float32_arithmetic():
    q, k, v = (x.float() for x in make_inputs(1, 40, 2, 16, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        o, _ = la.lightning_attn(q, k, v)
    o_ref, _ = naive.quadratic_lightning_attn(q.double(), k.double(), v.double())
    assert o.dtype == torch.float32
    assert_close("o under autocast", o, o_ref, torch.float32)


# ---- lightning_attn_func: the drop-in for the official package ([b, h, n, d], s = slope, no scale)


@pytest.mark.parametrize("d,e", [(16, 16), (96, 96), (64, 48)], ids=["d16", "d96", "d64e48"])
@pytest.mark.parametrize("s_shape", ["none", "h", "h11"])
def test_lightning_attn_func_equals_lightning_attn(d, e, s_shape):
    b, h, n = 2, 4, 70
    q, k = torch.randn(b, h, n, d), torch.randn(b, h, n, d)
    v = torch.randn(b, h, n, e)
    slope = make_slope("mixed", h, torch.float32)
    s = {"none": None, "h": slope, "h11": slope[:, None, None]}[s_shape]
    o = la.lightning_attn_func(q, k, v, s, variant="parallel")
    assert o.shape == (b, h, n, e) and o.is_contiguous()
    o_ref, _ = la.lightning_attn(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), None if s is None else slope
    )
    torch.testing.assert_close(o, o_ref.transpose(1, 2))


def test_lightning_attn_func_rejects_wrong_slope():
    q = torch.randn(1, 4, 8, 16)
    with pytest.raises(ValueError, match="s must have shape"):
        la.lightning_attn_func(q, q, q, torch.ones(3))


# ---- slope recipes


def test_tnl_slopes_hand_computed_h8():
    # 2^(-8(h+1)/8) = 2^-(h+1); layer 0 of 12: factor 1 + 1e-5; last layer: factor 1e-5
    expected = torch.tensor([2.0 ** -(h + 1) for h in range(8)])
    torch.testing.assert_close(la.tnl_slopes(8, 0, 12), expected * (1 + 1e-5))
    torch.testing.assert_close(la.tnl_slopes(8, 11, 12), expected * 1e-5)
    torch.testing.assert_close(la.tnl_slopes(8, 3, 4), expected * (1 - 3 / 3 + 1e-5))
    torch.testing.assert_close(la.tnl_slopes(8, 0, 1), expected)  # L = 1: factor 1


def test_tnl_slopes_hand_computed_h12_alibi_interleave():
    # H = 12: the 8 slopes of H = 8, then every other slope of H = 16 (2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5)
    expected = [2.0 ** -(h + 1) for h in range(8)] + [2.0 ** -(0.5 + i) for i in range(4)]
    got = la.tnl_slopes(12, 0, 1)
    assert got.dtype == torch.float32 and got.shape == (12,)
    torch.testing.assert_close(got, torch.tensor(expected))


def test_paper_slopes_hand_computed():
    torch.testing.assert_close(la.paper_slopes(8, 0, 2), torch.arange(8.0))  # 8h/8 · 1
    torch.testing.assert_close(la.paper_slopes(8, 1, 2), torch.arange(8.0) * 0.5)
    torch.testing.assert_close(la.paper_slopes(12, 0, 1), torch.tensor([8 * h / 12 for h in range(12)]))
    assert la.paper_slopes(12, 0, 1)[0] == 0.0  # head 0: no decay, every layer


@pytest.mark.parametrize("fn", [la.tnl_slopes, la.paper_slopes])
def test_slope_helpers_reject_bad_layers(fn):
    with pytest.raises(ValueError, match="layer_idx"):
        fn(8, 4, 4)
    with pytest.raises(ValueError, match="num_layers"):
        fn(8, 0, 0)
    assert math.isfinite(float(fn(8, 0, 4).sum()))
