"""Hybrid chunk attention and the inter-chunk term it is built on.

- lightning_attn_inter (PyTorch path and the Triton inter-only walk) vs a direct float64 formula;
- the two hybrid references agree; the fast op matches them forward and backward for T not a multiple of C;
- decoding token by token matches the float64 reference; the nn.Module trains its learned feature map;
- bad chunk_size / eps / feature maps raise ValueError.
"""

import os

import pytest
import torch

from lightning_attention.nn.hybrid_attention import HybridChunkAttention
from lightning_attention.ops import feature_naive
from lightning_attention.ops.hybrid import HybridDecodeState, hybrid_chunk_attn, hybrid_chunk_attn_decode
from lightning_attention.ops.lightning import naive
from lightning_attention.ops.lightning.inter import lightning_attn_inter, triton_supports_chunk_size
from lightning_attention.utils.testing import assert_close

F64 = torch.float64


def make_inputs(B, T, H, K, V, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, T, H, d, generator=g).to(dtype) for d in (K, K, V))


def mixed_slope(H):
    return torch.tensor([(0.0, 0.05, 0.5, 3.0)[h % 4] for h in range(H)])


def inter_reference(q, k, v, slope, chunk_size, scale, h0):
    """o_t = scale λ^(t-c0+1) q_t S_{c0-1}, with S_{c0-1} from the float64 recurrent reference on the prefix."""
    B, T, H, _ = q.shape
    lam = torch.exp(-slope.double()) if slope is not None else torch.ones(H, dtype=F64)
    out = torch.zeros(B, T, H, v.shape[-1], dtype=F64)
    for c0 in range(0, T, chunk_size):
        _, S = naive.recurrent_lightning_attn(q[:, :c0].double(), k[:, :c0].double(), v[:, :c0].double(),
                                              None if slope is None else slope.double(), initial_state=h0)
        for t in range(c0, min(c0 + chunk_size, T)):
            out[:, t] = scale * lam[None, :, None] ** (t - c0 + 1) * torch.einsum("bhk,bhkv->bhv", q[:, t].double(), S)
    return out


# (B, T, H, K, V, C, decay, h0, dtype, cu_seqlens)
INTER_CASES = [
    (2, 45, 4, 16, 24, 16, "mixed", True, torch.float32, None),
    (1, 64, 2, 32, 16, 64, "none", True, torch.float32, None),
    (1, 33, 2, 16, 16, 1, "mixed", False, torch.float32, None),
    (2, 50, 4, 16, 32, 16, "mixed", True, torch.bfloat16, None),
    (1, 40, 2, 16, 16, 8, "mixed", True, torch.float32, [0, 0, 1, 15, 40]),
]


def _inter_case_id(c):
    return f"T{c[1]}-C{c[5]}-{c[6]}-{str(c[8])[6:]}-{'varlen' if c[9] else 'dense'}"


def _check_inter(fn, case):
    B, T, H, K, V, C, decay, with_h0, dtype, cu = case
    q, k, v = make_inputs(B, T, H, K, V, dtype)
    slope = mixed_slope(H) if decay == "mixed" else None
    cu_t = None if cu is None else torch.tensor(cu)
    N = B if cu is None else len(cu) - 1
    h0 = torch.randn(N, H, K, V, generator=torch.Generator().manual_seed(3)) if with_h0 else None
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    o, ht = fn(*leaves, slope, chunk_size=C, scale=0.5, initial_state=h0, output_final_state=True, cu_seqlens=cu_t)
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(4))
    dht = torch.randn(ht.shape, generator=torch.Generator().manual_seed(6))
    ((o.float() * do).sum() + (ht * dht).sum()).backward()  # the final state is in the loss too
    if cu is None:
        o_ref = inter_reference(q, k, v, slope, C, 0.5, h0)
    else:  # every sequence restarts its chunks and its state
        o_ref = torch.cat([inter_reference(q[:, a:b], k[:, a:b], v[:, a:b], slope, C, 0.5,
                                           None if h0 is None else h0[n : n + 1].double())
                           for n, (a, b) in enumerate(zip(cu[:-1], cu[1:]))], dim=1)
    _, ht_ref = naive.recurrent_lightning_attn(q.double(), k.double(), v.double(),
                                               None if slope is None else slope.double(), initial_state=h0,
                                               cu_seqlens=cu_t)
    assert_close("o_inter", o, o_ref, dtype)
    assert_close("final_state", ht, ht_ref, dtype)
    # gradients: autograd of the float64 formula (output) and of the recurrent reference (final state)
    ref_leaves = [x.double().requires_grad_() for x in (q, k, v)]
    _, ht_r = naive.recurrent_lightning_attn(*ref_leaves, None if slope is None else slope.double(),
                                             initial_state=h0, cu_seqlens=cu_t)
    if cu is None:
        o_r = inter_reference_autograd(*ref_leaves, slope, C, 0.5, h0)
    else:
        o_r = torch.cat([inter_reference_autograd(*(x[:, a:b] for x in ref_leaves), slope, C, 0.5,
                                                  None if h0 is None else h0[n : n + 1].double())
                         for n, (a, b) in enumerate(zip(cu[:-1], cu[1:]))], dim=1)
    ((o_r * do.double()).sum() + (ht_r * dht.double()).sum()).backward()
    for name, a, b in zip(("dq", "dk", "dv"), leaves, ref_leaves):
        assert_close(name, a.grad, b.grad, dtype)


