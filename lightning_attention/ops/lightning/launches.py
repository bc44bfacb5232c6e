"""One launch of each chunk kernel, its arguments laid out from a problem's tensors: what the programs are built of.

Every builder takes a :class:`~lightning_attention.ops.lightning.program.ProgramBuilder` and the
:class:`~lightning_attention.ops.lightning.plan.ChunkProblem`, and records its launch with every shape, stride, flag
and grid fixed; the tensors are :class:`~lightning_attention.ops.lightning.program.Ref` references, filled in per
call. The plan's decisions (segments, kernel variants, candidate configurations) are asked here, launch by launch; the
order of the launches of a pass is :mod:`~lightning_attention.ops.lightning.run`'s.
"""

import functools
from dataclasses import dataclass

import torch

from lightning_attention.ops.lightning.kernels import dkdv_walk, dkdv_ws, tuned, walk, walk_ws
from lightning_attention.ops.lightning.kernels.configs import (
    cdiv,
    dkdv_candidates,
    inter_only_config,
    inter_only_tile,
    padded_dim,
    state_operand_bytes,
    walk_candidates,
    walk_tile,
)
from lightning_attention.ops.lightning.kernels.dkdv_walk import dkdv_kernel, tuned_dkdv_kernel
from lightning_attention.ops.lightning.kernels.scan import lightning_scan_kernel
from lightning_attention.ops.lightning.kernels.walk import tuned_walk_kernel, walk_kernel
from lightning_attention.ops.lightning.launch import Launcher
from lightning_attention.ops.lightning.library import pointers, token_strides
from lightning_attention.ops.lightning.naive import compute_dtype
from lightning_attention.ops.lightning.plan import (
    ChunkProblem,
    SegmentPlan,
    acc_dtype,
    dkdv_descriptors,
    pin,
    precisions,
    tma_ready,
    use_dkdv_ws,
    use_walk_ws,
    walk_ws_programs,
    waves,
)
from lightning_attention.ops.lightning.prepass_plan import PrepassPieces, prepass_pieces
from lightning_attention.ops.lightning.program import ProgramBuilder, Ref
from lightning_attention.ops.lightning.tma import ensure_allocator
from lightning_attention.utils.dtypes import dtype_name

# launchers of the kernels launched with one configuration passed explicitly; the autotuned ones are made per
# candidate list (_tuned)
_WALK = Launcher(walk_kernel, "lightning_attn walk")
_SCAN = Launcher(lightning_scan_kernel, "lightning_attn segment scan")
_DKDV = Launcher(dkdv_kernel, "lightning_attn dk/dv walk")
_LAUNCHERS = [_WALK, _SCAN, _DKDV]
if walk_ws.lightning_walk_ws_kernel is not None:
    _WALK_WS = Launcher(walk_ws.lightning_walk_ws_kernel, "lightning_attn walk (two warpgroups)")
    _STATE_WS = Launcher(walk_ws.lightning_state_ws_kernel, "lightning_attn segment pre-pass (two warpgroups)")
    _DKDV_WS = Launcher(dkdv_ws.lightning_dkdv_ws_kernel, "lightning_attn dk/dv walk (two warpgroups)")
    _LAUNCHERS += [_WALK_WS, _STATE_WS, _DKDV_WS]


@functools.lru_cache(maxsize=None)
def _tuned(kind: str, candidates: tuple) -> Launcher:
    """The launcher of the walk (``kind`` "walk") or the fused dk/dv walk ("dkdv") autotuned over ``candidates``."""
    kernel = tuned_walk_kernel(candidates) if kind == "walk" else tuned_dkdv_kernel(candidates)
    name = "lightning_attn walk (tuned)" if kind == "walk" else "lightning_attn dk/dv walk (tuned)"
    launcher = Launcher(kernel, name)
    _LAUNCHERS.append(launcher)
    return launcher


def launchers() -> list[Launcher]:
    """Every launcher the programs have used so far (tests check that they stay on the direct path)."""
    return list(_LAUNCHERS)


