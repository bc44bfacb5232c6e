"""The three executable references (quadratic, recurrent, chunked) agree in float64 (the first link of the reference
chain)."""

import pytest
import torch

from lightning_attention.ops.lightning import naive

REFERENCES = {
    "quadratic": naive.quadratic_lightning_attn,
    "recurrent": naive.recurrent_lightning_attn,
    "chunk": naive.chunk_lightning_attn,
}

# (B, T, H, K, V, decay, with_h0, scale): curated, not a Cartesian product
CASES = [
    (2, 0, 3, 16, 16, "none", True, 1.0),
    (1, 1, 1, 16, 48, "weak", True, 1.0),
    (2, 2, 3, 48, 16, "strong", False, 0.5),
    (1, 63, 8, 64, 64, "mixed", True, 1.0),
    (2, 64, 3, 16, 100, "none", False, 1.0),
    (1, 65, 1, 100, 48, "weak", True, 0.125),
    (2, 100, 3, 128, 128, "mixed", True, 1.0),
    (1, 1000, 8, 16, 16, "mixed", True, 0.3),
    (1, 1000, 1, 48, 64, "none", False, 1.0),
]


def make_slope(kind: str, H: int, dtype=torch.float64):
    if kind == "none":
        return None
    if kind == "weak":
        return torch.full((H,), 0.01, dtype=dtype)
    if kind == "strong":
        return torch.full((H,), 5.0, dtype=dtype)
    # mixed: no decay, weak and strong heads side by side
    return torch.tensor([(0.0, 0.01, 0.5, 5.0)[h % 4] for h in range(H)], dtype=dtype)


def make_inputs(B, T, H, K, V, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=g, dtype=dtype)
    k = torch.randn(B, T, H, K, generator=g, dtype=dtype)
    v = torch.randn(B, T, H, V, generator=g, dtype=dtype)
    return q, k, v


def case_id(case):
    B, T, H, K, V, decay, h0, scale = case
    return f"B{B}-T{T}-H{H}-K{K}-V{V}-{decay}-{'h0' if h0 else 'noh0'}-s{scale}"


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_references_agree(case):
    B, T, H, K, V, decay, with_h0, scale = case
    q, k, v = make_inputs(B, T, H, K, V)
    slope = make_slope(decay, H)
    h0 = torch.randn(B, H, K, V, dtype=torch.float64) if with_h0 else None
    results = {
        name: fn(q, k, v, slope, scale=scale, initial_state=h0) for name, fn in REFERENCES.items()
    }
    o_ref, s_ref = results["quadratic"]
    assert o_ref.shape == (B, T, H, V) and s_ref.shape == (B, H, K, V)
    for name, (o, s) in results.items():
        assert o.dtype == torch.float64 and s.dtype == torch.float64
        torch.testing.assert_close(o, o_ref, rtol=1e-10, atol=1e-10, msg=f"{name} output")
        torch.testing.assert_close(s, s_ref, rtol=1e-10, atol=1e-10, msg=f"{name} final state")


