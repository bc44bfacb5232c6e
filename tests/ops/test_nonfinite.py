"""Non-finite values (docs/design.md, "Non-finite values and overflow"): a NaN or inf at token t reaches only what
the semantics say, on both backends, forward and backward; debug mode names what it cannot keep apart.

The chunked computation selects with ``where`` wherever a token must not see another, so a non-finite q or k at
token t reaches no output before t. A matrix product still carries 0 · NaN = NaN across its contracted dimension:
the operand multiplied by a chunk's score matrix (v in the forward; k, q and do in the backward's walks) reaches the
other tokens of its chunk. Each case below lists, per output, the tokens that must come out exactly as in a clean
run: everything the semantics do not connect to token t, except that chunk.

Chunks: 64 tokens on the PyTorch path; 32 on the Triton path (pinned here, so that the cases have chunks on both
sides of t; the recompute backward's chunk is 32 too).
"""

import pytest
import torch

import lightning_attention as la
from lightning_attention.ops.lightning.naive import quadratic_lightning_attn

T, H, K, V = 160, 2, 16, 16
BAD_T = 80  # the poisoned token: chunk [64, 128) on the PyTorch path, [64, 96) on the Triton path
PIN = "BT=32,BV=16,num_warps=4,num_stages=1"
# NumPy, which runs the interpreted kernels, warns where they compute with the non-finite values on purpose
pytestmark = pytest.mark.filterwarnings("ignore:(invalid value|overflow) encountered:RuntimeWarning")
VALUES = {"nan": float("nan"), "inf": float("inf")}
# (id, settings, backward, chunk)
PATHS = [
    ("torch", dict(backend="torch"), "auto", 64),
    ("triton-chunk", dict(backend="triton", kernel_config=PIN), "chunk", 32),
    ("triton-recompute", dict(backend="triton", kernel_config=PIN), "recompute", 32),
]


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(1, T, H, K, generator=g) for _ in range(2))
    v, do = (torch.randn(1, T, H, V, generator=g) for _ in range(2))
    return {"q": q, "k": k, "v": v, "do": do}, torch.tensor([0.05, 0.3])


def _run(x, slope, backward, cu=None):
    """o and the gradients of q, k, v for the output gradient x["do"] (autograd.grad: no loss value is formed)."""
    leaves = [x[n].clone().requires_grad_() for n in ("q", "k", "v")]
    o, ht = la.lightning_attn(*leaves, slope, cu_seqlens=cu, output_final_state=cu is not None, backward=backward)
    grads = torch.autograd.grad(o, leaves, x["do"])
    return {"o": o.detach(), "dq": grads[0], "dk": grads[1], "dv": grads[2], "ht": None if ht is None else ht.detach()}


def _clean_tokens(poisoned: str, out: str, t: int, chunk: int) -> list[int]:
    """The tokens of ``out`` that a non-finite ``poisoned`` value at token t leaves exactly as they were."""
    c0, c1 = t // chunk * chunk, (t // chunk + 1) * chunk  # t's chunk
    every = range(T)
    rules = {
        # the forward: q_t reaches o_t only; k_t and v_t reach o_s for s >= t (v: and the rest of t's chunk)
        ("q", "o"): [s for s in every if s != t],
        ("k", "o"): range(t),
        ("v", "o"): range(c0),
        # dq_s = do_s S_sᵀ: S_s holds k, v up to s (the dq walk multiplies its scores by k: k's chunk)
        ("q", "dq"): [s for s in every if s != t],
        ("k", "dq"): range(c0),
        ("v", "dq"): range(t),
        ("do", "dq"): [s for s in every if s != t],
        # dk_s = Σ_{i>=s} λ^(i-s) (do_i·v_s) q_i: no k; the dk walk multiplies its scores by q
        ("q", "dk"): range(c1, T),
        ("k", "dk"): every,
        ("v", "dk"): [s for s in every if s != t],
        ("do", "dk"): range(t + 1, T),
        # dv_s = Σ_{i>=s} λ^(i-s) (q_i·k_s) do_i: no v; the dv walk multiplies its scores by do
        ("q", "dv"): range(t + 1, T),
        ("k", "dv"): [s for s in every if s != t],
        ("v", "dv"): every,
        ("do", "dv"): range(c1, T),
    }
    return list(rules[(poisoned, out)])


