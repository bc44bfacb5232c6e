"""lightning_attention.compat.fla against flash-linear-attention's formulas, written out here in float64.

FLA's lightning attention (``fla.ops.lightning_attn``, fla-core 0.6.0) is a decay ``g_gamma = -(8/H · (1 - l/L)) ·
arange(H)`` (float32) fed to its simple-GLA recurrence ``S_t = exp(g_gamma) S_{t-1} + k_tᵀ v_t``, ``o_t = scale ·
q_t S_t`` (scale ``K ** -0.5`` by default), per packed sequence, from the last token backwards with ``reverse``.
:func:`fla_recurrence` writes exactly that, token by token in float64; the compat functions are held to it within
the tolerance of their input dtype, outputs and every gradient. On a GPU, the FLA wheel itself is held to the same
reference next to this library (``pytest -m gpu tests/compat``; skipped when ``fla`` is not importable).
"""

import dataclasses
import inspect

import pytest
import torch

import lightning_attention as la
from lightning_attention.compat.fla import chunk_lightning_attn, fla_slopes, fused_recurrent_lightning_attn
from lightning_attention.utils.testing import assert_close, tolerance

FUNCTIONS = {"chunk": chunk_lightning_attn, "fused_recurrent": fused_recurrent_lightning_attn}


def fla_log_decay(num_heads: int, layer_idx: int, num_layers: int) -> torch.Tensor:
    """FLA's ``g_gamma`` [H] (float32): the log decay per head, as fla.ops.lightning_attn forms it."""
    return -(8 / num_heads * (1 - layer_idx / num_layers)) * torch.arange(num_heads, dtype=torch.float)


def fla_recurrence(q, k, v, layer_idx, num_layers, scale=None, h0=None, cu_seqlens=None, reverse=False):
    """FLA's lightning attention in float64, one token at a time: ``(o [B, T, H, V], final [N, H, K, V])``.

    q, k ``[B, T, H, K]``, v ``[B, T, H, V]``, h0 ``[N, H, K, V]`` (any float dtype: FLA reads it as float32),
    cu_seqlens a list of N + 1 offsets (B == 1). Differentiable (autograd through the loop).
    """
    q, k, v = (x.double() for x in (q, k, v))
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K**-0.5 if scale is None else scale
    decay = torch.exp(fla_log_decay(H, layer_idx, num_layers).double())[:, None, None]  # [H, 1, 1]
    if cu_seqlens is None:
        sequences = [(b, 0, T) for b in range(B)]
    else:
        sequences = [(0, start, end) for start, end in zip(cu_seqlens[:-1], cu_seqlens[1:])]
    rows, finals = {}, []
    for n, (b, start, end) in enumerate(sequences):
        state = torch.zeros(H, K, V, dtype=torch.float64) if h0 is None else h0[n].float().double()
        for t in reversed(range(start, end)) if reverse else range(start, end):
            state = decay * state + k[b, t, :, :, None] * v[b, t, :, None, :]
            rows[b, t] = scale * torch.einsum("hk,hkv->hv", q[b, t], state)
        finals.append(state)
    if T == 0:
        o = torch.zeros(B, 0, H, V, dtype=torch.float64)
    else:
        o = torch.stack([torch.stack([rows[b, t] for t in range(T)]) for b in range(B)])
    return o, torch.stack(finals)


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    function: str  # "chunk" or "fused_recurrent"
    batch: int
    length: int  # T (the packed length with cu_seqlens)
    heads: int
    dim_k: int
    dim_v: int
    layer_idx: int
    num_layers: int
    dtype: torch.dtype = torch.float32
    scale: float | None = None  # None: FLA's default K ** -0.5
    cu_seqlens: tuple[int, ...] | None = None
    reverse: bool = False
    initial_state: bool = True
    output_final_state: bool = True


