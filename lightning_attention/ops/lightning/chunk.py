"""Triton path of :func:`lightning_attention.lightning_attn`: launchers, ``torch.library`` ops and the autograd Function.

Every pass is one run of the chunk walk (:mod:`lightning_attention.ops.lightning.kernels.walk`), which keeps the
[K, BV] fp32 state of one (segment, head, V tile) on chip while it walks the segment's chunks:

- forward: ``o`` (and the final state) in one walk over q, k, v;
- backward: ``dq`` = the forward walk of (do, v, k) from h0ᵀ; ``dv``, ``dk`` = reverse walks of (k, q, do) and
  (v, do, q) through the reverse-time state G_t = λ G_{t+1} + scale·q_tᵀ do_t (G_{T-1} includes dht), or both
  from one fused reverse walk (:mod:`~lightning_attention.ops.lightning.kernels.dkdv_walk`, opt-in);
  ``dh0`` = λ·G_0. Derivation, FLOP and byte counts: ``ops/lightning/README.md``.

At K = 256 (bf16, on an sm_90 GPU) the walks run as :mod:`~lightning_attention.ops.lightning.kernels.walk_ws`, the
same walk with two consumer warpgroups per program (Gluon), wherever its grid fills the GPU (:func:`_use_walk_ws`).

Nothing per chunk is ever written to memory. When (sequences × heads × V tiles) would not fill the GPU (long
sequences, small batch), each sequence is cut into segments: a pre-pass computes every segment's local state from
(k, v) in parallel, a short decayed scan turns them into incoming states, and the walk then runs all segments in
parallel. The segment-state buffer ([segments, H, K, V] fp32) is kept within 25% of one input tensor; the forward's
is saved for the backward's dq walk (whose incoming states are its transposes), the reverse-time one lives for its
pass only. No per-chunk state is ever kept.

Environment:

``LIGHTNING_ATTENTION_SEGMENT_LEN``
    Force segments of this many tokens (a multiple of 16; ``0`` disables segmentation). Default: segments only on
    CUDA, as many as minimise the estimated time (:func:`best_segment_len`). Tests use it to run the segmented path
    at small T under the interpreter. Varlen batches are segmented only when ``cu_seqlens_cpu`` is given (cutting
    sequences needs their lengths on the host, and a device->host copy would synchronise).
``LIGHTNING_ATTENTION_PREPASS_LEN``
    Force the pre-pass of a segmented fixed-length batch onto pieces of this many tokens (a multiple of 16 dividing
    the segment length; ``0``: the walk's segments). Default: pieces only on CUDA, see :func:`prepass_split`.
``LIGHTNING_ATTENTION_KERNEL_CONFIG``
    Pin one launch configuration, see :mod:`lightning_attention.ops.lightning.kernels.configs`.
``LIGHTNING_ATTENTION_DKDV``
    ``1``: dk and dv from the fused dk/dv walk where it fits; default ``0``: two reverse walks (faster on an H100).
``LIGHTNING_ATTENTION_TMA``
    ``0``: the walk loads and stores through pointers everywhere (default: tensor descriptors where
    :mod:`~lightning_attention.ops.lightning.tma` allows them).
``LIGHTNING_ATTENTION_BF16_INTER``
    ``input`` (default) or ``tf32``: operand precision of the inter-chunk product (λq)·S for bf16 inputs.
``LIGHTNING_ATTENTION_GLUON``
    ``0``: the Triton walk at K = 256 too (default: the two-warpgroup walk where :func:`_use_walk_ws` allows it).
``LIGHTNING_ATTENTION_REPLAY``
    ``0``: every :func:`chunk_forward` / :func:`chunk_backward` call plans its launches again (default: later calls
    of a recorded shape repeat the first one's launches, :mod:`~lightning_attention.ops.lightning.replay`).
"""

import contextlib
import functools
import os
from dataclasses import dataclass

import torch
import triton.language as tl

from lightning_attention.backend import plain_eager
from lightning_attention.ops.lightning import naive, replay
from lightning_attention.ops.lightning.kernels import walk_ws
from lightning_attention.ops.lightning.kernels.configs import (
    ENV_CONFIG,
    SHARED_PER_SM,
    cdiv,
    dkdv_state_bytes,
    inter_only_config,
    inter_only_tile,
    padded_dim,
    shared_limit,
    use_dkdv_walk,
    walk_first_config,
    walk_programs_per_sm,
    walk_tile,
)
from lightning_attention.ops.lightning.kernels.dkdv_walk import lightning_dkdv_fixed_bt_kernel, lightning_dkdv_kernel
from lightning_attention.ops.lightning.kernels.launch import DirectLauncher
from lightning_attention.ops.lightning.kernels.walk import (
    lightning_inter_walk_kernel,
    lightning_scan_kernel,
    lightning_state_kernel,
    lightning_walk_kernel,
)
from lightning_attention.ops.lightning.tma import ENV_TMA, ensure_allocator, tma_enabled, tma_ready

ENV_SEGMENT_LEN = "LIGHTNING_ATTENTION_SEGMENT_LEN"
ENV_DKDV = "LIGHTNING_ATTENTION_DKDV"
ENV_PREPASS_LEN = "LIGHTNING_ATTENTION_PREPASS_LEN"
ENV_BF16_INTER = "LIGHTNING_ATTENTION_BF16_INTER"
ENV_GLUON = "LIGHTNING_ATTENTION_GLUON"
MAX_HEAD_DIM = 256
# the backward="auto" rule: the chunk backward wants >= 128 KB of shared memory per block (DESIGN §2)
CHUNK_BACKWARD_MIN_SHARED = 128 * 1024


# segment plan


@dataclass(frozen=True)
class SegmentPlan:
    """How the sequences are cut into the walk's work items.

    varlen: 0 = fixed-length batch (segments of ``seg_len`` tokens, ``per_seq`` per sequence), 1 = packed sequences
    one segment each (read from cu_seqlens on the device), 2 = packed sequences cut on the host (``seg_table``
    [total, 4] int32 = (n, bos, eos, flags) and ``seq_segs`` [N + 1] int32).
    """

    varlen: int
    segmented: bool
    total: int  # number of work items (segments over all sequences)
    per_seq: int = 1
    seg_len: int = 0
    seg_table: torch.Tensor | None = None
    seq_segs: torch.Tensor | None = None
    cu_seqlens: torch.Tensor | None = None


def _device_index(x: torch.Tensor) -> int:
    return x.device.index if x.device.index is not None else torch.cuda.current_device()


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


@functools.lru_cache(maxsize=None)
def _walk_occupancy(index: int, DK: int, DV: int, elem_bytes: int, state_bytes: int) -> tuple[int, int]:
    """(walk programs the GPU runs at once, their value tile) for the main walk's first configuration
    (:func:`configs.walk_first_config`): SMs × :func:`configs.walk_programs_per_sm` slots (a grid of fewer leaves
    SMs idle, a grid of more runs in rounds), and the BV that sets a grid's program count (cdiv(V, BV) per head)."""
    props = torch.cuda.get_device_properties(index)
    cc = props.major * 10 + props.minor
    block_limit = getattr(props, "shared_memory_per_block_optin", 0) or shared_limit(cc)
    sm_shared = getattr(props, "shared_memory_per_multiprocessor", 0) or SHARED_PER_SM.get(cc, block_limit)
    tma = tma_enabled(torch.device("cuda", index))
    per_sm = walk_programs_per_sm(DK, DV, elem_bytes, block_limit, sm_shared, tma, state_bytes)
    BV = walk_first_config(DK, DV, elem_bytes, block_limit, tma, state_bytes).kwargs["BV"]
    return _sm_count(index) * per_sm, BV


