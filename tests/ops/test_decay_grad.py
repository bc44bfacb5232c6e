"""The slope's gradient on every backend, against float64 autograd through the quadratic reference.

On the PyTorch path autograd differentiates the decay directly; on the Triton path the gradient comes from the other
gradients (``ops/lightning/decay_grad.py``), with the backward in float32 for 16-bit inputs. The loss covers the
outputs and the final state; cases cover h0, packed sequences with lengths 0, 1 and 15, the inter-only mode, the
recompute backward and the weak decays where the position-weighted sum cancels most.
"""

import pytest
import torch

import lightning_attention as la
from lightning_attention.ops.lightning import naive
from lightning_attention.ops.lightning.decay_grad import slope_gradient
from lightning_attention.utils.testing import relative_error

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _case(T, dtype, *, B=2, H=3, K=16, V=8, lengths=None, h0=True, final=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    if lengths is not None:
        B, T = 1, sum(lengths)
    q, k, v = (torch.randn(B, T, H, d, generator=g).to(DEVICE, dtype).requires_grad_() for d in (K, K, V))
    N = B if lengths is None else len(lengths)
    h = torch.randn(N, H, K, V, generator=g).to(DEVICE).requires_grad_() if h0 else None
    cu = None if lengths is None else torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device=DEVICE)
    do = torch.randn(B, T, H, V, generator=g).to(DEVICE, dtype)
    dht = torch.randn(N, H, K, V, generator=g).to(DEVICE) if final else None
    return q, k, v, h, cu, do, dht


def _slope_grad(q, k, v, h, cu, do, dht, slope, **kwargs):
    slope = slope.to(DEVICE).requires_grad_()
    o, ht = la.lightning_attn(q, k, v, slope, scale=0.7, initial_state=h, output_final_state=dht is not None,
                              cu_seqlens=cu, **kwargs)  # fmt: skip
    loss = (o.double() * do.double()).sum() + ((ht * dht).sum() if dht is not None else 0.0)
    (grad,) = torch.autograd.grad(loss, [slope], allow_unused=True)  # T = 0: nothing depends on the slope
    return torch.zeros_like(slope) if grad is None else grad


def _reference(q, k, v, h, cu, do, dht, slope):
    s64 = slope.double().to(DEVICE).requires_grad_()
    x64 = [x.detach().double() for x in (q, k, v)]
    h64 = None if h is None else h.detach().double()
    o, ht = naive.quadratic_lightning_attn(
        *x64, s64, scale=0.7, initial_state=h64, cu_seqlens=None if cu is None else cu.cpu()
    )
    loss = (o * do.double()).sum() + ((ht * dht.double()).sum() if dht is not None else 0.0)
    (grad,) = torch.autograd.grad(loss, [s64], allow_unused=True)
    return torch.zeros_like(s64) if grad is None else grad


SLOPES = torch.tensor([0.0, 0.05, 1.5])
CASES = [
    pytest.param(dict(T=100, dtype=torch.float32), id="fp32"),
    pytest.param(dict(T=100, dtype=torch.float32, h0=False, final=False), id="fp32-no-states"),
    pytest.param(dict(T=70, dtype=torch.bfloat16), id="bf16"),
    pytest.param(dict(T=70, dtype=torch.float16, h0=False), id="fp16-final-only"),
    pytest.param(dict(T=0, dtype=torch.float32), id="empty"),
    pytest.param(dict(T=0, dtype=torch.float32, lengths=[0, 1, 15, 0, 40]), id="varlen-0-1-15-0-40"),
    pytest.param(dict(T=0, dtype=torch.bfloat16, lengths=[33, 0, 30]), id="varlen-bf16"),
]


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("case", CASES)
def test_slope_gradient_matches_float64(case, backend, configure):
    configure(backend=backend)
    inputs = _case(**case)
    got = _slope_grad(*inputs, SLOPES)
    ref = _reference(*inputs, SLOPES)
    assert relative_error(got, ref) <= 1e-5, (got, ref)


