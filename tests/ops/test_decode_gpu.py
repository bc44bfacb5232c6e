"""Decoding on CUDA (`pytest -m gpu tests/ops/test_decode_gpu.py`): the compiled Triton step at real sizes, the
prefill -> pool -> decode hand-off, padding slots, CUDA-graph capture and replay, torch.compile and opcheck.

Every result is compared with float64 from the same rounded inputs (docs/design.md, "Testing discipline"). Timings are
not asserted here: they belong to the benchmark (lightning_attention.bench.decode_timing).
"""

import dataclasses

import pytest
import torch

import lightning_attention as la
from lightning_attention.ops.lightning import decode_triton, naive
from lightning_attention.ops.lightning.decode_validation import check_decode_inputs
from lightning_attention.ops.lightning.launch import Launcher
from lightning_attention.utils.testing import assert_close
from tests.ops.test_naive import make_slope

pytestmark = pytest.mark.gpu

DEV = "cuda"


PREFILL = [
    pytest.param("torch", id="prefill-torch"),
    pytest.param("triton", id="prefill-triton"),
]


@pytest.fixture(autouse=True)
def fast_path(configure):
    # the path under test: Triton on CUDA tensors, no device->host value checks (tests that need others set them)
    configure(backend="auto", debug=False)


def randn(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    return torch.randn(*shape, device=DEV, generator=g).to(dtype)


def step_reference(q, k, v, state_rows, slope, scale):
    """float64 single step: q, k [B, H, K], v [B, H, V], state_rows [B, H, K, V] -> (o [B, H, V], new rows)."""
    s = state_rows.double()
    if slope is not None:
        s = torch.exp(-slope.double())[None, :, None, None] * s
    s = s + torch.einsum("bhk,bhv->bhkv", k.double(), v.double())
    return scale * torch.einsum("bhk,bhkv->bhv", q.double(), s), s


@pytest.mark.parametrize("decay", ["none", "weak", "strong", "mixed"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("prefill_backend", PREFILL)
def test_prefill_then_decode_matches_float64(prefill_backend, dtype, decay, configure):
    B, T, T0, H, K, V, P = 3, 300, 237, 16, 128, 128, 8
    q, k = (randn(B, T, H, K, dtype=dtype, seed=s) for s in (1, 2))
    v = randn(B, T, H, V, dtype=dtype, seed=3)
    k = (k.float() * K**-0.5).to(dtype)  # keeps undecayed heads' outputs O(1) over 300 tokens
    slope = None if decay == "none" else make_slope(decay, H, torch.float32).to(DEV)
    s64 = None if slope is None else slope.double()
    o_ref, s_ref = naive.recurrent_lightning_attn(q.double(), k.double(), v.double(), s64)

    configure(backend=prefill_backend)
    o_full, s_full = la.lightning_attn(q, k, v, slope, output_final_state=True)
    assert_close("o (one call)", o_full, o_ref, dtype)
    assert_close("final_state (one call)", s_full, s_ref, dtype)
    o_pre, ht = la.lightning_attn(q[:, :T0], k[:, :T0], v[:, :T0], slope, output_final_state=True)

    pool = randn(P, H, K, V, seed=4)
    idx = torch.tensor([6, 1, 3], device=DEV, dtype=torch.int32)
    pool[idx.long()] = ht
    spare = [0, 2, 4, 5, 7]
    before = pool[spare].clone()
    configure(backend="triton")
    o_dec = torch.stack(
        [la.lightning_attn_decode(q[:, t], k[:, t], v[:, t], pool, slope, state_indices=idx) for t in range(T0, T)],
        dim=1,
    )
    assert_close("o (prefill)", o_pre, o_ref[:, :T0], dtype)
    assert_close("o (decode)", o_dec, o_ref[:, T0:], dtype)
    assert_close("final_state (decode)", pool[idx.long()], s_ref, dtype)
    assert torch.equal(pool[spare], before)


@pytest.mark.parametrize("prefill_backend", PREFILL)
def test_varlen_prefill_into_pool_then_decode(prefill_backend, configure):
    """Packed prompts of lengths 0, 1, 15, 700 -> pool rows -> 20 decode steps with a padding slot."""
    H, K, V, P, steps = 16, 64, 128, 10, 20
    lengths = [0, 1, 15, 700]
    rows = torch.tensor([9, 2, 5, 0], device=DEV)
    slope = make_slope("mixed", H, torch.float32).to(DEV)
    seqs = [
        tuple(randn(1, n + steps, H, d, dtype=torch.bfloat16, seed=10 * i + j) for j, d in enumerate((K, K, V)))
        for i, n in enumerate(lengths)
    ]
    q, k, v = (torch.cat([s[j][:, :n] for s, n in zip(seqs, lengths)], dim=1) for j in range(3))
    cu = torch.tensor([0] + lengths, device=DEV).cumsum(0)
    pool = randn(P, H, K, V, seed=99)
    spare = [1, 3, 4, 6, 7, 8]
    before = pool[spare].clone()

    configure(backend=prefill_backend)
    o_pre, ht = la.lightning_attn(q, k, v, slope, cu_seqlens=cu, output_final_state=True)
    pool[rows] = ht

    idx = torch.tensor([rows[0], rows[1], -1, rows[2], rows[3]], device=DEV)
    junk = [randn(1, steps, H, d, dtype=torch.bfloat16, seed=7) for d in (K, K, V)]
    dq, dk, dv = (
        torch.cat([seqs[0][j][:, 0:], seqs[1][j][:, 1:], junk[j], seqs[2][j][:, 15:], seqs[3][j][:, 700:]])
        for j in range(3)
    )
    configure(backend="triton")
    out = torch.full((5, H, V), float("nan"), device=DEV, dtype=torch.bfloat16)
    o_dec = []
    for t in range(steps):
        la.lightning_attn_decode(dq[:, t], dk[:, t], dv[:, t], pool, slope, state_indices=idx, out=out)
        o_dec.append(out.clone())
    o_dec = torch.stack(o_dec, dim=1)

    assert torch.equal(o_dec[2], torch.zeros_like(o_dec[2]))
    assert torch.equal(pool[spare], before)
    offsets = cu.tolist()
    for i, (s, n) in enumerate(zip(seqs, lengths)):
        o_ref, s_ref = naive.recurrent_lightning_attn(*(x.double() for x in s), slope.double())
        if n:
            assert_close(f"o prefill seq {i}", o_pre[:, offsets[i] : offsets[i + 1]], o_ref[:, :n], torch.bfloat16)
        assert_close(f"o decode seq {i}", o_dec[i + (i >= 2)][None], o_ref[:, n:], torch.bfloat16)
        assert_close(f"state seq {i}", pool[rows[i]][None], s_ref, torch.bfloat16)


# (batch, K, V, dtype): the benchmark batches at K = V = 128, and the head-dim edge cases
STEP_CASES = [
    (1, 128, 128, torch.bfloat16),
    (8, 128, 128, torch.bfloat16),
    (64, 128, 128, torch.bfloat16),
    (256, 128, 128, torch.bfloat16),
    (64, 128, 128, torch.float16),
    (64, 128, 128, torch.float32),
    (32, 256, 256, torch.bfloat16),
    (8, 256, 48, torch.float32),
    (16, 48, 100, torch.bfloat16),
    (16, 100, 48, torch.float16),
    (4, 16, 16, torch.float32),
    (1024, 64, 64, torch.bfloat16),
]


@pytest.mark.parametrize("batch,K,V,dtype", STEP_CASES, ids=lambda x: str(x).replace("torch.", ""))
def test_step_real_sizes(batch, K, V, dtype, monkeypatch):
    """One step in a pool with spare rows and padding slots, on strided views of a fused projection."""
    H = 16
    P = batch + 5
    fused = randn(batch, H, 2 * K + V, dtype=dtype, seed=1)
    q, k, v = fused[..., :K], fused[..., K : 2 * K], fused[..., 2 * K :]
    slope = la.tnl_slopes(H, 0, 12).to(DEV)
    pool = randn(P, H, K, V, seed=2)
    before = pool.clone()
    perm = torch.randperm(P, device=DEV)[:batch]
    idx = torch.where(torch.arange(batch, device=DEV) % 7 == 3, -1, perm)  # some padding slots
    live = idx >= 0
    o = la.lightning_attn_decode(q, k, v, pool, slope, scale=K**-0.5, state_indices=idx)
    o_ref, s_ref = step_reference(q[live], k[live], v[live], before[idx[live]], slope, K**-0.5)
    assert_close("o", o[live], o_ref, dtype)
    assert_close("state", pool[idx[live]], s_ref, torch.float32)
    assert torch.equal(o[~live], torch.zeros_like(o[~live]))
    untouched = torch.ones(P, dtype=torch.bool, device=DEV)
    untouched[idx[live]] = False
    assert torch.equal(pool[untouched], before[untouched])


def _graph_case():
    """The CUDA-graph tests' case: B = 8 slots (two padding), H = 16, K = V = 128, a pool of 12 rows, 6 bf16 steps.

    Returns (B, H, K, V, P, steps, slope [H], qs [steps, B, H, K], ks, vs [steps, B, H, V], idx [B],
    pool0 [P, H, K, V]).
    """
    B, H, K, V, P, steps = 8, 16, 128, 128, 12, 6
    dtype = torch.bfloat16
    slope = la.tnl_slopes(H, 3, 12).to(DEV)
    qs, ks = (randn(steps, B, H, K, dtype=dtype, seed=s) for s in (1, 2))
    vs = randn(steps, B, H, V, dtype=dtype, seed=3)
    idx = torch.tensor([11, 0, -1, 5, 7, -1, 2, 9], device=DEV, dtype=torch.int32)
    pool0 = randn(P, H, K, V, seed=4)
    return B, H, K, V, P, steps, slope, qs, ks, vs, idx, pool0


@dataclasses.dataclass
class _StaticStep:
    """A step with ``out=`` on static buffers, as a CUDA graph captures it: q, k, v (step 0's, overwritten before each
    replay), the slot indices, a copy of the case's pool and the output buffer."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    idx: torch.Tensor
    pool: torch.Tensor
    out: torch.Tensor
    slope: torch.Tensor

    @classmethod
    def of(cls, qs, ks, vs, idx, pool0, slope) -> "_StaticStep":
        out = torch.empty(*qs.shape[1:3], vs.shape[-1], device=DEV, dtype=qs.dtype)
        return cls(qs[0].clone(), ks[0].clone(), vs[0].clone(), idx.clone(), pool0.clone(), out, slope)

    def __call__(self) -> None:
        la.lightning_attn_decode(self.q, self.k, self.v, self.pool, self.slope, state_indices=self.idx, out=self.out)

    def warm_up(self, times: int) -> None:
        """Run ``times`` steps on a side stream (the first compiles the kernel), as capture requires."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(times):
                self()
        torch.cuda.current_stream().wait_stream(stream)

    def replay(self, graph: torch.cuda.CUDAGraph, q, k, v) -> None:
        """Copy one step's inputs into the static buffers and replay ``graph``."""
        for static, x in zip((self.q, self.k, self.v), (q, k, v), strict=True):
            static.copy_(x)
        graph.replay()


def test_cuda_graph_capture_and_replay_match_eager():
    """A step with out= captured once and replayed for 6 tokens equals eager steps (bitwise: same kernel, same
    inputs) and float64; the pool rows advance in place, padding stays zero."""
    B, H, K, V, P, steps, slope, qs, ks, vs, idx, pool0 = _graph_case()
    dtype = qs.dtype

    pool_eager = pool0.clone()
    eager = [la.lightning_attn_decode(qs[t], ks[t], vs[t], pool_eager, slope, state_indices=idx) for t in range(steps)]

    step = _StaticStep.of(qs, ks, vs, idx, pool0, slope)
    pool, out = step.pool, step.out
    step.warm_up(1)  # it moves the pool, which is reset below
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    pool.copy_(pool0)

    s_ref = pool0.double()
    live = (idx >= 0).nonzero().squeeze(1)
    rows = idx[live].long()
    for t in range(steps):
        step.replay(graph, qs[t], ks[t], vs[t])
        assert torch.equal(out, eager[t]), f"graph replay differs from eager at step {t}"
        o_ref, s_rows = step_reference(qs[t][live], ks[t][live], vs[t][live], s_ref[rows], slope, 1.0)
        s_ref[rows] = s_rows
        assert_close(f"o step {t}", out[live], o_ref, dtype)
    assert torch.equal(pool, pool_eager)
    assert_close("state", pool, s_ref, torch.float32)
    assert torch.equal(out[idx < 0], torch.zeros_like(out[idx < 0]))


@pytest.fixture
def launch_cache():
    """The decode step's Launcher, emptied before and after: its entries are this test's."""
    launcher = decode_triton._LAUNCHER
    launcher.reset()
    yield launcher
    launcher.reset()


def _tritons_launch_only(monkeypatch):
    """Makes eager steps launch through JITFunction.run (a disabled Launcher), for side-by-side runs."""
    off = Launcher(decode_triton.decode_step_kernel, "decode (Triton's launch only)")
    off.disabled = "test: Triton's launch only"
    monkeypatch.setattr(decode_triton, "_LAUNCHER", off)


def _offset_view(x):
    """x's values in a view one element past its buffer's start: same strides, data_ptr not 16-byte aligned."""
    buf = torch.empty(x.numel() + 1, device=DEV, dtype=x.dtype)
    view = buf[1:].view(x.shape)
    view.copy_(x)
    assert view.data_ptr() % 16 != 0
    return view


def _entry(launcher, q, k, v, pool, slope, idx, out):
    """The launcher's entry for a step on these tensors (found by the exact key its launch builds)."""
    seen = []
    real = launcher._launch
    launcher._launch = lambda entry, grid, args, device: seen.append(entry)
    try:
        decode_triton.launch_decode_step(q, k, v, pool, slope, 0.5, idx, out)
    finally:
        launcher._launch = real
    return seen[0]


# (id, dtype, slope given, state_indices given, inputs and output off 16-byte alignment): run in this order, so the
# cache sees new keys (alignment, dtype, constexprs) and comes back to an old one
DIRECT_CASES = [
    ("bf16", torch.bfloat16, True, True, False),
    ("bf16-unaligned", torch.bfloat16, True, True, True),
    ("fp16", torch.float16, True, True, False),
    ("fp32-no-slope-no-indices", torch.float32, False, False, False),
    ("bf16-again", torch.bfloat16, True, True, False),
]


def test_direct_launch_matches_tritons_launch_and_float64(launch_cache, monkeypatch):
    """Each case, 5 steps: step 1 launches through Triton, step 2 through Triton with the recorder (verification),
    steps 3-5 directly, through the bound launch the step's structure keeps. Every step equals the same step launched
    through JITFunction.run (bitwise: same compiled kernel, same arguments) and float64; a view off 16-byte alignment
    gets its own compiled kernel."""
    B, H, K, V, P, steps = 8, 16, 128, 128, 12, 5
    compiled = {}
    for name, dtype, has_slope, has_idx, unaligned in DIRECT_CASES:
        slope = la.tnl_slopes(H, 3, 12).to(DEV) if has_slope else None
        idx = torch.tensor([11, 0, -1, 5, 7, -1, 2, 9], device=DEV, dtype=torch.int32) if has_idx else None
        pool0 = randn(P if has_idx else B, H, K, V, seed=4)
        pool, pool_triton, s_ref = pool0.clone(), pool0.clone(), pool0.double()
        rows = torch.arange(B, device=DEV) if idx is None else idx.long()
        live = rows >= 0
        steps_in = []
        for t in range(steps):
            q, k = (randn(B, H, K, dtype=dtype, seed=10 * t + s) for s in (1, 2))
            v = randn(B, H, V, dtype=dtype, seed=10 * t + 3)
            out, o_triton = (torch.full((B, H, V), float("nan"), device=DEV, dtype=dtype) for _ in range(2))
            if unaligned:  # the twin gets the same alignment: the same specialisation, so bitwise equal results
                q, k, v, out, o_triton = (_offset_view(x) for x in (q, k, v, out, o_triton))
            steps_in.append((q, k, v, out, o_triton))
        with monkeypatch.context() as m:  # the twin's steps first: the step's own launcher stays in place for its 5
            _tritons_launch_only(m)
            for q, k, v, _, o_triton in steps_in:
                la.lightning_attn_decode(q, k, v, pool_triton, slope, scale=0.5, state_indices=idx, out=o_triton)
        for t, (q, k, v, out, o_triton) in enumerate(steps_in):
            la.lightning_attn_decode(q, k, v, pool, slope, scale=0.5, state_indices=idx, out=out)
            assert torch.equal(out, o_triton), f"{name}: step {t} differs from Triton's launch"
            o_ref, s_rows = step_reference(q[live], k[live], v[live], s_ref[rows[live]], slope, 0.5)
            s_ref[rows[live]] = s_rows
            assert_close(f"{name} o step {t}", out[live], o_ref, dtype)
            assert torch.equal(out[~live], torch.zeros_like(out[~live]))
        assert torch.equal(pool, pool_triton), name
        assert_close(f"{name} state", pool, s_ref, torch.float32)
        entry = _entry(launch_cache, q, k, v, pool, slope, idx, out)
        assert entry.launcher is not None, f"{name}: the direct launch was not used"
        structure = check_decode_inputs(q, k, v, pool, slope, scale=0.5, state_indices=idx, out=out)
        kept = decode_triton._STRUCTURE_LAUNCHES[structure].bound.values()  # per alignment (bf16 and its offset views)
        assert any(b.entry is entry and b.pointers for b in kept), f"{name}: the structure's bound launch was not kept"
        compiled[name] = entry.compiled
    assert launch_cache.disabled is None
    assert compiled["bf16-unaligned"] is not compiled["bf16"], "an unaligned view needs its own specialisation"
    assert compiled["bf16-again"] is compiled["bf16"]


def _count_calls(entry):
    """Wraps the entry's direct launcher; returns the list of stream arguments it is called with."""
    streams, launcher = [], entry.launcher

    def counted(*args):
        streams.append(args[3])
        return launcher(*args)

    entry.launcher = counted
    return streams


@pytest.mark.parametrize("warmup", [1, 3], ids=["capture-verification", "capture-direct"])
def test_cuda_graph_captures_the_fast_path(warmup, launch_cache, monkeypatch):
    """With 1 warm-up step the captured step is the verification (Triton's launch with the recorder); with 3
    (Triton, verification, direct) it is the direct launch, on the capture stream. Either way replays equal steps
    launched through Triton, bitwise."""
    B, H, K, V, P, steps, slope, qs, ks, vs, idx, pool0 = _graph_case()
    pool_triton = pool0.clone()
    with monkeypatch.context() as m:
        _tritons_launch_only(m)
        eager = [
            la.lightning_attn_decode(qs[t], ks[t], vs[t], pool_triton, slope, state_indices=idx) for t in range(steps)
        ]

    step = _StaticStep.of(qs, ks, vs, idx, pool0, slope)
    pool, out = step.pool, step.out
    step.warm_up(warmup)
    entry = _entry(launch_cache, step.q, step.k, step.v, pool, slope, step.idx, out)
    assert (entry.launcher is not None) == (warmup == 3)
    streams = _count_calls(entry) if warmup == 3 else None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
        capture_stream = torch.cuda.current_stream().cuda_stream
    assert entry.launcher is not None and launch_cache.disabled is None
    if streams is not None:
        assert streams == [capture_stream], "the captured step must be the direct launch, on the capture stream"
    pool.copy_(pool0)
    for t in range(steps):
        step.replay(graph, qs[t], ks[t], vs[t])
        assert torch.equal(out, eager[t]), f"replay differs from Triton's launch at step {t}"
    if streams is not None:
        assert len(streams) == 1, "replays do not go through Python"
    assert torch.equal(pool, pool_triton)


def test_direct_launch_runs_on_the_current_stream(launch_cache):
    """Steps issued under torch.cuda.stream(s) launch on s (the stream is read per call, not cached)."""
    B, H, K, V = 4, 16, 64, 64
    slope = la.tnl_slopes(H, 0, 12).to(DEV)
    pool = randn(B, H, K, V, seed=1)
    s_ref = pool.double()
    qs, ks, vs = (randn(6, B, H, K, dtype=torch.bfloat16, seed=s) for s in (2, 3, 4))
    for t in range(3):
        la.lightning_attn_decode(qs[t], ks[t], vs[t], pool, slope)
        _, s_ref = step_reference(qs[t], ks[t], vs[t], s_ref, slope, 1.0)
    out = torch.empty(B, H, V, device=DEV, dtype=torch.bfloat16)
    streams = _count_calls(_entry(launch_cache, qs[3], ks[3], vs[3], pool, slope, None, out))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for t in range(3, 6):
            la.lightning_attn_decode(qs[t], ks[t], vs[t], pool, slope, out=out)
    side.synchronize()
    for t in range(3, 6):
        o_ref, s_ref = step_reference(qs[t], ks[t], vs[t], s_ref, slope, 1.0)
    assert streams == [side.cuda_stream] * 3
    assert_close("o", out, o_ref, torch.bfloat16)
    assert_close("state", pool, s_ref, torch.float32)


def test_torch_compile_fullgraph_inductor(fresh_dynamo):
    """torch.compile(fullgraph=True) (Inductor) of a loop of public decode steps: no graph break, float64 agreement,
    and the pool is updated in place."""
    B, H, K, V, P = 4, 16, 64, 128, 6
    slope = la.tnl_slopes(H, 0, 12).to(DEV)
    idx = torch.tensor([5, -1, 0, 3], device=DEV)
    qs, ks = (randn(3, B, H, K, dtype=torch.bfloat16, seed=s) for s in (1, 2))
    vs = randn(3, B, H, V, dtype=torch.bfloat16, seed=3)
    pool = randn(P, H, K, V, seed=4)
    before = pool.clone()

    def three_steps(qs, ks, vs, pool):
        return torch.stack(
            [la.lightning_attn_decode(qs[t], ks[t], vs[t], pool, slope, state_indices=idx) for t in range(3)]
        )

    o = torch.compile(three_steps, fullgraph=True)(qs, ks, vs, pool)
    live = idx >= 0
    s_ref = before[idx[live]]
    for t in range(3):
        o_ref, s_ref = step_reference(qs[t][live], ks[t][live], vs[t][live], s_ref, slope, 1.0)
        assert_close(f"o step {t}", o[t][live], o_ref, torch.bfloat16)
        assert torch.equal(o[t][~live], torch.zeros_like(o[t][~live]))
    assert_close("state", pool[idx[live]], s_ref, torch.float32)
    assert torch.equal(pool[[1, 2, 4]], before[[1, 2, 4]])


def test_opcheck_cuda():
    H, K, V = 16, 128, 128
    q, k = (randn(3, H, K, dtype=torch.bfloat16, seed=s) for s in (1, 2))
    v = randn(3, H, V, dtype=torch.bfloat16, seed=3)
    slope = la.tnl_slopes(H, 0, 12).to(DEV)
    args = (q, k, v, randn(5, H, K, V, seed=4), slope, 0.5, torch.tensor([4, -1, 0], device=DEV),
            torch.zeros(3, H, V, device=DEV, dtype=torch.bfloat16))
    torch.library.opcheck(decode_triton.decode_step_op.op, args)


def test_debug_mode_checks_indices_on_cuda(configure):
    configure(debug=True)
    H, K, V = 2, 16, 16
    pool = torch.zeros(3, H, K, V, device=DEV)
    q, k, v = (randn(2, H, K, seed=s) for s in range(3))
    with pytest.raises(ValueError, match="must not repeat"):
        la.lightning_attn_decode(q, k, v, pool, state_indices=torch.tensor([1, 1], device=DEV))
    with pytest.raises(ValueError, match="must be in"):
        la.lightning_attn_decode(q, k, v, pool, state_indices=torch.tensor([0, 3], device=DEV))


def test_memory_flat_and_timing_helpers_run():
    """Small versions of the benchmark helpers: flat peak memory (exact allocator counts) and a timing dict."""
    from lightning_attention.bench.decode_timing import decode_memory_flat, time_decode_step

    mem = decode_memory_flat(tokens=(256, 4096), verbose=False)
    assert mem["flat"], mem
    assert all(r["state_finite"] for r in mem["runs"])
    assert mem["steps_per_graph"] == 256 and [r["graph_replays"] for r in mem["runs"]] == [1, 16]
    eager = decode_memory_flat(tokens=(64, 256), cuda_graph=False, verbose=False)
    assert eager["flat"] and eager["mode"] == "eager", eager
    res = time_decode_step(8, cuda_graph=True, steps=10, reps=3, warmup=2)
    for key in ("ours_us", "ours_gpu_us", "ours_graph_us", "ours_graph_gpu_us", "floor_us"):
        assert res[key] > 0, (key, res)
    assert "fla_us" in res or "fla_skipped" in res
