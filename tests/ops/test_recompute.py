"""Recompute-heavy backward (Lightning-3) against gradients of the float64 reference.

``recompute_backward`` is called directly with random ``do`` and ``dht`` and compared with autograd through
:func:`lightning_attention.ops.lightning.naive.chunk_lightning_attn` run in float64 on the same (rounded) inputs,
loss ``(o·do).sum() + (final_state·dht).sum()``. Without CUDA the Triton kernels run under the interpreter (tests/
conftest.py), where the package's ``torch.empty`` outputs are NaN-poisoned: an element a kernel forgets to write
fails the finiteness check of ``assert_close``.
"""

import pytest
import torch

from lightning_attention.ops.lightning import (
    naive,
    ops,  # noqa: F401 - registers lightning_attention::recompute_bwd
)
from lightning_attention.ops.lightning.recompute import recompute_backward
from lightning_attention.utils.testing import assert_close

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# decay recipes for H heads: none (Lightning-1), weak (TNL-like), strong (λ^32 underflows in fp32), mixed
# (a zero slope next to strong ones, all through the decayed kernel path)
DECAYS = {
    "none": None,
    "weak": lambda H: torch.full((H,), 0.01),
    "strong": lambda H: torch.full((H,), 4.0),
    "mixed": lambda H: torch.tensor([0.0, 0.05, 0.7, 8.0][:H] + [0.3] * max(0, H - 4)),
}


def _slope(decay: str, H: int):
    make = DECAYS[decay]
    return None if make is None else make(H).to(DEVICE, torch.float32)


def _reference_grads(q, k, v, do, dht, slope, scale, h0, cu_seqlens):
    """float64 autograd gradients (dq, dk, dv, dh0 or None) of the loss through the chunked reference."""
    qd, kd, vd = (x.detach().double().requires_grad_() for x in (q, k, v))
    h0d = None if h0 is None else h0.detach().double().requires_grad_()
    o, ht = naive.chunk_lightning_attn(
        qd, kd, vd, slope, scale=scale, initial_state=h0d, cu_seqlens=None if cu_seqlens is None else cu_seqlens.cpu()
    )
    loss = (o * do.double()).sum()
    if dht is not None:
        loss = loss + (ht * dht.double()).sum()
    inputs = [qd, kd, vd] + ([h0d] if h0d is not None else [])
    grads = torch.autograd.grad(loss, inputs, allow_unused=True)
    grads = [torch.zeros_like(x) if g is None else g for x, g in zip(inputs, grads)]
    return (*grads[:3], grads[3] if h0 is not None else None)


