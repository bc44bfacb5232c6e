"""Edge shapes, the offsets rule and memory safety (docs/design.md, "Input checks"), on both backends.

- Zero-size batch, heads, length and sequence counts return correctly shaped results (and gradients).
- With ``cu_seqlens_cpu`` given, both backends compute with its offsets, forward and both backwards.
- Values that only CUDA outside debug mode leaves unchecked (offsets, state indices) never address memory outside
  the tensors: the kernels clamp them, the PyTorch path sanitises them. Tests call below the public checks to pass
  such values on the CPU.
- The CPU Triton mode without the test suite's interpreter shims (a subprocess), as the README documents it.
"""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import triton
import triton.language as tl

import lightning_attention as la
from lightning_attention.ops.lightning import interface
from lightning_attention.ops.lightning.decode import decode_step_torch
from lightning_attention.ops.lightning.inter import lightning_attn_inter
from lightning_attention.ops.lightning.kernels.recompute import _sequence_bounds
from lightning_attention.ops.lightning.kernels.walk import _segment
from lightning_attention.ops.lightning.naive import chunk_lightning_attn, recurrent_lightning_attn
from lightning_attention.utils.testing import assert_close

H, K, V = 2, 16, 16
BACKENDS = ["torch", "triton"]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# zero-size inputs

SHAPES = [("B0", 0, 8, 2), ("H0", 2, 8, 0), ("T0", 2, 0, 2), ("all0", 0, 0, 0)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name,B,T,heads", SHAPES, ids=[s[0] for s in SHAPES])
def test_zero_size_shapes(name, B, T, heads, backend, configure):
    configure(backend=backend)
    q, k = (torch.randn(B, T, heads, K, requires_grad=True) for _ in range(2))
    v = torch.randn(B, T, heads, V, requires_grad=True)
    h0 = torch.randn(B, heads, K, V, requires_grad=True)
    o, ht = la.lightning_attn(q, k, v, torch.rand(heads), initial_state=h0, output_final_state=True)
    assert o.shape == (B, T, heads, V) and ht.shape == (B, heads, K, V)
    if T == 0:  # the final state is h0, never the caller's tensor itself
        assert torch.equal(ht, h0) and (ht.data_ptr() != h0.data_ptr() or not h0.numel())
    grads = torch.autograd.grad((o.sum() + ht.sum()), (q, k, v, h0), allow_unused=True, materialize_grads=True)
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape, h0.shape]
    o, ht = lightning_attn_inter(q, k, v, chunk_size=16, initial_state=h0, output_final_state=True)
    assert o.shape == (B, T, heads, V) and ht.shape == (B, heads, K, V)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name,B,heads,P", [("B0", 0, 2, 0), ("H0", 3, 0, 3), ("P0-padding", 2, 2, 0)],
                         ids=["B0", "H0", "P0-padding"])  # fmt: skip
def test_zero_size_decode(name, B, heads, P, backend, configure):
    configure(backend=backend)
    q, k = (torch.randn(B, heads, K) for _ in range(2))
    v = torch.randn(B, heads, V)
    pool = torch.zeros(P, heads, K, V)
    idx = torch.full((B,), -1) if P < B else None
    o = la.lightning_attn_decode(q, k, v, pool, torch.rand(heads), state_indices=idx)
    assert o.shape == (B, heads, V) and not o.any()


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_sequences_and_empty_sequences(backend, configure):
    configure(backend=backend)
    q = torch.randn(1, 0, H, K)
    o, ht = la.lightning_attn(q, q, q, cu_seqlens=torch.tensor([0]), output_final_state=True)
    assert o.shape == (1, 0, H, K) and ht.shape == (0, H, K, K)
    q = torch.randn(1, 5, H, K)
    h0 = torch.randn(3, H, K, K)
    o, ht = la.lightning_attn(q, q, q, cu_seqlens=torch.tensor([0, 0, 5, 5]), initial_state=h0, output_final_state=True)
    assert torch.equal(ht[0], h0[0]) and torch.equal(ht[2], h0[2])


# the offsets rule: cu_seqlens_cpu, when given, is what every path computes with


