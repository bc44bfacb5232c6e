"""Decoding: `lightning_attn_decode` on the PyTorch path and on the Triton kernel (CPU interpreter in CI), and the
prefill -> state pool -> decode hand-off.

Every result is compared with float64 computed from the same rounded inputs (docs/design.md, "Testing
discipline"): the recurrent reference over the whole sequence (prompt + decoded tokens) gives both the outputs and
the final state. Prefill runs on either backend.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import lightning_attention as la
from lightning_attention import settings
from lightning_attention.ops.lightning import decode_triton, naive
from lightning_attention.utils.testing import assert_close
from tests.ops.test_naive import make_inputs, make_slope

DECAYS = ["none", "weak", "strong", "mixed"]


# (prefill backend, decode backend)
BACKENDS = [
    pytest.param("torch", "torch", id="prefill-torch-decode-torch"),
    pytest.param("torch", "triton", id="prefill-torch-decode-triton"),
    pytest.param("triton", "triton", id="prefill-triton-decode-triton"),
]


def reference(q, k, v, slope, scale, h0):
    """float64 recurrent reference: q, k [B, T, H, K], v [B, T, H, V], h0 [B, H, K, V] -> (o, final_state)."""
    s64 = None if slope is None else slope.double()
    return naive.recurrent_lightning_attn(
        q.double(), k.double(), v.double(), s64, scale=scale, initial_state=None if h0 is None else h0.double()
    )


def decode_tokens(q, k, v, pool, slope, scale, idx):
    """Token-by-token decode of q, k [B, T, H, K], v [B, T, H, V] from pool rows idx; returns o [B, T, H, V]."""
    outs = [la.lightning_attn_decode(q[:, t], k[:, t], v[:, t], pool, slope, scale=scale, state_indices=idx)
            for t in range(q.shape[1])]
    return torch.stack(outs, dim=1)


# Every decay regime on both decode paths; the Triton prefill (interpreted chunk kernels: seconds per call) with
# "mixed", whose four heads are the no / weak / strong decay regimes side by side, and "none".
AGREEMENT = [
    pytest.param(*b.values, decay, id=f"{b.id}-{decay}", marks=b.marks)
    for b in BACKENDS
    for decay in DECAYS
    if b.values[0] == "torch" or decay in ("mixed", "none")
]


@pytest.mark.parametrize("prefill_backend,decode_backend,decay", AGREEMENT)
def test_prefill_then_decode_matches_float64(prefill_backend, decode_backend, decay, configure):
    """lightning_attn on all T tokens, and prefill of T0 tokens + T - T0 decode steps, both agree with float64."""
    B, T, T0, H, K, V, P, scale = 2, 17, 9, 4, 32, 48, 5, 0.5
    q, k, v = (x.float() for x in make_inputs(B, T, H, K, V, seed=1))
    slope = make_slope(decay, H, torch.float32)
    o_ref, s_ref = reference(q, k, v, slope, scale, None)

    configure(backend=prefill_backend)
    o_full, s_full = la.lightning_attn(q, k, v, slope, scale=scale, output_final_state=True)
    assert_close("o (one call)", o_full, o_ref, torch.float32)
    assert_close("final_state (one call)", s_full, s_ref, torch.float32)

    o_pre, ht = la.lightning_attn(q[:, :T0], k[:, :T0], v[:, :T0], slope, scale=scale, output_final_state=True)
    pool = torch.randn(P, H, K, V)
    idx = torch.tensor([3, 1])
    pool[idx] = ht
    others = pool[[0, 2, 4]].clone()

    configure(backend=decode_backend)
    o_dec = decode_tokens(q[:, T0:], k[:, T0:], v[:, T0:], pool, slope, scale, idx)
    assert_close("o (prefill)", o_pre, o_ref[:, :T0], torch.float32)
    assert_close("o (decode)", o_dec, o_ref[:, T0:], torch.float32)
    assert_close("final_state (decode)", pool[idx], s_ref, torch.float32)
    assert torch.equal(pool[[0, 2, 4]], others), "decode touched pool rows it was not given"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("decode_backend", ["torch", "triton"])
def test_prefill_then_decode_low_precision(decode_backend, dtype, configure):
    """fp16/bf16 inputs, mixed decay, random h0: outputs within the dtype's tolerance, state within fp32's."""
    B, T, T0, H, K, V = 2, 17, 6, 4, 48, 32
    q, k, v = (x.to(dtype) for x in make_inputs(B, T, H, K, V, seed=2))
    slope = make_slope("mixed", H, torch.float32)
    h0 = torch.randn(B, H, K, V)
    o_ref, s_ref = reference(q, k, v, slope, 1.0, h0)

    configure(backend="torch")
    o_pre, pool = la.lightning_attn(q[:, :T0], k[:, :T0], v[:, :T0], slope, initial_state=h0, output_final_state=True)
    configure(backend=decode_backend)
    o_dec = decode_tokens(q[:, T0:], k[:, T0:], v[:, T0:], pool, slope, 1.0, None)
    assert o_dec.dtype == dtype
    assert_close("o (prefill)", o_pre, o_ref[:, :T0], dtype)
    assert_close("o (decode)", o_dec, o_ref[:, T0:], dtype)
    # the state is fp32 all the way: products of fp16/bf16 values are exact in fp32
    assert_close("final_state", pool, s_ref, torch.float32)


@pytest.mark.parametrize("prefill_backend,decode_backend", BACKENDS)
def test_varlen_chunked_prefill_into_pool_then_decode(prefill_backend, decode_backend, configure):
    """Packed prompts (lengths 15, 1, 0, 20) prefilled in two chunks through their pool rows, then decoded in one
    batch that also holds a padding slot; every sequence agrees with float64 over prompt + decoded tokens."""
    H, K, V, P, steps = 2, 16, 24, 7, 4
    lengths = [15, 1, 0, 20]
    first = [7, 1, 0, 9]  # chunk 1 of each prompt; chunk 2 is the rest (lengths 8, 0, 0, 11)
    rows = torch.tensor([4, 0, 6, 2])  # pool row of each request
    slope = make_slope("mixed", H, torch.float32)
    seqs = [make_inputs(1, n + steps, H, K, V, dtype=torch.float32, seed=10 + i) for i, n in enumerate(lengths)]

    def packed(parts):
        q, k, v = (torch.cat([p[j] for p in parts], dim=1) for j in range(3))
        cu = torch.tensor([0] + [p[0].shape[1] for p in parts]).cumsum(0)
        return q, k, v, cu

    pool = torch.randn(P, H, K, V)
    spare = pool[[1, 3, 5]].clone()
    configure(backend=prefill_backend)
    q, k, v, cu = packed([tuple(x[:, :f] for x in s) for s, f in zip(seqs, first)])
    o1, ht = la.lightning_attn(q, k, v, slope, cu_seqlens=cu, output_final_state=True)
    pool[rows] = ht
    q, k, v, cu = packed([tuple(x[:, f:n] for x in s) for s, f, n in zip(seqs, first, lengths)])
    o2, ht = la.lightning_attn(q, k, v, slope, initial_state=pool[rows], cu_seqlens=cu, output_final_state=True)
    pool[rows] = ht

    # decode batch: the four requests with a padding slot (garbage q/k/v) in the middle
    idx = torch.tensor([rows[0], rows[1], -1, rows[2], rows[3]])
    junk = make_inputs(1, steps, H, K, V, dtype=torch.float32, seed=99)
    dq, dk, dv = (torch.cat([s[j][:, n:] for s, n in zip(seqs[:2], lengths[:2])] + [junk[j]]
                            + [s[j][:, n:] for s, n in zip(seqs[2:], lengths[2:])]) for j in range(3))
    configure(backend=decode_backend)
    o_dec = decode_tokens(dq, dk, dv, pool, slope, 1.0, idx)

    assert torch.equal(o_dec[2], torch.zeros_like(o_dec[2])), "padding slot must output zeros"
    assert torch.equal(pool[[1, 3, 5]], spare), "rows of no request were touched"
    cu1 = [0] + torch.tensor(first).cumsum(0).tolist()
    cu2 = [0] + torch.tensor([n - f for n, f in zip(lengths, first)]).cumsum(0).tolist()
    for i, (s, n, f) in enumerate(zip(seqs, lengths, first)):
        o_ref, s_ref = reference(*s, slope, 1.0, None)
        o_pre = torch.cat([o1[:, cu1[i] : cu1[i + 1]], o2[:, cu2[i] : cu2[i + 1]]], dim=1)
        if n:
            assert_close(f"o prefill seq {i}", o_pre, o_ref[:, :n], torch.float32)
        assert_close(f"o decode seq {i}", o_dec[i + (i >= 2), :][None], o_ref[:, n:], torch.float32)
        assert_close(f"state seq {i}", pool[rows[i]][None], s_ref, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=str)
def test_padding_slots_out_and_untouched_rows(backend, dtype, index_dtype, configure):
    """-1 slots: zero output, no row touched; rows outside state_indices bitwise equal; out= written and returned."""
    configure(backend=backend)
    B, H, K, V, P = 4, 2, 16, 32, 6
    q, k = (torch.randn(B, H, K).to(dtype) for _ in range(2))
    v = torch.randn(B, H, V).to(dtype)
    slope = torch.tensor([0.2, 3.0])
    idx = torch.tensor([5, -1, 0, -1], dtype=index_dtype)
    pool = torch.randn(P, H, K, V)
    before = pool.clone()
    out = torch.full((B, H, V), float("nan"), dtype=dtype)

    o = la.lightning_attn_decode(q, k, v, pool, slope, scale=0.25, state_indices=idx, out=out)
    assert o is out
    assert torch.equal(out[[1, 3]], torch.zeros(2, H, V, dtype=dtype))
    assert torch.equal(pool[[1, 2, 3, 4]], before[[1, 2, 3, 4]])
    live = [0, 2]
    s_ref = torch.exp(-slope.double())[None, :, None, None] * before[[5, 0]].double()
    s_ref = s_ref + torch.einsum("bhk,bhv->bhkv", k[live].double(), v[live].double())
    o_ref = 0.25 * torch.einsum("bhk,bhkv->bhv", q[live].double(), s_ref)
    assert_close("o", out[live], o_ref, dtype)
    assert_close("state", pool[[5, 0]], s_ref, torch.float32)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_all_padding_and_no_decay_default_indices(backend, configure):
    """Every slot padding: nothing changes, outputs are zeros (allocated out is fully written: no NaN poison left)."""
    configure(backend=backend)
    H, K, V = 2, 16, 16
    pool = torch.randn(3, H, K, V)
    before = pool.clone()
    q, k, v = (torch.randn(2, H, K) for _ in range(3))
    o = la.lightning_attn_decode(q, k, v, pool, state_indices=torch.tensor([-1, -1]))
    assert torch.equal(o, torch.zeros(2, H, V)) and torch.equal(pool, before)


def test_triton_step_under_inference_mode(configure):
    """Serving loops run under torch.inference_mode: the direct launch (version-counter bump included) works there."""
    configure(backend="triton")
    H, K, V = 2, 16, 32
    with torch.inference_mode():
        q, k = (torch.randn(2, H, K) for _ in range(2))
        v = torch.randn(2, H, V)
        pool = torch.randn(2, H, K, V)
        s_ref = pool.double() + torch.einsum("bhk,bhv->bhkv", k.double(), v.double())
        o = la.lightning_attn_decode(q, k, v, pool)
    assert_close("o", o, torch.einsum("bhk,bhkv->bhv", q.double(), s_ref), torch.float32)
    assert_close("state", pool, s_ref, torch.float32)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize(
    "indices,fragment", [([0, 3, -1], "must be in"), ([2, 2, -1], "must not repeat"), ([0, -5, 1], "must be in")]
)
def test_bad_indices_raise_on_cpu(backend, indices, fragment, configure):
    configure(backend=backend)
    H, K, V = 2, 16, 16
    pool = torch.zeros(3, H, K, V)
    q, k, v = (torch.randn(3, H, K) for _ in range(3))
    with pytest.raises(ValueError, match=fragment):
        la.lightning_attn_decode(q, k, v, pool, state_indices=torch.tensor(indices))
    assert torch.equal(pool, torch.zeros_like(pool)), "a rejected call must not touch the pool"


# (K, V, dtype): K != V, odd sizes, the smallest and a large head dim; curated, not a product
SHAPES = [
    (48, 100, torch.float32),
    (100, 48, torch.bfloat16),
    (16, 16, torch.float16),
    (128, 64, torch.bfloat16),
    (256, 32, torch.float32),
]


@pytest.mark.parametrize("K,V,dtype", SHAPES, ids=lambda x: str(x).replace("torch.", ""))
def test_triton_step_shapes_and_strided_views(K, V, dtype, configure):
    """One step on strided views: q, k, v split from a fused projection, the pool a layer slice of a bigger buffer."""
    configure(backend="triton")
    B, H, L, P = 3, 2, 2, 4
    fused = torch.randn(B, H, 2 * K + V + 8).to(dtype)  # 8 spare columns: rows are not contiguous blocks of q
    q, k, v = fused[..., :K], fused[..., K : 2 * K], fused[..., 2 * K : 2 * K + V]
    layers = torch.randn(L, P, H, K, V)
    pool = layers[1]
    before = layers.clone()
    slope = torch.tensor([0.05, 1.5])
    idx = torch.tensor([2, 0, 3])

    o = la.lightning_attn_decode(q, k, v, pool, slope, scale=K**-0.5, state_indices=idx)
    s_ref = torch.exp(-slope.double())[None, :, None, None] * before[1, idx].double()
    s_ref = s_ref + torch.einsum("bhk,bhv->bhkv", k.double(), v.double())
    o_ref = K**-0.5 * torch.einsum("bhk,bhkv->bhv", q.double(), s_ref)
    assert_close("o", o, o_ref, dtype)
    assert_close("state", layers[1, idx], s_ref, torch.float32)
    assert torch.equal(layers[0], before[0]) and torch.equal(layers[1, 1], before[1, 1])


@pytest.mark.parametrize(
    "K,V,block_k,block_v", [(48, 100, 16, 16), (100, 48, 32, 32), (64, 64, 64, 16)], ids=lambda x: str(x)
)
def test_kernel_tiles_k_loop_and_ragged_v(K, V, block_k, block_v):
    """Explicit tiles: several K steps (the last one partial) and ragged V tiles give the same float64 agreement."""
    B, H = 2, 3
    q, k = (torch.randn(B, H, K) for _ in range(2))
    v = torch.randn(B, H, V)
    slope = torch.tensor([0.0, 0.3, 4.0])
    pool = torch.randn(B, H, K, V)
    s_ref = torch.exp(-slope.double())[None, :, None, None] * pool.double()
    s_ref = s_ref + torch.einsum("bhk,bhv->bhkv", k.double(), v.double())
    o_ref = 0.5 * torch.einsum("bhk,bhkv->bhv", q.double(), s_ref)
    out = torch.full((B, H, V), float("nan"))
    decode_triton.launch_decode_step(q, k, v, pool, slope, 0.5, None, out, tiles=(block_k, block_v, 4))
    assert_close("o", out, o_ref, torch.float32)
    assert_close("state", pool, s_ref, torch.float32)


def test_launch_config_spreads_small_batches_and_bounds_tiles():
    """Batch 1 x 16 heads uses the narrowest V tiles (most programs); large batches use 64-wide rows; the [BK, BV]
    slab a program holds never exceeds the register budget and covers K in one step whenever it fits."""
    sms = 132
    assert decode_triton.launch_config(16, 128, 128, sms) == (128, 16, 4)
    assert decode_triton.launch_config(8 * 16, 128, 128, sms)[1] == 32
    assert decode_triton.launch_config(64 * 16, 128, 128, sms) == (128, 64, 8)
    for bh in (1, 16, 128, 4096):
        for K, V in ((16, 16), (48, 100), (128, 128), (256, 256), (256, 48)):
            bk, bv, _ = decode_triton.launch_config(bh, K, V, sms)
            assert bk * bv <= decode_triton._MAX_TILE and bk >= 16 and bv >= 16
            assert bk >= K or bk * bv == decode_triton._MAX_TILE


def test_opcheck_decode_step_op():
    """The registered op (mutating state and out) passes torch.library.opcheck: schema, fake, dispatch, AOT."""
    H, K, V = 2, 16, 32
    q, k = (torch.randn(3, H, K) for _ in range(2))
    v = torch.randn(3, H, V)
    slope = torch.tensor([0.1, 2.0])
    for args in (
        (q, k, v, torch.randn(4, H, K, V), slope, 0.5, torch.tensor([3, -1, 0]), torch.zeros(3, H, V)),
        (q, k, v, torch.randn(3, H, K, V), None, 1.0, None, torch.zeros(3, H, V)),
    ):
        torch.library.opcheck(decode_triton.decode_step_op.op, args)


def test_torch_compile_fullgraph_decode_loop(fresh_dynamo):
    """torch.compile(fullgraph=True) traces the Triton step (functionalised in-place op); two compiled steps agree
    with float64. aot_eager: the graph capture is what is checked here (Inductor needs a C++ toolchain on CPU)."""
    H, K, V = 2, 16, 32
    slope = torch.tensor([0.1, 2.0])
    idx = torch.tensor([1, -1, 0])
    q, k = (torch.randn(2, 3, H, K) for _ in range(2))
    v = torch.randn(2, 3, H, V)
    pool = torch.randn(2, H, K, V)
    s_ref = pool.double().clone()

    def two_steps(q, k, v, pool, out):
        for t in range(2):
            decode_triton.decode_step_triton(q[t], k[t], v[t], pool, slope, 0.5, idx, out[t])
        return out

    out = torch.full((2, 3, H, V), float("nan"))
    torch.compile(two_steps, fullgraph=True, backend="aot_eager")(q, k, v, pool, out)
    lam = torch.exp(-slope.double())[None, :, None, None]
    for t in range(2):
        s_ref = lam * s_ref + torch.einsum("bhk,bhv->bhkv", k[t, [2, 0]].double(), v[t, [2, 0]].double())
        o_ref = 0.5 * torch.einsum("bhk,bhkv->bhv", q[t, [2, 0]].double(), s_ref)
        assert_close(f"o step {t}", out[t, [2, 0]], o_ref, torch.float32)
        assert torch.equal(out[t, 1], torch.zeros(H, V))
    assert_close("state", pool[[0, 1]], s_ref, torch.float32)


def test_torch_compile_fullgraph_public_api(fresh_dynamo):
    """The public function (validation, backend choice, launcher) traces without a graph break. On CPU tensors only
    without slope and state_indices: their value checks need host data (on CUDA they are skipped, see GPU suite)."""
    H, K, V = 2, 16, 48
    q, k = (torch.randn(3, H, K) for _ in range(2))
    v = torch.randn(3, H, V)
    pool = torch.randn(3, H, K, V)
    s_ref = pool.double() + torch.einsum("bhk,bhv->bhkv", k.double(), v.double())
    with settings.override(backend="triton"):
        o = torch.compile(lambda *a: la.lightning_attn_decode(*a, scale=0.5), fullgraph=True, backend="aot_eager")(
            q, k, v, pool
        )
    assert_close("o", o, 0.5 * torch.einsum("bhk,bhkv->bhv", q.double(), s_ref), torch.float32)
    assert_close("state", pool, s_ref, torch.float32)


def test_kernel_compiles_for_hopper_with_128bit_state_access():
    """AOT compile for sm_90 (no GPU needed) of the configurations the dispatcher picks at batch 1/8/64/256 and for
    K = V = 256: every fp32 state element is loaded and stored by a 128-bit vector access (the floor needs it)."""
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.ops.decode_aot"], cwd=root, env=env, capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(results) == {"batch1", "batch8", "batch64", "batch256", "batch64-k256"}
    for name, r in results.items():
        block_k, block_v, num_warps = r["config"]
        per_thread_v4 = block_k * block_v // (32 * num_warps * 4)
        assert r["ld_v4_b32"] == per_thread_v4 and r["st_v4_b32"] == per_thread_v4, (name, r)
        assert r["shared"] <= 16384, (name, r)  # only the q·S reduction uses shared memory


def test_decode_memory_flat_and_timing_run_on_cpu(configure):
    """The benchmark helpers run end to end at toy sizes (their numbers are measured on the GPU, not here)."""
    from lightning_attention.bench.decode_timing import decode_memory_flat, time_decode_step

    configure(backend="torch")
    mem = decode_memory_flat(tokens=(4, 16), heads=2, k_dim=16, v_dim=16, verbose=False)
    assert [r["tokens"] for r in mem["runs"]] == [4, 16]
    assert all(r["state_finite"] for r in mem["runs"])
    res = time_decode_step(1, heads=2, k_dim=16, v_dim=16, dtype=torch.float32, reps=3, warmup=1)
    assert res["ours_us"] > 0 and res["floor_us"] > 0
    assert res["floor_us"] == pytest.approx(2 * 1 * 2 * 16 * 16 * 4 / 3.0e12 * 1e6)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_strided_slope_and_indices(backend, configure):
    """slope and state_indices as strided views (the kernel reads them at unit stride: the launcher copies them)."""
    configure(backend=backend)
    H, K, V = 2, 16, 32
    slope = torch.tensor([0.1, 9.0, 2.0, 9.0])[::2]
    idx = torch.tensor([4, 7, -1, 7, 0, 7])[::2]
    pool = torch.randn(5, H, K, V)
    before = pool.clone()
    q, k = (torch.randn(3, H, K) for _ in range(2))
    v = torch.randn(3, H, V)
    o = la.lightning_attn_decode(q, k, v, pool, slope, scale=0.5, state_indices=idx)
    s_ref = torch.exp(-slope.double())[None, :, None, None] * before[[4, 0]].double()
    s_ref = s_ref + torch.einsum("bhk,bhv->bhkv", k[[0, 2]].double(), v[[0, 2]].double())
    assert_close("o", o[[0, 2]], 0.5 * torch.einsum("bhk,bhkv->bhv", q[[0, 2]].double(), s_ref), torch.float32)
    assert_close("state", pool[[4, 0]], s_ref, torch.float32)
    assert torch.equal(o[1], torch.zeros(H, V)) and torch.equal(pool[[1, 2, 3]], before[[1, 2, 3]])