@pytest.mark.parametrize("value", list(VALUES))
@pytest.mark.parametrize("poisoned", ["q", "k", "v", "do"])
@pytest.mark.parametrize("path", PATHS, ids=[p[0] for p in PATHS])
def test_non_finite_token_reaches_only_what_the_semantics_say(path, poisoned, value, configure):
    _, config, backward, chunk = path
    configure(**config)
    x, slope = _inputs()
    clean = _run(x, slope, backward)
    x[poisoned] = x[poisoned].clone()
    x[poisoned][0, BAD_T, 1, 3] = VALUES[value]
    got = _run(x, slope, backward)
    for out in ("o", "dq", "dk", "dv"):
        if poisoned == "do" and out == "o":
            continue
        tokens = _clean_tokens(poisoned, out, BAD_T, chunk)
        assert torch.equal(got[out][0, tokens], clean[out][0, tokens]), f"{out}: a token it must not reach moved"
    if poisoned in ("k", "v"):  # ... and it does reach the later outputs (the state carries it)
        assert not torch.isfinite(got["o"][0, BAD_T:, 1]).all(dim=-1).any()


@pytest.mark.parametrize("poisoned", ["q", "k"])
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_non_finite_token_does_not_cross_packed_sequences(poisoned, value, configure):
    """Packed sequences on the PyTorch path, whose 64-token blocks are blocks of the row: a non-finite q or k in
    one sequence reaches no output and no final state of the next (the block states select their own sequence's
    tokens); its gradients only within the block the two share (here tokens 50..63: the documented chunk)."""
    configure(backend="torch")
    x, slope = _inputs(seed=1)
    cu = torch.tensor([0, 50, T])
    clean = _run(x, slope, "auto", cu)
    x[poisoned] = x[poisoned].clone()
    x[poisoned][0, 30, 0, 0] = VALUES[value]
    got = _run(x, slope, "auto", cu)
    assert torch.equal(got["o"][0, 50:], clean["o"][0, 50:]), "an output of the next sequence changed"
    assert torch.equal(got["ht"][1], clean["ht"][1]), "the final state of the next sequence changed"
    for out in ("dq", "dk", "dv"):
        assert torch.equal(got[out][0, 64:], clean[out][0, 64:]), f"{out} of the next sequence changed"


def _run_packed(x, slope, cu, h0, op=None):
    """o, the final states and the gradients of q, k, v and the initial states of a packed call (PyTorch path)."""
    leaves = [x[n].clone().requires_grad_() for n in ("q", "k", "v")] + [h0.clone().requires_grad_()]
    op = op or la.lightning_attn
    o, ht = op(*leaves[:3], slope, cu_seqlens=cu, initial_state=leaves[3], output_final_state=True)
    dq, dk, dv, dh0 = torch.autograd.grad(o, leaves, x["do"])
    return {"o": o.detach()[0], "dq": dq[0], "dk": dk[0], "dv": dv[0], "ht": ht.detach(), "dh0": dh0}


def _poison(x, name, token):
    x = dict(x)
    x[name] = x[name].clone()
    x[name][0, token, 1, 3] = float("nan")
    return x


@pytest.mark.parametrize("poisoned", ["q", "k", "v"])
@pytest.mark.parametrize("bad, other", [(30, 1), (140, 0)], ids=["first-block", "after-shared-block"])
def test_non_finite_token_reaches_another_packed_sequence_only_in_its_block(poisoned, bad, other, configure):
    """The first sequence runs over two 64-token blocks and the next starts in the second (tokens 64..127 shared): a
    non-finite value outside the shared block reaches nothing of the other sequence, forward or backward, its final
    state and its initial state's gradient included. The state carried into a block is selected on both sides of
    its product, so a token that does not read it takes neither its non-finite values into dq nor gives its own
    non-finite q to the state's gradient."""
    configure(backend="torch")
    x, slope = _inputs(seed=3)
    cu = torch.tensor([0, 100, T])
    h0 = torch.randn(2, H, K, V, generator=torch.Generator().manual_seed(4))
    clean = _run_packed(x, slope, cu, h0)
    got = _run_packed(_poison(x, poisoned, bad), slope, cu, h0)
    tokens = slice(int(cu[other]), int(cu[other + 1]))
    for out in ("o", "dq", "dk", "dv"):
        assert torch.equal(got[out][tokens], clean[out][tokens]), f"{out} of the other sequence"
    for out in ("ht", "dh0"):
        assert torch.equal(got[out][other], clean[out][other]), f"{out} of the other sequence"