VARLEN = (0, 0, 1, 16, 36)  # sequence lengths 0, 1, 15 and 20
CASES = [
    Case("dense", "chunk", 2, 37, 3, 16, 24, layer_idx=1, num_layers=4),
    Case("dense_recurrent", "fused_recurrent", 2, 37, 3, 16, 24, layer_idx=1, num_layers=4),
    Case("dense_reverse", "fused_recurrent", 2, 37, 3, 16, 24, layer_idx=1, num_layers=4, reverse=True),
    Case("one_token_no_state", "fused_recurrent", 3, 1, 2, 32, 16, 0, 2, initial_state=False, output_final_state=False),
    Case("varlen", "chunk", 1, 36, 2, 16, 16, 0, 3, scale=0.5, cu_seqlens=VARLEN),
    Case("varlen_reverse", "fused_recurrent", 1, 36, 2, 16, 16, 0, 3, scale=0.5, cu_seqlens=VARLEN, reverse=True),
    Case("varlen_reverse_bf16", "fused_recurrent", 1, 36, 4, 32, 32, 0, 2, torch.bfloat16, cu_seqlens=VARLEN,
         reverse=True),
    Case("reverse_bf16", "fused_recurrent", 2, 29, 4, 32, 32, 0, 2, torch.bfloat16, reverse=True),
    # layer_idx == num_layers: FLA's formula gives no decay on any head
    Case("last_layer_index_no_decay", "chunk", 1, 40, 2, 16, 16, layer_idx=3, num_layers=3),
    Case("varlen_all_empty", "fused_recurrent", 1, 0, 2, 16, 16, 1, 2, cu_seqlens=(0, 0, 0), reverse=True),
]


def _inputs(case: Case, seed: int = 0) -> dict:
    """Random inputs of a case, rounded to its dtype; h0 [N, H, K, V] float32 and the loss weights do, dht."""
    gen = torch.Generator().manual_seed(seed)
    B, T, H, K, V = case.batch, case.length, case.heads, case.dim_k, case.dim_v
    N = B if case.cu_seqlens is None else len(case.cu_seqlens) - 1
    return {
        "q": torch.randn(B, T, H, K, generator=gen).to(case.dtype),
        "k": torch.randn(B, T, H, K, generator=gen).to(case.dtype),
        "v": torch.randn(B, T, H, V, generator=gen).to(case.dtype),
        "h0": torch.randn(N, H, K, V, generator=gen) if case.initial_state else None,
        "do": torch.randn(B, T, H, V, generator=gen),
        "dht": torch.randn(N, H, K, V, generator=gen),
    }


def _loss(o, final, x) -> torch.Tensor:
    loss = (o.double() * x["do"].double()).sum()
    return loss if final is None else loss + (final.double() * x["dht"].double()).sum()


def _run(fn, x, case: Case, leaves, cu_seqlens=None, **extra) -> dict:
    """Forward + backward of ``fn`` on the leaves (q, k, v, h0); outputs and gradients by name."""
    q, k, v, h0 = leaves
    args = (q, k, v, case.layer_idx, case.num_layers, case.scale, h0, case.output_final_state)
    if case.reverse:
        extra["reverse"] = True
    o, final = fn(*args, cu_seqlens=cu_seqlens, **extra)
    if not case.output_final_state:
        assert final is None
    grads = torch.autograd.grad(_loss(o, final, x), [t for t in leaves if t is not None], allow_unused=True)
    names = [n for n, t in zip(("dq", "dk", "dv", "dh0"), leaves) if t is not None]
    return {"o": o.detach(), "final": None if final is None else final.detach(), **dict(zip(names, grads))}


def _leaves(x, dtype=None):
    return [None if t is None else t.clone().to(dtype or t.dtype).requires_grad_()
            for t in (x[n] for n in "q k v h0".split())]


def _reference(x, case: Case) -> dict:
    def fn(q, k, v, layer_idx, num_layers, scale, h0, output_final_state, cu_seqlens=None, reverse=False):
        o, final = fla_recurrence(q, k, v, layer_idx, num_layers, scale, h0, case.cu_seqlens, reverse)
        return o, final if output_final_state else None

    return _run(fn, x, case, _leaves(x, torch.float64))