# head dims up to this: a walk grid of one program per SM already streams its bytes at about DRAM speed (H100, bf16,
# K = V = 64: 128 programs of 8K tokens at 2.5 TB/s), so a second resident program per SM adds little and segments
# to fill it only add the pre-pass: 8 × 8K took 0.77 ms of kernels per fwd+bwd whole against 0.92 in 256 segments
# (benchmarks/results/h100-2026-11-22z26). Grids of fewer programs than SMs are still segmented as the model says.
BANDWIDTH_BOUND_DIM = 64


def fills_every_sm_once(DK: int, DV: int, programs: int, sms: int) -> bool:
    """Whether an unsegmented walk of ``programs`` programs is left whole because it already fills every SM once
    (within the plan's 5% margin: 128 programs on 132 SMs do) and the walk is bound by bandwidth there (head dims up
    to :data:`BANDWIDTH_BOUND_DIM`)."""
    return max(DK, DV) <= BANDWIDTH_BOUND_DIM and programs >= 0.95 * sms


# pre-pass programs resident per SM (its tuned configurations: one 8-warp program with BV = 128, or two or three
# 4-warp programs with BV = 64)
PREPASS_PROGRAMS_PER_SM = 2
# a segmented pass costs about this much more than one walk over the same segments: the pre-pass reads (k, v) or
# (q, do) again (forward 6 tensor passes instead of 4; backward 14 instead of 10)
SEGMENTED_COST = 1.5


