"""Normalised linear attention: references agree, the fast path (our lightning_attn with v' = [v, 1]) matches the
float64 reference forward and backward, decode matches it token by token, and bad arguments are refused."""

import pytest
import torch

from lightning_attention.ops import feature_naive
from lightning_attention.ops.normalized import (
    fused_normaliser,
    new_normalized_state,
    normalized_linear_attn,
    normalized_linear_attn_decode,
    packed_buffer,
)
from lightning_attention.utils.testing import assert_close

F64 = torch.float64


def make_slope(kind, H):
    if kind == "none":
        return None
    return torch.tensor([(0.0, 0.05, 0.5, 3.0)[h % 4] for h in range(H)])  # none / weak / medium / strong


def make_inputs(B, T, H, K, V, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, T, H, d, generator=g).to(dtype) for d in (K, K, V))
    return q, k, v


def make_state(N, H, K, V, seed=1):
    g = torch.Generator().manual_seed(seed)
    # a state as a prefix of positive features would leave it: S any sign, z positive
    return torch.randn(N, H, K, V, generator=g), torch.rand(N, H, K, generator=g) * 5


# (B, T, H, K, V, decay, with_state, scale, feature_map, cu_seqlens)
REF_CASES = [
    (2, 0, 2, 16, 16, "mixed", True, 1.0, "elu+1", None),
    (1, 1, 1, 16, 48, "none", False, 1.0, "relu2", None),
    (2, 63, 4, 16, 24, "mixed", True, 0.5, "elu+1", None),
    (1, 100, 3, 48, 16, "none", True, 1.0, "relu2", None),
    (1, 31, 2, 16, 16, "mixed", True, 1.0, "elu+1", [0, 0, 1, 16, 31]),
]


@pytest.mark.parametrize("case", REF_CASES, ids=lambda c: f"T{c[1]}-{c[5]}-{c[8]}-{'varlen' if c[9] else 'dense'}")
def test_references_agree(case):
    B, T, H, K, V, decay, with_state, scale, fm, cu = case
    q, k, v = make_inputs(B, T, H, K, V, F64)
    slope = make_slope(decay, H)
    slope = None if slope is None else slope.double()
    cu = None if cu is None else torch.tensor(cu)
    N = B if cu is None else len(cu) - 1
    h0 = tuple(x.double() for x in make_state(N, H, K, V)) if with_state else None
    kw = dict(feature_map=fm, scale=scale, initial_state=h0, cu_seqlens=cu)
    o1, (s1, z1) = feature_naive.recurrent_normalized_linear_attn(q, k, v, slope, **kw)
    o2, (s2, z2) = feature_naive.quadratic_normalized_linear_attn(q, k, v, slope, **kw)
    for name, a, b in (("o", o2, o1), ("S", s2, s1), ("z", z2, z1)):
        assert_close(name, a, b, 1e-12)


# dq and dk of the normalised form in bfloat16 are measured at 0.5-1.3e-2 (forward 2.9e-3): the kernels' backward
# receives d[v, 1] = [do / den, -(do·o) / den] rounded to bfloat16, and dφ(q) = (do·Sᵀ - (do·o) zᵀ) / den is a
# difference of two nearly equal terms, which amplifies that rounding 3-4x. float16 runs its linear part in float32
# (normalized.py) and float32 is exact: both keep the table's tolerance.
QK_GRAD_TOL = {torch.bfloat16: 2e-2}

# (B, T, H, K, V, decay, feature_map, dtype, cu_seqlens): V = 255 is the widest fused layout, V = 256 the split one
FAST_CASES = [
    (2, 63, 4, 16, 32, "mixed", "elu+1", torch.float32, None),
    (1, 100, 2, 32, 48, "none", "relu2", torch.float32, None),
    (1, 20, 2, 16, 255, "mixed", "elu+1", torch.float32, None),
    (1, 20, 2, 16, 256, "mixed", "elu+1", torch.float32, None),
    (2, 70, 4, 32, 32, "mixed", "elu+1", torch.bfloat16, None),
    (1, 80, 2, 16, 256, "mixed", "relu2", torch.bfloat16, None),
    (2, 70, 4, 32, 32, "mixed", "elu+1", torch.float16, None),
    (1, 47, 2, 16, 16, "mixed", "elu+1", torch.float32, [0, 1, 1, 16, 47]),
]


def _fast_id(c):
    return f"T{c[1]}-V{c[4]}-{c[6]}-{str(c[7])[6:]}-{'varlen' if c[8] else 'dense'}"