def inter_reference_autograd(q, k, v, slope, C, scale, h0):
    """Differentiable float64 inter term: masked quadratic form with M_ts = λ^(t-s) for c(s) < c(t)."""
    B, T, H, _ = q.shape
    s = torch.zeros(H, dtype=F64) if slope is None else slope.double()
    t = torch.arange(T)
    earlier = (t[:, None] // C) > (t[None, :] // C)
    dist = (t[:, None] - t[None, :]).double()
    M = torch.exp(torch.where(earlier, -s[:, None, None] * dist, torch.full_like(dist, float("-inf"))))
    o = torch.einsum("bhts,bshv->bthv", torch.einsum("bthk,bshk->bhts", q, k) * M, v)
    if h0 is not None:
        o = o + torch.einsum("bthk,bhkv->bthv", q * torch.exp(-s[None, :] * (t[:, None] + 1))[None, :, :, None],
                             h0.double())
    return scale * o


@pytest.mark.parametrize("case", INTER_CASES, ids=_inter_case_id)
def test_inter_torch_path(case, configure):
    configure(backend="torch")
    _check_inter(lightning_attn_inter, case)


@pytest.mark.parametrize("case", INTER_CASES[:2] + INTER_CASES[3:], ids=_inter_case_id)
def test_inter_triton_path(case, monkeypatch, configure):
    """The Triton inter-only mode through the dispatcher (under the interpreter on CPU); chunk sizes the kernel
    cannot walk (here 8) take the PyTorch path, and must still be right."""
    configure(backend="triton")
    assert os.environ.get("TRITON_INTERPRET") == "1" or torch.cuda.is_available()
    calls = []
    from lightning_attention.ops.lightning import ops
    original = ops.lightning_attn_inter_triton
    monkeypatch.setattr(ops, "lightning_attn_inter_triton", lambda *a, **kw: calls.append(1) or original(*a, **kw))
    _check_inter(lightning_attn_inter, case)
    assert bool(calls) == triton_supports_chunk_size(case[5])


def test_inter_plus_intra_is_lightning_attn():
    """Sanity of the definition: with C = 1 there is no intra part beyond the token itself."""
    q, k, v = make_inputs(1, 20, 2, 16, 16, F64)
    slope = mixed_slope(2).double()
    o_inter, _ = lightning_attn_inter(q, k, v, slope, chunk_size=1)
    o_full, _ = naive.quadratic_lightning_attn(q, k, v, slope)
    self_term = torch.einsum("bthk,bthk->bth", q, k)[..., None] * v
    assert_close("o", o_inter + self_term, o_full, 1e-12)


def test_inter_bad_chunk_size():
    q, k, v = make_inputs(1, 4, 1, 16, 16, torch.float32)
    for bad in (0, -3):
        with pytest.raises(ValueError, match="chunk_size"):
            lightning_attn_inter(q, k, v, chunk_size=bad)
    with pytest.raises(TypeError, match="chunk_size"):
        lightning_attn_inter(q, k, v, chunk_size=2.5)


# hybrid


@pytest.mark.parametrize("C", [1, 7, 16, 200])
def test_hybrid_references_agree(C):
    q, k, v = make_inputs(2, 45, 4, 16, 24, F64)
    slope = mixed_slope(4).double()
    a = feature_naive.recurrent_hybrid_chunk_attn(q, k, v, slope, chunk_size=C, feature_map="relu2", scale=0.5)
    b = feature_naive.quadratic_hybrid_chunk_attn(q, k, v, slope, chunk_size=C, feature_map="relu2", scale=0.5)
    assert_close("o", a, b, 1e-12)


# (B, T, H, K, V, C, decay, feature_map, dtype): T never a multiple of C except the first
HYBRID_CASES = [
    (2, 64, 2, 16, 16, 16, "none", "elu+1", torch.float32),
    (2, 77, 4, 32, 24, 16, "mixed", "relu2", torch.float32),
    (1, 50, 2, 16, 32, 64, "mixed", "elu+1", torch.float32),  # one ragged chunk: softmax only
    (2, 90, 4, 32, 32, 32, "mixed", "elu+1", torch.bfloat16),
    (2, 90, 4, 32, 32, 32, "mixed", "elu+1", torch.float16),
    (1, 40, 2, 16, 256, 16, "mixed", "elu+1", torch.float32),  # V = 256: separate normaliser call
]


@pytest.mark.parametrize("case", HYBRID_CASES, ids=lambda c: f"T{c[1]}-C{c[5]}-V{c[4]}-{c[6]}-{str(c[8])[6:]}")
def test_hybrid_matches_reference(case):
    B, T, H, K, V, C, decay, fm, dtype = case
    q, k, v = make_inputs(B, T, H, K, V, dtype)
    slope = mixed_slope(H) if decay == "mixed" else None
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    o = hybrid_chunk_attn(*leaves, slope, chunk_size=C, feature_map=fm)
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(5))
    (o.float() * do).sum().backward()
    ref_leaves = [x.double().requires_grad_() for x in (q, k, v)]
    o_ref = feature_naive.quadratic_hybrid_chunk_attn(*ref_leaves, None if slope is None else slope.double(),
                                                      chunk_size=C, feature_map=fm)
    (o_ref * do.double()).sum().backward()
    assert o.dtype == dtype
    assert_close("o", o, o_ref, dtype)
    qk_tol = {torch.bfloat16: 2e-2}.get(dtype, dtype)  # the normalised part's cancellation, see test_normalized.py
    for name, a, b in zip(("dq", "dk", "dv"), leaves, ref_leaves):
        assert_close(name, a.grad, b.grad, qk_tol if name != "dv" else dtype)