@pytest.mark.parametrize("poisoned", ["q", "k", "v"])
def test_non_finite_token_reaches_no_other_packed_sequence_state(poisoned, configure):
    """A short first sequence (tokens 0..9) and a non-finite value of the next one in the block they share: the
    first sequence's final state and its initial state's gradient come out as in a clean run (its h0 term is taken
    over a window of its first 64 tokens, of which the others are selected out, q included)."""
    configure(backend="torch")
    x, slope = _inputs(seed=7)
    cu = torch.tensor([0, 10, T])
    h0 = torch.randn(2, H, K, V, generator=torch.Generator().manual_seed(8))
    clean = _run_packed(x, slope, cu, h0)
    got = _run_packed(_poison(x, poisoned, 30), slope, cu, h0)
    for out in ("ht", "dh0"):
        assert torch.equal(got[out][0], clean[out][0]), f"{out} of the first sequence"


@pytest.mark.parametrize("poisoned", ["q", "k", "v"])
def test_inter_only_packed_non_finite_reaches_no_other_sequence(poisoned, configure):
    """The inter-only mode on packed sequences (PyTorch path) builds each token's state from its own sequence's
    tokens alone, though the row blocks of ``chunk_size`` tokens hold several sequences: a non-finite value reaches
    no other sequence's output, gradient, final state or initial state's gradient."""
    from lightning_attention.ops.lightning.inter import lightning_attn_inter

    configure(backend="torch")
    C, bad = 16, 45  # row blocks of 16 tokens: the poisoned token in block 2, of the second sequence (37..89)
    x, slope = _inputs(seed=5)
    cu = torch.tensor([0, 37, 90, T])
    h0 = torch.randn(3, H, K, V, generator=torch.Generator().manual_seed(6))

    def op(*args, **kwargs):
        return lightning_attn_inter(*args, chunk_size=C, **kwargs)

    clean = _run_packed(x, slope, cu, h0, op)
    got = _run_packed(_poison(x, poisoned, bad), slope, cu, h0, op)
    t = torch.arange(T)
    others = (t < 37) | (t >= 90)
    for out in ("o", "dq", "dk", "dv"):
        assert torch.equal(got[out][others], clean[out][others]), f"{out} of another sequence"
    for out in ("ht", "dh0"):
        assert torch.equal(got[out][[0, 2]], clean[out][[0, 2]]), f"{out} of another sequence"


@pytest.mark.parametrize("poisoned", ["k", "q"])
def test_quadratic_reference_selects_its_mask(poisoned):
    x, slope = _inputs(seed=2)
    clean, _ = quadratic_lightning_attn(x["q"], x["k"], x["v"], slope)
    x[poisoned] = x[poisoned].clone()
    x[poisoned][0, BAD_T] = float("nan")
    got, _ = quadratic_lightning_attn(x["q"], x["k"], x["v"], slope)
    assert torch.equal(got[0, :BAD_T], clean[0, :BAD_T])


# debug mode: what the chunks cannot keep apart is refused, naming the tensor and the token


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("poisoned", ["q", "k", "v"])
def test_debug_mode_names_a_non_finite_input(poisoned, backend, configure):
    configure(backend=backend, debug=True)
    x, slope = _inputs()
    x[poisoned][0, 57, 1, 2] = float("nan")
    with pytest.raises(ValueError, match=rf"{poisoned} is not finite at token 57 \(batch 0, head 1\)"):
        la.lightning_attn(x["q"], x["k"], x["v"], slope)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_debug_mode_names_a_non_finite_output_gradient(backend, configure):
    configure(backend=backend, debug=True)
    x, slope = _inputs()
    leaves = [x[n].requires_grad_() for n in ("q", "k", "v")]
    o, _ = la.lightning_attn(*leaves, slope)
    do = x["do"].clone()
    do[0, 71, 0, 5] = float("inf")
    with pytest.raises(ValueError, match=r"do \(the gradient of o\) is not finite at token 71 \(batch 0, head 0\)"):
        torch.autograd.grad(o, leaves, do)