def _check(got: dict, ref: dict, dtype: torch.dtype, case: Case) -> None:
    for name, value in got.items():
        if value is None or ref[name] is None:
            assert value is None and ref[name] is None, name
            continue
        if name == "final":
            assert value.dtype == torch.float32, "final_state must be float32"
        elif name != "dh0":
            assert value.dtype == dtype, f"{name}: dtype {value.dtype}"
        if value.numel() == 0:
            assert value.shape == ref[name].shape, name
            continue
        assert_close(f"{case.name}: {name}", value, ref[name], tolerance(dtype))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_matches_fla_formulas(case):
    x = _inputs(case)
    cu = None if case.cu_seqlens is None else torch.tensor(case.cu_seqlens)
    got = _run(FUNCTIONS[case.function], x, case, _leaves(x), cu_seqlens=cu)
    _check(got, _reference(x, case), case.dtype, case)


def test_triton_backend_varlen_reverse(configure):
    """The same on the Triton kernels (interpreter on CPU), with int32 offsets and their host copy."""
    configure(backend="triton")
    case = dataclasses.replace(CASES[5], name="varlen_reverse_triton", length=36)
    x = _inputs(case, seed=1)
    cu = torch.tensor(case.cu_seqlens, dtype=torch.int32)
    got = _run(fused_recurrent_lightning_attn, x, case, _leaves(x), cu_seqlens=cu, cu_seqlens_cpu=cu.clone())
    _check(got, _reference(x, case), case.dtype, case)


def test_reverse_is_the_forward_recurrence_of_the_reversed_sequence():
    """Independent of the reference: reversing time twice is the identity, and reverse=False == chunk."""
    case = CASES[2]
    x = _inputs(case, seed=2)
    o_rev, ht_rev = fused_recurrent_lightning_attn(x["q"], x["k"], x["v"], 1, 4, None, x["h0"], True, reverse=True)
    flipped = [x[n].flip(1) for n in ("q", "k", "v")]
    o_fwd, ht_fwd = chunk_lightning_attn(*flipped, 1, 4, None, x["h0"], True)
    torch.testing.assert_close(o_rev, o_fwd.flip(1), rtol=0, atol=0)
    torch.testing.assert_close(ht_rev, ht_fwd, rtol=0, atol=0)


def test_initial_state_in_half_precision_is_read_as_float32():
    """Like FLA: a bf16 h0 is accepted, its gradient comes back in bf16."""
    case = dataclasses.replace(CASES[0], name="bf16_h0")
    x = _inputs(case, seed=3)
    x["h0"] = x["h0"].to(torch.bfloat16)
    got = _run(chunk_lightning_attn, x, case, _leaves(x))
    assert got["dh0"].dtype == torch.bfloat16
    _check({k: v for k, v in got.items() if k != "dh0"}, _reference(x, case), torch.float32, case)
    assert_close("dh0 (bf16 h0)", got["dh0"], _reference(x, case)["dh0"], tolerance(torch.bfloat16))


def test_default_scale_is_inverse_sqrt_of_k():
    q, k, v = (torch.randn(1, 9, 2, d) for d in (16, 16, 8))
    o_default, _ = chunk_lightning_attn(q, k, v, 0, 2)
    o_explicit, _ = chunk_lightning_attn(q, k, v, 0, 2, scale=16**-0.5)
    o_one, _ = chunk_lightning_attn(q, k, v, 0, 2, scale=1.0)
    torch.testing.assert_close(o_default, o_explicit, rtol=0, atol=0)
    torch.testing.assert_close(o_one, o_default * 4, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("num_heads", [1, 2, 3, 8, 12, 16, 20, 32, 64])
def test_slopes_are_fla_bit_for_bit_and_paper_slopes_within_two_ulp(num_heads):
    """fla_slopes == -g_gamma of FLA exactly; head 0 never decays; paper_slopes (one rounding) agrees to 2 ulp."""
    for num_layers in (1, 2, 3, 7, 12, 24, 48):
        for layer_idx in range(num_layers + 1):
            slopes = fla_slopes(num_heads, layer_idx, num_layers)
            assert slopes.dtype == torch.float32 and slopes.shape == (num_heads,)
            assert torch.equal(slopes, -fla_log_decay(num_heads, layer_idx, num_layers)), (layer_idx, num_layers)
            assert slopes[0] == 0
            if layer_idx < num_layers:
                paper = la.paper_slopes(num_heads, layer_idx, num_layers)
                ulp = torch.finfo(torch.float32).eps * paper.abs()
                assert bool(((slopes - paper).abs() <= 2 * ulp).all()), (layer_idx, num_layers)
            else:
                assert not slopes.any()


def test_signatures_are_flas():
    """FLA's parameter names, order and defaults (fla-core 0.6.0), then this library's keyword-only extras."""
    common = [("q", None), ("k", None), ("v", None), ("layer_idx", None), ("num_layers", None), ("scale", None),
              ("initial_state", None), ("output_final_state", False)]
    expected = {
        "chunk": common + [("cu_seqlens", None)],
        "fused_recurrent": common + [("reverse", False), ("cu_seqlens", None)],
    }
    for name, fn in FUNCTIONS.items():
        params = inspect.signature(fn).parameters.values()
        positional = [(p.name, None if p.default is p.empty else p.default) for p in params
                      if p.kind == p.POSITIONAL_OR_KEYWORD]
        assert positional == expected[name], name
        assert all(p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY, p.VAR_KEYWORD) for p in params)


