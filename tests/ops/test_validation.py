"""Every bad input of the public functions raises ValueError/TypeError naming the argument (one case each)."""

import numpy as np
import pytest
import torch

import lightning_attention as la
from lightning_attention import settings
from lightning_attention.compat.fla import chunk_lightning_attn
from lightning_attention.distributed import lightning_attn_sp
from lightning_attention.ops.hybrid import HybridDecodeState, hybrid_chunk_attn, hybrid_chunk_attn_decode
from lightning_attention.ops.lightning.inter import lightning_attn_inter
from lightning_attention.ops.normalized import new_normalized_state, normalized_linear_attn_decode

B, T, H, K, V = 2, 8, 3, 16, 24


def good():
    return dict(
        q=torch.randn(B, T, H, K),
        k=torch.randn(B, T, H, K),
        v=torch.randn(B, T, H, V),
        slope=torch.rand(H),
    )


def packed():
    d = good()
    d = {name: (x[:1] if name != "slope" else x) for name, x in d.items()}
    return d


CASES = [
    # (id, overrides applied to good() or packed(), keyword args, error type, message fragment)
    ("q-not-tensor", dict(q=[[1.0]]), {}, TypeError, "q must be a torch.Tensor"),
    ("q-rank", dict(q=torch.randn(B, T, H * K)), {}, ValueError, "q must have 4 dimensions"),
    ("v-rank", dict(v=torch.randn(B, T, H)), {}, ValueError, "v must have 4 dimensions"),
    ("q-int-dtype", dict(q=torch.ones(B, T, H, K, dtype=torch.int32)), {}, TypeError, "q must be float16"),
    ("k-dtype-mismatch", dict(k=torch.randn(B, T, H, K, dtype=torch.float16)), {}, TypeError, "k must have the dtype"),
    ("v-dtype-mismatch", dict(v=torch.randn(B, T, H, V).bfloat16()), {}, TypeError, "v must have the dtype"),
    ("k-shape", dict(k=torch.randn(B, T, H, K + 1)), {}, ValueError, "k must have the shape of q"),
    ("v-heads", dict(v=torch.randn(B, T, H + 1, V)), {}, ValueError, "v must have shape"),
    ("v-length", dict(v=torch.randn(B, T + 1, H, V)), {}, ValueError, "v must have shape"),
    ("slope-shape", dict(slope=torch.rand(H, 1, 1)), {}, ValueError, "slope must have shape"),
    ("slope-heads", dict(slope=torch.rand(H + 1)), {}, ValueError, "slope must have shape"),
    ("slope-int", dict(slope=torch.ones(H, dtype=torch.int64)), {}, TypeError, "slope must be a floating"),
    ("slope-negative", dict(slope=torch.tensor([0.1, -0.5, 0.0])), {}, ValueError, "slope must be >= 0"),
    ("slope-nan", dict(slope=torch.tensor([0.1, float("nan"), 0.0])), {}, ValueError, "slope must be finite"),
    ("slope-inf", dict(slope=torch.tensor([0.1, float("inf"), 0.0])), {}, ValueError, "slope must be finite"),
    # finite in float64, inf in the float32 the kernels read
    ("slope-f64-overflow", dict(slope=torch.tensor([0.1, 1e300, 0.0], dtype=torch.float64)), {}, ValueError,
     "slope must be finite in float32"),
    # finite in float32, but slope·log2(e) is not: the kernels' own token would get inf·0 = NaN
    ("slope-too-large", dict(slope=torch.tensor([0.1, 3e38, 0.0])), {}, ValueError, r"slope must be <= 1e\+38"),
    ("slope-not-tensor", dict(slope=[0.1, 0.2, 0.3]), {}, TypeError, "slope must be a torch.Tensor"),
    ("scale-nan", {}, dict(scale=float("nan")), ValueError, "scale must be finite"),
    ("scale-inf", {}, dict(scale=float("inf")), ValueError, "scale must be finite"),
    ("backward-not-str", {}, dict(backward=["chunk"]), ValueError, "backward must be one of"),
    ("scale-tensor", {}, dict(scale=torch.tensor(1.0)), TypeError, "scale must be a Python float"),
    ("output-final-state", {}, dict(output_final_state=1), TypeError, "output_final_state must be a bool"),
    ("backward-value", {}, dict(backward="fused"), ValueError, "backward must be one of"),
    ("h0-shape", {}, dict(initial_state=torch.zeros(B, H, V, K)), ValueError, "initial_state must have shape"),
    ("h0-batch", {}, dict(initial_state=torch.zeros(B + 1, H, K, V)), ValueError, "initial_state must have shape"),
    ("h0-dtype", {}, dict(initial_state=torch.zeros(B, H, K, V).bfloat16()), TypeError,
     "initial_state must be float32"),
    ("cu-needs-b1", {}, dict(cu_seqlens=torch.tensor([0, T])), ValueError, "requires a packed batch"),
    ("cu-cpu-alone", {}, dict(cu_seqlens_cpu=torch.tensor([0, T])), ValueError, "cu_seqlens_cpu was given"),
]