def test_debug_mode_names_the_packed_sequence_and_the_initial_state(configure):
    configure(debug=True)
    x, slope = _inputs()
    cu = torch.tensor([0, 30, T])
    x["v"][0, 45, 0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"v is not finite at token 45 of the packed row \(sequence 1, its token 15"):
        la.lightning_attn(x["q"], x["k"], x["v"], slope, cu_seqlens=cu)
    x, slope = _inputs()
    h0 = torch.zeros(2, H, K, V)
    h0[1, 1, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="initial_state is not finite for sequence 1, head 1"):
        la.lightning_attn(x["q"], x["k"], x["v"], slope, cu_seqlens=cu, initial_state=h0)


def test_debug_mode_off_runs_non_finite_inputs(configure):
    """Outside debug mode nothing reads the data: a non-finite input is computed with, as above."""
    configure(debug=False)
    x, slope = _inputs()
    x["v"][0, 57] = float("nan")
    o, _ = la.lightning_attn(x["q"], x["k"], x["v"], slope)
    assert torch.isnan(o[0, 57:]).all()


# overflow: no decay and large k, v take the float32 state past its range


def _overflowing(T_total=96, big_from=70):
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.rand(1, T_total, H, 16, generator=g) + 0.5 for _ in range(3))
    k[0, big_from:] *= 1e19  # k v ~ 1e38 per token from here: the undecayed state passes float32's 3.4e38
    v[0, big_from:] *= 1e19
    return q, k, v


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_debug_mode_reports_an_overflow_and_where(backend, configure):
    q, k, v = _overflowing()
    configure(backend=backend, debug=False)
    o, _ = la.lightning_attn(q, k, v)  # silent outside debug mode: the outputs are no longer finite
    first = int((~torch.isfinite(o[0])).any(dim=(1, 2)).nonzero()[0])
    assert 70 <= first < 96 and torch.isfinite(o[0, :first]).all()
    configure(debug=True)
    with pytest.raises(ValueError, match=rf"overflow: .* first at token {first} .* within tokens 0\.\.{first} "):
        la.lightning_attn(q, k, v)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_debug_mode_guards_a_decode_step(backend, configure):
    """Non-finite inputs are refused before the pool is written; a row whose state overflows at this step is named."""
    configure(backend=backend, debug=True)
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.rand(3, H, 16, generator=g) + 0.5 for _ in range(3))
    pool = torch.zeros(4, H, 16, 16)
    idx = torch.tensor([2, -1, 0])
    bad = k.clone()
    bad[2, 1, 7] = float("nan")
    with pytest.raises(ValueError, match=r"k is not finite at slot 2, head 1"):
        la.lightning_attn_decode(q, bad, v, pool, state_indices=idx)
    assert not pool.any(), "a refused step wrote the pool"
    pool[0] = 3e38  # row 0 (slot 2) is one token away from float32's limit
    with pytest.raises(ValueError, match=r"overflow: .* pool row 0 .* slot 2, head 0"):
        la.lightning_attn_decode(q, k, v, pool, state_indices=idx)
    configure(debug=False)
    pool[0] = 3e38
    o = la.lightning_attn_decode(q, k, v, pool, state_indices=idx)  # outside debug mode: computed, silently
    assert not torch.isfinite(o[2]).all()


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_debug_mode_reports_a_final_state_no_output_reads(backend, configure):
    """The inter-only mode's outputs read the state before their chunk: an overflow in the last chunk shows in the
    final state alone."""
    from lightning_attention.ops.lightning.inter import lightning_attn_inter

    configure(backend=backend, debug=True)
    q, k, v = _overflowing(T_total=96, big_from=70)  # chunks of 32: tokens 64..95 read the state after token 63
    with pytest.raises(ValueError, match="every output are finite but the final state of sequence 0 is not"):
        lightning_attn_inter(q, k, v, chunk_size=32, output_final_state=True)