def test_positional_call_and_return_convention():
    x = _inputs(CASES[4])
    cu = torch.tensor(VARLEN)
    out = chunk_lightning_attn(x["q"], x["k"], x["v"], 0, 3, 0.5, x["h0"], True, cu)
    assert isinstance(out, tuple) and len(out) == 2 and out[1].shape == x["h0"].shape
    o, final = fused_recurrent_lightning_attn(x["q"], x["k"], x["v"], 0, 3, 0.5, x["h0"], False, True, cu)
    assert final is None and o.shape == (1, 36, 2, 16)


def test_chunk_size_is_accepted_like_fla():
    q = k = v = torch.randn(1, 20, 2, 16)
    torch.testing.assert_close(
        chunk_lightning_attn(q, k, v, 0, 2, chunk_size=32)[0], chunk_lightning_attn(q, k, v, 0, 2)[0]
    )
    chunk_lightning_attn(q, k, v, 0, 2, head_first=False)  # the only layout: accepted


BAD_CALLS = [
    ("chunk_size_not_power_of_two", chunk_lightning_attn, {"chunk_size": 48}, ValueError,
     "chunk_size must be a power of 2"),
    ("head_first", chunk_lightning_attn, {"head_first": True}, ValueError, r"head_first=True .* \[B, T, H, K\]"),
    ("reverse_on_chunk", chunk_lightning_attn, {"reverse": True}, TypeError, "reverse.*fused_recurrent_lightning_attn"),
    ("unknown_keyword", chunk_lightning_attn, {"state_v_first": True}, TypeError, "unexpected keyword.*state_v_first"),
    ("unknown_keyword_recurrent", fused_recurrent_lightning_attn, {"chunk_size": 64}, TypeError, "chunk_size"),
    ("layer_beyond_num_layers", chunk_lightning_attn, {"layer_idx": 5}, ValueError,
     r"layer_idx must be in \[0, num_layers\] = \[0, 4\]"),
    ("negative_layer", fused_recurrent_lightning_attn, {"layer_idx": -1}, ValueError, "layer_idx must be in"),
    ("float_layer", chunk_lightning_attn, {"layer_idx": 1.0}, TypeError, "layer_idx must be an int"),
    ("bool_num_layers", chunk_lightning_attn, {"num_layers": True}, TypeError, "num_layers must be an int"),
    ("zero_layers", chunk_lightning_attn, {"layer_idx": 0, "num_layers": 0}, ValueError, "num_layers must be >= 1"),
    ("reverse_not_bool", fused_recurrent_lightning_attn, {"reverse": 1}, TypeError, "reverse must be a bool"),
    ("q_not_4d", chunk_lightning_attn, {"q": torch.randn(8, 2, 16)}, ValueError,
     r"q must have 4 dimensions \[B, T, H, K\]"),
    ("varlen_batch", fused_recurrent_lightning_attn, {"cu_seqlens": torch.tensor([0, 8]), "reverse": True},
     ValueError, "B == 1"),
    ("varlen_float_offsets", fused_recurrent_lightning_attn, {"cu_seqlens": torch.tensor([0.0, 8.0]), "reverse": True},
     TypeError, "cu_seqlens must be int32 or int64"),
    ("h0_count", chunk_lightning_attn, {"initial_state": torch.zeros(3, 2, 16, 16)}, ValueError, "initial_state"),
]