PACKED_CASES = [
    ("cu-dtype", dict(cu_seqlens=torch.tensor([0.0, T])), TypeError, "cu_seqlens must be int32 or int64"),
    ("cu-rank", dict(cu_seqlens=torch.tensor([[0, T]])), ValueError, "cu_seqlens must have shape"),
    ("cu-start", dict(cu_seqlens=torch.tensor([1, T])), ValueError, "cu_seqlens must start at 0"),
    ("cu-decreasing", dict(cu_seqlens=torch.tensor([0, 5, 3, T])), ValueError, "cu_seqlens must be non-decreasing"),
    ("cu-end", dict(cu_seqlens=torch.tensor([0, 3, T - 1])), ValueError, "cu_seqlens must end at T"),
    (
        "cu-cpu-end",
        dict(cu_seqlens=torch.tensor([0, 3, T]), cu_seqlens_cpu=torch.tensor([0, 3, T - 1])),
        ValueError,
        "cu_seqlens_cpu must end at T",
    ),
    (
        "cu-cpu-dtype",
        dict(cu_seqlens=torch.tensor([0, 3, T]), cu_seqlens_cpu=torch.tensor([0.0, 3.0, T])),
        TypeError,
        "cu_seqlens_cpu must be int32 or int64",
    ),
    (
        "cu-cpu-shape",
        dict(cu_seqlens=torch.tensor([0, 3, T]), cu_seqlens_cpu=torch.tensor([0, T])),
        ValueError,
        "cu_seqlens_cpu must have the shape of cu_seqlens",
    ),
    (
        "cu-cpu-not-tensor",
        dict(cu_seqlens=torch.tensor([0, 3, T]), cu_seqlens_cpu=[0, 3, T]),
        TypeError,
        "cu_seqlens_cpu must be a torch.Tensor",
    ),
    (
        # both are host data on CPU tensors: always compared (on CUDA tensors in debug mode)
        "cu-disagrees-with-cpu-copy",
        dict(cu_seqlens=torch.tensor([0, 3, T]), cu_seqlens_cpu=torch.tensor([0, 5, T])),
        ValueError,
        "cu_seqlens must equal cu_seqlens_cpu",
    ),
    (
        "h0-varlen-count",
        dict(cu_seqlens=torch.tensor([0, 3, T]), initial_state=torch.zeros(3, H, K, V)),
        ValueError,
        "initial_state must have shape",
    ),
]


@pytest.mark.parametrize("name,overrides,kwargs,error,fragment", CASES, ids=[c[0] for c in CASES])
def test_lightning_attn_rejects(name, overrides, kwargs, error, fragment):
    args = good()
    args.update(overrides)
    with pytest.raises(error, match=fragment):
        la.lightning_attn(args["q"], args["k"], args["v"], args["slope"], **kwargs)


@pytest.mark.parametrize("name,kwargs,error,fragment", PACKED_CASES, ids=[c[0] for c in PACKED_CASES])
def test_lightning_attn_rejects_varlen(name, kwargs, error, fragment):
    args = packed()
    with pytest.raises(error, match=fragment):
        la.lightning_attn(args["q"], args["k"], args["v"], args["slope"], **kwargs)


