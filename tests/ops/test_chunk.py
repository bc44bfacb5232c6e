"""Triton path of ``lightning_attn`` (forward and every gradient) against the float64 reference.

Without a GPU the kernels run under the Triton interpreter (tests/conftest.py), so the shapes are small; with a GPU
the same cases run compiled. Every case compares with ``naive.quadratic_lightning_attn`` in float64 computed from the
same rounded inputs, with the loss ``(o·do).sum() + (final_state·dht).sum()`` so that dh0 and the path through the
final state are covered, and the relative-L2 tolerance of the input dtype (docs/design.md, "Testing discipline").
The plan's rules and the launch programs are tested without kernels in tests/ops/test_plan.py.
"""

from dataclasses import dataclass

import pytest
import torch

import lightning_attention as la
from lightning_attention.ops.lightning import naive
from lightning_attention.utils.testing import assert_close

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

DECAYS = {
    "none": None,
    "weak": lambda h: torch.full((h,), 0.01),
    "strong": lambda h: torch.full((h,), 5.0),
    "mixed": lambda h: torch.tensor([0.0, 0.05, 5.0, 0.5])[:h],
}


@dataclass(frozen=True)
class Case:
    id: str
    T: int
    K: int
    V: int
    B: int = 1
    H: int = 2
    dtype: torch.dtype = torch.float32
    decay: str = "weak"
    scale: float = 1.0
    h0: bool = True
    final: bool = True
    cu: tuple | None = None  # varlen offsets (B == 1)
    cu_cpu: bool = False  # also pass cu_seqlens_cpu
    seg: int | None = None  # the segment_len setting: force segments at small T
    piece: int | None = None  # the prepass_len setting: the pre-pass on pieces of the segments
    strided: bool = False  # q, k, v, u split from one fused projection


CASES = [
    Case("fp32-T63-K64", T=63, K=64, V=64),
    Case("fp32-T100-K48-V100-strong-scale", T=100, K=48, V=100, decay="strong", scale=0.5),
    Case("fp32-T1-K16-nodecay", T=1, K=16, V=16, decay="none"),
    Case("fp32-T0-h0", T=0, K=32, V=32),
    Case("fp32-T0-noh0", T=0, K=16, V=48, h0=False),
    Case("fp32-T200-K128-mixed", T=200, K=128, V=128, H=3, decay="mixed", h0=False),
    Case("fp32-K8-V20-tiny-dims", T=40, K=8, V=20),
    Case("fp32-B2-nofinal", T=50, K=32, V=64, B=2, final=False, h0=False, decay="mixed"),
    Case("fp16-T100-K64-V48-scale", T=100, K=64, V=48, dtype=torch.float16, scale=0.125),
    Case("fp16-T40-K256-V64-strong", T=40, K=256, V=64, H=1, dtype=torch.float16, decay="strong"),
    Case("bf16-T100-K64-mixed", T=100, K=64, V=64, H=4, dtype=torch.bfloat16, decay="mixed"),
    Case("bf16-T63-K100-V128-nodecay", T=63, K=100, V=128, dtype=torch.bfloat16, decay="none", h0=False),
    Case("fp32-T70-K256-V256", T=70, K=256, V=256, H=1),
    Case("varlen-0-1-15-0-100", T=116, K=32, V=48, cu=(0, 0, 1, 16, 16, 116)),
    Case("varlen-cpu-segments", T=116, K=32, V=16, cu=(0, 0, 1, 16, 16, 116), cu_cpu=True, seg=32, decay="mixed", H=3),
    Case("varlen-cpu-short-unsegmented", T=40, K=16, V=16, cu=(0, 1, 16, 40), cu_cpu=True, seg=64),
    Case("segments-B2-T190-bf16", T=190, K=64, V=64, B=2, dtype=torch.bfloat16, seg=64),
    Case("segments-T200-nodecay-noh0", T=200, K=48, V=32, decay="none", h0=False, seg=48),
    # no final state and no h0: both pre-passes skip each sequence's last segment in walk order (SKIP_FINAL)
    Case("segments-B2-nofinal-noh0", T=170, K=32, V=32, B=2, final=False, h0=False, decay="mixed", seg=48),
    Case("varlen-cpu-segments-nofinal", T=116, K=32, V=16, cu=(0, 0, 1, 16, 16, 116), cu_cpu=True, seg=32,
         final=False, h0=False),  # fmt: skip
    # 16-bit segments of several chunks, weak and mixed decay, no dh0: the dq walk computes the reverse local states of
    # every segment but each sequence's first, which the earlier segments' gradients depend on
    Case("segments-multichunk-bf16-nofinal", T=300, K=32, V=48, B=2, dtype=torch.bfloat16, decay="mixed", seg=128,
         final=False, h0=False),  # fmt: skip
    Case("varlen-cpu-segments-multichunk-fp16-nofinal", T=300, K=48, V=32, cu=(0, 0, 1, 150, 150, 300), cu_cpu=True,
         seg=128, final=False, h0=False, dtype=torch.float16),  # fmt: skip
    # the pre-pass on pieces of the segments (the scan composes them): with the final state and h0 (every piece,
    # ragged last one), and without (the forward skips the last segment's pieces, the reverse pass the first's)
    Case("pieces-B2-final-h0", T=150, K=32, V=48, B=2, decay="mixed", seg=64, piece=16),
    Case("pieces-B2-nofinal-noh0", T=190, K=32, V=32, B=2, final=False, h0=False, decay="mixed", seg=64, piece=32),
    Case("pieces-bf16-nodecay-nofinal", T=200, K=64, V=64, dtype=torch.bfloat16, decay="none", final=False, seg=96,
         piece=32),  # fmt: skip
    Case("segments-fp16-strong", T=150, K=32, V=64, dtype=torch.float16, decay="strong", seg=32, scale=2.0),
    Case("strided-fused-projection", T=100, K=64, V=48, B=2, strided=True, decay="mixed"),
    Case("strided-segments-fp16", T=130, K=32, V=32, strided=True, dtype=torch.float16, seg=32),
]


