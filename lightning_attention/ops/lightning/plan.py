"""The chunk plan: pure functions of a call's problem that decide how the kernels run it.

A :class:`ChunkProblem` holds everything a chunk forward or backward call's launches depend on: the tensors' shapes,
strides, dtypes and 16-byte alignment (:class:`TensorSpec`), which optional inputs are given, the packed
sequences' host offsets when the caller gave them, the device's properties (:class:`~.device.DeviceInfo`) and the
settings. From it the functions here decide, without tensors or a GPU:

- the segment plan (:func:`plan_segments`): whether long sequences are cut into segments so that enough programs
  fill the GPU, and how long the segments are (:func:`best_segment_len`, a time model over the walk's occupancy);
- the kernel variants: tensor descriptors (:func:`tma_ready`), the two-warpgroup walk (:func:`use_walk_ws`), the
  fused dk/dv walk (:func:`use_fused_dkdv`), the walk configurations (``kernels/configs.walk_candidates``) and the
  operand precisions (:func:`precisions`).

:mod:`~lightning_attention.ops.lightning.prepass_plan` decides the segment pre-pass's pieces of a segmented plan;
:mod:`~lightning_attention.ops.lightning.run` turns these decisions into the launch program of a call. Why the rules
are what they are, with the measurements behind them: docs/kernels.md, "The segment plan".
"""

import functools
from dataclasses import dataclass

import torch
import triton.language as tl

from lightning_attention.ops.lightning.device import DeviceInfo
from lightning_attention.ops.lightning.kernels import dkdv_ws, walk_ws
from lightning_attention.ops.lightning.kernels.configs import (
    cdiv,
    dkdv_descriptor_space,
    state_operand_bytes,
    use_dkdv_walk,
    walk_candidates,
    walk_programs_per_sm,
    walk_tile,
)
from lightning_attention.settings import Settings

MAX_HEAD_DIM = 256
# the backward="auto" rule: the chunk backward wants >= 128 KB of shared memory per block, below it the recompute
# backward runs (docs/design.md, "Public API")
CHUNK_BACKWARD_MIN_SHARED = 128 * 1024
# head dims up to this: a walk grid of one program per SM already streams its bytes at about DRAM speed, so
# segments that only add a second resident program per SM cost more (the pre-pass) than they gain
BANDWIDTH_BOUND_DIM = 64
# a segmented pass costs about this much more than one walk over the same segments: the pre-pass reads (k, v) or
# (q, do) again (forward 6 tensor passes instead of 4; backward 14 instead of 10)
SEGMENTED_COST = 1.5
TMA_MIN_CAPABILITY = 90  # Hopper: the tensor memory accelerator
TMA_ALIGN = 16  # bytes: start address and every stride but the last
_HAS_DESCRIPTORS = hasattr(tl, "make_tensor_descriptor")


