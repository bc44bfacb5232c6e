"""Decoding on CUDA (`pytest -m gpu tests/ops/test_decode_gpu.py`): the compiled Triton step at real sizes, the
prefill -> pool -> decode hand-off, padding slots, CUDA-graph capture and replay, torch.compile and opcheck.

Every result is compared with float64 from the same rounded inputs (DESIGN §5). Timings are not asserted here:
they belong to the benchmark (lightning_attention.bench.decode_timing).
"""

import importlib

import pytest
import torch

import lightning_attention as la
from lightning_attention.ops.lightning import naive
from lightning_attention.ops.lightning.kernels import decode as kdecode
from lightning_attention.utils.testing import assert_close
from tests.ops.test_decode import fresh_dynamo_rules  # noqa: F401 (fixture)
from tests.ops.test_naive import make_slope

pytestmark = pytest.mark.gpu

DEV = "cuda"


def _chunk_kernels_missing() -> str | None:
    try:
        importlib.import_module("lightning_attention.ops.lightning.chunk")
    except ImportError as e:
        return f"Triton prefill (lightning_attention.ops.lightning.chunk) cannot be imported: {e}"
    return None


PREFILL = [
    pytest.param("torch", id="prefill-torch"),
    pytest.param(
        "triton",
        id="prefill-triton",
        marks=pytest.mark.skipif(_chunk_kernels_missing() is not None, reason=str(_chunk_kernels_missing())),
    ),
]


@pytest.fixture(autouse=True)
def fast_path(monkeypatch):
    # the path under test: Triton on CUDA tensors, no device->host value checks (tests that need others set them)
    monkeypatch.setenv("LIGHTNING_ATTENTION_BACKEND", "auto")
    monkeypatch.delenv("LIGHTNING_ATTENTION_DEBUG", raising=False)


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
def test_prefill_then_decode_matches_float64(prefill_backend, dtype, decay, monkeypatch):
    B, T, T0, H, K, V, P = 3, 300, 237, 16, 128, 128, 8
    q, k = (randn(B, T, H, K, dtype=dtype, seed=s) for s in (1, 2))
    v = randn(B, T, H, V, dtype=dtype, seed=3)
    k = (k.float() * K**-0.5).to(dtype)  # keeps undecayed heads' outputs O(1) over 300 tokens
    slope = None if decay == "none" else make_slope(decay, H, torch.float32).to(DEV)
    s64 = None if slope is None else slope.double()
    o_ref, s_ref = naive.recurrent_lightning_attn(q.double(), k.double(), v.double(), s64)

    monkeypatch.setenv("LIGHTNING_ATTENTION_BACKEND", prefill_backend)
    o_full, s_full = la.lightning_attn(q, k, v, slope, output_final_state=True)
    assert_close("o (one call)", o_full, o_ref, dtype)
    assert_close("final_state (one call)", s_full, s_ref, dtype)
    o_pre, ht = la.lightning_attn(q[:, :T0], k[:, :T0], v[:, :T0], slope, output_final_state=True)

    pool = randn(P, H, K, V, seed=4)
    idx = torch.tensor([6, 1, 3], device=DEV, dtype=torch.int32)
    pool[idx.long()] = ht
    spare = [0, 2, 4, 5, 7]
    before = pool[spare].clone()
    monkeypatch.setenv("LIGHTNING_ATTENTION_BACKEND", "triton")
    o_dec = torch.stack(
        [la.lightning_attn_decode(q[:, t], k[:, t], v[:, t], pool, slope, state_indices=idx) for t in range(T0, T)],
        dim=1,
    )
    assert_close("o (prefill)", o_pre, o_ref[:, :T0], dtype)
    assert_close("o (decode)", o_dec, o_ref[:, T0:], dtype)
    assert_close("final_state (decode)", pool[idx.long()], s_ref, dtype)
    assert torch.equal(pool[spare], before)