@pytest.mark.parametrize("fn, changes, error, match", [c[1:] for c in BAD_CALLS], ids=[c[0] for c in BAD_CALLS])
def test_bad_calls_raise_clear_errors(fn, changes, error, match):
    q = torch.randn(2, 8, 2, 16)
    kwargs = {"q": q, "k": q, "v": q, "layer_idx": 1, "num_layers": 4, **changes}
    with pytest.raises(error, match=match):
        fn(**kwargs)


GPU_CASES = [
    pytest.param("chunk", None, False, id="chunk"),
    pytest.param("fused_recurrent", None, False, id="fused_recurrent"),
    pytest.param("fused_recurrent", None, True, id="fused_recurrent_reverse"),
    pytest.param("chunk", (0, 0, 1, 16, 150, 301), False, id="chunk_varlen"),
    pytest.param("fused_recurrent", (0, 0, 1, 16, 150, 301), True, id="fused_recurrent_varlen_reverse"),
]


def _fla_unchecked(function: str, cu_seqlens) -> set:
    """What of FLA's result is not compared: FLA 0.6's chunk returns non-finite final states for two of this packing's
    sequences on an H100 (its outputs agree with the reference); this module's final states are checked there as
    everywhere."""
    return {"final"} if function == "chunk" and cu_seqlens is not None else set()


@pytest.fixture
def fla_untuned(monkeypatch):
    """FLA's autotuned kernels launch their first candidate configuration, unmeasured: this module compares values,
    which every candidate computes alike, and autotuning FLA's kernels from an empty cache made each case take
    minutes on a fresh GPU machine. This library's own kernels tune as they do everywhere."""
    from triton.runtime.autotuner import Autotuner

    prune = Autotuner.prune_configs

    def first_for_fla(self, kwargs, *args, **kw):
        configs = prune(self, kwargs, *args, **kw)
        module = getattr(getattr(self, "base_fn", None), "__module__", "") or ""
        return configs[:1] if module.split(".")[0] == "fla" else configs

    monkeypatch.setattr(Autotuner, "prune_configs", first_for_fla)


# one xdist worker takes every case: one after another in one process they took 37 s on an H200, where five workers
# running them side by side took 183-294 s each (docs/performance.md, "Producing a run")
@pytest.mark.gpu
@pytest.mark.xdist_group("fla")
@pytest.mark.parametrize("function, cu_seqlens, reverse", GPU_CASES)
def test_matches_fla_wheel_on_cuda_bf16(function, cu_seqlens, reverse, fla_untuned):
    """FLA's own functions and this module, on the same bf16 CUDA inputs, each against the float64 recurrence.

    Both must be within the bf16 tolerance: FLA's result confirms the reference is FLA's function, this module's
    result is then FLA's function too (two bf16 results are never compared with each other).
    """
    fla_ops = pytest.importorskip("fla.ops.lightning_attn")
    theirs = {"chunk": fla_ops.chunk_lightning_attn, "fused_recurrent": fla_ops.fused_recurrent_lightning_attn}
    B = 2 if cu_seqlens is None else 1
    T = 301 if cu_seqlens is None else cu_seqlens[-1]
    case = Case(f"gpu_{function}", function, B, T, 4, 64, 64, layer_idx=2, num_layers=6, dtype=torch.bfloat16,
                cu_seqlens=cu_seqlens, reverse=reverse)
    x = _inputs(case, seed=4)
    ref = _reference(x, case)
    x_cuda = {n: None if t is None else t.cuda() for n, t in x.items()}
    cu = None if cu_seqlens is None else torch.tensor(cu_seqlens, dtype=torch.long, device="cuda")
    for who, fn in (("fla", theirs[function]), ("lightning_attention", FUNCTIONS[function])):
        got = _run(fn, x_cuda, case, _leaves(x_cuda), cu_seqlens=cu)
        if who == "fla":
            got = {name: value for name, value in got.items() if name not in _fla_unchecked(function, cu_seqlens)}
        _check(got, ref, torch.bfloat16, dataclasses.replace(case, name=f"{who} {function}"))