def test_slope_gradient_of_the_recompute_backward(triton_backend):
    inputs = _case(64, torch.bfloat16, seed=1)
    got = _slope_grad(*inputs, SLOPES, backward="recompute")
    assert relative_error(got, _reference(*inputs, SLOPES)) <= 1e-5


def test_slope_gradient_of_the_inter_only_mode(triton_backend):
    """The identity holds for every mode: the inter-only term's pairs also carry λ to their distance."""
    from lightning_attention.ops.lightning.inter import inter_lightning_attn_torch, lightning_attn_inter

    q, k, v, h, _, do, dht = _case(80, torch.float32, seed=2)
    slope = SLOPES.to(DEVICE).requires_grad_()
    o, ht = lightning_attn_inter(q, k, v, slope, chunk_size=32, initial_state=h, output_final_state=True)
    (got,) = torch.autograd.grad((o * do).sum() + (ht * dht).sum(), [slope])
    s64 = SLOPES.double().to(DEVICE).requires_grad_()
    o64, ht64 = inter_lightning_attn_torch(*(x.detach().double() for x in (q, k, v)), s64, chunk_size=32,
                                           initial_state=h.detach().double())  # fmt: skip
    (ref,) = torch.autograd.grad((o64 * do.double()).sum() + (ht64 * dht.double()).sum(), [s64])
    assert relative_error(got, ref) <= 1e-5


def test_bf16_gradients_would_swamp_it_at_long_lengths():
    """Why the Triton path runs the backward in float32 when the slope learns: from exact gradients merely rounded to
    bf16, the position-weighted sum is far off at 8K tokens with weak decays, while float32 gradients give it to
    float64 rounding."""
    g = torch.Generator().manual_seed(3)
    H, K, V, T = 2, 16, 16, 8192
    q, k, v = (torch.randn(1, T, H, d, generator=g, dtype=torch.float64).requires_grad_() for d in (K, K, V))
    slope = la.tnl_slopes(H, 0, 24).double().requires_grad_()
    o, _ = naive.chunk_lightning_attn(q, k, v, slope, scale=K**-0.5, chunk_size=256)
    dq, dk, ds = torch.autograd.grad((o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum(), (q, k, slope))
    assert relative_error(slope_gradient(q, k, dq.float(), dk.float(), None, None, None), ds) < 1e-4
    assert relative_error(slope_gradient(q, k, dq.bfloat16(), dk.bfloat16(), None, None, None), ds) > 1e-2


@pytest.mark.gpu
@pytest.mark.gpu_memory
@pytest.mark.parametrize("T", [8192, 65536])
def test_slope_gradient_at_long_lengths_on_gpu(T, triton_backend):
    """bf16 on the GPU at long T with the TNL slopes of a last layer (the weakest decays): against a float64 chunked
    reference (the quadratic one does not fit at 64K)."""
    g = torch.Generator(device="cuda").manual_seed(4)
    B, H, K = 1, 8, 128
    q, k, v = (torch.randn(B, T, H, K, device="cuda", generator=g).bfloat16().requires_grad_() for _ in range(3))
    do = torch.randn(B, T, H, K, device="cuda", generator=g).bfloat16()
    slope = la.tnl_slopes(H, 23, 24).cuda().requires_grad_()
    o, _ = la.lightning_attn(q, k, v, slope, scale=K**-0.5)
    (got,) = torch.autograd.grad((o.float() * do.float()).sum(), [slope])
    s64 = slope.detach().double().requires_grad_()
    o64, _ = naive.chunk_lightning_attn(*(x.detach().double() for x in (q, k, v)), s64, scale=K**-0.5, chunk_size=256)
    (ref,) = torch.autograd.grad((o64 * do.double()).sum(), [s64])
    assert relative_error(got, ref) <= 1e-4, (got, ref)