def make_inputs(case: Case, seed: int = 0):
    """Returns q, k, v (leaf tensors, or strided views of a fused leaf), slope, h0, cu_seqlens, and their leaves."""
    g = torch.Generator().manual_seed(seed)
    B, T, H, K, V = case.B, case.T, case.H, case.K, case.V
    if case.strided:
        # one fused projection [B, T, H, 2K + 2V] split into q, k, v, u: views with stride(-1) == 1, not contiguous
        fused = torch.randn(B, T, H, 2 * K + 2 * V, generator=g).to(DEVICE, case.dtype).requires_grad_()
        q, k, v, _ = fused.split([K, K, V, V], dim=-1)
        leaves = [fused]
    else:
        q, k, v = (torch.randn(B, T, H, d, generator=g).to(DEVICE, case.dtype).requires_grad_() for d in (K, K, V))
        leaves = [q, k, v]
    decay = DECAYS[case.decay]
    slope = None if decay is None else decay(H).to(DEVICE, torch.float32)
    N = B if case.cu is None else len(case.cu) - 1
    h0 = torch.randn(N, H, K, V, generator=g).to(DEVICE).requires_grad_() if case.h0 else None
    cu = None if case.cu is None else torch.tensor(case.cu, dtype=torch.int32, device=DEVICE)
    return q, k, v, slope, h0, cu, leaves


def check_case(case: Case, configure, backward: str = "chunk"):
    configure(segment_len=case.seg, prepass_len=case.piece)
    q, k, v, slope, h0, cu, leaves = make_inputs(case)
    cu_cpu = cu.cpu() if case.cu_cpu else None
    o, ht = la.lightning_attn(
        q, k, v, slope, scale=case.scale, initial_state=h0, output_final_state=case.final,
        cu_seqlens=cu, cu_seqlens_cpu=cu_cpu, backward=backward,
    )  # fmt: skip
    assert o.dtype == q.dtype and o.shape == (*q.shape[:-1], case.V)
    assert (ht is not None) == case.final

    g = torch.Generator().manual_seed(1)
    do = torch.randn(o.shape, generator=g).to(DEVICE, o.dtype)
    dht = torch.randn(ht.shape, generator=g).to(DEVICE) if case.final else None
    loss = (o.double() * do.double()).sum() + ((ht * dht).sum() if case.final else 0.0)
    grads = torch.autograd.grad(loss, leaves + ([h0] if case.h0 else []), allow_unused=True)

    # float64 reference from the same rounded inputs
    leaves64 = [x.detach().double().requires_grad_() for x in leaves]
    if case.strided:
        q64, k64, v64, _ = leaves64[0].split([case.K, case.K, case.V, case.V], dim=-1)
    else:
        q64, k64, v64 = leaves64
    h064 = h0.detach().double().requires_grad_() if case.h0 else None
    o64, ht64 = naive.quadratic_lightning_attn(
        q64, k64, v64, slope, scale=case.scale, initial_state=h064, cu_seqlens=None if cu is None else cu.cpu()
    )
    loss64 = (o64 * do.double()).sum() + ((ht64 * dht.double()).sum() if case.final else 0.0)
    refs = torch.autograd.grad(loss64, leaves64 + ([h064] if case.h0 else []), allow_unused=True)

    tol = case.dtype
    assert_close("o", o, o64, tol)
    if case.final:
        assert_close("final_state", ht, ht64, tol)
    names = ["d_fused"] if case.strided else ["dq", "dk", "dv"]
    names += ["dh0"] if case.h0 else []
    for name, got, ref in zip(names, grads, refs):
        if case.T == 0 and name != "dh0":
            assert got is None or got.numel() == 0
            continue
        if name == "d_fused":  # u is not used: its slice of the gradient is exactly zero
            assert got[..., 2 * case.K + case.V :].abs().max() == 0
        assert_close(name, got, ref, tol)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_chunk_matches_float64(case, triton_backend):
    check_case(case, triton_backend)