@pytest.mark.parametrize("C", [1, 3, 8, 16])
def test_inter_only_packed_equals_per_sequence(C, configure):
    """The PyTorch path's inter-only mode on packed sequences (each row block's state at its one x) against each
    sequence alone: outputs, final states and the gradients of q, k, v and the initial states, in float64; lengths 0,
    1, C, C + 1 and 2C + 3 and sequences that start inside a block, end in one or run over several."""
    configure(backend="torch")
    lens = [2 * C + 3, 0, 1, C, C + 1, 5 * C - 2, C + 1]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    T, N, H, K, V = int(cu[-1]), len(lens), 2, 8, 6
    g = torch.Generator().manual_seed(C)
    leaves = [torch.randn(1, T, H, d, generator=g, dtype=F64).requires_grad_() for d in (K, K, V)]
    h0 = torch.randn(N, H, K, V, generator=g, dtype=F64).requires_grad_()
    slope = mixed_slope(H).double()
    do, dht = torch.randn(1, T, H, V, generator=g, dtype=F64), torch.randn(N, H, K, V, generator=g, dtype=F64)
    o, ht = lightning_attn_inter(*leaves, slope, chunk_size=C, cu_seqlens=cu, initial_state=h0,
                                 output_final_state=True)  # fmt: skip
    grads = torch.autograd.grad((o * do).sum() + (ht * dht).sum(), [*leaves, h0])
    for n, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        own = [x.detach()[:, a:b].clone().requires_grad_() for x in leaves] + [h0.detach()[n:n + 1].requires_grad_()]
        o_n, ht_n = lightning_attn_inter(*own[:3], slope, chunk_size=C, initial_state=own[3], output_final_state=True)
        got = torch.autograd.grad((o_n * do[:, a:b]).sum() + (ht_n * dht[n:n + 1]).sum(), own, allow_unused=True)
        got = [torch.zeros_like(x) if d is None else d for x, d in zip(own, got)]  # an empty sequence uses no token
        assert_close(f"o of sequence {n}", o[:, a:b], o_n, 1e-12)
        assert_close(f"final state of sequence {n}", ht[n:n + 1], ht_n, 1e-12)
        for name, full, part in zip(("dq", "dk", "dv"), grads[:3], got[:3]):
            assert_close(f"{name} of sequence {n}", full[:, a:b], part, 1e-12)
        assert_close(f"dh0 of sequence {n}", grads[3][n:n + 1], got[3], 1e-12)