@pytest.mark.parametrize("backward", ["chunk", "recompute"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_both_backends_compute_with_the_host_offsets(backend, backward, configure):
    """A device cu_seqlens that disagrees with cu_seqlens_cpu (what only CUDA outside debug mode lets through) is
    not what either backend computes with: both give the result of cu_seqlens_cpu, forward and backward."""
    configure(backend=backend)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 40, H, d, generator=g, dtype=torch.float64) for d in (K, K, V))
    slope, h0 = torch.tensor([0.1, 0.7]), torch.randn(3, H, K, V, generator=g, dtype=torch.float64)
    host, device = torch.tensor([0, 7, 7, 40]), torch.tensor([0, 30, 35, 40])
    leaves = [x.clone().requires_grad_() for x in (q, k, v, h0)]
    o, ht = interface._dispatch(*leaves[:3], slope, scale=1.0, initial_state=leaves[3], output_final_state=True,
                                cu_seqlens=device, cu_seqlens_cpu=host, backward=backward)
    want_o, want_ht = recurrent_lightning_attn(*(x.detach() for x in leaves[:3]), slope, initial_state=h0,
                                               cu_seqlens=host)  # fmt: skip
    assert_close("o", o, want_o, 1e-10)
    assert_close("final_state", ht, want_ht, 1e-10)
    grads = torch.autograd.grad((o.square().sum() + ht.square().sum()), leaves)
    ref = [x.clone().requires_grad_() for x in (q, k, v, h0)]
    ref_o, ref_ht = recurrent_lightning_attn(*ref[:3], slope, initial_state=ref[3], cu_seqlens=host)
    want = torch.autograd.grad((ref_o.square().sum() + ref_ht.square().sum()), ref)
    for name, a, b in zip(("dq", "dk", "dv", "dh0"), grads, want):
        assert_close(name, a, b, 1e-10)


# memory safety of unchecked values


@triton.jit
def _segments_of(cu, out, T, VARLEN: tl.constexpr):
    i = tl.program_id(0)
    _, _, bos, eos, _, _ = _segment(i, cu, cu, T, 1, 1, VARLEN)
    tl.store(out + 2 * i, bos)
    tl.store(out + 2 * i + 1, eos)


@triton.jit
def _bounds_of(cu, out, T):
    i = tl.program_id(0)
    _, bos, eos = _sequence_bounds(cu, i, T, True)
    tl.store(out + 2 * i, bos)
    tl.store(out + 2 * i + 1, eos)


GARBAGE = torch.tensor([0, -5, 300, 12, 7, 40], dtype=torch.int64)


def _clamped_bounds(cu: list[int], T: int) -> list[list[int]]:
    bounds = []
    for a, b in zip(cu[:-1], cu[1:]):
        bos = min(max(a, 0), T)
        bounds.append([bos, min(max(b, bos), T)])
    return bounds


@pytest.mark.parametrize("kernel", ["walk", "recompute"])
def test_kernels_clamp_unchecked_offsets(kernel):
    """The segment of packed sequence i is [clamp(cu[i], 0, T), clamp(cu[i+1], bos, T)): offsets that were never
    checked (CUDA outside debug mode) address no token outside the row, whatever they hold."""
    T, N = 20, GARBAGE.numel() - 1
    out = torch.full((N, 2), -99, dtype=torch.int64)
    if kernel == "walk":
        _segments_of[(N,)](GARBAGE, out, T, VARLEN=1)
    else:
        _bounds_of[(N,)](GARBAGE, out, T)
    assert out.tolist() == _clamped_bounds(GARBAGE.tolist(), T)


def test_triton_walk_with_unchecked_offsets_stays_in_its_row(configure):
    """End to end, below the checks: garbage device offsets run, and each sequence's final state is that of its
    clamped token range (the outputs of overlapping ranges are written twice: wrong, but inside the row)."""
    configure(backend="triton")
    from lightning_attention.ops.lightning import ops

    g = torch.Generator().manual_seed(1)
    T = 20
    q, k, v = (torch.randn(1, T, H, K, generator=g) for _ in range(3))
    o, ht = ops.chunk_lightning_attn_triton(
        q, k, v, None, scale=1.0, initial_state=None, output_final_state=True, cu_seqlens=GARBAGE, cu_seqlens_cpu=None,
        backward="auto",
    )  # fmt: skip
    assert o.shape == q.shape and ht.shape == (GARBAGE.numel() - 1, H, K, V)
    for n, (bos, eos) in enumerate(_clamped_bounds(GARBAGE.tolist(), T)):
        _, want = recurrent_lightning_attn(q[:, bos:eos], k[:, bos:eos], v[:, bos:eos])
        assert_close(f"final state {n}", ht[n], want[0], 1e-5)


def test_pytorch_path_sanitises_unchecked_offsets():
    """The PyTorch path on offsets nobody checked: no index error (a device assert on CUDA), the result of valid
    offsets (clamped to [0, T], made non-decreasing)."""
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 20, H, K, generator=g, dtype=torch.float64) for _ in range(3))
    h0 = torch.randn(GARBAGE.numel() - 1, H, K, V, generator=g, dtype=torch.float64)
    o, ht = chunk_lightning_attn(q, k, v, initial_state=h0, cu_seqlens=GARBAGE)
    sane = GARBAGE.clamp(0, 20).cummax(0).values
    want_o, want_ht = recurrent_lightning_attn(q, k, v, initial_state=h0, cu_seqlens=sane)
    assert_close("o", o[:, : int(sane[-1])], want_o, 1e-10)
    assert_close("final_state", ht, want_ht, 1e-10)