EIGHT_WARP_CASES = [c for c in CASES if c.id in {
    "fp32-T63-K64", "fp32-T100-K48-V100-strong-scale", "fp32-T1-K16-nodecay", "bf16-T100-K64-mixed",
    "fp32-T70-K256-V256", "varlen-0-1-15-0-100", "segments-B2-T190-bf16", "strided-fused-projection",
}]  # fmt: skip


@pytest.mark.parametrize("case", EIGHT_WARP_CASES, ids=lambda c: c.id)
def test_walk_with_inter_product_apart_matches_float64(case, triton_backend):
    """The walk's form for 8 warps (``INTER_APART``: q·S added after the intra product, not its accumulator), which
    the K = 256 walks use on a GPU: a pinned 8-warp configuration, in the forward walk, the pre-pass and the
    backward's dq / dk / dv walks."""
    triton_backend(kernel_config="BT=64,BV=64,num_warps=8,num_stages=2")
    check_case(case, triton_backend)


POINTER_CASES = [c for c in CASES if c.id in {
    "fp32-T63-K64", "fp32-T200-K128-mixed", "fp32-K8-V20-tiny-dims", "fp16-T40-K256-V64-strong", "bf16-T100-K64-mixed",
    "varlen-0-1-15-0-100", "varlen-cpu-segments", "segments-B2-T190-bf16", "segments-B2-nofinal-noh0",
    "pieces-B2-final-h0", "strided-fused-projection",
}]  # fmt: skip


@pytest.mark.parametrize("case", POINTER_CASES, ids=lambda c: c.id)
def test_walk_through_pointers_matches_float64(case, triton_backend):
    """The walk's loads and stores through pointers and masks (the ``tma`` setting off): what GPUs before sm_90 and
    tensors off TMA's 16-byte rules run. Every other case here runs the tensor-descriptor path wherever the tensors
    allow it, as an sm_90 GPU does (``plan.tma_ready``)."""
    triton_backend(tma=False)
    check_case(case, triton_backend)


def test_segmented_equals_unsegmented_path_in_fp32(triton_backend):
    """The segment pre-pass + scan reproduces the one-walk result (to fp32 rounding) on an input where the incoming
    states matter: no decay, an initial state, segments of 16 tokens."""
    case = Case("seg16", T=97, K=32, V=32, decay="none")
    q, k, v, slope, h0, _, _ = make_inputs(case)
    o1, h1 = la.lightning_attn(q, k, v, slope, initial_state=h0, output_final_state=True)
    triton_backend(segment_len=16)
    o2, h2 = la.lightning_attn(q, k, v, slope, initial_state=h0, output_final_state=True)
    assert_close("o", o2, o1.detach(), 1e-6)
    assert_close("final_state", h2, h1.detach(), 1e-6)


FUSED_CASES = [c for c in CASES if max(c.K, c.V) <= 128 and c.T > 0]


@pytest.mark.parametrize(
    "case",
    [
        Case("two-walks-segments-h0", T=150, K=32, V=48, decay="mixed", seg=64, H=3),
        Case("two-walks-varlen-cpu-segments-bf16", T=116, K=64, V=32, cu=(0, 0, 1, 16, 16, 116), cu_cpu=True, seg=32,
             dtype=torch.bfloat16),
        *(c for c in FUSED_CASES if c.dtype in (torch.float16, torch.bfloat16) and max(c.K, c.V) <= 64),
    ],
    ids=lambda c: c.id,
)  # fmt: skip
def test_two_walk_backward_matches_float64(case, triton_backend):
    """dk and dv from the two reverse walks with ``fused_dkdv=False`` set explicitly: on segments, and on every
    16-bit case with head dims up to 64 (those the default sends to the fused walk among them)."""
    triton_backend(fused_dkdv=False)
    check_case(case, triton_backend)