def decode_args(P=4):
    return dict(
        q=torch.randn(3, H, K),
        k=torch.randn(3, H, K),
        v=torch.randn(3, H, V),
        state=torch.zeros(P, H, K, V),
    )


DECODE_CASES = [
    ("q-rank", dict(q=torch.randn(3, 1, H, K)), {}, ValueError, "q must have 3 dimensions"),
    ("v-batch", dict(v=torch.randn(2, H, V)), {}, ValueError, "v must have shape"),
    ("state-dtype", dict(state=torch.zeros(4, H, K, V).half()), {}, TypeError, "state must be float32"),
    ("state-shape", dict(state=torch.zeros(4, H, V, K)), {}, ValueError, "state must have shape"),
    ("state-rows", dict(state=torch.zeros(4, H, K, V)), {}, ValueError, "P == B"),
    ("slope", {}, dict(slope=torch.tensor([1.0, -1.0, 0.0])), ValueError, "slope must be >= 0"),
    ("indices-dtype", {}, dict(state_indices=torch.tensor([0.0, 1.0, 2.0])), TypeError, "state_indices must be int"),
    ("indices-shape", {}, dict(state_indices=torch.tensor([0, 1])), ValueError, "state_indices must have shape"),
    ("indices-range", {}, dict(state_indices=torch.tensor([0, 4, -1])), ValueError, "state_indices must be in"),
    ("indices-below", {}, dict(state_indices=torch.tensor([0, -2, 1])), ValueError, "state_indices must be in"),
    ("indices-dup", {}, dict(state_indices=torch.tensor([1, 1, -1])), ValueError, "must not repeat"),
    ("out-dtype", {}, dict(out=torch.zeros(3, H, V).half()), TypeError, "out must have the dtype"),
    ("out-shape", {}, dict(out=torch.zeros(3, H, K + 1)), ValueError, "out must have shape"),
    ("scale", {}, dict(scale="1"), TypeError, "scale must be a Python float"),
]


# written tensors that share memory with another argument, or are expanded views: (id, change of decode_args() and
# the keyword arguments, message fragment)
MEMORY_CASES = [
    ("out-is-v", lambda a: {"out": a["v"]}, "out must not share memory with v"),
    ("out-overlaps-q", lambda a: a.update(q=(o := torch.zeros(3, H, V))[..., :K]) or {"out": o},
     "out must not share memory with q"),
    ("out-inside-state", lambda a: {"out": a["state"][:3, :, 0, :]}, "out must not share memory with state"),
    ("state-overlaps-k", lambda a: a.update(k=a["state"][:3, :, :, 0]) or {}, "state must not share memory with k"),
    ("state-expanded", lambda a: a.update(state=torch.zeros(1, H, K, V).expand(4, H, K, V)) or {},
     r"state must not be an expanded \(stride-0\) view"),
    ("out-expanded", lambda a: {"out": torch.zeros(1, H, V).expand(3, H, V)}, r"out must not be an expanded"),
]


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("name,change,fragment", MEMORY_CASES, ids=[c[0] for c in MEMORY_CASES])
def test_decode_rejects_shared_or_expanded_outputs(name, change, fragment, backend, configure):
    """Checked before anything is written: the pool and the inputs are untouched afterwards."""
    configure(backend=backend)
    args = decode_args()
    kwargs = change(args)
    before = {n: x.clone() for n, x in args.items()}
    with pytest.raises(ValueError, match=fragment):
        la.lightning_attn_decode(args["q"], args["k"], args["v"], args["state"],
                                 state_indices=torch.tensor([0, 2, -1]), **kwargs)  # fmt: skip
    for n, x in args.items():
        assert torch.equal(x, before[n]), f"{n} was written"