@pytest.mark.parametrize("case", FAST_CASES, ids=_fast_id)
def test_fast_path_matches_reference(case):
    """Forward and gradients (q, k, v, S0, z0) of the loss (o·do) + (S·dS) + (z·dz) vs the float64 reference."""
    B, T, H, K, V, decay, fm, dtype, cu = case
    q, k, v = make_inputs(B, T, H, K, V, dtype)
    slope = make_slope(decay, H)
    cu = None if cu is None else torch.tensor(cu)
    N = B if cu is None else len(cu) - 1
    S0, z0 = make_state(N, H, K, V)
    g = torch.Generator().manual_seed(2)
    do, dS, dz = (torch.randn(shape, generator=g) for shape in ((B, T, H, V), (N, H, K, V), (N, H, K)))

    def run(fn, q, k, v, S0, z0, slope, **extra):
        leaves = [x.detach().clone().requires_grad_() for x in (q, k, v, S0, z0)]
        o, (S, z) = fn(*leaves[:3], slope, feature_map=fm, scale=0.7, initial_state=(leaves[3], leaves[4]),
                       cu_seqlens=cu, **extra)
        wide = F64 if o.dtype == F64 else torch.float32  # the loss in float32 (float64 for the reference)
        loss = (o.to(wide) * do.to(wide)).sum() + (S * dS.to(S.dtype)).sum() + (z * dz.to(z.dtype)).sum()
        loss.backward()
        return o, S, z, [x.grad for x in leaves]

    o, S, z, grads = run(normalized_linear_attn, q, k, v, S0, z0, slope, output_final_state=True)
    ref_slope = None if slope is None else slope.double()
    o_r, S_r, z_r, grads_r = run(feature_naive.recurrent_normalized_linear_attn, q.double(), k.double(), v.double(),
                                 S0.double(), z0.double(), ref_slope)
    assert o.dtype == dtype and S.dtype == torch.float32 and z.dtype == torch.float32
    assert_close("o", o, o_r, dtype)
    # the states are float32, but they sum φ(k) rounded to the input dtype (the kernels' inputs): the input dtype's
    # tolerance applies to them
    names = ("S", "z", "dv", "dS0", "dz0")
    for name, a, b in zip(names, (S, z, grads[2], *grads[3:]), (S_r, z_r, grads_r[2], *grads_r[3:])):
        assert_close(name, a, b, dtype)
    for name, a, b in zip(("dq", "dk"), grads[:2], grads_r[:2]):
        assert_close(name, a, b, QK_GRAD_TOL.get(dtype, dtype))


def test_layout_choice():
    # the normaliser rides along unless the extra column would double the value tile (or exceed 256); value tiles
    # are at least 64 wide (kernels.configs.WALK_MIN_TILE), so narrow heads always have room for it
    assert fused_normaliser(255) and fused_normaliser(100) and fused_normaliser(48) and fused_normaliser(32)
    assert not fused_normaliser(256) and not fused_normaliser(128) and not fused_normaliser(64)
    q, k, v = make_inputs(1, 5, 1, 16, 40, torch.float32)
    _, (S, z) = normalized_linear_attn(q, k, v, output_final_state=True)
    assert packed_buffer(S, z) is not None  # final (S, z) of the fused layout is decode-ready as is


def test_layout_choice_uses_the_walks_value_tile():
    """normalized._tile is a Triton-free copy of kernels.configs.walk_tile (the module must import without
    Triton): the two agree on every head dim the kernels take."""
    configs = pytest.importorskip("lightning_attention.ops.lightning.kernels.configs")
    from lightning_attention.ops import normalized

    assert [normalized._tile(d) for d in range(1, 257)] == [configs.walk_tile(d) for d in range(1, 257)]