@pytest.mark.parametrize("case", FUSED_CASES, ids=lambda c: c.id)
def test_fused_dkdv_walk_matches_float64(case, triton_backend):
    """The fused dk/dv walk forced on (the ``fused_dkdv`` setting) on every case it applies to (head dims <= 128),
    segmented, varlen and strided ones included; with descriptors where the default takes it (16-bit, K = V = 64)."""
    triton_backend(fused_dkdv=True)
    check_case(case, triton_backend)


def test_prepass_len_must_divide_the_segment(triton_backend):
    triton_backend(segment_len=64, prepass_len=48)
    q = torch.randn(1, 130, 1, 16, device=DEVICE)
    with pytest.raises(ValueError, match="PREPASS_LEN"):
        la.lightning_attn(q, q, q, None)


def test_gradcheck_float64_on_triton_path(triton_backend):
    """torch.autograd.gradcheck (fast mode) through the Triton kernels, in float64, with decay, h0 and final state."""
    if DEVICE == "cuda":
        pytest.skip("float64 runs the PyTorch path on CUDA")
    g = torch.Generator().manual_seed(0)
    B, T, H, K, V = 1, 37, 2, 16, 16
    q, k, v = (torch.randn(B, T, H, d, generator=g, dtype=torch.float64).requires_grad_() for d in (K, K, V))
    h0 = torch.randn(B, H, K, V, generator=g, dtype=torch.float64).requires_grad_()
    slope = torch.tensor([0.1, 1.0])

    def fn(q, k, v, h0):
        o, ht = la.lightning_attn(q, k, v, slope, scale=0.7, initial_state=h0, output_final_state=True)
        return o, ht

    assert torch.autograd.gradcheck(fn, (q, k, v, h0), fast_mode=True)


def test_recompute_backward_matches_float64(triton_backend):
    """backward='recompute': the recompute backward under the chunk forward, every gradient against float64."""
    check_case(Case("recompute", T=40, K=16, V=16), triton_backend, backward="recompute")


@pytest.mark.parametrize("K, V", [(16, 257), (300, 16)])
def test_head_dims_over_256_are_rejected(K, V, triton_backend):
    q = torch.randn(1, 4, 1, K, device=DEVICE)
    v = torch.randn(1, 4, 1, V, device=DEVICE)
    with pytest.raises(ValueError, match="head dims"):
        la.lightning_attn(q, q, v)


def test_no_grad_inputs_and_repeatability(triton_backend):
    """Inference call (no grad): two runs give bit-identical outputs (no atomics, fixed reduction order)."""
    case = Case("det", T=90, K=32, V=32, dtype=torch.float16)
    q, k, v, slope, h0, _, _ = make_inputs(case)
    with torch.no_grad():
        o1, h1 = la.lightning_attn(q, k, v, slope, initial_state=h0, output_final_state=True)
        o2, h2 = la.lightning_attn(q, k, v, slope, initial_state=h0, output_final_state=True)
    assert torch.equal(o1, o2) and torch.equal(h1, h2)


# inter-only mode (the linear half of hybrid chunk attention)


