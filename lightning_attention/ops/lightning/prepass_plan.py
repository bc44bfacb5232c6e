"""The pre-pass pieces: whether the segment pre-pass of a segmented plan runs on shorter pieces of its segments.

The pre-pass walks each segment of the walk once for its local state (``[K, V]`` per segment and head), from which the
scan computes every segment's incoming state. With few, long segments it has few programs and is bound by
latency, so on fixed-length batches each segment may be cut into pieces whose states the scan composes. From a
:class:`~lightning_attention.ops.lightning.plan.ChunkProblem` and its
:class:`~lightning_attention.ops.lightning.plan.SegmentPlan`, :func:`prepass_pieces` decides the pieces, without
tensors or a GPU: :func:`prepass_split` for the Triton pre-pass, :func:`prepass_split_by_fill` for the
two-warpgroup one (one program per SM), or the ``prepass_len`` setting.
:mod:`~lightning_attention.ops.lightning.launches` lays out the pre-pass and the scan over them. Why the rules are
what they are, with the measurements behind them: docs/kernels.md, "Pre-pass pieces and the scan".
"""

import functools
from dataclasses import dataclass

from lightning_attention.ops.lightning.kernels.configs import cdiv
from lightning_attention.ops.lightning.plan import (
    ChunkProblem,
    SegmentPlan,
    tma_ready,
    walk_ws_programs,
    walk_ws_shape,
)

# pre-pass programs resident per SM (its tuned configurations: one 8-warp program with BV = 128, or two or three
# 4-warp programs with BV = 64)
PREPASS_PROGRAMS_PER_SM = 2
# the share of the SMs the two-warpgroup pre-pass (one program per SM) fills before it is bound by DRAM: whole segments
# read at 2.3 TB/s with 64 of 132 programs, 3.4 with 96 and 3.7 with 112 (docs/kernels.md, "Pre-pass pieces and the
# scan")
PREPASS_FILL = 0.7


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

    @classmethod
    def whole(cls, plan: SegmentPlan, T: int) -> "PrepassPieces":
        """The walk's own segments, every one of them (the local states in place in the segment-state buffer)."""
        return cls(1, plan.seg_len, 0, T, plan.per_seq, 0)


def _fewest_pieces(seg_len: int, programs: int, target: float, min_piece: int) -> int:
    """The fewest pieces per segment whose ``programs`` × pieces reach ``target``, else the most there are: pieces of at
    least ``min_piece`` tokens, a multiple of 64 dividing ``seg_len`` (1 = the segments themselves)."""
    best = 1
    for split in range(1, seg_len // max(min_piece, 64) + 1):
        if (seg_len // 64) % split:
            continue
        best = split
        if programs * split >= target:
            break
    return best


@functools.lru_cache(maxsize=4096)
def prepass_split(seg_len: int, programs: int, slots: int, min_piece: int) -> int:
    """Pieces per walk segment for the pre-pass (1 = the walk's own segments).

    The pre-pass reads (k, v) once and keeps no q or o: with enough programs it is bound by bandwidth, but one
    program per (walked segment, head) leaves it bound by latency when segments are long and few. So each segment is
    cut into pieces of at least ``min_piece`` tokens (a multiple of 64 dividing ``seg_len``) until ``programs`` ×
    pieces reaches twice ``slots`` (the pre-pass programs the GPU runs at once); the scan composes the pieces.
    Segments whose ``programs`` already fill half the slots stay whole: there the pieces' extra scan and state
    traffic cost more than the latency they hide (docs/kernels.md, "Pre-pass pieces and the scan").
    """
    if 2 * programs >= slots:
        return 1
    return _fewest_pieces(seg_len, max(programs, 1), 2 * slots, min_piece)


@functools.lru_cache(maxsize=4096)
def prepass_split_by_fill(seg_len: int, programs: int, slots: int, min_piece: int) -> int:
    """Pieces per walk segment for a pre-pass that runs one program per SM (the two-warpgroup one; 1 = the walk's own
    segments): the fewest whose programs fill :data:`PREPASS_FILL` of the ``slots`` in their first round, or the most
    there are. Past that share of streaming SMs the pre-pass is bound by DRAM, and each piece adds a state to write
    and to scan. Pieces are at least ``min_piece`` tokens, a multiple of 64 dividing ``seg_len`` (docs/kernels.md,
    "Pre-pass pieces and the scan")."""
    return _fewest_pieces(seg_len, programs, PREPASS_FILL * slots, min_piece)


def prepass_pieces(problem: ChunkProblem, plan: SegmentPlan, skip_final: bool, reverse: bool,
                   tensors: tuple | None = None) -> PrepassPieces:  # fmt: skip
    """The pre-pass's pieces of a segmented plan (:func:`prepass_split_by_fill` where the two-warpgroup pre-pass
    runs on ``tensors``, the pair it reads, by default the call's k and v; else :func:`prepass_split`; or the
    ``prepass_len`` setting; varlen plans: the walk's segments).

    ``skip_final``: the walk's last segment in walk order (the first one of a reverse walk) is left out: its local
    state only feeds the final state."""
    _, T, H, DK, DV = problem.shape
    split = 1
    if plan.varlen == 0:
        forced = problem.settings.prepass_len
        if forced:
            if plan.seg_len % forced:
                raise ValueError(
                    f"LIGHTNING_ATTENTION_PREPASS_LEN must be a multiple of 16 that divides the segment length "
                    f"{plan.seg_len}, got {forced}"
                )
            split = plan.seg_len // forced
        elif forced is None and problem.device.is_cuda:
            walked = plan.total - (plan.total // plan.per_seq if skip_final else 0)
            # the pieces' states within 12.5% of one input: 4·V / (piece·elem) <= 1/8
            min_piece = max(256, 32 * DV // problem.q.element_size())
            tensors = (problem.k, problem.v) if tensors is None else tensors
            if walk_ws_shape(problem, DK, DV) and tma_ready(problem.device, problem.settings, *tensors):
                programs = walk_ws_programs(DK, DV, walked * H)
                split = prepass_split_by_fill(plan.seg_len, programs, problem.device.sm_count, min_piece)
            else:
                slots = PREPASS_PROGRAMS_PER_SM * problem.device.sm_count
                split = prepass_split(plan.seg_len, walked * H, slots, min_piece)
    if split == 1:
        return PrepassPieces.whole(plan, T)
    piece = plan.seg_len // split
    lo = plan.seg_len if skip_final and reverse else 0
    hi = (plan.per_seq - 1) * plan.seg_len if skip_final and not reverse else T
    return PrepassPieces(split, piece, lo, hi, cdiv(hi - lo, piece), lo // piece)
