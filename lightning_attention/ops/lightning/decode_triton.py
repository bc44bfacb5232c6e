"""The Triton decode step behind :func:`lightning_attention.lightning_attn_decode`: launch configuration and operator.

The step is registered as ``torch.library.custom_op("lightning_attention::decode_step")`` mutating ``state`` and
``out`` (it returns nothing: an operator may not return an alias of its input), with a shape-only fake, so
``torch.compile(fullgraph=True)`` traces through it and ``torch.library.opcheck`` passes. In plain eager mode the
operator's dispatcher round trip is skipped and the kernel is launched through the library's
:class:`~lightning_attention.ops.lightning.launch.Launcher` (its compiled launcher called directly once verified).
Either way a step allocates nothing beyond ``out`` (when not given), never syncs with the host, and reuses its
launch configuration (cached per shape), so a step with ``out=`` can be captured in a CUDA graph.
"""

import functools

import torch

from lightning_attention.backend import plain_eager
from lightning_attention.ops.lightning.device import INTERPRETER, cuda_device_info
from lightning_attention.ops.lightning.interpreter import require_interpreter
from lightning_attention.ops.lightning.kernels.configs import cdiv, padded_dim
from lightning_attention.ops.lightning.kernels.decode import decode_step_kernel
from lightning_attention.ops.lightning.launch import Launcher
from lightning_attention.ops.lightning.library import TritonOp

# Largest state slab a program keeps in registers: 8192 fp32 values = 32 KB (64 per thread at 4 warps, 32 at 8).
_MAX_TILE = 8192