@pytest.mark.parametrize("prefill_backend", PREFILL)
def test_varlen_prefill_into_pool_then_decode(prefill_backend, monkeypatch):
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

    monkeypatch.setenv("LIGHTNING_ATTENTION_BACKEND", prefill_backend)
    o_pre, ht = la.lightning_attn(q, k, v, slope, cu_seqlens=cu, output_final_state=True)
    pool[rows] = ht

    idx = torch.tensor([rows[0], rows[1], -1, rows[2], rows[3]], device=DEV)
    junk = [randn(1, steps, H, d, dtype=torch.bfloat16, seed=7) for d in (K, K, V)]
    dq, dk, dv = (
        torch.cat([seqs[0][j][:, 0:], seqs[1][j][:, 1:], junk[j], seqs[2][j][:, 15:], seqs[3][j][:, 700:]])
        for j in range(3)
    )
    monkeypatch.setenv("LIGHTNING_ATTENTION_BACKEND", "triton")
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


def test_cuda_graph_capture_and_replay_match_eager():
    """A step with out= captured once and replayed for 6 tokens equals eager steps (bitwise: same kernel, same
    inputs) and float64; the pool rows advance in place, padding stays zero."""
    B, H, K, V, P, steps = 8, 16, 128, 128, 12, 6
    dtype = torch.bfloat16
    slope = la.tnl_slopes(H, 3, 12).to(DEV)
    qs, ks = (randn(steps, B, H, K, dtype=dtype, seed=s) for s in (1, 2))
    vs = randn(steps, B, H, V, dtype=dtype, seed=3)
    idx = torch.tensor([11, 0, -1, 5, 7, -1, 2, 9], device=DEV, dtype=torch.int32)
    pool0 = randn(P, H, K, V, seed=4)

    pool_eager = pool0.clone()
    eager = [la.lightning_attn_decode(qs[t], ks[t], vs[t], pool_eager, slope, state_indices=idx) for t in range(steps)]

    static_q, static_k, static_v = qs[0].clone(), ks[0].clone(), vs[0].clone()
    static_idx = idx.clone()
    pool = pool0.clone()
    out = torch.empty(B, H, V, device=DEV, dtype=dtype)

    def step():
        la.lightning_attn_decode(static_q, static_k, static_v, pool, slope, state_indices=static_idx, out=out)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # warm-up (compiles the kernel); it moves the pool, which is reset below
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    pool.copy_(pool0)

    s_ref = pool0.double()
    live = (idx >= 0).nonzero().squeeze(1)
    rows = idx[live].long()
    for t in range(steps):
        static_q.copy_(qs[t])
        static_k.copy_(ks[t])
        static_v.copy_(vs[t])
        graph.replay()
        assert torch.equal(out, eager[t]), f"graph replay differs from eager at step {t}"
        o_ref, s_rows = step_reference(qs[t][live], ks[t][live], vs[t][live], s_ref[rows], slope, 1.0)
        s_ref[rows] = s_rows
        assert_close(f"o step {t}", out[live], o_ref, dtype)
    assert torch.equal(pool, pool_eager)
    assert_close("state", pool, s_ref, torch.float32)
    assert torch.equal(out[idx < 0], torch.zeros_like(out[idx < 0]))


def test_torch_compile_fullgraph_inductor(fresh_dynamo_rules):
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
    torch.library.opcheck(kdecode.decode_step_op, args)


def test_debug_mode_checks_indices_on_cuda(monkeypatch):
    monkeypatch.setenv("LIGHTNING_ATTENTION_DEBUG", "1")
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
    res = time_decode_step(8, cuda_graph=True, steps=10, reps=3, warmup=2)
    for key in ("ours_us", "ours_gpu_us", "ours_graph_us", "ours_graph_gpu_us", "floor_us"):
        assert res[key] > 0, (key, res)
    assert "fla_us" in res or "fla_skipped" in res