def test_empty_sequence_returns_initial_state():
    q, k, v = make_inputs(2, 0, 2, 16, 16, torch.float32)
    S0, z0 = make_state(2, 2, 16, 16)
    o, (S, z) = normalized_linear_attn(q, k, v, initial_state=(S0, z0), output_final_state=True)
    assert o.shape == (2, 0, 2, 16)
    torch.testing.assert_close(S, S0)
    torch.testing.assert_close(z, z0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("packed", [True, False])
def test_decode_matches_reference(dtype, packed):
    """Prefill a prompt, then decode token by token from the pool with a padding slot: each step vs float64."""
    B, T0, T, H, K, V, P = 2, 9, 25, 4, 16, 24, 4
    q, k, v = make_inputs(B, T, H, K, V, dtype)
    slope = make_slope("mixed", H)
    o_ref, (S_ref, z_ref) = feature_naive.recurrent_normalized_linear_attn(q.double(), k.double(), v.double(),
                                                                           slope.double())
    _, (S_pre, z_pre) = normalized_linear_attn(q[:, :T0], k[:, :T0], v[:, :T0], slope, output_final_state=True)
    if packed:
        S, z = new_normalized_state(P, H, K, V)
        assert packed_buffer(S, z) is not None
    else:
        S, z = torch.zeros(P, H, K, V), torch.zeros(P, H, K)
    rows = torch.tensor([3, 1])
    S[rows], z[rows] = S_pre, z_pre
    untouched = (S[[0, 2]].clone(), z[[0, 2]].clone())
    idx = torch.tensor([3, -1, 1])  # a padding slot between the two sequences
    outs = []
    for t in range(T0, T):
        pad = lambda x: torch.stack([x[0], torch.full_like(x[0], float("nan")), x[1]])  # noqa: E731
        o = normalized_linear_attn_decode(pad(q[:, t]), pad(k[:, t]), pad(v[:, t]), (S, z), slope, state_indices=idx)
        assert bool((o[1] == 0).all()), "padding slot output must be zeros"
        outs.append(o[[0, 2]])
    assert_close("o", torch.stack(outs, dim=1), o_ref[:, T0:], dtype)
    assert_close("S", S[rows], S_ref, dtype)  # float32 states of features rounded to the input dtype
    assert_close("z", z[rows], z_ref, dtype)
    torch.testing.assert_close(S[[0, 2]], untouched[0])
    torch.testing.assert_close(z[[0, 2]], untouched[1])


def test_decode_v256_and_out_buffer():
    B, T, H, K, V = 2, 6, 2, 16, 256
    q, k, v = make_inputs(B, T, H, K, V, torch.float32)
    o_ref, _ = feature_naive.recurrent_normalized_linear_attn(q.double(), k.double(), v.double(), None)
    S, z = new_normalized_state(B, H, K, V)
    assert packed_buffer(S, z) is None  # V + 1 = 257 exceeds the kernels: S and z are stepped separately
    out = torch.empty(B, H, V)
    outs = []
    for t in range(T):
        res = normalized_linear_attn_decode(q[:, t], k[:, t], v[:, t], (S, z), out=out)
        assert res is out
        outs.append(res.clone())
    assert_close("o", torch.stack(outs, dim=1), o_ref, torch.float32)


@pytest.mark.parametrize("eps", [0.0, -1e-6, float("inf"), float("nan")])
def test_bad_eps(eps):
    q, k, v = make_inputs(1, 4, 1, 16, 16, torch.float32)
    with pytest.raises(ValueError, match="eps"):
        normalized_linear_attn(q, k, v, eps=eps)
    with pytest.raises(ValueError, match="eps"):
        normalized_linear_attn_decode(q[:, 0], k[:, 0], v[:, 0], new_normalized_state(1, 1, 16, 16), eps=eps)


def test_bad_state_and_inputs():
    q, k, v = make_inputs(2, 4, 2, 16, 16, torch.float32)
    S0, z0 = make_state(2, 2, 16, 16)
    with pytest.raises(TypeError, match="pair"):
        normalized_linear_attn(q, k, v, initial_state=S0)
    with pytest.raises(ValueError, match="z"):
        normalized_linear_attn(q, k, v, initial_state=(S0, z0[:, :, :8]))
    with pytest.raises(TypeError, match="float32"):
        normalized_linear_attn(q, k, v, initial_state=(S0.half(), z0))
    with pytest.raises(ValueError, match="v must have shape"):
        normalized_linear_attn(q, k, v[:, :3])


def test_triton_backend_matches_reference(configure):
    """The same op on our Triton kernels (interpreter on CPU): v' = [v, 1] with V + 1 = 32, forward and gradients."""
    configure(backend="triton")
    B, T, H, K, V = 1, 50, 2, 16, 31
    q, k, v = make_inputs(B, T, H, K, V, torch.float32)
    slope = torch.tensor([0.0, 0.3])
    S0, z0 = make_state(B, H, K, V)
    do = torch.randn(B, T, H, V, generator=torch.Generator().manual_seed(8))
    leaves = [x.clone().requires_grad_() for x in (q, k, v, S0, z0)]
    o, (S, z) = normalized_linear_attn(*leaves[:3], slope, initial_state=tuple(leaves[3:]), output_final_state=True)
    ((o * do).sum() + S.sum() + z.sum()).backward()
    ref = [x.double().requires_grad_() for x in (q, k, v, S0, z0)]
    o_r, (S_r, z_r) = feature_naive.recurrent_normalized_linear_attn(*ref[:3], slope.double(),
                                                                     initial_state=tuple(ref[3:]))
    ((o_r * do.double()).sum() + S_r.sum() + z_r.sum()).backward()
    for name, a, b in (("o", o, o_r), ("S", S, S_r), ("z", z, z_r)):
        assert_close(name, a, b, torch.float32)
    for name, a, b in zip(("dq", "dk", "dv", "dS0", "dz0"), leaves, ref):
        assert_close(name, a.grad, b.grad, torch.float32)