# every autotuned launch planned in this process: its tuned-table key -> the shapes of its candidates
_AUTOTUNED: dict[tuple, tuple[tuple[int, int, int, int], ...]] = {}


def autotuned_launches() -> dict[tuple, tuple[tuple[int, int, int, int], ...]]:
    """The tuned-table keys (``kernels/tuned.table_key``) of the autotuned launches planned so far, each with the
    (BT, BV, num_warps, num_stages) of its candidates, best first (what ``benchmarks/tune_table.py`` measures)."""
    return dict(_AUTOTUNED)


def forget_autotuned() -> None:
    """Empties :func:`autotuned_launches` (with the cached programs that planned them: ``run.clear_programs``)."""
    _AUTOTUNED.clear()


def config_shape(cfg, constexprs: dict) -> tuple[int, int, int, int]:
    """(BT, BV, num_warps, num_stages) of a candidate, BT and BV from the launch where the candidate leaves them."""
    return (cfg.kwargs.get("BT", constexprs.get("BT")), cfg.kwargs.get("BV", constexprs.get("BV")), cfg.num_warps,
            cfg.num_stages)  # fmt: skip


def _launch_tuned(b: ProgramBuilder, p: ChunkProblem, kind: str, plain: Launcher, candidates: tuple, per_tile: int,
                  DV: int, args, constexprs: dict, x: Ref, key: tuple) -> None:  # fmt: skip
    """A launch over ``candidates``: the plain kernel with the one configuration, or the autotuner over several; the
    grid is ``per_tile`` programs per value tile (its width chosen by the configuration). Where ``key`` (a tuned-table
    key) has an entry for this GPU's architecture among the candidates, that one alone (``kernels/tuned.py``). Under
    Triton's interpreter (no GPU) the plain kernel runs the first candidate: the autotuner's benchmark needs a GPU
    driver, and timings taken on the interpreter would say nothing about one."""
    if len(candidates) > 1:
        shapes = _AUTOTUNED[key] = tuple(config_shape(c, constexprs) for c in candidates)
        entry = tuned.tuned_config(p.device.capability, key) if p.settings.tuned_table else None
        candidates = tuple(c for c, shape in zip(candidates, shapes) if shape == entry) or candidates
    if len(candidates) == 1 or not p.device.is_cuda:
        cfg = candidates[0]
        constexprs = {**constexprs, **cfg.kwargs, "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
        b.launch(plain, (cdiv(DV, cfg.kwargs.get("BV", DV)) * per_tile,), args, constexprs, x)
        return
    grid = (lambda meta: (cdiv(DV, meta["BV"]) * per_tile,)) if kind == "walk" else (per_tile,)
    b.launch(_tuned(kind, candidates), grid, args, constexprs, x)


def _strides(x: Ref | None) -> tuple:
    """A state's strides (slot, head, row, column), one kernel argument; zeros for an absent state (never read)."""
    return (0, 0, 0, 0) if x is None else x.stride()


def _descriptor_scratch(b: ProgramBuilder, p: ChunkProblem, use_tma: bool) -> None:
    """Before a launch that makes tensor descriptors in the kernel (``use_tma``) on a GPU: Triton's allocator for
    their global scratch (ops/lightning/tma.py)."""
    if use_tma and p.device.is_cuda:
        b.call(ensure_allocator)


@dataclass(frozen=True)
class ReverseStates:
    """What a forward segmented walk computes besides its own pass (``kernels/walk.py``, REV_STATES): the local states
    ``states`` [NSEG, H, DK, DV] (a ref, through strides) of the reverse walk whose k is ``x`` [B, T, H, DV] and
    whose v is the walk's q, times ``scale``; ``every_segment``: also each sequence's first segment (else zeros
    there)."""

    x: Ref
    states: Ref
    scale: float
    every_segment: bool


def walk_launch(
    b, p, q, k, v, o, *, slope, h0, ht, states, plan, T, H, scale_intra, scale_inter, scale_upd, reverse,
    state_only, inter_chunk=0, skip_final=False, reverse_states: ReverseStates | None = None,
):  # fmt: skip
    """One launch of the chunk walk. q, k: [B, T, H, DK]; v: [B, T, H, DV]; o: [B, T, H, DV] (or None with
    ``state_only``); h0/ht: [N, H, DK, DV] refs or None; states: [NSEG, H, DK, DV] ref or None.
    ``inter_chunk`` > 0: the inter-only mode with chunks of that many tokens (BT fixed, no intra-chunk term).
    ``skip_final`` (with ``state_only``): the last segment of each sequence in walk order stores zeros unread.
    ``reverse_states`` (a forward walk of a segmented plan, on the Triton walk: ``plan.dq_reverse_states``): the
    reverse walk's local states, written in the same pass."""
    DK, DV = q.shape[-1], v.shape[-1]
    if reverse_states is not None and (reverse or state_only or not plan.segmented):
        raise ValueError("reverse local states come from a forward walk over segments (plan.dq_reverse_states)")
    (o_,) = pointers(q, o)
    # tensor descriptors need whole chunks: not the inter-only mode, whose chunks are shorter than its tile
    use_tma = not (inter_chunk and not state_only) and tma_ready(p.device, p.settings, q, k, v, o_)
    _descriptor_scratch(b, p, use_tma)
    dot_prec, inter_prec, split = precisions(q.dtype, p.settings)
    if use_walk_ws(p, DK, DV, plan, inter_chunk, use_tma):
        if reverse_states is not None:  # the plan's rule never asks (head dims up to 64 only)
            raise ValueError("the two-warpgroup walk does not compute reverse local states (plan.dq_reverse_states)")
        if state_only:
            _two_warpgroup_prepass(
                b, k, v, states, slope=slope, plan=plan, T=T, H=H, scale_upd=scale_upd, reverse=reverse,
                skip_final=skip_final, split=split,
            )  # fmt: skip
        else:
            _two_warpgroup_walk(
                b, q, k, v, o, slope=slope, h0=h0, ht=ht, states=states, plan=plan, T=T, H=H,
                scale_intra=scale_intra, scale_inter=scale_inter, scale_upd=scale_upd, reverse=reverse, split=split,
            )  # fmt: skip
        return
    cu = _cu_seqlens(b, p) if plan.varlen == 1 else None
    table = None if plan.seg_table is None else _segment_table(b, plan)
    wave_count = waves(p, cdiv(DV, 64) * H * plan.total)
    rev = reverse_states
    # without reverse states, x takes v's place (any [B, T, H, DV] tensor gives its stride group; never read)
    x, rev_states, rev_scale = (v, None, 1.0) if rev is None else (rev.x, rev.states, rev.scale)
    args = (
        q, k, v, o_, *pointers(q, slope, h0, ht, states, cu, table), x, *pointers(q, rev_states),
        *token_strides(q, k, v, o_, x), _strides(h0), _strides(ht), _strides(states), _strides(rev_states),
        float(scale_intra), float(scale_inter), float(scale_upd), float(rev_scale),
        T, H, plan.per_seq, plan.seg_len, inter_chunk if not state_only else 0,
        wave_count,
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
        ACC=acc_dtype(q.dtype),
        DOT_PREC=dot_prec,
        INTER_PREC=inter_prec,
        SPLIT_OPERANDS=split,
        REV_STATES=rev is not None,
        REV_ALL=rev is not None and rev.every_segment,
    )  # fmt: skip
    per_tile = H * plan.total
    if inter_chunk and not state_only:  # the inter-only walk: one configuration (the pre-pass does not chunk)
        cfg = inter_only_config(inter_only_tile(inter_chunk), DK, DV, pin(p))
        constexprs.update(cfg.kwargs, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        b.launch(_WALK, (cdiv(DV, cfg.kwargs["BV"]) * per_tile,), args, constexprs, q)
        return
    candidates = walk_candidates(
        DK, DV, q.element_size(), p.device.shared_per_block, state_only=state_only, tma=use_tma,
        state_bytes=state_operand_bytes(inter_prec), pin=pin(p), rev_states=rev is not None,
    )  # fmt: skip
    key = tuned.table_key("walk", dtype_name(q.dtype), {**constexprs, "WAVES": wave_count}, walk.AUTOTUNE_KEY)
    _launch_tuned(b, p, "walk", _WALK, candidates, per_tile, DV, args, constexprs, q, key)


def _two_warpgroup_walk(
    b, q, k, v, o, *, slope, h0, ht, states, plan, T, H, scale_intra, scale_inter, scale_upd, reverse, split
):
    """One launch of the two-warpgroup walk, with :func:`walk_launch`'s arguments (the cases ``plan.use_walk_ws``
    allows); ``split``: the split precision's operands."""
    DK, DV = q.shape[-1], v.shape[-1]
    args = (
        q, k, v, o, *pointers(q, slope, h0, ht, states),
        *token_strides(q, k, v, o), _strides(h0), _strides(ht), _strides(states),
        float(scale_intra), float(scale_inter), float(scale_upd),
        T, H, plan.per_seq, plan.seg_len,
    )  # fmt: skip
    constexprs = dict(
        DK=DK, DV=DV, BT=walk_ws.WS_BT, BV=walk_ws.value_tile(DK, DV), STAGES=walk_ws.WS_STAGES,
        REVERSE=reverse,
        HAS_DECAY=slope is not None,
        USE_H0=h0 is not None and not plan.segmented,
        STORE_HT=ht is not None and not plan.segmented,
        SEG_IN=plan.segmented,
        SPLIT=split,
        num_warps=walk_ws.WS_WARPS,
    )  # fmt: skip
    b.launch(_WALK_WS, (walk_ws_programs(DK, DV, H * plan.total),), args, constexprs, q)


def _two_warpgroup_prepass(b, k, v, states, *, slope, plan, T, H, scale_upd, reverse, skip_final, split):
    """One launch of the two-warpgroup pre-pass: the local state of every segment of ``plan`` into ``states``
    (``split``: the decayed values as two halves)."""
    DK, DV = k.shape[-1], v.shape[-1]
    args = (
        k, v, *pointers(k, slope), states,
        *token_strides(k, v), _strides(states),
        float(scale_upd), T, H, plan.per_seq, plan.seg_len,
    )  # fmt: skip
    constexprs = dict(
        DK=DK, DV=DV, BT=walk_ws.WS_BT, BV=walk_ws.value_tile(DK, DV), STAGES=walk_ws.WS_STATE_STAGES,
        REVERSE=reverse, HAS_DECAY=slope is not None, SKIP_FINAL=skip_final, SPLIT=split, num_warps=walk_ws.WS_WARPS,
    )  # fmt: skip
    b.launch(_STATE_WS, (walk_ws_programs(DK, DV, H * plan.total),), args, constexprs, k)


def dkdv_launch(b, p, q, k, v, do, dk, dv, *, slope, dht, dh0, g_states, plan, T, H, scale, inter_chunk=0):
    """One launch of the fused dk/dv reverse walk: the two-warpgroup one (kernels/dkdv_ws.py) where
    ``plan.use_dkdv_ws`` takes it, else the Triton one (kernels/dkdv_walk.py). q, k: [B, T, H, DK]; v, do:
    [B, T, H, DV]; dk, dv: outputs like k, v; dht/dh0: [N, H, DK, DV] or None; g_states: [NSEG, H, DK, DV] incoming
    G or None."""
    DK, DV = q.shape[-1], v.shape[-1]
    if use_dkdv_ws(p, DK, DV, plan):  # dk and dv are new contiguous tensors: descriptors always take them
        _descriptor_scratch(b, p, True)
        _two_warpgroup_dkdv(b, q, k, v, do, dk, dv, slope=slope, dht=dht, dh0=dh0, g_states=g_states, plan=plan, T=T,
                            H=H, scale=scale)  # fmt: skip
        return
    dot_prec, inter_prec, _ = precisions(q.dtype, p.settings)  # never "split": use_fused_dkdv
    fixed_bt = inter_only_tile(inter_chunk) if inter_chunk else 0
    use_tma = dkdv_descriptors(p, DK, DV, q, k, v, do, dk, dv)
    _descriptor_scratch(b, p, use_tma)
    cu = _cu_seqlens(b, p) if plan.varlen == 1 else None
    table = None if plan.seg_table is None else _segment_table(b, plan)
    args = (
        q, k, v, do, dk, dv, *pointers(q, slope, dht, dh0, g_states, cu, table),
        *token_strides(q, k, v, do, dk, dv), _strides(dht), _strides(dh0), _strides(g_states),
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
        ACC=acc_dtype(q.dtype),
        DOT_PREC=dot_prec,
        INTER_PREC=inter_prec,
        USE_TMA=use_tma,
        **({"BT": fixed_bt} if fixed_bt else {}),
    )  # fmt: skip
    candidates = dkdv_candidates(
        DK, DV, q.element_size(), state_operand_bytes(inter_prec), p.device.shared_per_block, fixed_bt, pin(p), use_tma
    )
    key = tuned.table_key("dkdv", dtype_name(q.dtype), constexprs, dkdv_walk.autotune_key(candidates))
    _launch_tuned(b, p, "dkdv", _DKDV, candidates, H * plan.total, padded_dim(DV), args, constexprs, q, key)


def _two_warpgroup_dkdv(b, q, k, v, do, dk, dv, *, slope, dht, dh0, g_states, plan, T, H, scale):
    """One launch of the two-warpgroup fused dk/dv walk (the cases ``plan.use_dkdv_ws`` allows), with
    :func:`dkdv_launch`'s arguments."""
    DK, DV = q.shape[-1], v.shape[-1]
    args = (
        q, k, v, do, dk, dv, *pointers(q, slope, dht, dh0, g_states),
        *token_strides(q, k, v, do, dk, dv), _strides(dht), _strides(dh0), _strides(g_states),
        float(scale), T, H, plan.per_seq, plan.seg_len,
    )  # fmt: skip
    constexprs = dict(
        DK=DK, DV=DV, BT=walk_ws.WS_BT, BV=dkdv_ws.DKDV_WS_BV, STAGES=dkdv_ws.DKDV_WS_STAGES,
        HAS_DECAY=slope is not None,
        USE_H0=dht is not None and not plan.segmented,
        STORE_HT=dh0 is not None and not plan.segmented,
        SEG_IN=plan.segmented,
        num_warps=walk_ws.WS_WARPS,
    )  # fmt: skip
    b.launch(_DKDV_WS, (H * plan.total,), args, constexprs, q)


def _scan_launch(b, states, pieces_states, pieces: PrepassPieces, *, slope, h0, ht, plan, N, H, T, reverse):
    """Incoming state of every segment into ``states`` [NSEG, H, DK, DV] from the pre-pass's local states
    ``pieces_states`` ([N·pieces.count, H, DK, DV], or ``states`` itself when pieces.split == 1); the final state
    into ``ht``."""
    DK, DV = states.shape[-2], states.shape[-1]
    BK = min(64, padded_dim(DK))
    BV = min(64, padded_dim(DV))
    seq_segs = None if plan.seq_segs is None else _sequence_segments(b, plan)
    table = None if plan.seg_table is None else _segment_table(b, plan)
    args = (
        states, pieces_states, *pointers(states, h0, ht, slope, seq_segs, table),
        _strides(states), _strides(pieces_states), _strides(h0), _strides(ht),
        T, H, plan.per_seq, plan.seg_len, pieces.count, pieces.piece_len, pieces.first, pieces.split,
    )  # fmt: skip
    constexprs = dict(
        DK=DK, DV=DV, BK=BK, BV=BV,
        VARLEN=plan.varlen,
        REVERSE=reverse,
        HAS_DECAY=slope is not None,
        USE_H0=h0 is not None,
        STORE_HT=ht is not None,
        ACC=acc_dtype(states.dtype),
        num_warps=4,
    )  # fmt: skip
    b.launch(_SCAN, (N * H, cdiv(DK, BK), cdiv(DV, BV)), args, constexprs, states)


def _prepass_launch(b, p, k, v, states, pieces: PrepassPieces, *, slope, plan, N, H, T, scale_upd, reverse, skip_final):
    """The pre-pass (a STATE_ONLY walk over (k, v)): the local state of every walk segment, in place in ``states``
    [NSEG, H, DK, DV] (``pieces.split == 1``), or of every piece, into a buffer of its own [N·pieces.count, H, DK,
    DV] that lives until the scan. Returns where the local states are."""
    if pieces.split == 1:
        local = states
    else:
        local = b.alloc((N * pieces.count, *states.shape[1:]), states.dtype)
        plan = SegmentPlan(varlen=0, segmented=True, total=N * pieces.count, per_seq=pieces.count,
                           seg_len=pieces.piece_len)  # fmt: skip
        k = b.narrow(k, 1, pieces.lo, pieces.hi - pieces.lo)
        v = b.narrow(v, 1, pieces.lo, pieces.hi - pieces.lo)
        T = pieces.hi - pieces.lo
        skip_final = False  # a skipped segment's tokens are outside [lo, hi)
    walk_launch(
        b, p, k, k, v, None, slope=slope, h0=None, ht=None, states=local, plan=plan, T=T, H=H, scale_intra=1.0,
        scale_inter=1.0, scale_upd=scale_upd, reverse=reverse, state_only=True, skip_final=skip_final,
    )  # fmt: skip
    return local


def segmented_states(b, p, k, v, *, slope, h0, ht, plan, N, H, T, scale_upd, reverse):
    """Pre-pass + scan: [NSEG, H, DK, DV] incoming states of the walk over (k, v); writes the final state to ht.

    Without ``ht`` the pre-pass skips each sequence's last segment in walk order (its local state only feeds the
    final state): at 2 segments per sequence that halves the pre-pass's reads. On fixed-length batches the pre-pass
    may run on pieces of the segments (``prepass_plan.prepass_pieces``)."""
    states = b.alloc((plan.total, H, k.shape[-1], v.shape[-1]), compute_dtype(k.dtype))
    skip_final = ht is None
    pieces = prepass_pieces(p, plan, skip_final, reverse, (k, v))
    local = _prepass_launch(
        b, p, k, v, states, pieces, slope=slope, plan=plan, N=N, H=H, T=T, scale_upd=scale_upd, reverse=reverse,
        skip_final=skip_final,
    )  # fmt: skip
    _scan_launch(b, states, local, pieces, slope=slope, h0=h0, ht=ht, plan=plan, N=N, H=H, T=T, reverse=reverse)
    return states


def scan_local_states(b, states, *, slope, h0, ht, plan, N, H, T, reverse):
    """The scan alone, in place: ``states`` [NSEG, H, DK, DV] holds every segment's local state (written by a walk with
    :class:`ReverseStates`) and becomes their incoming states; the final state into ``ht``."""
    pieces = PrepassPieces.whole(plan, T)
    _scan_launch(b, states, states, pieces, slope=slope, h0=h0, ht=ht, plan=plan, N=N, H=H, T=T, reverse=reverse)


def _cu_seqlens(b: ProgramBuilder, p: ChunkProblem) -> Ref:
    """The offsets the kernels read (ops/lightning/offsets.py): the host copy's, as a table of the program, when the
    call gave ``cu_seqlens_cpu``; else the call's device ``cu_seqlens``."""
    if p.offsets is None:
        return b.refs["cu_seqlens"]
    if "host_offsets" not in b.refs:
        b.refs["host_offsets"] = b.constant(p.offsets, torch.int32)
    return b.refs["host_offsets"]


def _segment_table(b: ProgramBuilder, plan: SegmentPlan) -> Ref:
    if "seg_table" not in b.refs:
        b.refs["seg_table"] = b.constant(plan.seg_table, torch.int32)
    return b.refs["seg_table"]


def _sequence_segments(b: ProgramBuilder, plan: SegmentPlan) -> Ref:
    if "seq_segs" not in b.refs:
        b.refs["seq_segs"] = b.constant(plan.seq_segs, torch.int32)
    return b.refs["seq_segs"]