@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_with_unchecked_indices_stays_in_the_pool(backend, configure):
    """An index past the pool (only CUDA outside debug mode lets one through) is a padding slot: its output is zero
    and no row outside the pool is touched (the pool is a view between two guard rows)."""
    configure(backend=backend)
    P = 3
    buffer = torch.randn(P + 2, H, K, V)
    pool, before = buffer[1 : P + 1], buffer.clone()
    q, k = (torch.randn(3, H, K) for _ in range(2))
    v = torch.randn(3, H, V)
    idx = torch.tensor([P, 0, -1])  # P: the guard row after the pool, were it used as an address
    out = torch.full((3, H, V), float("nan"))
    if backend == "triton":
        from lightning_attention.ops.lightning.decode_triton import decode_step_triton

        decode_step_triton(q, k, v, pool, None, 1.0, idx, out)
    else:
        decode_step_torch(q, k, v, pool, None, 1.0, idx, out)
    assert torch.equal(buffer[0], before[0]) and torch.equal(buffer[P + 1], before[P + 1]), "a guard row was written"
    assert torch.equal(buffer[2:P + 1], before[2:P + 1]), "a row nobody named was written"
    assert not out[0].any() and not out[2].any()
    assert_close("row 0", pool[0], before[1] + torch.einsum("hk,hv->hkv", k[1], v[1]), 1e-6)


# the CPU Triton mode, without the test suite's shims

CPU_TRITON_SCRIPT = textwrap.dedent(
    """
    import torch, lightning_attention as la
    from lightning_attention.ops.lightning.naive import chunk_lightning_attn, recurrent_lightning_attn
    g = torch.Generator().manual_seed(0)
    for dtype, tol in ((torch.float32, 1e-5), (torch.float16, 2e-3)):
        q, k, v, do = (torch.randn(1, 40, 2, 16, generator=g).to(dtype) for _ in range(4))
        s = torch.tensor([0.1, 0.5])
        for backward in ("chunk", "recompute"):
            leaves = [x.clone().requires_grad_() for x in (q, k, v)]
            o, _ = la.lightning_attn(*leaves, s, backward=backward)
            ref = [x.double().requires_grad_() for x in (q, k, v)]
            want, _ = chunk_lightning_attn(*ref, s)
            got = [o] + list(torch.autograd.grad(o, leaves, do))
            exp = [want] + list(torch.autograd.grad(want, ref, do.double()))
            for name, a, b in zip(("o", "dq", "dk", "dv"), got, exp):
                err = ((a.double() - b).norm() / b.norm()).item()
                assert err <= tol, (dtype, backward, name, err)
    for dtype, tol in ((torch.float32, 1e-5), (torch.float16, 2e-3), (torch.bfloat16, 5e-3)):
        q, k, v = (torch.randn(3, 2, 16, generator=g).to(dtype) for _ in range(3))
        pool = torch.randn(3, 2, 16, 16, generator=g)
        new = pool.double() + torch.einsum("bhk,bhv->bhkv", k.double(), v.double())
        want = torch.einsum("bhk,bhkv->bhv", q.double(), new)
        o = la.lightning_attn_decode(q, k, v, pool)
        err = ((o.double() - want).norm() / want.norm()).item()
        assert err <= tol, (dtype, "decode", err)
    for dtype, precision in ((torch.bfloat16, "input"), (torch.float16, "split")):  # split fp16 computes in bf16
        x = torch.randn(1, 20, 2, 16).to(dtype)
        try:
            with la.settings.override(precision=precision):
                la.lightning_attn(x, x, x)
        except NotImplementedError as e:
            assert "bfloat16" in str(e) and "interpreter" in str(e), e
        else:
            raise AssertionError(f"{dtype} chunk calls ({precision}) must raise on an interpreter "
                                 "computing bf16 wrongly")
    print("CPU TRITON MODE OK")
    """
)


def test_cpu_triton_mode_without_the_test_shims():
    """LIGHTNING_ATTENTION_BACKEND=triton with TRITON_INTERPRET=1, in a fresh process that imports nothing from
    tests/: float32 and float16 forward and both backwards, decode in every dtype, bfloat16 chunk calls (and float16
    ones under the split precision, which compute in bf16) refused with a clear error (Triton's interpreter computes
    bf16 on raw bits; the README says so)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LIGHTNING_ATTENTION_", "TRITON_", "INTERP_"))}
    env.update(LIGHTNING_ATTENTION_BACKEND="triton", TRITON_INTERPRET="1", PYTHONPATH=ROOT)
    proc = subprocess.run(
        [sys.executable, "-c", CPU_TRITON_SCRIPT], env=env, capture_output=True, text=True, timeout=600, cwd=ROOT
    )
    assert proc.returncode == 0 and "CPU TRITON MODE OK" in proc.stdout, proc.stderr[-3000:]