def _inputs(B, T, H, K, V, dtype, *, N=None, h0=False, dht=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    N = B if N is None else N

    def randn(*shape, dt=dtype):
        return torch.randn(*shape, generator=gen).to(DEVICE, dt)

    q, k = randn(B, T, H, K), randn(B, T, H, K)
    v, do = randn(B, T, H, V), randn(B, T, H, V)
    h0 = randn(N, H, K, V, dt=torch.float32) if h0 else None
    dht = randn(N, H, K, V, dt=torch.float32) if dht else None
    return q, k, v, do, h0, dht


def _check(q, k, v, do, h0, dht, slope, scale, cu_seqlens=None, tol=None):
    tol = q.dtype if tol is None else tol
    dq, dk, dv, dh0 = recompute_backward(
        q, k, v, do, dht, slope, scale=scale, initial_state=h0, cu_seqlens=cu_seqlens, cu_seqlens_cpu=None
    )
    ref = _reference_grads(q, k, v, do, dht, slope, scale, h0, cu_seqlens)
    for name, got in (("dq", dq), ("dk", dk), ("dv", dv)):
        assert got.dtype == q.dtype, f"{name} dtype {got.dtype} != {q.dtype}"
    assert_close("dq", dq, ref[0], tol)
    assert_close("dk", dk, ref[1], tol)
    assert_close("dv", dv, ref[2], tol)
    if h0 is None:
        assert dh0 is None
    else:
        assert dh0.dtype == torch.float32 and dh0.shape == h0.shape
        assert_close("dh0", dh0, ref[3], tol)


# (B, T, H, K, V, dtype, decay, scale, h0, dht): curated, one concern per line
CASES = [
    pytest.param(2, 1, 2, 16, 16, torch.float32, "none", 1.0, False, False, id="T1-K16-none"),
    pytest.param(1, 63, 2, 48, 16, torch.float32, "weak", 0.5, True, True, id="T63-K48-V16-weak-scale-h0-dht"),
    pytest.param(2, 100, 2, 64, 64, torch.float32, "strong", 1.0, True, False, id="T100-K64-strong-h0"),
    pytest.param(1, 200, 4, 100, 48, torch.float32, "mixed", 0.125, False, True, id="T200-K100-V48-mixed-dht"),
    pytest.param(1, 100, 2, 16, 100, torch.float32, "none", 2.0, True, True, id="T100-K16-V100-none-h0-dht"),
    pytest.param(1, 70, 2, 128, 128, torch.float32, "weak", 1.0, True, True, id="T70-K128-weak-h0-dht"),
    pytest.param(1, 33, 1, 256, 256, torch.float32, "mixed", 1.0, True, True, id="T33-K256-V256-h0-dht"),
    pytest.param(1, 100, 2, 64, 48, torch.float16, "weak", 0.5, True, True, id="fp16-T100-K64-V48-weak"),
    pytest.param(1, 63, 2, 128, 64, torch.float16, "none", 1.0, False, True, id="fp16-T63-K128-V64-none"),
    pytest.param(1, 100, 2, 64, 64, torch.bfloat16, "mixed", 1.0, True, True, id="bf16-T100-K64-mixed"),
    pytest.param(1, 63, 2, 48, 128, torch.bfloat16, "none", 0.25, True, False, id="bf16-T63-K48-V128-none"),
]


@pytest.mark.parametrize("B, T, H, K, V, dtype, decay, scale, use_h0, use_dht", CASES)
def test_recompute_backward_matches_fp64_reference(B, T, H, K, V, dtype, decay, scale, use_h0, use_dht):
    q, k, v, do, h0, dht = _inputs(B, T, H, K, V, dtype, h0=use_h0, dht=use_dht)
    _check(q, k, v, do, h0, dht, _slope(decay, H), scale)


@pytest.mark.parametrize(
    "lengths, dtype, decay",
    [
        pytest.param([0, 1, 15, 40], torch.float32, "mixed", id="fp32-0-1-15-40-mixed"),
        pytest.param([15, 0, 33, 1, 0], torch.float32, "none", id="fp32-15-0-33-1-0-none"),
        pytest.param([1, 15, 0, 64], torch.bfloat16, "weak", id="bf16-1-15-0-64-weak"),
    ],
)
def test_recompute_backward_varlen(lengths, dtype, decay):
    """Packed sequences: each starts from its own h0 and its dh0 comes only from its own tokens (or dht alone for a
    zero-length sequence); tokens of one sequence never leak into another's gradients."""
    H, K, V = 2, 32, 48
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=DEVICE)
    q, k, v, do, h0, dht = _inputs(1, int(cu[-1]), H, K, V, dtype, N=len(lengths), h0=True, dht=True)
    _check(q, k, v, do, h0, dht, _slope(decay, H), 0.75, cu_seqlens=cu)


def test_recompute_backward_strided_views():
    """q, k, v sliced from one fused projection and a do with unusual strides are read in place, not copied."""
    B, T, H, K, V = 2, 50, 2, 32, 48
    gen = torch.Generator().manual_seed(3)
    fused = torch.randn(B, T, H, 2 * K + V + 8, generator=gen).to(DEVICE)
    q, k, v = fused[..., :K], fused[..., K : 2 * K], fused[..., 2 * K : 2 * K + V]
    do = torch.randn(B, H, T, V, generator=gen).to(DEVICE).transpose(1, 2)  # [B, T, H, V], stride(1) != H*V
    h0 = torch.randn(B, H, K, V, generator=gen).to(DEVICE)
    assert not q.is_contiguous() and not do.is_contiguous()
    _check(q, k, v, do, h0, None, _slope("weak", H), 1.0)


def test_recompute_backward_expanded_do():
    """The gradient of ``o.sum()`` arrives as an expanded tensor (all strides 0); it must be read correctly."""
    B, T, H, K, V = 1, 40, 2, 16, 32
    q, k, v, _, h0, dht = _inputs(B, T, H, K, V, torch.float32, h0=True, dht=True)
    do = torch.ones(1, 1, 1, 1, device=DEVICE).expand(B, T, H, V)
    _check(q, k, v, do, h0, dht, _slope("mixed", H), 1.0)


def test_recompute_backward_empty_sequence_returns_dht_as_dh0():
    """T == 0: no token, final_state = h0, so dh0 = dht (a copy) and dq, dk, dv are empty."""
    H, K, V = 2, 16, 32
    q, k, v, do, h0, dht = _inputs(1, 0, H, K, V, torch.float32, N=2, h0=True, dht=True)
    cu = torch.tensor([0, 0, 0], dtype=torch.int64, device=DEVICE)
    dq, dk, dv, dh0 = recompute_backward(
        q, k, v, do, dht, None, scale=1.0, initial_state=h0, cu_seqlens=cu, cu_seqlens_cpu=None
    )
    assert dq.shape == (1, 0, H, K) and dk.shape == (1, 0, H, K) and dv.shape == (1, 0, H, V)
    torch.testing.assert_close(dh0, dht, rtol=0, atol=0)
    assert dh0.data_ptr() != dht.data_ptr()


