"""Layers: SRMSNorm, LRPE, the TNL token mixer's wiring against a float64 composition of the reference op."""

import sys
import types

import pytest
import torch
import torch.nn.functional as F

from lightning_attention import paper_slopes, tnl_slopes
from lightning_attention.nn import LRPE, RMSNorm, SGLU, SRMSNorm, TNLAttention
from lightning_attention.ops.lightning import naive
from lightning_attention.utils.testing import assert_close


def released_srmsnorm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """The released TNL SimpleRMSNorm as written there: statistic in float32, eps inside the root, no weight."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def test_srmsnorm_formula_and_zero_rows():
    x = torch.randn(3, 5, 40, dtype=torch.float64)
    x[1, 2] = 0
    y = SRMSNorm(40, eps=1e-6)(x)
    ref = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    assert_close("srmsnorm", y, ref, torch.float64)
    assert bool((y[1, 2] == 0).all())  # an all-zero (padded) row stays finite
    assert list(SRMSNorm(8).parameters()) == [] and len(list(RMSNorm(8).parameters())) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_norms_match_the_released_computation(dtype):
    """torch's rms_norm kernel gives the released code's float32-statistic result, bit for bit in 16-bit dtypes."""
    x = (torch.randn(4, 7, 1024, dtype=torch.float64) * 3).to(dtype)
    x[0, 0] = 0
    y = SRMSNorm(1024, eps=1e-6)(x)
    assert y.dtype == dtype
    ref = x.double() / torch.sqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6)
    assert_close("srmsnorm vs float64", y, ref, dtype)
    if dtype != torch.float32:
        assert torch.equal(y, released_srmsnorm(x))
    else:
        assert_close("srmsnorm vs released", y, released_srmsnorm(x), torch.float32)
    norm = RMSNorm(1024, eps=1e-6)
    with torch.no_grad():
        norm.weight.normal_()
    weighted = norm(x)  # float32 weight, 16-bit input: the autocast situation
    assert weighted.dtype == dtype
    expected = (norm.weight.float() * released_srmsnorm(x.float())).to(dtype)
    assert_close("rmsnorm vs released", weighted, expected, torch.float32)


def test_lrpe_is_relative():
    lrpe = LRPE(num_heads=2, head_dim=8).double()
    q, k = torch.randn(2, 1, 6, 2, 8, dtype=torch.float64)
    pos = torch.arange(6)[None]

    def scores(shift):
        qe, ke = lrpe(q, pos + shift), lrpe(k, pos + shift)
        assert qe.shape == (1, 6, 2, 16)
        return torch.einsum("bthd,bshd->bhts", qe, ke)

    assert_close("shifted origin", scores(1000), scores(0), 1e-9)


def test_sglu_has_no_activation():
    glu = SGLU(6, 10).double()
    x = torch.randn(4, 6, dtype=torch.float64)
    assert_close("sglu", glu(x), glu.l3(glu.l1(x) * glu.l2(x)), torch.float64)


def reference_tnl_mixer(layer: TNLAttention, x: torch.Tensor) -> torch.Tensor:
    """The token mixer written out from the paper, on the float64 quadratic reference op."""
    B, T, _ = x.shape
    H, D, h = layer.num_heads, layer.head_dim, layer.hidden_dim
    w = layer.qkvu_proj.weight
    q, k, v, u = (F.linear(x, w[i * h : (i + 1) * h]) for i in range(4))
    q, k = F.silu(q).view(B, T, H, D), F.silu(k).view(B, T, H, D)
    if layer.lrpe is not None:
        angle = torch.arange(T, dtype=x.dtype)[:, None, None] * layer.lrpe.theta.view(H, D)
        q = torch.cat([q * torch.cos(angle), q * torch.sin(angle)], dim=-1)
        k = torch.cat([k * torch.cos(angle), k * torch.sin(angle)], dim=-1)
    o, _ = naive.quadratic_lightning_attn(q, k, v.view(B, T, H, D), layer.slope.double())
    o = o.reshape(B, T, h)
    o = o / torch.sqrt(o.pow(2).mean(-1, keepdim=True) + 1e-6)
    return F.linear(u * o, layer.out_proj.weight)


@pytest.mark.parametrize("use_lrpe", [True, False])
def test_tnl_mixer_matches_the_written_out_reference(use_lrpe):
    torch.manual_seed(0)
    layer = TNLAttention(24, 24, 3, layer_idx=1, num_layers=4, use_lrpe=use_lrpe).double()
    assert torch.equal(layer.slope, tnl_slopes(3, 1, 4))
    x = torch.randn(2, 37, 24, dtype=torch.float64)
    assert_close("tnl mixer", layer(x), reference_tnl_mixer(layer, x), 1e-6)


def test_minimax_variant_formula():
    torch.manual_seed(0)
    layer = TNLAttention(16, 16, 2, layer_idx=0, num_layers=2, variant="minimax", decay="paper").double()
    assert torch.equal(layer.slope, paper_slopes(2, 0, 2))
    x = torch.randn(1, 9, 16, dtype=torch.float64)
    q, k, v = F.silu(layer.qkv_proj(x)).split(16, dim=-1)
    o, _ = naive.recurrent_lightning_attn(q.view(1, 9, 2, 8), k.view(1, 9, 2, 8), v.view(1, 9, 2, 8),
                                          layer.slope.double())
    o = layer.norm.weight * F.rms_norm(o.reshape(1, 9, 16), (16,), eps=1e-6)
    ref = layer.out_proj(torch.sigmoid(layer.output_gate(x)) * o)
    assert_close("minimax mixer", layer(x), ref, 1e-6)


def test_fused_projection_is_split_without_copies(monkeypatch):
    import lightning_attention.nn.tnl_attention as mod

    original, seen = mod.lightning_attn, {}

    def spy(q, k, v, slope, **kwargs):
        seen["v"] = v
        return original(q, k, v, slope, **kwargs)

    monkeypatch.setattr(mod, "lightning_attn", spy)
    TNLAttention(16, 16, 2, layer_idx=0, num_layers=1)(torch.randn(2, 5, 16))
    v = seen["v"]
    assert v.stride(-1) == 1 and v.stride(1) == 4 * 16  # a strided view of the [B, T, 4h] projection


def test_sequence_parallel_hook_calls_lightning_attn_sp(monkeypatch):
    calls = []

    def fake_sp(q, k, v, slope=None, *, group=None, scale=1.0, initial_state=None, output_final_state=False):
        calls.append(group)
        return naive.chunk_lightning_attn(q, k, v, slope, scale=scale, initial_state=initial_state)

    fake = types.ModuleType("lightning_attention.distributed")
    fake.lightning_attn_sp = fake_sp
    monkeypatch.setitem(sys.modules, "lightning_attention.distributed", fake)
    torch.manual_seed(0)
    layer = TNLAttention(16, 16, 2, layer_idx=0, num_layers=2).double()
    x = torch.randn(1, 12, 16, dtype=torch.float64)
    ref = layer(x)
    layer.sequence_parallel_group = "group-0"
    assert_close("sequence-parallel path", layer(x), ref, torch.float64)
    assert calls == ["group-0"]


def test_invalid_options_are_rejected():
    with pytest.raises(ValueError, match="variant"):
        TNLAttention(16, 16, 2, 0, 1, variant="gla")
    with pytest.raises(ValueError, match="decay"):
        TNLAttention(16, 16, 2, 0, 1, decay="alibi")
    with pytest.raises(ValueError, match="divisible"):
        TNLAttention(16, 18, 4, 0, 1)
