"""The ``precision`` setting (docs/design.md, "Precision"): with ``split`` the chunk walks carry their fp32 operands
(intra-chunk scores, state, decayed values) as two halves in the input dtype, and 16-bit results reach the rounding
floor, the float64 result rounded to the output dtype; with ``input`` (the default) they round them once. float32
inputs run every product as three tf32 products under either setting, as accurate as exact float32 products.

Runs on CPU under the interpreter (float16, and bfloat16 through the test suite's interpreter shims), and compiled
where pytest runs on a GPU; tests/ops/test_precision_gpu.py holds the GPU-only checks at real sizes.
"""

import pytest
import torch

import lightning_attention as la
from lightning_attention import settings
from lightning_attention.ops.lightning import naive
from lightning_attention.utils.testing import error_over_rounding_floor, relative_error
from tests.ops.test_chunk import CASES, check_case

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
HALF_CASES = [c for c in CASES if c.dtype in (torch.float16, torch.bfloat16)]


@pytest.mark.parametrize("case", HALF_CASES, ids=lambda c: c.id)
def test_split_precision_matches_float64(case, triton_backend):
    """Every 16-bit case of the chunk tests (segments, pre-pass pieces, strided inputs, no decay) under the split
    precision: forward, final state and every gradient against float64."""
    triton_backend(precision="split")
    check_case(case, triton_backend)


def _errors_over_floor(dtype, K, precision, configure, seg=None):
    """max over (o, dq, dk, dv) of relative L2 error ÷ that of the float64 result rounded to ``dtype``."""
    configure(precision=precision, segment_len=seg)
    g = torch.Generator().manual_seed(0)
    B, T, H = 1, 200, 2
    q, k, v = (
        (torch.randn(B, T, H, K, generator=g) * K**-0.25).to(DEVICE, dtype).requires_grad_() for _ in range(3)
    )
    do = torch.randn(B, T, H, K, generator=g).to(DEVICE, dtype)
    slope = torch.tensor([0.02, 0.3], device=DEVICE)  # weak and strong decay: the state and the scores both matter
    o, _ = la.lightning_attn(q, k, v, slope)
    got = (o, *torch.autograd.grad(o, (q, k, v), do))
    x64 = [x.detach().double().requires_grad_() for x in (q, k, v)]
    o64, _ = naive.quadratic_lightning_attn(*x64, slope)
    ref = (o64, *torch.autograd.grad(o64, x64, do.double()))
    return max(error_over_rounding_floor(a, b, dtype) for a, b in zip(got, ref))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("K, seg", [(64, None), (32, 64)], ids=["K64", "K32-segments"])
def test_split_precision_reaches_the_rounding_floor(dtype, K, seg, triton_backend):
    """Split: within 1.1× the rounding floor on o, dq, dk, dv (the unsegmented walk, and segments with their
    pre-pass and scan). The default precision rounds the scores, state and decayed values once and lands well above
    it, which is what makes the comparison a test of the split path."""
    split = _errors_over_floor(dtype, K, "split", triton_backend, seg)
    default = _errors_over_floor(dtype, K, "input", triton_backend, seg)
    assert split <= 1.1, f"split precision: {split:.3f}× the rounding floor"
    assert default > 1.2, f"default precision: {default:.3f}× the rounding floor (expected above the split's)"


def test_split_precision_rules_out_the_kernels_without_split_products():
    """The fused dk/dv walk, and the two-warpgroup walk at K = 256 (whose split operands would not fit its shared
    memory), have no split products: under the split precision the plan runs the Triton walks even where its settings
    or the shape would pick those. At K = 128 the two-warpgroup walk splits its operands itself."""
    from lightning_attention.ops.lightning import plan
    from lightning_attention.ops.lightning.plan import precisions, use_fused_dkdv, walk_ws_shape
    from tests.ops.test_plan import problem

    assert use_fused_dkdv(problem(fused_dkdv=True), 64, 64)
    assert not use_fused_dkdv(problem(fused_dkdv=True, precision="split"), 64, 64)
    assert not walk_ws_shape(problem(K=256, V=256, precision="split"), 256, 256)
    if plan._walk_ws_available():  # a Triton with the Gluon the two-warpgroup walk was checked with
        assert walk_ws_shape(problem(K=128, V=128, precision="split"), 128, 128)
    split = settings.Settings(precision="split")
    assert precisions(torch.bfloat16, split) == (None, "split", True)
    assert precisions(torch.float16, split) == (None, "bf16x3", True)  # the state is never rounded to fp16
    assert precisions(torch.float32, split) == ("tf32x3", "tf32x3", False)  # already at float32's accuracy


@pytest.mark.parametrize("precision", ["input", "split"])
def test_float32_products_are_three_tf32_products_and_float64_stays_exact(precision):
    from lightning_attention.ops.lightning.plan import FP32_PRECISION, precisions

    chosen = settings.Settings(precision=precision)
    assert FP32_PRECISION == "tf32x3"
    assert precisions(torch.float32, chosen) == (FP32_PRECISION, FP32_PRECISION, False)
    assert precisions(torch.float64, chosen) == ("ieee", "ieee", False)


@pytest.mark.parametrize("K", [64, 128])
def test_float32_walks_are_as_accurate_as_exact_float32_products(K, triton_backend):
    """fp32 inputs run every product as three tf32 products (the interpreter computes them as the GPU does, through
    the test suite's shim in tests/interpreter/tf32.py). Their error against float64 stays within 1.25× that of the
    PyTorch quadratic form in float32 with exact products, on o, dq, dk and dv; one tf32 product per product would
    land three orders of magnitude above it."""
    triton_backend()
    g = torch.Generator().manual_seed(0)
    B, T, H = 1, 200, 2
    q, k, v = ((torch.randn(B, T, H, K, generator=g) * K**-0.25).to(DEVICE).requires_grad_() for _ in range(3))
    do = torch.randn(B, T, H, K, generator=g).to(DEVICE)
    slope = torch.tensor([0.02, 0.3], device=DEVICE)

    def outputs(attention, leaves):
        o, _ = attention(*leaves, slope)
        return (o, *torch.autograd.grad(o, leaves, do.to(o.dtype)))

    fresh = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    got = outputs(la.lightning_attn, fresh)
    exact32 = outputs(naive.quadratic_lightning_attn, [x.detach().clone().requires_grad_() for x in (q, k, v)])
    ref = outputs(naive.quadratic_lightning_attn, [x.detach().double().requires_grad_() for x in (q, k, v)])
    for name, a, b, r in zip(("o", "dq", "dk", "dv"), got, exact32, ref):
        assert relative_error(a, r) <= 1.25 * relative_error(b, r), (name, relative_error(a, r), relative_error(b, r))


def test_precision_setting_is_validated():
    with pytest.raises(ValueError, match="PRECISION"):
        settings.Settings(precision="tf32")
    assert settings.from_environment({"LIGHTNING_ATTENTION_PRECISION": " Split "}).precision == "split"
