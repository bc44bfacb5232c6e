"""Real sizes on a GPU (``pytest -m gpu``; skipped without CUDA): T up to 65,536, K = V = 128, B·H up to 64, and
head dims from 32 to 256.

Reference: ``naive.chunk_lightning_attn`` in float64 on the GPU (the quadratic form is O(T²) memory), from the same
rounded inputs, forward and every gradient. Outputs are NaN-poisoned by tests/conftest.py. Long sequences at small
B·H go through the segmented path (pre-pass + scan + walk) by themselves.
"""

import os
import subprocess
import sys

import pytest
import torch

import lightning_attention as la
from lightning_attention.ops.lightning import naive
from lightning_attention.utils.testing import assert_close

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _triton(triton_backend):
    return triton_backend


def _inputs(B, T, H, K, V, dtype, seed=0, N=None):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(B, T, H, d, device="cuda", generator=g).to(dtype).requires_grad_() for d in (K, K, V))
    h0 = torch.randn(N or B, H, K, V, device="cuda", generator=g).requires_grad_()
    do = torch.randn(B, T, H, V, device="cuda", generator=g).to(dtype)
    dht = torch.randn(N or B, H, K, V, device="cuda", generator=g)
    return q, k, v, h0, do, dht


def _fwd_bwd(q, k, v, h0, do, dht, slope, cu=None, cu_cpu=None, scale=1.0):
    o, ht = la.lightning_attn(
        q, k, v, slope, scale=scale, initial_state=h0, output_final_state=True, cu_seqlens=cu, cu_seqlens_cpu=cu_cpu
    )
    grads = torch.autograd.grad((o.double() * do.double()).sum() + (ht.double() * dht.double()).sum(), (q, k, v, h0))
    return (o, ht, *grads)


def _reference(q, k, v, h0, do, dht, slope, cu_cpu=None, scale=1.0):
    x64 = [t.detach().double().requires_grad_() for t in (q, k, v, h0)]
    o, ht = naive.chunk_lightning_attn(
        *x64[:3], slope, scale=scale, initial_state=x64[3], cu_seqlens=cu_cpu, chunk_size=256
    )
    grads = torch.autograd.grad((o * do.double()).sum() + (ht * dht.double()).sum(), x64)
    return (o, ht, *grads)


def _compare(got, ref, dtype):
    for name, a, b in zip(("o", "final_state", "dq", "dk", "dv", "dh0"), got, ref):
        assert_close(name, a, b, dtype)


REAL = [
    pytest.param(1, 65536, 4, 128, torch.bfloat16, "tnl", id="bf16-B1-T64K-H4-tnl-segmented"),
    pytest.param(8, 8192, 8, 128, torch.bfloat16, "none", id="bf16-B8-T8K-H8-nodecay"),
    pytest.param(4, 4096, 16, 128, torch.float16, "tnl", id="fp16-B4-T4K-H16"),
    pytest.param(2, 3000, 4, 64, torch.float32, "strong", id="fp32-B2-T3000-K64-strong"),
    # segmented at K = 64: the dq walk also computes the reverse local states
    pytest.param(2, 32768, 4, 64, torch.bfloat16, "tnl", id="bf16-B2-T32K-H4-K64-segmented"),
]


@pytest.mark.gpu_memory
@pytest.mark.parametrize("B, T, H, D, dtype, decay", REAL)
def test_real_sizes_against_float64(B, T, H, D, dtype, decay):
    K = V = D
    slope = {"tnl": la.tnl_slopes(H, 1, 12), "none": None, "strong": torch.full((H,), 5.0)}[decay]
    slope = None if slope is None else slope.to("cuda", torch.float32)
    inputs = _inputs(B, T, H, K, V, dtype)
    _compare(_fwd_bwd(*inputs, slope, scale=0.5), _reference(*inputs, slope, scale=0.5), dtype)