def test_hybrid_varlen_equals_per_sequence():
    """Chunks restart at every packed sequence; lengths 0, 1 and 15 included."""
    cu = [0, 0, 1, 16, 43]
    q, k, v = make_inputs(1, 43, 2, 16, 16, F64)
    slope = mixed_slope(2).double()
    o = hybrid_chunk_attn(q, k, v, slope, chunk_size=8, cu_seqlens=torch.tensor(cu))
    o_ref = torch.cat([feature_naive.recurrent_hybrid_chunk_attn(q[:, a:b], k[:, a:b], v[:, a:b], slope, chunk_size=8)
                       for a, b in zip(cu[:-1], cu[1:])], dim=1)
    assert_close("o", o, o_ref, 1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_hybrid_decode_matches_reference(dtype):
    """Token-by-token decode from an empty state vs the float64 reference (the parallel op is checked against the
    same reference above): crosses three chunk boundaries, ends in a ragged chunk."""
    B, T, H, K, V, C = 2, 27, 4, 16, 24, 8
    q, k, v = make_inputs(B, T, H, K, V, dtype)
    slope = mixed_slope(H)
    state = HybridDecodeState.empty(B, H, K, V, K, chunk_size=C, dtype=dtype)
    outs = [hybrid_chunk_attn_decode(q[:, t], k[:, t], v[:, t], state, slope, feature_map="relu2") for t in range(T)]
    o_ref = feature_naive.quadratic_hybrid_chunk_attn(q.double(), k.double(), v.double(), slope.double(),
                                                      chunk_size=C, feature_map="relu2")
    assert state.pos == T % C
    assert_close("o", torch.stack(outs, dim=1), o_ref, dtype)


def test_module_forward_step_and_learned_feature_map_gradients():
    torch.manual_seed(0)
    B, T, H, K, V, C = 2, 37, 2, 16, 16, 8
    layer = HybridChunkAttention(K, H, chunk_size=C, feature_dim=24, per_head_feature_map=True, slope=mixed_slope(H))
    q, k, v = make_inputs(B, T, H, K, V, torch.float32)
    o = layer(q, k, v)
    assert o.shape == (B, T, H, V)
    (o * torch.randn_like(o)).sum().backward()
    assert layer.feature_map.weight.grad is not None and bool(layer.feature_map.weight.grad.abs().sum() > 0)

    # the layer's gradient in W equals the float64 reference's
    w = layer.feature_map.weight.detach().double().requires_grad_()
    phi = lambda x: torch.relu(torch.einsum("...hk,hkf->...hf", x, w)).square() + layer.feature_map.eps  # noqa: E731
    phi.positive = True
    do = torch.randn(B, T, H, V, generator=torch.Generator().manual_seed(7))
    layer.zero_grad()
    (layer(q, k, v) * do).sum().backward()
    o_ref = feature_naive.quadratic_hybrid_chunk_attn(q.double(), k.double(), v.double(), mixed_slope(H).double(),
                                                      chunk_size=C, feature_map=phi)
    (o_ref * do.double()).sum().backward()
    assert_close("dW", layer.feature_map.weight.grad, w.grad, 1e-5)

    # decode through the layer equals the reference token by token
    state = layer.init_state(B, V)
    with torch.no_grad():
        steps = torch.stack([layer.step(q[:, t], k[:, t], v[:, t], state) for t in range(T)], dim=1)
    assert_close("step", steps, o_ref, 1e-5)


@pytest.mark.parametrize("kwargs, match", [
    (dict(chunk_size=0), "chunk_size"),
    (dict(chunk_size=-4), "chunk_size"),
    (dict(eps=0.0), "eps"),
    (dict(eps=float("nan")), "eps"),
    (dict(feature_map="identity"), "positive"),
    (dict(feature_map="silu"), "positive"),
    (dict(combine="concat"), "combine"),
])
def test_hybrid_bad_arguments(kwargs, match):
    q, k, v = make_inputs(1, 8, 1, 16, 16, torch.float32)
    with pytest.raises(ValueError, match=match):
        hybrid_chunk_attn(q, k, v, **kwargs)


@pytest.mark.parametrize("kwargs", [dict(chunk_size=0), dict(feature_map="silu"), dict(eps=-1.0),
                                    dict(slope=torch.tensor([-1.0]))])
def test_module_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        HybridChunkAttention(16, 1, **kwargs)