def test_decode_checks_memory_on_every_call_of_a_remembered_signature():
    """The structural checks of a signature are remembered; the address ranges are compared on every call."""
    args = decode_args()
    idx = torch.tensor([0, 2, -1])
    out = torch.zeros(3, H, V)
    for _ in range(2):  # the second call has the pointers of the last one that passed: compared as one tuple
        la.lightning_attn_decode(args["q"], args["k"], args["v"], args["state"], state_indices=idx, out=out)
    with pytest.raises(ValueError, match="out must not share memory with v"):  # same shapes, strides, dtypes
        la.lightning_attn_decode(args["q"], args["k"], args["v"], args["state"], state_indices=idx, out=args["v"])


@pytest.mark.parametrize("name,overrides,kwargs,error,fragment", DECODE_CASES, ids=[c[0] for c in DECODE_CASES])
def test_decode_rejects(name, overrides, kwargs, error, fragment):
    args = decode_args()
    args.update(overrides)
    if "state_indices" not in kwargs and name != "state-rows":
        kwargs = dict(kwargs, state_indices=torch.tensor([0, 2, -1]))
    with pytest.raises(error, match=fragment):
        la.lightning_attn_decode(args["q"], args["k"], args["v"], args["state"], **kwargs)


# the other public functions

FUNC_CASES = [
    ("q-rank", lambda q, k, v: la.lightning_attn_func(q[0], k, v), ValueError,
     r"q must have 4 dimensions \[b, h, n, d\]"),
    ("v-heads", lambda q, k, v: la.lightning_attn_func(q, k, v[:, :1]), ValueError,
     r"v must have shape .*\[b, h, n, e\]"),
    ("s-int", lambda q, k, v: la.lightning_attn_func(q, k, v, torch.ones(H, dtype=torch.int64)), TypeError,
     "s must be a floating-point tensor"),
    ("s-shape", lambda q, k, v: la.lightning_attn_func(q, k, v, torch.rand(1, H)), ValueError,
     r"s must have shape \[h\] or \[h, 1, 1\]"),
    ("s-negative", lambda q, k, v: la.lightning_attn_func(q, k, v, -torch.rand(H, 1, 1)), ValueError, "s must be >= 0"),
    ("s-not-tensor", lambda q, k, v: la.lightning_attn_func(q, k, v, [0.1] * H), TypeError, "s must be a torch.Tensor"),
]


@pytest.mark.parametrize("name,call,error,fragment", FUNC_CASES, ids=[c[0] for c in FUNC_CASES])
def test_lightning_attn_func_rejects(name, call, error, fragment):
    q, k = (torch.randn(B, H, T, K) for _ in range(2))
    with pytest.raises(error, match=fragment):
        call(q, k, torch.randn(B, H, T, V))


RECIPE_CASES = [
    ("layer-float", (4, 1.5, 4), TypeError, "layer_idx must be an int, got float"),
    ("heads-bool", (True, 0, 4), TypeError, "num_heads must be an int, got bool"),
    ("heads-float", (4.0, 0, 4), TypeError, "num_heads must be an int, got float"),
    ("heads-str", ("4", 0, 4), TypeError, "num_heads must be an int, got str"),
    ("heads-zero", (0, 0, 4), ValueError, "num_heads must be >= 1"),
    ("layers-zero", (4, 0, 0), ValueError, "num_layers must be >= 1"),
    ("layers-float", (4, 0, 4.0), TypeError, "num_layers must be an int"),
    ("layer-range", (4, 4, 4), ValueError, r"layer_idx must be in \[0, num_layers\)"),
    ("layer-negative", (4, -1, 4), ValueError, r"layer_idx must be in \[0, num_layers\)"),
]


@pytest.mark.parametrize("recipe", [la.tnl_slopes, la.paper_slopes], ids=["tnl", "paper"])
@pytest.mark.parametrize("name,args,error,fragment", RECIPE_CASES, ids=[c[0] for c in RECIPE_CASES])
def test_slope_recipes_reject(name, args, error, fragment, recipe):
    with pytest.raises(error, match=fragment):
        recipe(*args)


@pytest.mark.parametrize("recipe", [la.tnl_slopes, la.paper_slopes], ids=["tnl", "paper"])
def test_slope_recipes_take_any_integer(recipe):
    """NumPy and 0-d tensor integers are integers (``__index__``)."""
    assert torch.equal(recipe(np.int64(6), torch.tensor(1), 3), recipe(6, 1, 3))


