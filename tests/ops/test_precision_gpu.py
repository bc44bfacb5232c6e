"""Precision of the compiled kernels on a GPU (``pytest -m gpu``; skipped without CUDA), docs/design.md, "Precision".

1. A peer's test matrix: vLLM's lightning-attention tests, adapted to this API. Prefill through
   ``lightning_attn_func`` with unscaled q, k, v ~ N(0, 1) in ``[B, H, N, D]``, a decay ``ed ~ U(0, 1)`` per head,
   against a float32 quadratic reference with weights exp(-ed·(i-j)); the same from an fp32 initial state; one-token
   decode into a slot-indexed fp32 pool. Each element within ``rtol = atol = 1e-2``.
2. Real sizes: relative L2 error of o, dq, dk, dv within 1.1× the rounding floor (the float64 result rounded to the
   inputs' dtype) under the split precision, on the walk and the segmented path.
"""

import itertools

import pytest
import torch

import lightning_attention as la
from lightning_attention.ops.lightning import naive
from lightning_attention.utils.testing import error_over_rounding_floor

pytestmark = pytest.mark.gpu

PREFILL = [
    pytest.param(B, H, D, N, dtype, id=f"B{B}-H{H}-D{D}-N{N}-{str(dtype)[6:]}")
    for B, H, D, N, dtype in itertools.product((1, 2), (4, 8), (64, 128), (16, 128), (torch.float16, torch.bfloat16))
]


def _prefill_inputs(B, H, D, N, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", generator=g).to(dtype) for _ in range(3))
    ed = torch.rand(H, device="cuda", generator=g)
    h0 = torch.randn(B, H, D, D, device="cuda", generator=g)
    return q, k, v, ed, h0


def _prefill_reference(q, k, v, ed, h0=None):
    """float32 o [B, H, N, D]: Σ_{j<=i} exp(-ed (i-j)) (q_i·k_j) v_j (+ exp(-ed (i+1)) q_i h0), by the library's
    quadratic reference on the inputs in float32."""
    o, _ = naive.quadratic_lightning_attn(*(x.float().transpose(1, 2) for x in (q, k, v)), ed, initial_state=h0)
    return o.transpose(1, 2)


@pytest.mark.parametrize("B, H, D, N, dtype", PREFILL)
def test_peer_matrix_prefill_split_precision(B, H, D, N, dtype, configure):
    configure(backend="triton", precision="split")
    q, k, v, ed, h0 = _prefill_inputs(B, H, D, N, dtype)
    o = la.lightning_attn_func(q, k, v, ed.reshape(H, 1, 1))
    torch.testing.assert_close(o.float(), _prefill_reference(q, k, v, ed), rtol=1e-2, atol=1e-2)
    o, _ = la.lightning_attn(*(x.transpose(1, 2) for x in (q, k, v)), ed, initial_state=h0)
    torch.testing.assert_close(o.transpose(1, 2).float(), _prefill_reference(q, k, v, ed, h0), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("B, H, D, N, dtype", PREFILL)
def test_peer_matrix_prefill_default_precision_error(B, H, D, N, dtype, configure):
    """The default precision rounds the scores and the state to the input dtype once: its relative L2 error stays
    within 1.6× the rounding floor (about 1.4× measured; the split precision is the one at the floor)."""
    configure(backend="triton")
    q, k, v, ed, h0 = _prefill_inputs(B, H, D, N, dtype)
    for initial in (None, h0):
        o, _ = la.lightning_attn(*(x.transpose(1, 2) for x in (q, k, v)), ed, initial_state=initial)
        ref = _prefill_reference(q, k, v, ed, initial).double()
        assert error_over_rounding_floor(o.transpose(1, 2), ref, dtype) <= 1.6


DECODE = [
    pytest.param(B, D, dtype, id=f"B{B}-D{D}-{str(dtype)[6:]}")
    for B, D, dtype in itertools.product((1, 2), (64, 128), (torch.float16, torch.float32, torch.bfloat16))
]


def _decode_check(B, H, D, dtype, slots, pool_size):
    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(B, H, D, device="cuda", generator=g).to(dtype) for _ in range(3))
    ed = torch.rand(H, device="cuda", generator=g)
    pool = torch.randn(pool_size, H, D, D, device="cuda", generator=g)
    before = pool.clone()
    idx = torch.tensor(slots, device="cuda")
    o = la.lightning_attn_decode(q, k, v, pool, ed, state_indices=idx)
    for b, slot in enumerate(slots):
        if slot < 0:  # a padding slot: zeros out, no row touched
            assert (o[b] == 0).all()
            continue
        s = torch.exp(-ed)[:, None, None] * before[slot] + k[b].float()[:, :, None] * v[b].float()[:, None, :]
        ref = (q[b].float()[:, None, :] @ s)[:, 0]
        torch.testing.assert_close(o[b].float(), ref, rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(pool[slot], s, rtol=1e-2, atol=1e-2)
    untouched = sorted(set(range(pool_size)) - {s for s in slots if s >= 0})
    assert torch.equal(pool[untouched], before[untouched])


@pytest.mark.parametrize("B, D, dtype", DECODE)
def test_peer_matrix_decode_into_a_slot_pool(B, D, dtype, triton_backend):
    _decode_check(B, 8, D, dtype, slots=list(range(B)), pool_size=B + 2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.bfloat16], ids=str)
def test_peer_matrix_decode_with_a_padding_slot(dtype, triton_backend):
    _decode_check(4, 8, 128, dtype, slots=[0, 1, -1, 2], pool_size=5)


REAL = [
    pytest.param(2, 4096, 8, 64, torch.bfloat16, None, id="bf16-K64"),
    pytest.param(2, 4096, 8, 128, torch.bfloat16, None, id="bf16-K128"),
    pytest.param(2, 2048, 4, 256, torch.bfloat16, None, id="bf16-K256"),
    pytest.param(2, 4096, 8, 128, torch.float16, None, id="fp16-K128"),
    pytest.param(1, 32768, 4, 128, torch.bfloat16, 4096, id="bf16-K128-segments"),
]


@pytest.mark.parametrize("B, T, H, K, dtype, seg", REAL)
def test_split_precision_at_the_rounding_floor_on_real_sizes(B, T, H, K, dtype, seg, configure):
    """o and every gradient within 1.1× the rounding floor, TNL slopes, unscaled N(0, 1) inputs as the benchmark's
    accuracy column uses them."""
    configure(backend="triton", precision="split", segment_len=seg)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, T, H, K, device="cuda", generator=g).to(dtype).requires_grad_() for _ in range(3))
    do = torch.randn(B, T, H, K, device="cuda", generator=g).to(dtype)
    slope = la.tnl_slopes(H, 0, 1).cuda()
    o, _ = la.lightning_attn(q, k, v, slope)
    got = (o, *torch.autograd.grad(o, (q, k, v), do))
    x64 = [x.detach().double().requires_grad_() for x in (q, k, v)]
    o64, _ = naive.chunk_lightning_attn(*x64, slope.double(), chunk_size=256)
    ref = (o64, *torch.autograd.grad(o64, x64, do.double()))
    for name, a, b in zip(("o", "dq", "dk", "dv"), got, ref):
        ratio = error_over_rounding_floor(a, b, dtype)
        assert ratio <= 1.1, f"{name}: {ratio:.3f}× the rounding floor"


