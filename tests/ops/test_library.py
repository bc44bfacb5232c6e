"""``torch.library`` integration of the Triton path: opcheck of both ops and ``torch.compile(fullgraph=True)``.

Runs the kernels under the interpreter on CPU (tests/conftest.py) or compiled on a GPU.
"""

import pytest
import torch

import lightning_attention as la
from lightning_attention.ops.lightning import ops, plan  # ops registers lightning_attention::chunk_fwd, chunk_bwd
from lightning_attention.utils.testing import assert_close

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def _triton(triton_backend):
    return triton_backend


def _tensors(T=40, H=2, K=16, V=32, N=1, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(1, T, H, K, generator=g).to(DEVICE, dtype) for _ in range(2))
    v = torch.randn(1, T, H, V, generator=g).to(DEVICE, dtype)
    h0 = torch.randn(N, H, K, V, generator=g).to(DEVICE)
    slope = torch.tensor([0.1, 1.0], device=DEVICE)
    return q, k, v, h0, slope


OPCHECK_TESTS = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")


@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
def test_opcheck_forward_op(varlen):
    q, k, v, h0, slope = _tensors(N=3 if varlen else 1)
    cu = torch.tensor([0, 7, 7, 40], dtype=torch.int32, device=DEVICE) if varlen else None
    torch.library.opcheck(
        torch.ops.lightning_attention.chunk_fwd.default,
        (q, k, v, slope, h0, cu, None, 0.5, True),
        test_utils=OPCHECK_TESTS,
    )


def test_opcheck_backward_op():
    q, k, v, h0, slope = _tensors()
    do = torch.randn_like(v)
    dht = torch.randn_like(h0)
    torch.library.opcheck(
        torch.ops.lightning_attention.chunk_bwd.default,
        (q, k, v, do, dht, slope, h0, None, None, 0.5),
        test_utils=OPCHECK_TESTS,
    )


def test_opcheck_segmented_forward_and_backward_with_saved_states(configure):
    """A segmented plan: the forward op's third output (the segment states, shaped by the fake from the plan) and
    the backward op taking them back."""
    configure(segment_len=16)
    q, k, v, h0, slope = _tensors()
    fwd_args = (q, k, v, slope, h0, None, None, 0.5, True)
    torch.library.opcheck(torch.ops.lightning_attention.chunk_fwd.default, fwd_args, test_utils=OPCHECK_TESTS)
    _, _, seg_states = torch.ops.lightning_attention.chunk_fwd(*fwd_args)
    assert seg_states.shape == (3, 2, q.shape[-1], v.shape[-1])  # T = 40 in segments of 16
    do, dht = torch.randn_like(v), torch.randn_like(h0)
    bwd_args = (q, k, v, do, dht, slope, h0, None, None, 0.5, 0)
    torch.library.opcheck(
        torch.ops.lightning_attention.chunk_bwd.default, (*bwd_args, seg_states), test_utils=OPCHECK_TESTS
    )
    with_states = torch.ops.lightning_attention.chunk_bwd(*bwd_args, seg_states)
    recomputed = torch.ops.lightning_attention.chunk_bwd(*bwd_args, None)
    for a, b in zip(with_states, recomputed):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_opcheck_autograd_registration():
    """The ops are called under the autograd.Function: with inputs that require grad, opcheck checks that autograd
    does not silently drop the gradient."""
    q, k, v, h0, slope = _tensors()
    args = [x.requires_grad_() for x in (q, k, v)]
    torch.library.opcheck(
        torch.ops.lightning_attention.chunk_fwd.default,
        (*args, slope, h0, None, None, 1.0, False),
        test_utils=("test_schema", "test_faketensor"),
    )