OTHER_CASES = [
    ("inter-chunk-float", lambda q, k, v, s: lightning_attn_inter(q, k, v, s, chunk_size=16.0), TypeError,
     "chunk_size must be an int"),
    ("inter-chunk-bool", lambda q, k, v, s: lightning_attn_inter(q, k, v, s, chunk_size=True), TypeError,
     "chunk_size must be an int, got bool"),
    ("inter-chunk-zero", lambda q, k, v, s: lightning_attn_inter(q, k, v, s, chunk_size=0), ValueError,
     "chunk_size must be >= 1"),
    ("hybrid-softmax-scale",
     lambda q, k, v, s: hybrid_chunk_attn(q, k, v, s, chunk_size=4, softmax_scale=torch.tensor(1.0)), TypeError,
     "softmax_scale must be a Python float"),
    ("fla-layer-float", lambda q, k, v, s: chunk_lightning_attn(q, k, v, 0.5, 4), TypeError,
     "layer_idx must be an int"),
    ("fla-q-not-tensor", lambda q, k, v, s: chunk_lightning_attn(q.tolist(), k, v, 0, 4), TypeError,
     "q must be a torch.Tensor"),
]


@pytest.mark.parametrize("name,call,error,fragment", OTHER_CASES, ids=[c[0] for c in OTHER_CASES])
def test_other_entry_points_reject(name, call, error, fragment):
    args = good()
    with pytest.raises(error, match=fragment):
        call(args["q"], args["k"], args["v"], args["slope"])