def _segment_len(x: torch.Tensor, lengths_total: int, num_seqs: int, H: int, DV: int, fixed_length: bool) -> int:
    """Tokens per segment (0: do not segment). Forced by ``LIGHTNING_ATTENTION_SEGMENT_LEN``, else from the GPU.
    ``fixed_length``: a [B, T] batch (the two-warpgroup walk's case), else packed sequences."""
    forced = os.environ.get(ENV_SEGMENT_LEN, "").strip()
    if forced:
        n = int(forced)
        if n < 0 or n % 16:
            raise ValueError(f"{ENV_SEGMENT_LEN} must be 0 or a positive multiple of 16, got {n}")
        return n
    if not x.is_cuda or num_seqs == 0:
        return 0
    # symbolic sizes (a fake call of the forward op under torch.compile with save_states): the plan is a search over
    # ints, so they specialise here (LightningAttnFunction does not ask for states while compiling)
    lengths_total, num_seqs, H, DV = int(lengths_total), int(num_seqs), int(H), int(DV)
    index, DK = _device_index(x), int(x.shape[-1])
    state_bytes = dkdv_state_bytes(_precisions(x.dtype)[1])
    if fixed_length and _walk_ws_shape(x, DK, DV):
        # the two-warpgroup walk: one program per SM, two 32-wide value tiles each (a batch-1 grid of 16 heads is
        # 64 programs: cut in two, not run on half the SMs)
        slots, BV = _sm_count(index), 2 * walk_ws.WS_BV
    else:
        # programs at the first configuration's value tile: at K = 256 (bf16) 32 wide, twice the 64-wide count, so
        # a batch-1 grid of 16 heads fills 128 SMs (counted 64-wide, it was cut into segments that ran in 2 rounds)
        slots, BV = _walk_occupancy(index, DK, DV, x.element_size(), state_bytes)
    programs = num_seqs * H * cdiv(DV, BV)
    if fills_every_sm_once(DK, DV, programs, _sm_count(index)):
        return 0
    # a segment's fp32 state (4·K·V bytes) must stay within 25% of its q tile (seg·K·elem bytes): seg >= 16·V/elem
    min_len = max(256, 16 * DV // x.element_size())
    return best_segment_len(cdiv(lengths_total, num_seqs), programs, slots, min_len)


@functools.lru_cache(maxsize=4096)  # a pure function of four ints, called on every launch: its loop is host time
def best_segment_len(length: int, programs: int, slots: int, min_len: int) -> int:
    """The segment length (a multiple of 64; 0 = one segment) that minimises the estimated time of a walk.

    ``length``: tokens per sequence; ``programs``: programs of the unsegmented walk; ``slots``: programs the GPU
    runs at once. Programs of equal length run in ``ceil(programs / slots)`` rounds, so cutting every sequence into
    ns segments costs ``rounds(ns·programs) · length/ns`` token steps, times :data:`SEGMENTED_COST` for the
    pre-pass. More segments must win by 5%: e.g. on 132 SMs, 256 programs of 8K tokens stay whole (one
    round either way), 64 programs of 32K become 256 of 8K.
    """

    def seg_of(ns: int) -> int:
        return cdiv(cdiv(length, ns), 64) * 64

    def cost(ns: int) -> float:
        return cdiv(ns * programs, slots) * seg_of(ns) * (1.0 if ns == 1 else SEGMENTED_COST)

    best = 1
    for ns in range(2, max(1, min(length // min_len, cdiv(4 * slots, programs))) + 1):
        if cost(ns) < 0.95 * cost(best):  # more segments only for a clear gain (the model is coarse)
            best = ns
    return 0 if best == 1 else seg_of(best)


def _aligned(seg: int, align: int) -> int:
    return cdiv(seg, align) * align if align else seg


def plan_segments(q, v, cu_seqlens, cu_seqlens_cpu, align: int = 0) -> SegmentPlan:
    """The work items of a call: never a device->host copy (varlen segments only from ``cu_seqlens_cpu``).

    ``align``: segments are a multiple of this many tokens (the inter-only mode's chunk size).
    """
    B, T, H, _ = q.shape
    DV = v.shape[-1]
    if cu_seqlens is None:
        seg = _aligned(_segment_len(q, B * T, B, H, DV, fixed_length=True), align)
        if seg == 0 or T <= seg:
            return SegmentPlan(varlen=0, segmented=False, total=B, per_seq=1, seg_len=max(T, 1))
        per_seq = cdiv(T, seg)
        return SegmentPlan(varlen=0, segmented=True, total=B * per_seq, per_seq=per_seq, seg_len=seg)
    N = cu_seqlens.numel() - 1
    seg = _aligned(_segment_len(q, T, N, H, DV, fixed_length=False), align) if cu_seqlens_cpu is not None else 0
    offsets = [int(x) for x in cu_seqlens_cpu.tolist()] if seg else []
    if seg == 0 or all(b - a <= seg for a, b in zip(offsets[:-1], offsets[1:])):
        return SegmentPlan(varlen=1, segmented=False, total=N, cu_seqlens=cu_seqlens)
    rows, seq_segs = [], [0]
    for n, (bos, eos) in enumerate(zip(offsets[:-1], offsets[1:])):
        cuts = list(range(bos, eos, seg)) or [bos]  # a zero-length sequence keeps one empty segment
        for j, start in enumerate(cuts):
            flags = (1 if j == 0 else 0) | (2 if j == len(cuts) - 1 else 0)
            rows.append((n, start, min(start + seg, eos), flags))
        seq_segs.append(len(rows))
    table = torch.tensor(rows, dtype=torch.int32).to(q.device, non_blocking=True)
    csr = torch.tensor(seq_segs, dtype=torch.int32).to(q.device, non_blocking=True)
    return SegmentPlan(varlen=2, segmented=True, total=len(rows), seg_table=table, seq_segs=csr)


# launchers


def _acc(dtype: torch.dtype):
    return tl.float64 if dtype == torch.float64 else tl.float32


def _precisions(dtype: torch.dtype):
    """(DOT_PREC, INTER_PREC): exact products for fp32/fp64 inputs; for fp16 the inter product (λq)·S in tf32 on fp32
    operands (the state is never rounded to fp16: its values outgrow fp16); for bf16 ``LIGHTNING_ATTENTION_BF16_INTER``
    = ``input`` (default: operands rounded to bf16 for the tensor-core product, as FLA does; 1.25× faster on an H100,
    benchmarks/results/chunk_sweep_h100.json) or ``tf32`` (fp32 operands)."""
    if dtype in (torch.float32, torch.float64):
        return "ieee", "ieee"
    if dtype == torch.bfloat16:
        mode = os.environ.get(ENV_BF16_INTER, "input")
        return None, "tf32" if mode == "tf32" else "input"
    return None, "tf32"


def _state_strides(x: torch.Tensor | None):
    return (0, 0, 0, 0) if x is None else tuple(x.stride())


# one launcher per kernel: after two launches through Triton, a launch key's compiled kernel is called directly
# (kernels/launch.py), which takes Triton's ~0.1-0.3 ms of host time per launch out of every call
_WALK = DirectLauncher(lightning_walk_kernel, "lightning_attn walk")
_STATE = DirectLauncher(lightning_state_kernel, "lightning_attn segment pre-pass")
_INTER_WALK = DirectLauncher(lightning_inter_walk_kernel, "lightning_attn inter-only walk")
_SCAN = DirectLauncher(lightning_scan_kernel, "lightning_attn segment scan")
_DKDV = DirectLauncher(lightning_dkdv_kernel, "lightning_attn dk/dv walk")
_DKDV_FIXED_BT = DirectLauncher(lightning_dkdv_fixed_bt_kernel, "lightning_attn inter-only dk/dv walk")
_WALK_WS = DirectLauncher(walk_ws.lightning_walk_ws_kernel, "lightning_attn walk (two warpgroups)")
_STATE_WS = DirectLauncher(walk_ws.lightning_state_ws_kernel, "lightning_attn segment pre-pass (two warpgroups)")


@functools.lru_cache(maxsize=256)
def _inter_only_config(BT: int, DK: int, DV: int) -> dict:
    """The inter-only walk's launch configuration as keyword arguments (BT, BK, BV, num_warps, num_stages)."""
    cfg = inter_only_config(BT, DK, DV)
    return {**cfg.kwargs, "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}


def _walk(
    q, k, v, o, *, slope, h0, ht, states, plan, T, H, scale_intra, scale_inter, scale_upd, reverse, state_only,
    inter_chunk=0, skip_final=False,
):  # fmt: skip
    """One launch of the chunk walk. q, k: [B, T, H, DK]; v: [B, T, H, DV]; o: [B, T, H, DV] (or None with
    ``state_only``); h0/ht: [N, H, DK, DV] views or None; states: [NSEG, H, DK, DV] view or None.
    ``inter_chunk`` > 0: the inter-only mode with chunks of that many tokens (BT fixed, no intra-chunk term).
    ``skip_final`` (with ``state_only``): the last segment of each sequence in walk order stores zeros unread."""
    DK, DV = q.shape[-1], v.shape[-1]
    dummy = q
    o_ = dummy if o is None else o
    # tensor descriptors (kernels/walk.py, ops/lightning/tma.py) need whole chunks: not the inter-only mode, whose
    # chunks of inter_chunk tokens are shorter than its tile
    use_tma = not (inter_chunk and not state_only) and tma_ready(q, k, v, o_)
    if use_tma and q.is_cuda:
        replay.call(ensure_allocator)
    if _use_walk_ws(q, DK, DV, plan, inter_chunk, use_tma):
        if state_only:
            _state_ws(k, v, states, slope=slope, plan=plan, T=T, H=H, scale_upd=scale_upd, reverse=reverse,
                      skip_final=skip_final)  # fmt: skip
        else:
            _walk_ws(
                q, k, v, o, slope=slope, h0=h0, ht=ht, states=states, plan=plan, T=T, H=H, scale_intra=scale_intra,
                scale_inter=scale_inter, scale_upd=scale_upd, reverse=reverse,
            )  # fmt: skip
        return
    dot_prec, inter_prec = _precisions(q.dtype)
    total = plan.total
    grid = lambda meta: (cdiv(DV, meta["BV"]) * H * total,)  # noqa: E731
    args = (
        q, k, v, o_,
        dummy if slope is None else slope,
        dummy if h0 is None else h0,
        dummy if ht is None else ht,
        dummy if states is None else states,
        dummy if plan.cu_seqlens is None else plan.cu_seqlens,
        dummy if plan.seg_table is None else plan.seg_table,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o_.stride()[:3],
        *_state_strides(h0), *_state_strides(ht), *_state_strides(states),
        float(scale_intra), float(scale_inter), float(scale_upd),
        T, H, plan.per_seq, plan.seg_len, inter_chunk if not state_only else 0,
        _waves(q, cdiv(DV, 64) * H * total),
    )  # fmt: skip
    constexprs = dict(
        DK=DK, DV=DV, BK=walk_tile(DK),
        VARLEN=plan.varlen,
        REVERSE=reverse,
        HAS_DECAY=slope is not None,
        USE_H0=h0 is not None and not plan.segmented,
        STORE_HT=ht is not None and not plan.segmented and not state_only,
        SEG_IN=plan.segmented and not state_only,
        STATE_ONLY=state_only,
        SKIP_FINAL=state_only and skip_final,
        INTER_ONLY=bool(inter_chunk) and not state_only,
        USE_TMA=use_tma,
        ACC=_acc(q.dtype),
        DOT_PREC=dot_prec,
        INTER_PREC=inter_prec,
    )  # fmt: skip
    launcher = _STATE if state_only else _WALK
    if inter_chunk and not state_only:  # the pre-pass's state does not depend on the chunking
        launcher = _INTER_WALK
        constexprs.update(_inter_only_config(inter_only_tile(inter_chunk), DK, DV))
    replay.launch(launcher, grid, args, constexprs, q)


@functools.lru_cache(maxsize=None)
def _walk_ws_device(index: int) -> bool:
    """Whether this GPU runs the two-warpgroup walk: Hopper's warpgroup MMA (sm_90; Blackwell has none) and a Triton
    with Gluon in the versions it was checked with (:data:`walk_ws.WS_TRITON_VERSIONS`)."""
    return (
        walk_ws.lightning_walk_ws_kernel is not None
        and walk_ws.triton_version_supported()
        and torch.cuda.get_device_capability(index) == (9, 0)
    )


def _walk_ws_shape(x: torch.Tensor, DK: int, DV: int) -> bool:
    """Whether walks of these inputs may run the two-warpgroup kernel (``kernels/walk_ws.py``): bf16 with the bf16 inter
    product, K = 256, V a multiple of 64, on an sm_90 GPU with descriptors on, unless ``LIGHTNING_ATTENTION_GLUON=0``."""
    return (
        x.is_cuda and x.dtype == torch.bfloat16 and DK == walk_ws.WS_DK and DV % (2 * walk_ws.WS_BV) == 0
        and _precisions(x.dtype)[1] == "input" and os.environ.get(ENV_GLUON, "1").strip() != "0"
        and _walk_ws_device(_device_index(x)) and tma_enabled(x.device)
    )  # fmt: skip


def _use_walk_ws(q, DK: int, DV: int, plan: SegmentPlan, inter_chunk: int, use_tma: bool) -> bool:
    """Whether a walk launch (the walk or its pre-pass) runs the two-warpgroup kernel instead of the Triton walk:
    :func:`_walk_ws_shape`, a fixed-length batch, tensors the descriptors take, not the inter-only mode, and a grid
    that would take the Triton walk more than one round (it has half the Triton walk's programs, each running both
    halves' chains: with fewer than half the SMs' worth, one Triton round at one chain per SM is shorter; the plan
    cuts such grids into segments where that pays, :func:`_segment_len`)."""
    if inter_chunk or not use_tma or plan.varlen != 0 or not _walk_ws_shape(q, DK, DV):
        return False
    programs = DV // (2 * walk_ws.WS_BV) * q.shape[2] * plan.total
    return 2 * programs > _sm_count(_device_index(q))


def _walk_ws(
    q, k, v, o, *, slope, h0, ht, states, plan, T, H, scale_intra, scale_inter, scale_upd, reverse,
):  # fmt: skip
    """One launch of the two-warpgroup walk, with :func:`_walk`'s arguments (the cases :func:`_use_walk_ws` allows)."""
    DK, DV = q.shape[-1], v.shape[-1]
    dummy = q
    grid = (DV // (2 * walk_ws.WS_BV) * H * plan.total,)
    args = (
        q, k, v, o,
        dummy if slope is None else slope,
        dummy if h0 is None else h0,
        dummy if ht is None else ht,
        dummy if states is None else states,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3],
        *_state_strides(h0), *_state_strides(ht), *_state_strides(states),
        float(scale_intra), float(scale_inter), float(scale_upd),
        T, H, plan.per_seq, plan.seg_len,
    )  # fmt: skip
    constexprs = dict(
        DK=DK, DV=DV, BT=walk_ws.WS_BT, BV=walk_ws.WS_BV, STAGES=walk_ws.WS_STAGES,
        REVERSE=reverse,
        HAS_DECAY=slope is not None,
        USE_H0=h0 is not None and not plan.segmented,
        STORE_HT=ht is not None and not plan.segmented,
        SEG_IN=plan.segmented,
        num_warps=walk_ws.WS_WARPS,
    )  # fmt: skip
    replay.launch(_WALK_WS, grid, args, constexprs, q)


def _state_ws(k, v, states, *, slope, plan, T, H, scale_upd, reverse, skip_final):
    """One launch of the two-warpgroup pre-pass: the local state of every segment of ``plan`` into ``states``."""
    DK, DV = k.shape[-1], v.shape[-1]
    grid = (DV // (2 * walk_ws.WS_BV) * H * plan.total,)
    args = (
        k, v, k if slope is None else slope, states,
        *k.stride()[:3], *v.stride()[:3], *_state_strides(states),
        float(scale_upd), T, H, plan.per_seq, plan.seg_len,
    )  # fmt: skip
    constexprs = dict(
        DK=DK, DV=DV, BT=walk_ws.WS_BT, BV=walk_ws.WS_BV, STAGES=walk_ws.WS_STATE_STAGES, REVERSE=reverse,
        HAS_DECAY=slope is not None, SKIP_FINAL=skip_final, num_warps=walk_ws.WS_WARPS,
    )  # fmt: skip
    replay.launch(_STATE_WS, grid, args, constexprs, k)


def _waves(x: torch.Tensor, programs: int) -> int:
    """The walk autotuner's WAVES key: 1 when ``programs`` (at 64-wide value tiles) fit the GPU at one per SM, else 2
    (on the CPU: 1)."""
    return 1 if not x.is_cuda or programs <= _sm_count(_device_index(x)) else 2


def _fused_dkdv_enabled(q: torch.Tensor, DK: int, DV: int) -> bool:
    """Whether dk and dv come from the fused walk (kernels/dkdv_walk.py) rather than two reverse walks.

    ``LIGHTNING_ATTENTION_DKDV=1`` opts in; the default is the two walks, which are faster on the GPUs measured.
    H100, bf16, H = 16, K = V = 128, each pass alone (benchmarks/results/h100-2026-11-22b/chunk_passes.json): two
    walks 0.56 + 0.56 ms vs fused 1.70 ms at B = 32, T = 2K; 0.58 + 0.58 vs 1.43 ms segmented at B = 2, T = 32K.
    The fused program reads q, k, v, do once instead of twice but holds all of G: one 8-warp program per SM with
    register spills, against two 4-warp walk programs per SM. It also needs padded head dims <= 128 and enough
    shared memory on this GPU (else the two walks run regardless)."""
    if os.environ.get(ENV_DKDV, "0").strip() != "1":
        return False
    _, inter_prec = _precisions(q.dtype)
    limit = shared_limit() if q.is_cuda else None
    return use_dkdv_walk(DK, DV, q.element_size(), dkdv_state_bytes(inter_prec), limit)


def _dkdv(q, k, v, do, dk, dv, *, slope, dht, dh0, g_states, plan, T, H, scale, inter_chunk=0):
    """One launch of the fused dk/dv reverse walk (kernels/dkdv_walk.py). q, k: [B, T, H, DK]; v, do: [B, T, H, DV];
    dk, dv: outputs like k, v; dht/dh0: [N, H, DK, DV] or None; g_states: [NSEG, H, DK, DV] incoming G or None."""
    DK, DV = q.shape[-1], v.shape[-1]
    dummy = q
    dot_prec, inter_prec = _precisions(q.dtype)
    launcher, extra = _DKDV, {}
    if inter_chunk:
        launcher, extra = _DKDV_FIXED_BT, {"BT": inter_only_tile(inter_chunk)}
    args = (
        q, k, v, do, dk, dv,
        dummy if slope is None else slope,
        dummy if dht is None else dht,
        dummy if dh0 is None else dh0,
        dummy if g_states is None else g_states,
        dummy if plan.cu_seqlens is None else plan.cu_seqlens,
        dummy if plan.seg_table is None else plan.seg_table,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3], *dk.stride()[:3], *dv.stride()[:3],
        *_state_strides(dht), *_state_strides(dh0), *_state_strides(g_states),
        float(scale), T, H, plan.per_seq, plan.seg_len, inter_chunk,
    )  # fmt: skip
    constexprs = dict(
        DK=DK, DV=DV, BK=padded_dim(DK), BV=padded_dim(DV),
        VARLEN=plan.varlen,
        HAS_DECAY=slope is not None,
        USE_H0=dht is not None and not plan.segmented,
        STORE_HT=dh0 is not None and not plan.segmented,
        SEG_IN=plan.segmented,
        INTER_ONLY=bool(inter_chunk),
        ACC=_acc(q.dtype),
        DOT_PREC=dot_prec,
        INTER_PREC=inter_prec,
        **extra,
    )  # fmt: skip
    replay.launch(launcher, (H * plan.total,), args, constexprs, q)


@dataclass(frozen=True)
class PrepassPieces:
    """How the pre-pass cuts a fixed-length batch's walk segments: ``split`` pieces of ``piece_len`` tokens per
    segment, over tokens ``[lo, hi)`` of every sequence, ``count`` pieces per sequence, the first of them being piece
    ``first`` of its sequence. ``split == 1``: the walk's own segments, all of them, in place (see the scan)."""

    split: int
    piece_len: int
    lo: int
    hi: int
    count: int
    first: int


def _prepass_pieces(x: torch.Tensor, plan: SegmentPlan, T: int, H: int, DV: int, skip_final: bool, reverse: bool):
    """The pre-pass's pieces of a segmented plan (:func:`prepass_split`; varlen plans: the walk's segments).

    ``skip_final``: the walk's last segment in walk order (the first one of a reverse walk) is left out: its local
    state only feeds the final state."""
    split = 1
    if plan.varlen == 0:
        forced = os.environ.get(ENV_PREPASS_LEN, "").strip()
        if forced and int(forced):
            piece = int(forced)
            if piece % 16 or plan.seg_len % piece:
                raise ValueError(
                    f"{ENV_PREPASS_LEN} must be a multiple of 16 that divides the segment length {plan.seg_len}, "
                    f"got {piece}"
                )
            split = plan.seg_len // piece
        elif x.is_cuda:
            walked = plan.total - (plan.total // plan.per_seq if skip_final else 0)
            # the pieces' states within 12.5% of one input: 4·V / (piece·elem) <= 1/8
            min_piece = max(256, 32 * DV // x.element_size())
            slots = PREPASS_PROGRAMS_PER_SM * _sm_count(_device_index(x))
            split = prepass_split(plan.seg_len, walked * H, slots, min_piece)
    if split == 1:
        return PrepassPieces(1, plan.seg_len, 0, T, plan.per_seq, 0)
    piece = plan.seg_len // split
    lo = plan.seg_len if skip_final and reverse else 0
    hi = (plan.per_seq - 1) * plan.seg_len if skip_final and not reverse else T
    return PrepassPieces(split, piece, lo, hi, cdiv(hi - lo, piece), lo // piece)


@functools.lru_cache(maxsize=4096)
def prepass_split(seg_len: int, programs: int, slots: int, min_piece: int) -> int:
    """Pieces per walk segment for the pre-pass (1 = the walk's own segments).

    The pre-pass reads (k, v) once and keeps no q or o: with enough programs it is bound by bandwidth, but one
    program per (walked segment, head) leaves it bound by latency when segments are long and few (H100, B = 2,
    T = 32K in 2 segments: 32 programs walking 16K tokens each). So each segment is cut into pieces of at least
    ``min_piece`` tokens (a multiple of 64 dividing ``seg_len``) until ``programs`` × pieces reaches twice ``slots``
    (the pre-pass programs the GPU runs at once); the scan composes the pieces.
    """
    want = cdiv(2 * slots, max(programs, 1))
    best = 1
    if want <= 1:
        return best
    for split in range(2, seg_len // max(min_piece, 64) + 1):
        if (seg_len // 64) % split:
            continue
        best = split
        if split >= want:
            break
    return best


def _scan(states, pieces_states, pieces: PrepassPieces, *, slope, h0, ht, plan, N, H, T, reverse):
    """Incoming state of every segment into ``states`` [NSEG, H, DK, DV] from the pre-pass's local states
    ``pieces_states`` ([N·pieces.count, H, DK, DV], or ``states`` itself when pieces.split == 1); the final state
    into ``ht``."""
    DK, DV = states.shape[-2], states.shape[-1]
    BK = min(64, padded_dim(DK))
    BV = min(64, padded_dim(DV))
    dummy = states
    grid = (N * H, cdiv(DK, BK), cdiv(DV, BV))
    args = (
        states, pieces_states,
        dummy if h0 is None else h0,
        dummy if ht is None else ht,
        dummy if slope is None else slope,
        dummy if plan.seq_segs is None else plan.seq_segs,
        dummy if plan.seg_table is None else plan.seg_table,
        *states.stride(), *pieces_states.stride(), *_state_strides(h0), *_state_strides(ht),
        T, H, plan.per_seq, plan.seg_len, pieces.count, pieces.piece_len, pieces.first, pieces.split,
    )  # fmt: skip
    constexprs = dict(
        DK=DK, DV=DV, BK=BK, BV=BV,
        VARLEN=plan.varlen,
        REVERSE=reverse,
        HAS_DECAY=slope is not None,
        USE_H0=h0 is not None,
        STORE_HT=ht is not None,
        ACC=_acc(states.dtype),
        num_warps=4,
    )  # fmt: skip
    replay.launch(_SCAN, grid, args, constexprs, states)


def _prepass(k, v, states, pieces: PrepassPieces, *, slope, plan, N, H, T, scale_upd, reverse, skip_final):
    """The pre-pass (STATE_ONLY walk over (k, v)): the local state of every walk segment, in place in ``states``
    [NSEG, H, DK, DV] (``pieces.split == 1``), or of every piece, into a buffer of its own [N·pieces.count, H, DK,
    DV] that lives until the scan. Returns where the local states are."""
    if pieces.split == 1:
        local = states
    else:
        local = replay.empty(N * pieces.count, *states.shape[1:], device=states.device, dtype=states.dtype)
        plan = SegmentPlan(varlen=0, segmented=True, total=N * pieces.count, per_seq=pieces.count,
                           seg_len=pieces.piece_len)  # fmt: skip
        k = replay.view(k[:, pieces.lo : pieces.hi], k)
        v = replay.view(v[:, pieces.lo : pieces.hi], v)
        T = pieces.hi - pieces.lo
        skip_final = False  # a skipped segment's tokens are outside [lo, hi)
    _walk(
        k, k, v, None, slope=slope, h0=None, ht=None, states=local, plan=plan, T=T, H=H, scale_intra=1.0,
        scale_inter=1.0, scale_upd=scale_upd, reverse=reverse, state_only=True, skip_final=skip_final,
    )  # fmt: skip
    return local


def _segmented_states(k, v, *, slope, h0, ht, plan, N, H, T, scale_upd, reverse):
    """Pre-pass + scan: [NSEG, H, DK, DV] incoming states of the walk over (k, v); writes the final state to ht.

    Without ``ht`` the pre-pass skips each sequence's last segment in walk order (its local state only feeds the
    final state): at 2 segments per sequence that halves the pre-pass's reads. On fixed-length batches the pre-pass
    may run on pieces of the segments (:func:`prepass_split`)."""
    states = replay.empty(plan.total, H, k.shape[-1], v.shape[-1], device=k.device, dtype=naive.compute_dtype(k.dtype))
    skip_final = ht is None
    pieces = _prepass_pieces(k, plan, T, H, v.shape[-1], skip_final, reverse)
    local = _prepass(
        k, v, states, pieces, slope=slope, plan=plan, N=N, H=H, T=T, scale_upd=scale_upd, reverse=reverse,
        skip_final=skip_final,
    )  # fmt: skip
    _scan(states, local, pieces, slope=slope, h0=h0, ht=ht, plan=plan, N=N, H=H, T=T, reverse=reverse)
    return states


# every environment variable the launch path below reads per call (the plan, the pre-pass pieces, pinned and fused
# configurations, descriptors, the bf16 inter product): part of a replay's key
LAUNCH_ENVIRONMENT = (ENV_SEGMENT_LEN, ENV_PREPASS_LEN, ENV_CONFIG, ENV_DKDV, ENV_TMA, ENV_BF16_INTER, ENV_GLUON)


# replayed (replay.py) but for T = 0 (outputs copied or zero-filled, no launches) and host offsets (cu_seqlens_cpu: the
# plan depends on their values, which the key does not see)
@replay.replayable(uncacheable=lambda a: a[0].shape[1] == 0 or a[6] is not None, environment=LAUNCH_ENVIRONMENT)
def chunk_forward(q, k, v, slope, h0, cu_seqlens, cu_seqlens_cpu, scale, output_final_state, inter_chunk=0):
    """(o [B, T, H, V] in q.dtype, final state [N, H, K, V] or None, segment states or None). Inputs validated.

    The segment states ([NSEG, H, K, V] fp32, the incoming state of every segment; None unless the plan is
    segmented) are what the backward's dq walk needs as its own incoming states, transposed: see
    :func:`chunk_backward`. ``inter_chunk`` > 0: o without its intra-chunk term, chunks of that many tokens from each
    sequence start."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    sdt = naive.compute_dtype(q.dtype)
    o = replay.empty(B, T, H, V, device=q.device, dtype=q.dtype)
    if T == 0:
        ht = None
        if output_final_state:
            ht = h0.to(sdt, copy=True) if h0 is not None else torch.zeros(N, H, K, V, device=q.device, dtype=sdt)
        return o, ht, None
    ht = replay.empty(N, H, K, V, device=q.device, dtype=sdt) if output_final_state else None
    plan = plan_segments(q, v, cu_seqlens, cu_seqlens_cpu, align=inter_chunk)
    states = None
    if plan.segmented:
        states = _segmented_states(
            k, v, slope=slope, h0=h0, ht=ht, plan=plan, N=N, H=H, T=T, scale_upd=1.0, reverse=False
        )
    _walk(
        q, k, v, o, slope=slope, h0=h0, ht=ht, states=states, plan=plan, T=T, H=H,
        scale_intra=scale, scale_inter=scale, scale_upd=1.0, reverse=False, state_only=False, inter_chunk=inter_chunk,
    )  # fmt: skip
    return o, ht, states


@replay.replayable(uncacheable=lambda a: a[0].shape[1] == 0 or a[8] is not None, environment=LAUNCH_ENVIRONMENT)
def chunk_backward(
    q, k, v, do, dht, slope, h0, cu_seqlens, cu_seqlens_cpu, scale, need_dh0, inter_chunk=0, fwd_states=None
):
    """(dq, dk, dv, dh0) of the loss whose gradients w.r.t. o and the final state are ``do`` and ``dht`` (or None).

    dq, dk, dv in the input dtype; dh0 [N, H, K, V] fp32 (None unless ``need_dh0``). ``fwd_states``: the forward's
    segment states of the same call ([NSEG, H, K, V], from :func:`chunk_forward`) or None; with them the dq walk
    skips its pre-pass and scan (its incoming states Sᵀ are their transposes).
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    sdt = naive.compute_dtype(q.dtype)
    dq = replay.empty(B, T, H, K, device=q.device, dtype=q.dtype)
    dk = replay.empty(B, T, H, K, device=q.device, dtype=q.dtype)
    dv = replay.empty(B, T, H, V, device=q.device, dtype=q.dtype)
    dh0 = None
    if T == 0:
        if need_dh0:
            dh0 = dht.to(sdt, copy=True) if dht is not None else torch.zeros(N, H, K, V, device=q.device, dtype=sdt)
        return dq, dk, dv, dh0
    if need_dh0:
        dh0 = replay.empty(N, H, K, V, device=q.device, dtype=sdt)
    plan = plan_segments(q, v, cu_seqlens, cu_seqlens_cpu, align=inter_chunk)
    h0t = None if h0 is None else replay.view(h0.transpose(-1, -2), h0)

    # dq_t = scale · do_t S_tᵀ: the forward walk of (do, v, k) with state Sᵀ [V, K] from h0ᵀ
    states = None
    if plan.segmented and fwd_states is not None and fwd_states.shape[0] == plan.total:
        states = replay.view(fwd_states.transpose(-1, -2), fwd_states)
    elif plan.segmented:
        states = _segmented_states(
            v, k, slope=slope, h0=h0t, ht=None, plan=plan, N=N, H=H, T=T, scale_upd=1.0, reverse=False
        )
    _walk(
        do, v, k, dq, slope=slope, h0=h0t, ht=None, states=states, plan=plan, T=T, H=H,
        scale_intra=scale, scale_inter=scale, scale_upd=1.0, reverse=False, state_only=False, inter_chunk=inter_chunk,
    )  # fmt: skip
    del states  # free (unless saved by the forward) before the reverse-time buffer

    # reverse time: G_t = λ G_{t+1} + scale · q_tᵀ do_t, G_{T-1} = dht + scale · q_{T-1}ᵀ do_{T-1}
    # dv_t = k_t G_t (walk of (k, q, do)); dk_t = v_t G_tᵀ (walk of (v, do, q) with Gᵀ); dh0 = λ G_0
    dht_t = None if dht is None else replay.view(dht.transpose(-1, -2), dht)
    g_states = g_states_t = None
    if plan.segmented:
        g_states = _segmented_states(
            q, do, slope=slope, h0=dht, ht=dh0, plan=plan, N=N, H=H, T=T, scale_upd=scale, reverse=True
        )
        g_states_t = replay.view(g_states.transpose(-1, -2), g_states)
    if _fused_dkdv_enabled(q, K, V):
        _dkdv(
            q, k, v, do, dk, dv, slope=slope, dht=dht, dh0=dh0, g_states=g_states, plan=plan, T=T, H=H, scale=scale,
            inter_chunk=inter_chunk,
        )  # fmt: skip
        return dq, dk, dv, dh0
    _walk(
        k, q, do, dv, slope=slope, h0=dht, ht=dh0, states=g_states, plan=plan, T=T, H=H,
        scale_intra=scale, scale_inter=1.0, scale_upd=scale, reverse=True, state_only=False, inter_chunk=inter_chunk,
    )  # fmt: skip
    _walk(
        v, do, q, dk, slope=slope, h0=dht_t, ht=None, states=g_states_t, plan=plan, T=T, H=H,
        scale_intra=scale, scale_inter=1.0, scale_upd=scale, reverse=True, state_only=False, inter_chunk=inter_chunk,
    )  # fmt: skip
    return dq, dk, dv, dh0


# torch.library ops (custom_op + register_fake: the interpreter cannot run on fake tensors, so no triton_op)


def last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    """Strided views are taken as they are; only a non-unit last stride is copied."""
    return x if x.stride(-1) == 1 else x.contiguous()


def _device_of(x: torch.Tensor):
    """Triton launches on the current CUDA device: make it the tensors' device."""
    return torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext()


def _num_seqs(q: torch.Tensor, cu_seqlens: torch.Tensor | None) -> int:
    return q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1


@torch.library.custom_op("lightning_attention::chunk_fwd", mutates_args=())
def chunk_fwd_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slope: torch.Tensor | None,
    initial_state: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
    cu_seqlens_cpu: torch.Tensor | None,
    scale: float,
    output_final_state: bool,
    inter_chunk: int = 0,
    save_states: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Forward op: (o [B, T, H, V], final_state [N, H, K, V] or an empty [0] tensor if not requested, segment
    states [NSEG, H, K, V] for the backward or an empty [0] tensor).

    Segment states are returned for fixed-length batches only, and only with ``save_states`` (their count is a
    function of the shapes and the GPU, which the fake implementation computes, specialising symbolic sizes; a
    varlen plan depends on the offsets' values). ``inter_chunk`` > 0: the inter-only mode (o without its
    intra-chunk term, chunks of that many tokens)."""
    return _chunk_fwd_direct(
        q, k, v, slope, initial_state, cu_seqlens, cu_seqlens_cpu, scale, output_final_state, inter_chunk, save_states
    )


def _chunk_forward_op_body(
    q, k, v, slope, initial_state, cu_seqlens, cu_seqlens_cpu, scale, output_final_state, inter_chunk,
    save_states=True,
):  # fmt: skip
    o, ht, states = chunk_forward(
        last_dim_contiguous(q),
        last_dim_contiguous(k),
        last_dim_contiguous(v),
        None if slope is None else slope.to(torch.float32).contiguous(),
        initial_state,
        cu_seqlens,
        cu_seqlens_cpu,
        scale,
        output_final_state,
        inter_chunk,
    )
    # empty [0] placeholders: new_empty, since new_zeros launches a fill (~15 µs of host time on an H100 host)
    if ht is None:
        ht = q.new_empty(0, dtype=naive.compute_dtype(q.dtype))
    if states is None or cu_seqlens is not None or not save_states:
        states = q.new_empty(0, dtype=naive.compute_dtype(q.dtype))
    return o, ht, states


@chunk_fwd_op.register_fake
def _(
    q, k, v, slope, initial_state, cu_seqlens, cu_seqlens_cpu, scale, output_final_state, inter_chunk=0,
    save_states=True,
):  # fmt: skip
    B, T, H, K = q.shape
    V = v.shape[-1]
    o = q.new_empty(B, T, H, V)
    shape = (_num_seqs(q, cu_seqlens), H, K, V) if output_final_state else (0,)
    seg_shape = (0,)
    if save_states and cu_seqlens is None and T > 0:
        plan = plan_segments(q, v, None, None, align=inter_chunk)
        seg_shape = (plan.total, H, K, V) if plan.segmented else (0,)
    return o, q.new_empty(shape, dtype=naive.compute_dtype(q.dtype)), q.new_empty(seg_shape, dtype=naive.compute_dtype(q.dtype))


@torch.library.custom_op("lightning_attention::chunk_bwd", mutates_args=())
def chunk_bwd_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    do: torch.Tensor,
    dht: torch.Tensor | None,
    slope: torch.Tensor | None,
    initial_state: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
    cu_seqlens_cpu: torch.Tensor | None,
    scale: float,
    inter_chunk: int = 0,
    fwd_states: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward op: (dq, dk, dv, dh0); dh0 is [N, H, K, V] when ``initial_state`` is given, else an empty [0].

    ``fwd_states``: the forward op's segment states (its third output; empty or None: recomputed)."""
    return _chunk_bwd_direct(
        q, k, v, do, dht, slope, initial_state, cu_seqlens, cu_seqlens_cpu, scale, inter_chunk, fwd_states
    )


def _chunk_backward_op_body(
    q, k, v, do, dht, slope, initial_state, cu_seqlens, cu_seqlens_cpu, scale, inter_chunk, fwd_states
):
    dq, dk, dv, dh0 = chunk_backward(
        last_dim_contiguous(q),
        last_dim_contiguous(k),
        last_dim_contiguous(v),
        last_dim_contiguous(do),
        dht,
        None if slope is None else slope.to(torch.float32).contiguous(),
        initial_state,
        cu_seqlens,
        cu_seqlens_cpu,
        scale,
        initial_state is not None,
        inter_chunk,
        fwd_states if fwd_states is not None and fwd_states.numel() else None,
    )
    if dh0 is None:
        dh0 = q.new_empty(0, dtype=naive.compute_dtype(q.dtype))
    return dq, dk, dv, dh0


def backward_outputs_fake(q, v, initial_state, cu_seqlens):
    """The shapes of a backward op's outputs (``chunk_bwd``, ``recompute_bwd``): dq, dk like q; dv like v; dh0
    ``[N, H, K, V]`` in the state dtype when there is an initial state, else an empty ``[0]``."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    shape = (_num_seqs(q, cu_seqlens), H, K, V) if initial_state is not None else (0,)
    return q.new_empty(B, T, H, K), q.new_empty(B, T, H, K), q.new_empty(B, T, H, V), q.new_empty(
        shape, dtype=naive.compute_dtype(q.dtype)
    )


@chunk_bwd_op.register_fake
def _(q, k, v, do, dht, slope, initial_state, cu_seqlens, cu_seqlens_cpu, scale, inter_chunk=0, fwd_states=None):
    return backward_outputs_fake(q, v, initial_state, cu_seqlens)


# the ops' implementations without the dispatcher round trip: what plain eager mode calls (backend.plain_eager)


def _chunk_fwd_direct(*args):
    """``chunk_fwd`` without ``torch.library`` dispatch (same arguments and results)."""
    with _device_of(args[0]):
        return _chunk_forward_op_body(*args)


def _chunk_bwd_direct(*args):
    """``chunk_bwd`` without ``torch.library`` dispatch (same arguments and results)."""
    with _device_of(args[0]):
        return _chunk_backward_op_body(*args)


# autograd


def _use_recompute_backward(mode: str, device: torch.device) -> bool:
    if mode != "auto":
        return mode == "recompute"
    return device.type == "cuda" and _small_shared_memory(device)


@functools.lru_cache(maxsize=None)  # a device property, asked on every backward
def _small_shared_memory(device: torch.device) -> bool:
    props = torch.cuda.get_device_properties(device)
    return getattr(props, "shared_memory_per_block_optin", CHUNK_BACKWARD_MIN_SHARED) < CHUNK_BACKWARD_MIN_SHARED


def _recompute_backward():
    try:
        from lightning_attention.ops.lightning.recompute import recompute_backward
    except ImportError as e:
        raise NotImplementedError(
            "backward='recompute' needs lightning_attention.ops.lightning.recompute.recompute_backward, "
            f"which is not available ({e}); use backward='chunk'"
        ) from e
    return recompute_backward


class LightningAttnFunction(torch.autograd.Function):
    """Autograd over the two ops. Saves the inputs and, for segmented plans, the forward's segment states (<= 25% of
    one input): the backward recomputes everything else, walk by walk."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda")
    def forward(
        ctx, q, k, v, slope, initial_state, cu_seqlens, cu_seqlens_cpu, scale, output_final_state, backward, inter_chunk
    ):
        fwd = _chunk_fwd_direct if plain_eager() else torch.ops.lightning_attention.chunk_fwd
        # the segment states (<= 25% of one input, empty unless segmented) spare the dq walk its pre-pass; not under
        # torch.compile, where the fake would have to plan segments from symbolic sizes (one graph per length)
        save_states = not torch.compiler.is_compiling()
        o, ht, seg_states = fwd(
            q, k, v, slope, initial_state, cu_seqlens, cu_seqlens_cpu, scale, output_final_state, inter_chunk,
            save_states,
        )  # fmt: skip
        ctx.save_for_backward(q, k, v, slope, initial_state, cu_seqlens, cu_seqlens_cpu, seg_states)
        ctx.scale = scale
        ctx.output_final_state = output_final_state
        ctx.backward_mode = backward
        ctx.inter_chunk = inter_chunk
        ctx.mark_non_differentiable(*([] if output_final_state else [ht]))
        # an unused output's gradient comes as None, not as zeros the engine would allocate and fill (host time)
        ctx.set_materialize_grads(False)
        return o, ht

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, do, dht):
        q, k, v, slope, initial_state, cu_seqlens, cu_seqlens_cpu, seg_states = ctx.saved_tensors
        if not ctx.output_final_state:
            dht = None
        if do is None:
            do = torch.zeros(*q.shape[:-1], v.shape[-1], device=q.device, dtype=q.dtype)
        if _use_recompute_backward(ctx.backward_mode, q.device) and not ctx.inter_chunk:
            _recompute_backward()  # imports recompute.py, which registers the op (torch.compile-opaque launch)
            from lightning_attention.ops.lightning.recompute import recompute_bwd_direct

            bwd = recompute_bwd_direct if plain_eager() else torch.ops.lightning_attention.recompute_bwd
            dq, dk, dv, dh0 = bwd(
                q, k, v, do.to(q.dtype), dht, slope, initial_state, cu_seqlens, cu_seqlens_cpu, ctx.scale
            )
        else:
            bwd = _chunk_bwd_direct if plain_eager() else torch.ops.lightning_attention.chunk_bwd
            dq, dk, dv, dh0 = bwd(
                q, k, v, do.to(q.dtype), dht, slope, initial_state, cu_seqlens, cu_seqlens_cpu, ctx.scale,
                ctx.inter_chunk, seg_states,
            )  # fmt: skip
        if initial_state is None:
            dh0 = None
        return dq, dk, dv, None, dh0, None, None, None, None, None, None


def chunk_lightning_attn_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slope: torch.Tensor | None,
    *,
    scale: float,
    initial_state: torch.Tensor | None,
    output_final_state: bool,
    cu_seqlens: torch.Tensor | None,
    cu_seqlens_cpu: torch.Tensor | None,
    backward: str,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Triton Lightning Attention (called by :func:`lightning_attention.lightning_attn` after validation).

    Args:
        q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``; float16 / bfloat16 / float32 (float64 under the interpreter;
            on CUDA float64 runs the PyTorch chunked path). Strided views are used as they are (last stride 1).
        slope: ``[H]`` float32 or None; scale: output scale.
        initial_state: ``[N, H, K, V]`` float32 or None; output_final_state: return ``[N, H, K, V]`` float32.
        cu_seqlens: ``[N + 1]`` offsets (B == 1) or None; cu_seqlens_cpu: optional host copy (enables segments).
        backward: "auto" | "chunk" | "recompute".

    Returns:
        ``(o [B, T, H, V] in q.dtype, final_state or None)``; differentiable w.r.t. q, k, v, initial_state.
    """
    K, V = q.shape[-1], v.shape[-1]
    if not (1 <= K <= MAX_HEAD_DIM and 1 <= V <= MAX_HEAD_DIM):
        raise ValueError(f"the Triton kernels support head dims K, V in 1..{MAX_HEAD_DIM}, got K={K}, V={V}")
    if q.dtype == torch.float64 and q.is_cuda:  # fp64 tensor-core dots do not exist: reference path
        o, ht = naive.chunk_lightning_attn(
            q, k, v, slope, scale=scale, initial_state=initial_state,
            cu_seqlens=cu_seqlens_cpu if cu_seqlens_cpu is not None else cu_seqlens,
        )  # fmt: skip
        return o, (ht.clone() if ht is initial_state else ht) if output_final_state else None
    o, ht = LightningAttnFunction.apply(
        q, k, v, slope, initial_state, cu_seqlens, cu_seqlens_cpu, float(scale), output_final_state, backward, 0
    )
    return o, (ht if output_final_state else None)


def lightning_attn_inter_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slope: torch.Tensor | None,
    *,
    chunk_size: int,
    scale: float = 1.0,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    cu_seqlens_cpu: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Inter-chunk part of Lightning Attention only (the linear half of hybrid chunk attention, issue 7).

    ``o_t = scale · λ^(t-c0+1) q_t S_{c0-1}`` where c0 is the first token of t's chunk of ``chunk_size`` tokens
    (chunks aligned to each sequence start): ``lightning_attn`` without the intra-chunk term, i.e. every token sees
    the decayed state of all *previous* chunks (plus h0) and nothing of its own chunk. The final state is the full
    S_{T-1}, as in ``lightning_attn``. Differentiable w.r.t. q, k, v, initial_state (and through the final state).

    Args:
        q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``; fp16 / bf16 / fp32 (fp64 under the interpreter), same layouts,
            options and shapes as :func:`lightning_attention.lightning_attn`.
        chunk_size: a multiple of 16 in 16..256.

    Returns:
        ``(o_inter [B, T, H, V] in q.dtype, final_state [N, H, K, V] float32 or None)``.
    """
    if not isinstance(chunk_size, int) or chunk_size % 16 or not 16 <= chunk_size <= 256:
        raise ValueError(f"chunk_size must be a multiple of 16 in 16..256, got {chunk_size!r}")
    from lightning_attention.ops.lightning.validation import check_lightning_attn_inputs

    check_lightning_attn_inputs(
        q, k, v, slope, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
        cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu, backward="chunk",
    )  # fmt: skip
    K, V = q.shape[-1], v.shape[-1]
    if not (1 <= K <= MAX_HEAD_DIM and 1 <= V <= MAX_HEAD_DIM):
        raise ValueError(f"the Triton kernels support head dims K, V in 1..{MAX_HEAD_DIM}, got K={K}, V={V}")
    o, ht = LightningAttnFunction.apply(
        q, k, v, slope, initial_state, cu_seqlens, cu_seqlens_cpu, float(scale), output_final_state, "chunk",
        chunk_size,
    )  # fmt: skip
    return o, (ht if output_final_state else None)