@pytest.mark.gpu_memory
def test_varlen_real_sizes_with_host_offsets():
    lengths = [0, 1, 15, 30000, 5000, 20000]
    offsets = torch.tensor([0] + lengths).cumsum(0).to(torch.int32)
    T, H = int(offsets[-1]), 4
    slope = la.tnl_slopes(H, 0, 12).to("cuda", torch.float32)
    inputs = _inputs(1, T, H, 128, 128, torch.bfloat16, N=len(lengths))
    cu = offsets.cuda()
    got = _fwd_bwd(*inputs, slope, cu=cu, cu_cpu=offsets)
    _compare(got, _reference(*inputs, slope, cu_cpu=offsets), torch.bfloat16)
    got_sync = _fwd_bwd(*inputs, slope, cu=cu)  # no host copy: one segment per sequence
    _compare(got_sync, _reference(*inputs, slope, cu_cpu=offsets), torch.bfloat16)


# every kind of launch sequence the dispatcher builds: the segmented path (pre-pass, scan, walks), the two-warpgroup
# walk (bf16 K = 128 in segments, K = 256 whole), the fused dk/dv walk (K = 64's backward; in segments after the dq
# walk that computes the reverse local states), fp16 and fp32 products,
# packed sequences, the split precision (through the Triton walk, and through the two-warpgroup walk in segments), the
# recompute backward and a learned decay (its float32 backward and the slope's gradient)
DETERMINISM = [
    pytest.param(1, 20000, 8, 128, torch.bfloat16, {"settings": {"gluon": False}}, id="bf16-K128-segmented"),
    pytest.param(2, 8192, 16, 128, torch.bfloat16, {}, id="bf16-K128-two-warpgroups-segmented"),
    pytest.param(8, 2048, 16, 64, torch.bfloat16, {"settings": {"fused_dkdv": True}}, id="bf16-K64-fused-dkdv"),
    pytest.param(2, 16384, 16, 64, torch.bfloat16, {}, id="bf16-K64-segmented-reverse-states"),
    pytest.param(4, 2048, 16, 256, torch.bfloat16, {}, id="bf16-K256-two-warpgroups"),
    pytest.param(4, 3000, 8, 128, torch.float16, {}, id="fp16-K128"),
    pytest.param(2, 3000, 4, 64, torch.float32, {}, id="fp32-K64"),
    pytest.param(1, 30000, 4, 128, torch.bfloat16, {"cu": (0, 1, 15, 20000, 30000)}, id="bf16-varlen"),
    pytest.param(4, 4096, 8, 128, torch.bfloat16, {"settings": {"precision": "split"}}, id="bf16-split"),
    pytest.param(2, 8192, 16, 128, torch.bfloat16, {"settings": {"precision": "split"}},
                 id="bf16-split-two-warpgroups-segmented"),  # fmt: skip
    pytest.param(2, 4096, 8, 128, torch.bfloat16, {"backward": "recompute"}, id="bf16-recompute-backward"),
    pytest.param(2, 4096, 8, 64, torch.bfloat16, {"learned_decay": True}, id="bf16-learned-decay"),
]


@pytest.mark.parametrize("B, T, H, D, dtype, case", DETERMINISM)
def test_run_to_run_determinism(B, T, H, D, dtype, case, triton_backend):
    """The same call twice in one process gives bitwise-equal outputs, final states and gradients (q, k, v, h0 and
    a learned slope): no kernel sums partial results in an order that depends on scheduling (docs/design.md,
    "Determinism")."""
    triton_backend(**case.get("settings", {}))
    slope = la.tnl_slopes(H, 2, 12).to("cuda", torch.float32).requires_grad_(case.get("learned_decay", False))
    cu_cpu = torch.tensor(case["cu"], dtype=torch.int32) if "cu" in case else None
    q, k, v, h0, do, dht = _inputs(B, T, H, D, D, dtype, N=None if cu_cpu is None else len(case["cu"]) - 1)
    leaves = (q, k, v, h0, slope) if slope.requires_grad else (q, k, v, h0)

    def call():
        o, ht = la.lightning_attn(
            q, k, v, slope, initial_state=h0, output_final_state=True, backward=case.get("backward", "auto"),
            cu_seqlens=None if cu_cpu is None else cu_cpu.cuda(), cu_seqlens_cpu=cu_cpu,
        )  # fmt: skip
        loss = (o.double() * do.double()).sum() + (ht.double() * dht.double()).sum()
        return (o, ht, *torch.autograd.grad(loss, leaves))

    first, second = call(), call()
    for name, a, b in zip(("o", "final_state", "dq", "dk", "dv", "dh0", "dslope"), first, second):
        assert torch.equal(a, b), f"{name} differs between two identical calls"