def test_sequence_parallel_rejects_a_group_that_is_not_one():
    """With torch.distributed initialised (one gloo process here), ``group`` must be a ProcessGroup."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        args = good()
        with pytest.raises(TypeError, match="group must be a torch.distributed ProcessGroup or None, got str"):
            lightning_attn_sp(args["q"], args["k"], args["v"], args["slope"], group="world")
    finally:
        dist.destroy_process_group()


def _normalized_step(change):
    q, k = (torch.rand(3, H, K) for _ in range(2))
    v = torch.randn(3, H, V)
    state = new_normalized_state(4, H, K, V)
    args = dict(q=q, k=k, v=v, state=state, state_indices=torch.tensor([0, 2, -1]))
    change(args)
    return lambda: normalized_linear_attn_decode(**args)


def _hybrid_step(change):
    q, k = (torch.randn(2, H, K) for _ in range(2))
    v = torch.randn(2, H, V)
    args = dict(q=q, k=k, v=v, cache=HybridDecodeState.empty(2, H, K, V, K, chunk_size=4))
    change(args)
    return lambda: hybrid_chunk_attn_decode(**args)


DECODE_VARIANT_CASES = [
    ("normalized-k-dtype", _normalized_step, lambda a: a.update(k=a["k"].double()), TypeError,
     "k must have the dtype of q"),
    ("normalized-q-not-tensor", _normalized_step, lambda a: a.update(q=a["q"].tolist()), TypeError,
     "q must be a torch.Tensor"),
    ("normalized-out-in-state", _normalized_step, lambda a: a.update(out=a["state"][0][:3, :, 0, :]), ValueError,
     r"out must not share memory with state\[0\] \(S\)"),
    ("normalized-state-expanded", _normalized_step,
     lambda a: a.update(state=(torch.zeros(1, H, K, V).expand(4, H, K, V), torch.zeros(4, H, K))), ValueError,
     r"state\[0\] \(S\) must not be an expanded"),
    ("hybrid-cache-type", _hybrid_step, lambda a: a.update(cache=a["cache"].state), TypeError,
     "cache must be a HybridDecodeState"),
    ("hybrid-cache-batch", _hybrid_step, lambda a: a.update(q=a["q"][:1], k=a["k"][:1], v=a["v"][:1]), ValueError,
     r"cache.keys must have shape \(1, 3, 4, 16\)"),
    ("hybrid-cache-pos", _hybrid_step, lambda a: setattr(a["cache"], "pos", 4), ValueError,
     "cache.pos must be < the chunk size 4"),
    ("hybrid-v-rank", _hybrid_step, lambda a: a.update(v=a["v"][None]), ValueError, "v must have 3 dimensions"),
    ("hybrid-scale", _hybrid_step, lambda a: a.update(scale=float("nan")), ValueError, "scale must be finite"),
]


@pytest.mark.parametrize(
    "name,make,change,error,fragment", DECODE_VARIANT_CASES, ids=[c[0] for c in DECODE_VARIANT_CASES]
)
def test_decode_variants_reject(name, make, change, error, fragment):
    step = make(change)
    with pytest.raises(error, match=fragment):
        step()


def test_settings_are_validated():
    """Every variable is read and checked once; a wrong value names the variable."""
    with pytest.raises(ValueError, match="LIGHTNING_ATTENTION_BACKEND"):
        settings.from_environment({"LIGHTNING_ATTENTION_BACKEND": "cuda"})
    with pytest.raises(ValueError, match="LIGHTNING_ATTENTION_SEGMENT_LEN"):
        settings.from_environment({"LIGHTNING_ATTENTION_SEGMENT_LEN": "100"})
    with pytest.raises(ValueError, match="LIGHTNING_ATTENTION_TMA"):
        settings.from_environment({"LIGHTNING_ATTENTION_TMA": "maybe"})
    with pytest.raises(ValueError, match="unknown key"):
        settings.from_environment({"LIGHTNING_ATTENTION_KERNEL_CONFIG": "BT=64,warp_spec=1"})
    with pytest.raises(ValueError, match="LIGHTNING_ATTENTION_BACKEND"):
        with settings.override(backend="cuda"):
            pass
    got = settings.from_environment({
        "LIGHTNING_ATTENTION_BACKEND": "Triton", "LIGHTNING_ATTENTION_DEBUG": "1", "LIGHTNING_ATTENTION_TMA": "0",
        "LIGHTNING_ATTENTION_KERNEL_CONFIG": "BT=32,num_stages=2", "LIGHTNING_ATTENTION_PREPASS_LEN": "0",
        "OTHER": "x",
    })  # fmt: skip
    assert got == settings.Settings(backend="triton", debug=True, tma=False, prepass_len=0,
                                    kernel_config=settings.KernelPin(BT=32, num_stages=2))  # fmt: skip
    # the fused dk/dv walk: the plan's choice unless forced either way
    for text, expected in (("auto", None), ("Auto", None), ("1", True), ("0", False)):
        assert settings.from_environment({"LIGHTNING_ATTENTION_DKDV": text}).fused_dkdv is expected
    assert settings.from_environment({}).fused_dkdv is None
    with pytest.raises(ValueError, match="LIGHTNING_ATTENTION_DKDV"):
        settings.from_environment({"LIGHTNING_ATTENTION_DKDV": "fused"})


def test_removed_variables_warn_once_at_import():
    """A variable that no longer has an effect is named in one warning when the package is imported."""
    import subprocess
    import sys

    env = {"LIGHTNING_ATTENTION_REPLAY": "0", "PATH": "/usr/bin:/bin"}
    code = "import warnings; warnings.simplefilter('always'); import lightning_attention"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("LIGHTNING_ATTENTION_REPLAY is set but no longer has an effect") == 1, proc.stderr


def test_override_is_scoped():
    before = settings.current()
    with settings.override(segment_len=32, kernel_config="BT=64,BV=32") as inside:
        assert settings.current() is inside and inside.segment_len == 32 and inside.kernel_config.BV == 32
    assert settings.current() is before


def test_conftest_poisons_package_allocations():
    """torch.empty* called from inside the package returns NaN during tests, so unwritten outputs cannot pass."""
    namespace = {"__name__": "lightning_attention.probe", "torch": torch}
    exec("def alloc():\n"
         "    return torch.empty(4), torch.empty_like(torch.ones(2)), torch.ones(1).new_empty(3)", namespace)
    for t in namespace["alloc"]():
        assert torch.isnan(t).all()
    outside = torch.empty(4)  # allocations made by the tests themselves are left alone (not checked: arbitrary)
    assert outside.shape == (4,)