@functools.lru_cache(maxsize=None)
def launch_config(num_programs_bh: int, head_k: int, head_v: int, num_sms: int) -> tuple[int, int, int]:
    """Tile sizes ``(BK, BV, num_warps)`` for ``num_programs_bh`` = B·H (sequence, head) pairs.

    BV: 64 (256-byte rows) unless B·H is too small to give every SM two programs, then down to 16.
    BK: the whole (power-of-two padded) K when a [BK, BV] fp32 slab fits in :data:`_MAX_TILE`, else a K loop.
    """
    bv = min(64, padded_dim(head_v))
    while bv > 16 and num_programs_bh * cdiv(head_v, bv) < 2 * num_sms:
        bv //= 2
    bk = min(padded_dim(head_k), max(16, _MAX_TILE // bv))
    num_warps = 8 if bk * bv >= _MAX_TILE else 4
    return bk, bv, num_warps


@functools.lru_cache(maxsize=1024)
def _launch(B: int, H: int, K: int, V: int, has_slope: bool, has_indices: bool, device_index: int,
            tiles: tuple[int, int, int] | None = None) -> tuple[tuple[int], dict]:  # fmt: skip
    """(grid, constexprs) of a step on CUDA device ``device_index`` (-1: the interpreter): ``tiles`` (BK, BV,
    num_warps), or :func:`launch_config`'s for this shape and the device's SM count."""
    num_sms = (INTERPRETER if device_index < 0 else cuda_device_info(device_index)).sm_count
    block_k, block_v, num_warps = tiles or launch_config(B * H, K, V, num_sms)
    constexprs = dict(
        H=H, K=K, V=V, BK=block_k, BV=block_v, HAS_DECAY=has_slope, HAS_INDICES=has_indices, num_warps=num_warps
    )
    return (B * H * cdiv(V, block_v),), constexprs


_LAUNCHER = Launcher(decode_step_kernel, "lightning_attn_decode")


def _pointers(q, k, v, state, slope, state_indices, out) -> tuple:
    """The kernel's 7 pointer arguments: an absent slope or state_indices gets q, never read (library.pointers,
    spelled out: this is on every step)."""
    return q, k, v, state, q if slope is None else slope, q if state_indices is None else state_indices, out


def _strides(q, k, v, state, out) -> tuple:
    """The kernel's 16 stride arguments, after its pointers (then ``scale`` and the pool's row count P)."""
    return (*q.stride(), *k.stride(), *v.stride(), *state.stride(), *out.stride())


def launch_decode_step(q, k, v, state, slope, scale, state_indices, out, tiles=None) -> None:
    """Launches the kernel (inputs validated; ``out`` ``[B, H, V]`` given). ``tiles`` (BK, BV, num_warps) override
    the launch configuration (tests cover K loops and ragged V tiles with it).

    The kernel's run-time arguments: 7 pointers (:func:`_pointers`), 16 strides (:func:`_strides`), ``scale`` and the
    pool's row count P; the constexprs follow from the shapes.
    """
    B, H, K = q.shape
    # q.get_device(): -1 for a CPU tensor (the interpreter)
    grid, constexprs = _launch(B, H, K, v.shape[-1], slope is not None, state_indices is not None, q.get_device(),
                               tiles)  # fmt: skip
    args = (*_pointers(q, k, v, state, slope, state_indices, out), *_strides(q, k, v, state, out))
    _LAUNCHER(grid, (*args, scale, state.shape[0]), constexprs, q)


class _StructureLaunch:
    """What a structure of decode calls (a :class:`~lightning_attention.ops.lightning.decode_validation.
    PassedStructure`) fixes of the step's launch: grid, constexprs, the 16 strides and the pool's row count; and the
    launcher's bound launches (:meth:`Launcher.bind`) per ``(scale, alignment of the 7 pointers)``, the rest of
    the launcher's exact key. A repeated step then costs its pointers, one look-up and the compiled launcher's call
    (docs/kernels.md, "Host overhead")."""

    __slots__ = ("bound", "constexprs", "grid", "launcher", "rows", "strides")

    def __init__(self, q, k, v, state, slope, state_indices, out):
        B, H, K = q.shape
        self.grid, self.constexprs = _launch(
            B, H, K, v.shape[-1], slope is not None, state_indices is not None, q.get_device()
        )
        self.strides = _strides(q, k, v, state, out)
        self.rows, self.launcher, self.bound = state.shape[0], _LAUNCHER, {}

    def __call__(self, q, k, v, state, slope, scale, state_indices, out) -> None:
        tensors = _pointers(q, k, v, state, slope, state_indices, out)
        a, b, c, d, e, f, g = addresses = (
            q.data_ptr(), k.data_ptr(), v.data_ptr(), state.data_ptr(), tensors[4].data_ptr(),
            tensors[5].data_ptr(), out.data_ptr(),
        )  # fmt: skip
        # Triton specialises on each pointer's 16-byte alignment: all aligned is the common key
        key = (scale, True if not (a | b | c | d | e | f | g) & 15 else tuple(x & 15 for x in addresses))
        bound = self.bound.get(key)
        if bound is not None:
            if bound((*(addresses if bound.pointers else tensors), *self.strides, scale, self.rows), q):
                return
            del self.bound[key]  # declined (a reset, a hook, another device): launched in full and bound again below
        args = (*tensors, *self.strides, scale, self.rows)
        self.launcher(self.grid, args, self.constexprs, q)
        bound = self.launcher.bind(self.grid, args, self.constexprs, q)
        if bound is not None:
            if len(self.bound) >= 64:
                self.bound.clear()
            self.bound[key] = bound


# PassedStructure -> its _StructureLaunch (bounded like the structures' own memo)
_STRUCTURE_LAUNCHES: dict = {}


def _launch_structured(structure, q, k, v, state, slope, scale, state_indices, out) -> None:
    """:func:`launch_decode_step` for a call whose structure passed the checks, with what the structure fixes kept."""
    launch = _STRUCTURE_LAUNCHES.get(structure)
    if launch is None or launch.launcher is not _LAUNCHER:  # new, or the launcher was replaced (tests)
        if len(_STRUCTURE_LAUNCHES) >= 1024:
            _STRUCTURE_LAUNCHES.clear()
        launch = _STRUCTURE_LAUNCHES[structure] = _StructureLaunch(q, k, v, state, slope, state_indices, out)
    launch(q, k, v, state, slope, scale, state_indices, out)


def _decode_step_fake(q, k, v, state, slope, scale, state_indices, out) -> None:
    # Everything the operator produces is written into its mutated arguments, whose metadata does not change.
    return None


# q, k [B, H, K], v [B, H, V], slope [H] or None, state_indices [B] or None (P == B); updates state [P, H, K, V]
# and writes out [B, H, V] (the operator returns nothing: it may not return an alias of its input).
decode_step_op = TritonOp(
    "decode_step", launch_decode_step, _decode_step_fake, mutates_args=("state", "out"),
    schema="(Tensor q, Tensor k, Tensor v, Tensor(a!) state, Tensor? slope, float scale, Tensor? state_indices, "
    "Tensor(b!) out) -> ()",
)  # fmt: skip


def decode_step_triton(q, k, v, state, slope, scale, state_indices, out, structure=None):
    """Triton decode step behind :func:`lightning_attention.lightning_attn_decode` (inputs already validated).

    Args:
        q, k: ``[B, H, K]``; v: ``[B, H, V]`` (float16 / bfloat16 / float32; strided views are used as they are).
        state: ``[P, H, K, V]`` float32 pool, updated in place (rows not named by ``state_indices`` untouched).
        slope: ``[H]`` float32 (λ = exp(-slope)) or ``None`` (no decay).
        scale: Python float.
        state_indices: ``[B]`` int32/int64 pool row per sequence, ``-1`` = padding slot; ``None``: row b.
        out: ``[B, H, V]`` in q.dtype or ``None`` (then allocated: the only allocation of a step).
        structure: the :class:`~lightning_attention.ops.lightning.decode_validation.PassedStructure` the inputs
            passed the checks as, or ``None``; with it, a plain eager step reuses what its structure fixes of the
            launch.

    Returns:
        o ``[B, H, V]`` in q.dtype (``out`` itself when given).

    In plain eager mode the launch bumps the version counters of ``state`` and ``out`` as the operator would
    (autograd sees the in-place write).
    """
    if not q.is_cuda:  # CPU tensors need Triton's interpreter (a clear error otherwise)
        require_interpreter()
    # The kernel reads slope[h] and state_indices[b] at unit stride; a strided view of these tiny vectors is copied.
    if slope is not None and slope.stride(0) != 1:
        slope = slope.contiguous()
    if state_indices is not None and state_indices.stride(0) != 1:
        state_indices = state_indices.contiguous()
    if out is None:
        out = torch.empty(q.shape[0], q.shape[1], v.shape[-1], device=q.device, dtype=q.dtype)
    if plain_eager():  # the launcher switches to q's device itself when it is not the current one
        if structure is None:
            launch_decode_step(q, k, v, state, slope, scale, state_indices, out)
        else:
            _launch_structured(structure, q, k, v, state, slope, scale, state_indices, out)
        torch.autograd.graph.increment_version(state)
        torch.autograd.graph.increment_version(out)
    else:
        decode_step_op.op(q, k, v, state, slope, scale, state_indices, out)
    return out