def test_autocast_bf16_region():
    """Inside torch.autocast the op takes the dtype it is given (q, k, v bf16 from autocast-ed projections)."""
    B, T, H, D = 2, 1000, 4, 64
    x = torch.randn(B, T, 3 * H * D, device="cuda")
    w = torch.randn(3 * H * D, 3 * H * D, device="cuda") / (3 * H * D) ** 0.5
    w.requires_grad_()
    slope = la.tnl_slopes(H, 0, 4).cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        q, k, v = (x @ w).view(B, T, H, 3 * D).split(D, dim=-1)  # strided bf16 views of one projection
        o, _ = la.lightning_attn(q, k, v, slope)
    assert o.dtype == torch.bfloat16
    o.float().square().mean().backward()
    assert w.grad is not None and torch.isfinite(w.grad).all()


@pytest.mark.parametrize("V, C", [(16, 64), (32, 128), (48, 64), (128, 64), (128, 256), (129, 128)])
def test_inter_only_mode_on_gpu(V, C):
    """The inter-only mode (hybrid attention) at the hybrid bench's head count against the PyTorch inter path, fwd and
    grads. These shapes faulted on an H100 while the mode was autotuned (docs/kernels.md, "The inter-only tiles")."""
    from lightning_attention.ops.lightning.ops import lightning_attn_inter_triton
    from lightning_attention.ops.lightning.inter import inter_lightning_attn_torch

    B, T, H, K = 1, 1024, 16, 128
    q, k, v, h0, do, dht = _inputs(B, T, H, K, V, torch.bfloat16)
    slope = la.tnl_slopes(H, 0, 2).cuda()
    o, ht = lightning_attn_inter_triton(q, k, v, slope, chunk_size=C, initial_state=h0, output_final_state=True)
    got = (o, ht, *torch.autograd.grad((o.double() * do.double()).sum() + (ht.double() * dht.double()).sum(),
                                       (q, k, v, h0)))  # fmt: skip
    x64 = [t.detach().double().requires_grad_() for t in (q, k, v, h0)]
    o_r, ht_r = inter_lightning_attn_torch(*x64[:3], slope, chunk_size=C, initial_state=x64[3])
    ref = (o_r, ht_r, *torch.autograd.grad((o_r * do.double()).sum() + (ht_r * dht.double()).sum(), x64))
    _compare(got, ref, torch.bfloat16)


@pytest.mark.parametrize("segment_len", [0, 256])
@pytest.mark.parametrize("K, V", [(64, 64), (64, 32), (32, 64), (32, 32), (128, 32), (256, 256), (256, 64)])
def test_head_dims_against_float64(K, V, segment_len, configure):
    """Small, narrow and large head dims, whole sequences and segments of 256 tokens, autotuned as in use. On an H100
    (triton 3.6) a 32-wide tile with 4 warps computed wrong values at K = V = 64 and faulted at (K, V) = (64, 32),
    (32, 64) and K = V = 256 (docs/kernels.md, "Walk tiles at least 64 wide")."""
    configure(segment_len=segment_len)
    B, T, H = 1, 1024, 16
    slope = la.tnl_slopes(H, 0, 2).to("cuda", torch.float32)
    inputs = _inputs(B, T, H, K, V, torch.bfloat16)
    _compare(_fwd_bwd(*inputs, slope), _reference(*inputs, slope), torch.bfloat16)