def inter_only_reference(q, k, v, slope, *, chunk_size, scale, initial_state, cu_seqlens=None):
    """float64 masked form: o_t = scale·(Σ_{s: chunk(s) < chunk(t)} λ^(t-s) (q_t·k_s) v_s + λ^(t+1) q_t h0),
    chunks of ``chunk_size`` tokens from each sequence start; the final state as in the full op."""
    if cu_seqlens is not None:
        outs, finals = [], []
        offsets = cu_seqlens.tolist()
        for n, (bos, eos) in enumerate(zip(offsets[:-1], offsets[1:])):
            h0 = None if initial_state is None else initial_state[n : n + 1]
            o, f = inter_only_reference(
                q[:, bos:eos], k[:, bos:eos], v[:, bos:eos], slope, chunk_size=chunk_size, scale=scale,
                initial_state=h0,
            )  # fmt: skip
            outs.append(o)
            finals.append(f)
        return torch.cat(outs, 1), torch.cat(finals, 0)
    B, T, H, K = q.shape
    s = torch.zeros(H, dtype=torch.float64) if slope is None else slope.double().cpu()
    t = torch.arange(T, dtype=torch.float64)
    dist = t[:, None] - t[None, :]
    earlier_chunk = (torch.arange(T)[:, None] // chunk_size) > (torch.arange(T)[None, :] // chunk_size)
    mask = torch.where(earlier_chunk, torch.exp(-s[:, None, None] * dist.clamp_min(0)), torch.zeros(()))  # [H, T, T]
    o = torch.einsum("bthk,bshk,hts,bshv->bthv", q, k, mask.to(q.device), v)
    _, final = naive.quadratic_lightning_attn(q, k, v, slope, scale=scale, initial_state=initial_state)
    if initial_state is not None:
        q_dec = torch.exp(-s[None, :] * (t[:, None] + 1)).to(q.device)  # [T, H]
        o = o + torch.einsum("bthk,bhkv->bthv", q * q_dec[None, :, :, None], initial_state)
    return scale * o, final


INTER_CASES = [
    Case("inter-fp32-C32-T100", T=100, K=32, V=48, decay="mixed", H=3, scale=0.5),
    Case("inter-bf16-C64-T150", T=150, K=64, V=64, dtype=torch.bfloat16),
    Case("inter-fp32-C48-segments", T=150, K=16, V=32, seg=32, decay="strong"),
    # 16-bit segments: the dq walk also computes the reverse local states, over chunks shorter than its tile
    Case("inter-fp16-C48-segments", T=150, K=32, V=32, seg=48, decay="strong", dtype=torch.float16, h0=True),
    Case("inter-varlen-C16", T=60, K=16, V=16, cu=(0, 0, 1, 17, 60), cu_cpu=True, seg=16),
]


@pytest.mark.parametrize("case", INTER_CASES, ids=lambda c: c.id)
def test_inter_only_mode(case, triton_backend):
    from lightning_attention.ops.lightning.ops import lightning_attn_inter_triton

    chunk_size = {"inter-fp32-C32-T100": 32, "inter-bf16-C64-T150": 64}.get(case.id, 48 if "C48" in case.id else 16)
    triton_backend(segment_len=case.seg)
    q, k, v, slope, h0, cu, leaves = make_inputs(case)
    cu_cpu = cu.cpu() if case.cu_cpu else None
    o, ht = lightning_attn_inter_triton(
        q, k, v, slope, chunk_size=chunk_size, scale=case.scale, initial_state=h0, output_final_state=True,
        cu_seqlens=cu, cu_seqlens_cpu=cu_cpu,
    )  # fmt: skip
    g = torch.Generator().manual_seed(1)
    do = torch.randn(o.shape, generator=g).to(DEVICE, o.dtype)
    dht = torch.randn(ht.shape, generator=g).to(DEVICE)
    grads = torch.autograd.grad((o.double() * do.double()).sum() + (ht * dht).sum(), [q, k, v, h0])
    x64 = [x.detach().double().requires_grad_() for x in (q, k, v, h0)]
    o64, ht64 = inter_only_reference(
        *x64[:3], slope, chunk_size=chunk_size, scale=case.scale, initial_state=x64[3],
        cu_seqlens=None if cu is None else cu.cpu(),
    )  # fmt: skip
    refs = torch.autograd.grad((o64 * do.double()).sum() + (ht64 * dht.double()).sum(), x64)
    assert_close("o_inter", o, o64, case.dtype)
    assert_close("final_state", ht, ht64, case.dtype)
    for name, got, ref in zip(("dq", "dk", "dv", "dh0"), grads, refs):
        assert_close(name, got, ref, case.dtype)


def test_inter_only_rejects_bad_chunk_size():
    from lightning_attention.ops.lightning.ops import lightning_attn_inter_triton

    q = torch.randn(1, 8, 1, 16, device=DEVICE)
    with pytest.raises(ValueError, match="chunk_size"):
        lightning_attn_inter_triton(q, q, q, None, chunk_size=24)


@pytest.mark.parametrize("backward", ["chunk", "recompute"])
def test_gradients_are_not_differentiable_and_say_so(triton_backend, backward):
    """No double backward on the Triton path: a gradient penalty through the op raises instead of getting gradients
    with no history (which would add nothing to the loss, silently)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 20, 2, 16, generator=g).to(DEVICE).requires_grad_() for _ in range(3))
    o, _ = la.lightning_attn(q, k, v, torch.full((2,), 0.1, device=DEVICE), backward=backward)
    (dq,) = torch.autograd.grad(o.square().sum(), q, create_graph=True)
    assert dq.requires_grad
    with pytest.raises(RuntimeError, match="once_differentiable"):
        dq.square().sum().backward()