@pytest.mark.parametrize(
    "T, segment_len, piece_len", [(1000, 0, 0), (2000, 1024, 256)], ids=["ragged", "segments-in-pieces"]
)
def test_split_precision_through_the_two_warpgroup_walk(T, segment_len, piece_len, configure):
    """bf16, K = V = 128 on sm_90 with a grid that fills the GPU: the split precision runs the two-warpgroup walk
    and pre-pass (kernels/walk_ws.py splits its own operands at K = 128). o and every gradient within 1.1× the
    rounding floor, the final state and dh0 within the bf16 tolerance, whole and in segments on pre-pass pieces;
    the same values as the Triton walk's split up to the order of the float32 sums."""
    from lightning_attention.ops.lightning import launches, plan
    from lightning_attention.ops.lightning.device import device_info
    from lightning_attention.utils.testing import assert_close
    from tests.ops.test_chunk_gpu import _fwd_bwd, _inputs, _reference

    if device_info(torch.device("cuda")).capability != 90 or not plan._walk_ws_available():
        pytest.skip("the two-warpgroup walk needs an sm_90 GPU and a Triton with Gluon")
    configure(backend="triton", precision="split", segment_len=segment_len, prepass_len=piece_len or None)
    B, H, K = 8, 16, 128  # 128 (head, sequence) pairs: more than half an H100's SMs, so the walk takes them
    inputs = _inputs(B, T, H, K, K, torch.bfloat16)
    slope = la.tnl_slopes(H, 0, 1).cuda()
    launches._WALK_WS.reset()
    launches._STATE_WS.reset()
    got = _fwd_bwd(*inputs, slope)
    assert launches._WALK_WS.entries, "the two-warpgroup walk did not run"
    assert bool(launches._STATE_WS.entries) == bool(segment_len), "the two-warpgroup pre-pass ran or did not"
    names = ("o", "final_state", "dq", "dk", "dv", "dh0")
    for name, a, b in zip(names, got, _reference(*inputs, slope)):
        if a.dtype == torch.bfloat16:
            ratio = error_over_rounding_floor(a, b, torch.bfloat16)
            assert ratio <= 1.1, f"{name}: {ratio:.3f}× the rounding floor"
        else:  # the fp32 states have no bf16 rounding to compare with
            assert_close(name, a, b, torch.bfloat16)
    configure(gluon=False)
    triton_walk = _fwd_bwd(*inputs, slope)
    for name, a, b in zip(names, got, triton_walk):
        diff = ((a.double() - b.double()).norm() / b.double().norm()).item()
        assert diff < 5e-3, (name, diff)