def test_every_chunk_launch_stays_on_the_direct_path(configure):
    """The chunk programs' launchers keep their direct path (ops/lightning/launch.py) through a segmented fwd+bwd,
    the fused dk/dv walk, the inter-only walk and (on sm_90) the two-warpgroup walk and pre-pass at K = 256: one that
    disables itself still computes right values but pays Triton's launch per call (once a walk constexpr with a
    default doubled K = 64's fwd+bwd)."""
    import warnings

    from lightning_attention.ops.lightning import launches, ops, plan
    from lightning_attention.ops.lightning.device import device_info

    for launcher in launches.launchers():
        launcher.reset()  # another test may have disabled one on purpose
    B, T, H, K = 2, 4096, 4, 64
    q, k, v, h0, do, dht = _inputs(B, T, H, K, K, torch.bfloat16)
    slope = la.tnl_slopes(H, 0, 2).cuda()
    device = device_info(q.device)
    two_warpgroups = device.capability == 90 and plan._walk_ws_available()
    with warnings.catch_warnings():
        # a launcher that disables itself warns: fail at that launch
        warnings.filterwarnings("error", message=".*direct kernel launch disabled", category=RuntimeWarning)
        for fused in (False, True):
            configure(segment_len=1024, fused_dkdv=fused)
            for _ in range(3):  # the first launch compiles, the second verifies, the third goes direct
                _fwd_bwd(q, k, v, h0, do, dht, slope)
        for _ in range(3):
            o, ht = ops.lightning_attn_inter_triton(q, k, v, slope, chunk_size=128, initial_state=h0,
                                                    output_final_state=True)  # fmt: skip
            torch.autograd.grad((o.float() * do.float()).sum() + (ht * dht).sum(), (q, k, v, h0))
        if two_warpgroups:  # K = 256 in segments: 4 × 16 heads × 4 pairs of value tiles per segment
            configure(segment_len=512)
            inputs = _inputs(4, 1024, 16, 256, 256, torch.bfloat16)
            slope16 = la.tnl_slopes(16, 0, 2).cuda()
            for _ in range(3):
                _fwd_bwd(*inputs, slope16)
    torch.cuda.synchronize()
    used = [launcher for launcher in launches.launchers() if launcher.entries]
    names = {launcher.name for launcher in used}
    assert "lightning_attn segment scan" in names and any(n.startswith("lightning_attn dk/dv walk") for n in names)
    assert any(n.startswith("lightning_attn walk") for n in names)
    if two_warpgroups:
        assert {"lightning_attn walk (two warpgroups)", "lightning_attn segment pre-pass (two warpgroups)"} <= names
    for launcher in used:
        assert launcher.disabled is None, (launcher.name, launcher.disabled)
        # verified: its compiled kernel's launcher is called directly
        assert any(e.launcher is not None for e in launcher.entries.values()), launcher.name