def test_recompute_backward_gradcheck_fp64():
    """fp64 (interpreter): the kernels are the exact derivative of the forward, checked by finite differences
    through an autograd.Function whose forward is the reference and whose backward is the recompute path."""
    if torch.cuda.is_available():
        pytest.skip("float64 kernels run only under the Triton interpreter (fp64 tensor-core dots do not exist)")
    slope = torch.tensor([0.0, 0.4], dtype=torch.float64)
    cu = torch.tensor([0, 5, 5, 21], dtype=torch.int64)

    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, h0):
            ctx.save_for_backward(q, k, v, h0)
            return naive.chunk_lightning_attn(q, k, v, slope, scale=0.5, initial_state=h0, cu_seqlens=cu, chunk_size=8)

        @staticmethod
        def backward(ctx, do, dht):
            q, k, v, h0 = ctx.saved_tensors
            return recompute_backward(
                q, k, v, do, dht, slope, scale=0.5, initial_state=h0, cu_seqlens=cu, cu_seqlens_cpu=None
            )

    gen = torch.Generator().manual_seed(5)
    args = [torch.randn(*s, generator=gen, dtype=torch.float64, requires_grad=True) for s in
            [(1, 21, 2, 16), (1, 21, 2, 16), (1, 21, 2, 16), (3, 2, 16, 16)]]  # fmt: skip
    assert torch.autograd.gradcheck(Fn.apply, args, fast_mode=True)


def test_recompute_bwd_custom_op_opcheck():
    """The ``lightning_attention::recompute_bwd`` op: schema, fake implementation and aot_autograd agree."""
    B, T, H, K, V = 1, 20, 2, 16, 16
    q, k, v, do, h0, dht = _inputs(B, T, H, K, V, torch.float32, h0=True, dht=True)
    slope = _slope("weak", H)
    torch.library.opcheck(torch.ops.lightning_attention.recompute_bwd, (q, k, v, do, dht, slope, h0, None, None, 1.0))
    dq, _, _, dh0 = torch.ops.lightning_attention.recompute_bwd(q, k, v, do, None, None, None, None, None, 1.0)
    assert dh0.shape == (0,)
    ref = _reference_grads(q, k, v, do, None, None, 1.0, None, None)
    assert_close("dq", dq, ref[0], q.dtype)


def test_lightning_attn_backward_recompute_end_to_end(monkeypatch, configure):
    """``lightning_attn(..., backward="recompute")`` runs this backward and matches the float64 reference."""
    import lightning_attention as la
    from lightning_attention.ops.lightning import recompute

    configure(backend="triton")
    calls = []
    original = recompute.recompute_config
    monkeypatch.setattr(recompute, "recompute_config", lambda *a: calls.append(a) or original(*a))

    B, T, H, K, V = 1, 90, 2, 32, 48
    q, k, v, do, h0, dht = _inputs(B, T, H, K, V, torch.float32, h0=True, dht=True)
    slope = _slope("mixed", H)
    leaves = [x.clone().requires_grad_() for x in (q, k, v, h0)]
    o, ht = la.lightning_attn(
        *leaves[:3], slope, scale=0.5, initial_state=leaves[3], output_final_state=True, backward="recompute"
    )
    ((o * do).sum() + (ht * dht).sum()).backward()
    assert calls, "backward='recompute' did not reach recompute_backward"
    ref = _reference_grads(q, k, v, do, dht, slope, 0.5, h0, None)
    for name, leaf, r in zip(("dq", "dk", "dv", "dh0"), leaves, ref):
        assert_close(name, leaf.grad, r, torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "B, T, H, D, dtype, decay",
    [
        pytest.param(2, 4096, 4, 128, torch.bfloat16, "weak", id="bf16-T4096-D128-weak"),
        pytest.param(1, 8191, 2, 128, torch.bfloat16, "none", id="bf16-T8191-D128-none"),
        pytest.param(2, 2048, 2, 256, torch.float16, "mixed", id="fp16-T2048-D256-mixed"),
        pytest.param(1, 3000, 2, 64, torch.float32, "strong", id="fp32-T3000-D64-strong"),
    ],
)
def test_recompute_backward_gpu_sizes(B, T, H, D, dtype, decay):
    """Compiled kernels at real sizes (tf32 / bf16 tensor cores on the GPU) against the float64 reference."""
    q, k, v, do, h0, dht = _inputs(B, T, H, D, D, dtype, h0=True, dht=True)
    k = k * D**-0.5  # keep the state O(1) per entry over thousands of tokens without decay
    _check(q, k, v, do, h0, dht, _slope(decay, H), 1.0)


@pytest.mark.gpu
@pytest.mark.gpu_memory
def test_recompute_backward_gpu_many_sequence_heads():
    """N·H = 65,600 programs per role: more than grid axis 1 allows (65,535), so N·H must be on axis 0."""
    q, k, v, do, h0, dht = _inputs(4100, 3, 16, 16, 16, torch.float32, h0=True, dht=True)
    _check(q, k, v, do, h0, dht, _slope("weak", 16), 1.0)