@dataclass(frozen=True)
class TensorSpec:
    """What a launch depends on of a tensor: shape, strides (elements), dtype and whether its address is a multiple
    of 16 bytes (Triton specialises on it, tensor descriptors need it)."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: torch.dtype
    aligned: bool = True

    @classmethod
    def of(cls, x: torch.Tensor) -> "TensorSpec":
        return cls(tuple(x.shape), x.stride(), x.dtype, not x.data_ptr() % TMA_ALIGN)

    @classmethod
    def contiguous(cls, shape: tuple[int, ...], dtype: torch.dtype) -> "TensorSpec":
        """A fresh allocation (PyTorch aligns them to at least 16 bytes)."""
        strides, n = [], 1
        for size in reversed(shape):
            strides.append(n)
            n *= max(size, 1)
        return cls(shape, tuple(reversed(strides)), dtype, True)

    def element_size(self) -> int:
        return self.dtype.itemsize


@dataclass(frozen=True)
class ChunkProblem:
    """One chunk forward or backward call, as its launches see it (module docstring).

    ``q``, ``k``: ``[B, T, H, K]``; ``v`` (and ``do``): ``[B, T, H, V]``; ``h0`` (and ``dht``): ``[N, H, K, V]``
    specs or None. ``num_seqs``: N; ``varlen``: the batch is packed sequences (cu_seqlens given); ``offsets``: their
    host offsets (cu_seqlens_cpu), which let the plan cut them into segments. ``final_state``: the forward stores the
    final state / the backward computes dh0. ``inter_chunk`` > 0: the inter-only mode with chunks of that many
    tokens. ``fwd_states``: the backward receives the forward's segment states (their spec), else None.
    """

    q: TensorSpec
    k: TensorSpec
    v: TensorSpec
    num_seqs: int
    varlen: bool
    offsets: tuple[int, ...] | None
    has_slope: bool
    h0: TensorSpec | None
    final_state: bool
    scale: float
    inter_chunk: int
    device: DeviceInfo
    settings: Settings
    do: TensorSpec | None = None
    dht: TensorSpec | None = None
    fwd_states: TensorSpec | None = None

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        """(B, T, H, K, V)."""
        B, T, H, K = self.q.shape
        return B, T, H, K, self.v.shape[-1]

    @property
    def dtype(self) -> torch.dtype:
        return self.q.dtype


# precisions

# fp32 products: a high and a low tf32 part of each operand, three tensor-core products (hi·hi + hi·lo + lo·hi)
FP32_PRECISION = "tf32x3"


def acc_dtype(dtype: torch.dtype):
    """The kernels' accumulator and state type: fp32, fp64 for fp64 inputs (the interpreter's references)."""
    return tl.float64 if dtype == torch.float64 else tl.float32


def precisions(dtype: torch.dtype, settings: Settings) -> tuple[str | None, str, bool]:
    """(DOT_PREC, INTER_PREC, SPLIT_OPERANDS) of the walk. fp32 inputs: every product as three tf32 tensor-core
    products on split operands (``tf32x3``: the error of exact fp32 products, on the tensor cores and with their
    build times; docs/design.md, "Precision"); fp64 inputs (the interpreter's references): exact products. For
    16-bit inputs the fp32 operands (the state, the intra-chunk scores, the decayed values) meet the tensor
    cores rounded to the input dtype, except: for fp16 the inter product (λq)·S is always tf32 on fp32 operands
    (the state is never rounded to fp16: its values outgrow fp16); for bf16 the ``bf16_inter`` setting ``tf32``
    does the same. The ``precision`` setting ``split`` carries every fp32 operand as two halves in the input
    dtype (``kernels/walk.split_halves``: results at the rounding floor of the output, docs/kernels.md, "Split
    operands"); for fp16, whose range cannot hold the state, q and S both go to bf16 products as halves
    (``bf16x3``: three products)."""
    if dtype == torch.float64:
        return "ieee", "ieee", False
    if dtype == torch.float32:
        return FP32_PRECISION, FP32_PRECISION, False
    split = settings.precision == "split"
    if dtype == torch.bfloat16:
        if split:
            return None, "split", True
        return None, "tf32" if settings.bf16_inter == "tf32" else "input", False
    return None, "bf16x3" if split else "tf32", split


def inter_precision(problem: ChunkProblem) -> str:
    return precisions(problem.dtype, problem.settings)[1]


def pin(problem: ChunkProblem) -> tuple[int, int, int, int] | None:
    """The pinned walk configuration (BT, BV, num_warps, num_stages) of the settings, or None."""
    p = problem.settings.kernel_config
    return None if p is None else (p.BT, p.BV, p.num_warps, p.num_stages)


# tensor descriptors (docs/kernels.md, "Tensor descriptors")


def tma_enabled(device: DeviceInfo, settings: Settings) -> bool:
    """An sm_90+ GPU, or the interpreter (CPU tests run the path an H100 runs), with a Triton that has in-kernel
    descriptors, unless the ``tma`` setting is off."""
    if not _HAS_DESCRIPTORS or not settings.tma:
        return False
    return not device.is_cuda or device.capability >= TMA_MIN_CAPABILITY


def tma_ready(device: DeviceInfo, settings: Settings, *tensors) -> bool:
    """Whether a walk may move ``tensors`` (each [B, T, H, D] with a contiguous last dim: specs or refs) through
    tensor descriptors: a 16-byte aligned start and batch / token / head strides on 16-byte multiples."""
    if not tma_enabled(device, settings):
        return False
    for x in tensors:
        spec = x.spec if hasattr(x, "spec") else x
        s = spec.strides
        if s[-1] != 1 or not spec.aligned or (s[0] | s[1] | s[2]) * spec.element_size() % TMA_ALIGN:
            return False
    return True


# the two-warpgroup walk (docs/kernels.md, "The two-warpgroup walk")


@functools.lru_cache(maxsize=None)
def _walk_ws_available() -> bool:
    return walk_ws.lightning_walk_ws_kernel is not None and walk_ws.triton_version_supported()


def walk_ws_shape(problem: ChunkProblem, DK: int, DV: int) -> bool:
    """Whether walks of this problem may run the two-warpgroup kernel (``kernels/walk_ws.py``): bf16 with the bf16
    inter product, or the split precision at a key dim the kernel splits (``walk_ws.WS_SPLIT_KEY_DIMS``), K = 128 or
    256 with V a multiple of the kernel's two value tiles, on an sm_90 GPU (Hopper's warpgroup MMA) with descriptors
    on and a Triton it was checked with, unless the ``gluon`` setting is off."""
    device, settings = problem.device, problem.settings
    inter = inter_precision(problem)
    return (
        device.is_cuda and device.capability == 90 and problem.dtype == torch.bfloat16
        and walk_ws.value_tile(DK, DV) is not None
        and (inter == "input" or inter == "split" and DK in walk_ws.WS_SPLIT_KEY_DIMS)
        and settings.gluon and tma_enabled(device, settings) and _walk_ws_available()
    )  # fmt: skip


def walk_ws_programs(DK: int, DV: int, heads_segments: int) -> int:
    """Programs of a two-warpgroup launch over ``heads_segments`` (head, segment) pairs: one per pair of value
    tiles."""
    return DV // (2 * walk_ws.value_tile(DK, DV)) * heads_segments


def use_walk_ws(problem: ChunkProblem, DK: int, DV: int, plan: "SegmentPlan", inter_chunk: int, use_tma: bool) -> bool:
    """Whether a walk launch (the walk or its pre-pass) runs the two-warpgroup kernel instead of the Triton walk:
    :func:`walk_ws_shape`, a fixed-length batch, tensors the descriptors take, not the inter-only mode, and a grid
    that would take the Triton walk more than one round (it has half the Triton walk's programs, each running both
    halves' chains: with fewer than half the SMs' worth, one Triton round at one chain per SM is shorter)."""
    if inter_chunk or not use_tma or plan.varlen != 0 or not walk_ws_shape(problem, DK, DV):
        return False
    return 2 * walk_ws_programs(DK, DV, problem.q.shape[2] * plan.total) > problem.device.sm_count


# the segment plan (docs/kernels.md, "The segment plan")


@dataclass(frozen=True)
class SegmentPlan:
    """How the sequences are cut into the walk's work items.

    varlen: 0 = fixed-length batch (segments of ``seg_len`` tokens, ``per_seq`` per sequence), 1 = packed sequences
    one segment each (read from cu_seqlens on the device), 2 = packed sequences cut on the host (``seg_table``: rows
    (n, bos, eos, flags) and ``seq_segs`` [N + 1]: the first segment of each sequence).
    """

    varlen: int
    segmented: bool
    total: int  # number of work items (segments over all sequences)
    per_seq: int = 1
    seg_len: int = 0
    seg_table: tuple[int, ...] | None = None  # flattened [total, 4] int32
    seq_segs: tuple[int, ...] | None = None


def walk_options(problem: ChunkProblem, DK: int, DV: int, tma: bool) -> tuple:
    """The main walk's candidate configurations for head dims (DK, DV), the selector's first (what the autotuner
    tries first) leading."""
    state_bytes = state_operand_bytes(inter_precision(problem))
    return walk_candidates(
        DK, DV, problem.q.element_size(), problem.device.shared_per_block, state_only=False, tma=tma,
        state_bytes=state_bytes, pin=pin(problem),
    )  # fmt: skip


def walk_slots(problem: ChunkProblem, DK: int, DV: int) -> tuple[int, int]:
    """(walk programs the GPU runs at once, their value tile): SMs × the programs one SM holds of the candidate that
    holds fewest (a grid of fewer leaves SMs idle, a grid of more runs in rounds), and the first candidate's BV, which
    sets a grid's program count (cdiv(V, BV) per head).

    The fewest, because the tuned table or the autotuner may launch any candidate: segments counted for two programs
    per SM would run in two rounds under a candidate that holds one (K = 128 with descriptors: two stages hold two,
    four stages one; docs/kernels.md, "The tuned table")."""
    device = problem.device
    tma = tma_enabled(device, problem.settings)
    options = walk_options(problem, DK, DV, tma)
    per_sm = min(
        walk_programs_per_sm(config, DK, problem.q.element_size(), device.shared_per_sm, tma) for config in options
    )
    return device.sm_count * per_sm, options[0].kwargs["BV"]


def fills_every_sm_once(DK: int, DV: int, programs: int, sms: int) -> bool:
    """Whether an unsegmented walk of ``programs`` programs is left whole because it already fills every SM once
    (within the plan's 5% margin: 128 programs on 132 SMs do) and the walk is bound by bandwidth there (head dims up
    to :data:`BANDWIDTH_BOUND_DIM`)."""
    return max(DK, DV) <= BANDWIDTH_BOUND_DIM and programs >= 0.95 * sms


@functools.lru_cache(maxsize=4096)
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


def segment_len(problem: ChunkProblem, lengths_total: int, num_seqs: int, fixed_length: bool) -> int:
    """Tokens per segment (0: do not segment): the ``segment_len`` setting, else from the GPU (never on the
    interpreter). ``fixed_length``: a [B, T] batch (the two-warpgroup walk's case), else packed sequences."""
    forced = problem.settings.segment_len
    if forced is not None:
        return forced
    device = problem.device
    if not device.is_cuda or num_seqs == 0:
        return 0
    _, _, H, DK, DV = problem.shape
    if fixed_length and walk_ws_shape(problem, DK, DV):
        # the two-warpgroup walk: one program per SM, two value tiles each (at K = 256 a batch-1 grid of 16 heads is
        # 64 programs: cut in two, not run on half the SMs)
        slots, programs = device.sm_count, walk_ws_programs(DK, DV, num_seqs * H)
    else:
        slots, BV = walk_slots(problem, DK, DV)
        programs = num_seqs * H * cdiv(DV, BV)
    if fills_every_sm_once(DK, DV, programs, device.sm_count):
        return 0
    # a segment's fp32 state (4·K·V bytes) must stay within 25% of its q tile (seg·K·elem bytes): seg >= 16·V/elem
    min_len = max(256, 16 * DV // problem.q.element_size())
    return best_segment_len(cdiv(lengths_total, num_seqs), programs, slots, min_len)


def _aligned(seg: int, align: int) -> int:
    return cdiv(seg, align) * align if align else seg


def plan_segments(problem: ChunkProblem) -> SegmentPlan:
    """The work items of a call: segments of a fixed-length batch from the shapes, of packed sequences only from host
    offsets (never a device->host copy). In the inter-only mode segments are a multiple of its chunk size."""
    B, T, H, _, _ = problem.shape
    align = problem.inter_chunk
    if not problem.varlen:
        seg = _aligned(segment_len(problem, B * T, B, fixed_length=True), align)
        if seg == 0 or T <= seg:
            return SegmentPlan(varlen=0, segmented=False, total=B, per_seq=1, seg_len=max(T, 1))
        per_seq = cdiv(T, seg)
        return SegmentPlan(varlen=0, segmented=True, total=B * per_seq, per_seq=per_seq, seg_len=seg)
    N, offsets = problem.num_seqs, problem.offsets
    seg = _aligned(segment_len(problem, T, N, fixed_length=False), align) if offsets is not None else 0
    if seg == 0 or all(b - a <= seg for a, b in zip(offsets[:-1], offsets[1:])):
        return SegmentPlan(varlen=1, segmented=False, total=N)
    rows, seq_segs = [], [0]
    for n, (bos, eos) in enumerate(zip(offsets[:-1], offsets[1:])):
        cuts = list(range(bos, eos, seg)) or [bos]  # a zero-length sequence keeps one empty segment
        for j, start in enumerate(cuts):
            flags = (1 if j == 0 else 0) | (2 if j == len(cuts) - 1 else 0)
            rows += [n, start, min(start + seg, eos), flags]
        seq_segs.append(len(rows) // 4)
    return SegmentPlan(varlen=2, segmented=True, total=len(rows) // 4, seg_table=tuple(rows), seq_segs=tuple(seq_segs))


def waves(problem: ChunkProblem, programs: int) -> int:
    """The walk autotuner's WAVES key: 1 when ``programs`` (at 64-wide value tiles) fit the GPU at one per SM, else 2
    (on the interpreter: 1)."""
    device = problem.device
    return 1 if not device.is_cuda or programs <= device.sm_count else 2


# backward variants


def dkdv_descriptors(problem: ChunkProblem, DK: int, DV: int, *tensors) -> bool:
    """Whether the fused dk/dv walk moves ``tensors`` (q, k, v, do and, at the launch, dk, dv: specs or refs; none:
    contiguous ones) by tensor descriptors: whole chunks (not the inter-only mode), tensors the descriptors take, and
    a configuration of :func:`.configs.dkdv_descriptor_space`, the configurations measured with them, fitting the
    shared memory. Elsewhere the fused walk loads through pointers, as measured."""
    state_bytes = state_operand_bytes(inter_precision(problem))
    return (
        not problem.inter_chunk and tma_ready(problem.device, problem.settings, *tensors)
        and bool(dkdv_descriptor_space(DK, DV, problem.q.element_size(), state_bytes, problem.device.shared_per_block))
    )  # fmt: skip


def use_dkdv_ws(problem: ChunkProblem, DK: int, DV: int, plan: "SegmentPlan") -> bool:
    """Whether the backward's dk and dv may come from the two-warpgroup fused walk (``kernels/dkdv_ws.py``): where
    the walks of ``plan`` run the two-warpgroup kernel (:func:`use_walk_ws`, which also rules out packed sequences
    and the inter-only mode) at K = V = 128 with the bf16 inter product, q, k, v and do taken by descriptors."""
    tensors = (problem.q, problem.k, problem.v, problem.do)
    if DK != DV or DK not in dkdv_ws.DKDV_WS_DIMS or dkdv_ws.lightning_dkdv_ws_kernel is None or None in tensors:
        return False
    use_tma = tma_ready(problem.device, problem.settings, *tensors)
    return inter_precision(problem) == "input" and use_walk_ws(problem, DK, DV, plan, problem.inter_chunk, use_tma)


def use_fused_dkdv(problem: ChunkProblem, DK: int, DV: int, plan: "SegmentPlan | None" = None) -> bool:
    """Whether dk and dv come from one fused walk rather than two reverse walks: the two-warpgroup one
    (:func:`use_dkdv_ws`, for the segments of ``plan``, by default the problem's own) or the Triton one
    (kernels/dkdv_walk.py). The ``fused_dkdv`` setting forces it on or off; by default (None) it runs where it was
    measured faster: the two-warpgroup walk wherever it applies, and the Triton walk for 16-bit inputs at head dims of
    64 (padded) with tensor descriptors, a configuration of :func:`.configs.dkdv_descriptor_space` fitting the shared
    memory (docs/kernels.md, "The fused dk/dv walk"); other heads and pointer loads keep the two walks. Never under
    the split precision (the walks alone split their operands), and the Triton walk only where its tiles cover the
    padded head dims (<= 128) and fit the shared memory."""
    choice = problem.settings.fused_dkdv
    if choice is False or problem.settings.precision == "split":
        return False
    if use_dkdv_ws(problem, DK, DV, plan_segments(problem) if plan is None else plan):
        return True
    if choice is None:
        tensors = (problem.q, problem.k, problem.v, problem.do)
        return (
            problem.dtype in (torch.bfloat16, torch.float16) and None not in tensors
            and dkdv_descriptors(problem, DK, DV, *tensors)
        )  # fmt: skip
    state_bytes = state_operand_bytes(inter_precision(problem))
    return use_dkdv_walk(DK, DV, problem.q.element_size(), state_bytes, problem.device.shared_per_block)


def dq_reverse_states(problem: ChunkProblem, plan: SegmentPlan) -> bool:
    """Whether the backward's dq walk also computes the dk/dv walks' segment-local states (``kernels/walk.py``,
    REV_STATES) in place of their pre-pass: a segmented plan whose dq walk is the Triton walk at head dims up to
    :data:`BANDWIDTH_BOUND_DIM`, not for fp32 inputs. There the walk is bound by memory, and reading q once more (3/4
    of a tensor pass at four segments per sequence) costs less than the pre-pass reading q and do again; the second
    [K, BV] state is 32 registers per thread at 4 warps (201 -> 249-255 on sm_90). fp32's walk, three products per
    product, already spills at K = 64 and would spill four times as much; the two-warpgroup walk (K = 128 and 256)
    has no room for a second state (docs/kernels.md, "The dq walk's reverse states")."""
    _, _, _, K, V = problem.shape
    return (
        plan.segmented and problem.dtype != torch.float32 and max(walk_tile(K), walk_tile(V)) <= BANDWIDTH_BOUND_DIM
        and not walk_ws_shape(problem, V, K)
    )  # fmt: skip


def use_recompute_backward(mode: str, device: DeviceInfo) -> bool:
    """The backward of ``backward=mode``: "recompute", or "auto" on a GPU with under
    :data:`CHUNK_BACKWARD_MIN_SHARED` bytes of shared memory per block."""
    if mode != "auto":
        return mode == "recompute"
    return device.is_cuda and (device.shared_per_block or CHUNK_BACKWARD_MIN_SHARED) < CHUNK_BACKWARD_MIN_SHARED