@pytest.mark.parametrize("K", [128, 256])
@pytest.mark.parametrize(
    "T, decay, scale, segment_len, piece_len",
    [
        (1000, "tnl", 1.0, 0, 0),
        (777, "none", 0.0625, 0, 0),
        (1024, "tnl", 1.0, 256, 0),
        (2000, "tnl", 0.5, 1024, 256),
        (130, "tnl", 1.0, 0, 0),
    ],
    ids=["ragged", "no-decay-scaled", "segments", "segments-in-pieces-ragged", "three-chunks"],
)
def test_two_warpgroup_walk_against_float64_and_the_triton_walk(T, decay, scale, segment_len, piece_len, K, configure):
    """K = V = 128 and 256 through the two-warpgroup walk and pre-pass (kernels/walk_ws.py) in all four passes (at
    K = 128 dk and dv from the two-warpgroup fused walk, kernels/dkdv_ws.py), with an initial state and a final-state
    gradient, whole and in segments (the pre-pass on the segments, on pieces the
    plan picks, or on given pieces): against float64, and against the Triton walk (the gluon setting off) within the
    rounding of the bf16 outputs."""
    from lightning_attention.ops.lightning import launches, plan
    from lightning_attention.ops.lightning.device import device_info

    if device_info(torch.device("cuda")).capability != 90 or not plan._walk_ws_available():
        pytest.skip("the two-warpgroup walk needs an sm_90 GPU and a Triton with Gluon")
    configure(segment_len=segment_len, prepass_len=piece_len or None)  # no pieces given: the plan's choice
    # more programs than half an H100's SMs, so the walk takes them: 256 of two 32-wide value tiles at K = 256, 128
    # of two 64-wide ones at K = 128
    B, H = (4, 16) if K == 256 else (8, 16)
    slope = la.tnl_slopes(H, 0, 2).cuda() if decay == "tnl" else None
    inputs = _inputs(B, T, H, K, K, torch.bfloat16)
    launches._WALK_WS.reset()
    launches._STATE_WS.reset()
    launches._DKDV_WS.reset()
    got = _fwd_bwd(*inputs, slope, scale=scale)
    assert launches._WALK_WS.entries, "the two-warpgroup walk did not run"
    assert bool(launches._DKDV_WS.entries) == (K == 128), "the two-warpgroup dk/dv walk ran or did not"
    assert bool(launches._STATE_WS.entries) == bool(segment_len), "the two-warpgroup pre-pass ran or did not"
    _compare(got, _reference(*inputs, slope, scale=scale), torch.bfloat16)
    configure(gluon=False)
    triton_walk = _fwd_bwd(*inputs, slope, scale=scale)
    for name, a, b in zip(("o", "final_state", "dq", "dk", "dv", "dh0"), got, triton_walk):
        diff = ((a.double() - b.double()).norm() / b.double().norm()).item()
        assert diff < 5e-3, (name, diff)


_FIRST_CALL = """
import pathlib, sys, torch
import lightning_attention as la
cache = pathlib.Path(sys.argv[1])
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v, do = (torch.randn(2, 4096, 4, 64, device="cuda", generator=g).bfloat16() for _ in range(4))
for x in (q, k, v):
    x.requires_grad_()
o, _ = la.lightning_attn(q, k, v, la.tnl_slopes(4, 0, 2).cuda())
torch.cuda.synchronize()
after_forward = sum(1 for _ in cache.rglob("*.cubin"))
(o.float() * do).sum().backward()
torch.cuda.synchronize()
after_backward = sum(1 for _ in cache.rglob("*.cubin"))
torch.save([o.detach(), q.grad, k.grad, v.grad], cache / "values.pt")
print(after_forward, after_backward)
"""


def test_first_fwd_bwd_compiles_the_backward_with_the_forward(tmp_path):
    """From an empty Triton cache, in a process of its own, a segmented fwd+bwd (pre-pass, scan and walks): with
    compile-ahead on, every kernel the backward launches is built during the forward call (ops/lightning/
    compile_ahead.py); off, the backward builds its own. Built ahead, an autotuned launch builds every candidate
    even where the launch will reuse the tuning of another launch with the same tuning key (which then builds only
    the winner): at least as many kernels, never fewer. The values are bitwise the same either way."""
    counts, values = {}, {}
    for ahead in ("1", "0"):
        cache = tmp_path / f"cache{ahead}"
        cache.mkdir()
        env = dict(os.environ, TRITON_CACHE_DIR=str(cache), LIGHTNING_ATTENTION_BACKEND="triton",
                   LIGHTNING_ATTENTION_SEGMENT_LEN="1024", LIGHTNING_ATTENTION_COMPILE_AHEAD=ahead)  # fmt: skip
        out = subprocess.run([sys.executable, "-c", _FIRST_CALL, str(cache)], env=env, capture_output=True, text=True,
                             timeout=300, check=True)  # fmt: skip
        counts[ahead] = tuple(int(n) for n in out.stdout.split()[-2:])
        values[ahead] = torch.load(cache / "values.pt")
    (forward_on, backward_on), (forward_off, backward_off) = counts["1"], counts["0"]
    assert forward_on == backward_on >= backward_off  # ahead: nothing left to build at the backward
    assert forward_off < backward_off  # the check means something: the backward has kernels of its own
    for a, b in zip(values["1"], values["0"]):
        assert torch.equal(a, b)