def test_chunk_sizes_agree():
    """The chunked form does not depend on its block size, including blocks larger than T and ragged tails."""
    q, k, v = make_inputs(2, 77, 3, 16, 24)
    slope = make_slope("mixed", 3)
    h0 = torch.randn(2, 3, 16, 24, dtype=torch.float64)
    o_ref, s_ref = naive.recurrent_lightning_attn(q, k, v, slope, initial_state=h0)
    for chunk in (1, 16, 32, 64, 128):
        o, s = naive.chunk_lightning_attn(q, k, v, slope, initial_state=h0, chunk_size=chunk)
        torch.testing.assert_close(o, o_ref, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(s, s_ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("lengths", [[0, 1, 15], [15, 0, 40, 1], [0]], ids=str)
@pytest.mark.parametrize("name", list(REFERENCES))
def test_varlen_equals_sequences_alone(name, lengths):
    fn = REFERENCES[name]
    H, K, V = 3, 16, 32
    T = sum(lengths)
    q, k, v = make_inputs(1, T, H, K, V, seed=1)
    slope = make_slope("mixed", H)
    h0 = torch.randn(len(lengths), H, K, V, dtype=torch.float64)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int32)
    o, s = fn(q, k, v, slope, scale=0.5, initial_state=h0, cu_seqlens=cu)
    assert o.shape == (1, T, H, V) and s.shape == (len(lengths), H, K, V)
    for n, (bos, eos) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        o_n, s_n = naive.quadratic_lightning_attn(
            q[:, bos:eos], k[:, bos:eos], v[:, bos:eos], slope, scale=0.5, initial_state=h0[n : n + 1]
        )
        torch.testing.assert_close(o[:, bos:eos], o_n, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(s[n : n + 1], s_n, rtol=1e-10, atol=1e-10)
        if eos == bos:  # a zero-length sequence returns its initial state
            torch.testing.assert_close(s[n], h0[n], rtol=0, atol=0)


def test_strong_decay_is_finite_and_local():
    """slope = 50: λ^t underflows to 0; nothing may overflow or turn NaN, and each output is q_t·k_tᵀv_t."""
    q, k, v = make_inputs(1, 130, 2, 16, 16)
    slope = torch.full((2,), 50.0, dtype=torch.float64)
    o, s = naive.chunk_lightning_attn(q, k, v, slope)
    assert torch.isfinite(o).all() and torch.isfinite(s).all()
    local = torch.einsum("bthk,bthk->bth", q, k)[..., None] * v
    torch.testing.assert_close(o, local, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("lengths", [[5, 0, 37, 1, 64, 15], [100], [0, 0, 3], [63, 65, 1, 1, 128]], ids=str)
@pytest.mark.parametrize("chunk", [7, 16, 64])
@pytest.mark.parametrize("intra", [True, False], ids=["full", "inter-only"])
def test_packed_rows_equal_each_sequence_chunked_alone(lengths, chunk, intra):
    """The packed form (one computation over the row, sequence boundaries as masks, no host offsets) equals the
    chunked form of each sequence alone, outputs and final states and their gradients, including the inter-only
    mode whose chunks restart at every sequence start; blocks of the row straddle the sequences' boundaries."""
    H, K, V = 3, 8, 5
    T = sum(lengths)
    q, k, v = make_inputs(1, T, H, K, V, seed=2)
    h0 = torch.randn(len(lengths), H, K, V, dtype=torch.float64)
    leaves = [x.clone().requires_grad_() for x in (q, k, v, h0)]
    slope = torch.tensor([0.0, 0.1, 2.0])
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
    o, s = naive.chunk_lightning_attn(*leaves[:3], slope, scale=0.5, initial_state=leaves[3], cu_seqlens=cu,
                                      chunk_size=chunk, intra=intra)  # fmt: skip
    outs, finals = [], []
    for n, (bos, eos) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        o_n, s_n = naive.chunk_lightning_attn(
            *(x[:, bos:eos] for x in leaves[:3]), slope, scale=0.5, initial_state=leaves[3][n : n + 1],
            chunk_size=chunk, intra=intra,
        )  # fmt: skip
        outs.append(o_n)
        finals.append(s_n)
    o_ref, s_ref = torch.cat(outs, dim=1), torch.cat(finals)
    torch.testing.assert_close(o, o_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(s, s_ref, rtol=1e-10, atol=1e-10)
    g = torch.Generator().manual_seed(3)
    do, ds = torch.randn(o.shape, generator=g, dtype=o.dtype), torch.randn(s.shape, generator=g, dtype=s.dtype)
    got = torch.autograd.grad((o * do).sum() + (s * ds).sum(), leaves)
    ref = torch.autograd.grad((o_ref * do).sum() + (s_ref * ds).sum(), leaves)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