def test_torch_compile_fullgraph_forward_and_backward():
    q, k, v, h0, slope = _tensors()
    for x in (q, k, v, h0):
        x.requires_grad_()

    def layer(q, k, v, h0):
        o, ht = la.lightning_attn(q * 2.0, k, v, slope, scale=0.5, initial_state=h0, output_final_state=True)
        return o.sin().sum() + ht.square().sum()

    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    loss = compiled(q, k, v, h0)
    grads = torch.autograd.grad(loss, (q, k, v, h0))
    loss_ref = layer(q, k, v, h0)
    grads_ref = torch.autograd.grad(loss_ref, (q, k, v, h0))
    assert_close("loss", loss, loss_ref.detach(), 1e-6)
    for name, a, b in zip(("dq", "dk", "dv", "dh0"), grads, grads_ref):
        assert_close(name, a, b, 1e-6)


def test_torch_compile_fullgraph_varlen_inductor():
    q, k, v, h0, slope = _tensors(N=3)
    cu = torch.tensor([0, 7, 7, 40], dtype=torch.int32, device=DEVICE)

    def fn(q, k, v):
        o, ht = la.lightning_attn(q, k, v, slope, initial_state=h0, output_final_state=True, cu_seqlens=cu)
        return o, ht

    o, ht = torch.compile(fn, fullgraph=True)(q, k, v)
    o_ref, ht_ref = fn(q, k, v)
    assert_close("o", o, o_ref, 1e-6)
    assert_close("final_state", ht, ht_ref, 1e-6)


def test_forward_fake_plans_segments_from_symbolic_cuda_sizes(monkeypatch):
    """The forward op's fake on CUDA tensors of symbolic size (torch.compile with dynamic shapes, op called directly):
    the segment plan is a search over ints, so the sizes specialise (guards) instead of failing to hash a SymInt.
    No GPU needed: a fake tensor that says it is on CUDA, on a device the plan takes for an H100."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    from lightning_attention.ops.lightning import device

    monkeypatch.setattr(ops, "device_info", lambda d: device.H100)
    shape_env = ShapeEnv()
    mode = FakeTensorMode(shape_env=shape_env)
    dynamic = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] * 2 + [DimDynamic.STATIC] * 2)
    real = torch.empty(2, 32768, 16, 128, dtype=torch.bfloat16, device="meta")  # made outside the mode: not fake yet
    with mode:
        meta = mode.from_tensor(real, symbolic_context=dynamic)
    q = FakeTensor(mode, meta, torch.device("cuda", 0))
    assert isinstance(q.shape[1], torch.SymInt)
    fake = ops.chunk_fwd.op._abstract_fn
    with mode:
        o, ht, states = fake(q, q, q, None, None, None, None, 1.0, False)
        _, _, no_states = fake(q, q, q, None, None, None, None, 1.0, False, 0, False)
    assert o.shape == q.shape and ht.shape == (0,)
    # the plan of these sizes on an H100: 2 sequences x 4 segments of 8K for the two-warpgroup walk (bf16 K = 128), 2 of
    # 16K for the Triton walk (with a Triton whose Gluon that walk was not checked with)
    segments = 8 if plan._walk_ws_available() else 4
    assert states.shape == (segments, 16, 128, 128)
    assert shape_env.guards  # ... specialised on them
    assert no_states.shape == (0,)  # save_states=False (what LightningAttnFunction passes while compiling)


def test_torch_compile_dynamic_lengths_on_segments(configure):
    """torch.compile(dynamic=True) over two lengths with the segmented path: the Function asks for no segment states
    while compiling (the backward recomputes them), so nothing specialises on T; values as in eager mode."""
    configure(segment_len=16)

    def layer(q, k, v):
        o, _ = la.lightning_attn(q, k, v, None, scale=0.5)
        return o.square().sum()

    compiled = torch.compile(layer, fullgraph=True, dynamic=True, backend="aot_eager")
    for T in (40, 56):
        q, k, v, _, _ = _tensors(T=T)
        for x in (q, k, v):
            x.requires_grad_()
        grads = torch.autograd.grad(compiled(q, k, v), (q, k, v))
        grads_ref = torch.autograd.grad(layer(q, k, v), (q, k, v))
        for name, a, b in zip(("dq", "dk", "dv"), grads, grads_ref):
            assert_close(name, a, b, 1e-6)
