"""Reliability on a GPU (``pytest -m gpu``; skipped without CUDA): what only the compiled kernels and a real device
can show (docs/design.md, "Input checks" and "Non-finite values and overflow").

- The default CUDA path does no host sync (``torch.cuda.set_sync_debug_mode("error")``), packed sequences with
  their host copy included.
- Offsets and state indices that only CUDA outside debug mode leaves unchecked stay inside the tensors (the
  kernels clamp them; run this file under ``compute-sanitizer --tool memcheck`` too), and debug mode catches them.
- A non-finite q or k at token t reaches no output before t in the compiled kernels, every variant the plan picks.
"""

import pytest
import torch

import lightning_attention as la
from lightning_attention.ops.lightning import naive
from lightning_attention.utils.testing import assert_close

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _triton(triton_backend):
    return triton_backend


def _qkv(B, T, H, K, V, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return tuple(torch.randn(B, T, H, d, device="cuda", generator=g).to(dtype) for d in (K, K, V))


def test_default_path_does_not_sync():
    q, k, v = _qkv(1, 4096, 8, 64, 64, torch.bfloat16)
    leaves = [x.requires_grad_() for x in (q, k, v)]
    slope = la.tnl_slopes(8, 0, 4).cuda()
    pool = torch.zeros(4, 8, 64, 64, device="cuda")
    idx = torch.tensor([2, -1, 0], device="cuda")
    step = [x[0, :3].detach().contiguous() for x in (q, k, v)]  # three decode rows [3, H, D]
    out = torch.empty(3, 8, 64, device="cuda", dtype=torch.bfloat16)

    packings = [torch.tensor(offsets, dtype=torch.int32) for offsets in ([0, 1000, 4096], [0, 7, 2000, 4096])]
    on_device = [cu.cuda() for cu in packings]  # the caller's device copies, made before the check

    def calls(n):
        o, ht = la.lightning_attn(*leaves, slope, output_final_state=True, cu_seqlens=on_device[n],
                                  cu_seqlens_cpu=packings[n])  # fmt: skip
        torch.autograd.grad((o.float().sum() + ht.sum()), leaves)
        la.lightning_attn_decode(*step, pool, slope, state_indices=idx, out=out)

    calls(0)  # compiles, tunes and plans outside the check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        calls(0)
        calls(1)  # new offsets: a new program and the library's device copy of them, still no sync
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


@pytest.mark.parametrize("backward", ["chunk", "recompute"])
def test_garbage_device_offsets_with_a_host_copy_compute_the_host_offsets(backward):
    q, k, v = (x.float().requires_grad_() for x in _qkv(1, 3000, 4, 64, 64, torch.float32))
    host = torch.tensor([0, 5, 1200, 3000])
    garbage = torch.tensor([7, -100000, 10**9, 2], device="cuda")
    o, ht = la.lightning_attn(q, k, v, output_final_state=True, cu_seqlens=garbage, cu_seqlens_cpu=host,
                              backward=backward)  # fmt: skip
    want, want_ht = naive.chunk_lightning_attn(*(x.detach().double() for x in (q, k, v)), cu_seqlens=host.cuda())
    assert_close("o", o, want, 1e-5)
    assert_close("final state", ht, want_ht, 1e-5)
    torch.autograd.grad(o.sum(), (q, k, v))
    torch.cuda.synchronize()  # a fault would surface here


def test_garbage_device_offsets_without_a_host_copy_stay_in_the_row():
    q, k, v = _qkv(1, 3000, 4, 64, 64, torch.bfloat16)
    for garbage in ([0, -5, 10**9], [10**6, 3, 2999, -1], [0, 2**31 - 1, 3000]):
        cu = torch.tensor(garbage, device="cuda")
        for mode in ("chunk", "recompute"):
            leaves = [x.clone().requires_grad_() for x in (q, k, v)]
            o, ht = la.lightning_attn(*leaves, output_final_state=True, cu_seqlens=cu, backward=mode)
            torch.autograd.grad(o.float().sum() + ht.sum(), leaves)
            torch.cuda.synchronize()


def test_garbage_state_indices_stay_in_the_pool():
    P, H, K, V = 4, 8, 128, 128
    buffer = torch.randn(P + 2, H, K, V, device="cuda")
    pool, before = buffer[1 : P + 1], buffer.clone()
    q, k, v = (x[:, 0].contiguous() for x in _qkv(3, 1, H, K, V, torch.bfloat16))
    from lightning_attention.ops.lightning.decode_triton import decode_step_triton

    out = decode_step_triton(q, k, v, pool, None, 1.0, torch.tensor([P, 10**6, -7], device="cuda"), None)
    torch.cuda.synchronize()
    assert torch.equal(buffer, before) and not out.any()


def test_debug_mode_catches_what_cuda_leaves_unchecked(configure):
    configure(debug=True)
    q, k, v = _qkv(1, 100, 2, 64, 64, torch.float32)
    with pytest.raises(ValueError, match="cu_seqlens must equal cu_seqlens_cpu"):
        la.lightning_attn(q, k, v, cu_seqlens=torch.tensor([0, 50, 100], device="cuda"),
                          cu_seqlens_cpu=torch.tensor([0, 60, 100]))  # fmt: skip
    with pytest.raises(ValueError, match="slope must be finite in float32"):
        la.lightning_attn(q, k, v, torch.tensor([0.1, 1e300], dtype=torch.float64, device="cuda"))
    pool = torch.zeros(2, 2, 64, 64, device="cuda")
    with pytest.raises(ValueError, match="state_indices must be in"):
        la.lightning_attn_decode(q[0, :1], k[0, :1], v[0, :1], pool, state_indices=torch.tensor([2], device="cuda"))
    v[0, 70, 1, 3] = float("nan")
    with pytest.raises(ValueError, match=r"v is not finite at token 70 \(batch 0, head 1\)"):
        la.lightning_attn(q, k, v)


# the compiled kernels' masks: (dtype, K = V, B, H); bfloat16 K = 128 and 256 on sm_90 with this many programs run
# the two-warpgroup walk (kernels/walk_ws.py), K = 128 with 8 (head, batch) pairs the Triton walk
CAUSAL_CASES = [(torch.float32, 64, 2, 4), (torch.float16, 128, 2, 4), (torch.bfloat16, 128, 2, 4),
                (torch.bfloat16, 128, 8, 16), (torch.bfloat16, 256, 4, 16)]  # fmt: skip


@pytest.mark.parametrize("poisoned", ["q", "k"])
@pytest.mark.parametrize("dtype,D,B,H", CAUSAL_CASES,
                         ids=["fp32-64", "fp16-128", "bf16-128", "bf16-128-two-warpgroups", "bf16-256"])  # fmt: skip
def test_non_finite_q_or_k_reaches_no_earlier_output(dtype, D, B, H, poisoned):
    _check_causal_masks(dtype, D, B, H, poisoned)


@pytest.mark.parametrize("poisoned", ["q", "k"])
def test_non_finite_q_or_k_reaches_no_earlier_output_under_the_split_precision(poisoned, configure):
    """The two-warpgroup walk's split operands (bf16 K = 128 on sm_90) select on the same masks."""
    configure(precision="split")
    _check_causal_masks(torch.bfloat16, 128, 8, 16, poisoned)


def _check_causal_masks(dtype, D, B, H, poisoned):
    """A NaN in q or k at token 700 of 1024 leaves every earlier output bitwise as it was."""
    T, t = 1024, 700
    q, k, v = _qkv(B, T, H, D, D, dtype)
    slope = la.tnl_slopes(H, 1, 4).cuda()
    clean, _ = la.lightning_attn(q, k, v, slope)
    x = {"q": q.clone(), "k": k.clone(), "v": v}
    x[poisoned][:, t] = float("nan")
    got, _ = la.lightning_attn(x["q"], x["k"], x["v"], slope)
    assert torch.equal(got[:, :t], clean[:, :t])
