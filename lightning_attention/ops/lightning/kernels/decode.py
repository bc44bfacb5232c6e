"""Triton decode step: one token per sequence, the fp32 state pool read-modify-written in place.

Per sequence b (pool row r = state_indices[b], or b) and head h, with λ = exp(-slope_h) (λ = 1 without slope)::

    S[r, h] = λ · S[r, h] + k[b, h]ᵀ v[b, h]          S is [K, V] float32, updated in place
    o[b, h] = scale · q[b, h] · S[r, h]                 inclusive: the new token is in the state it reads

A padding slot (r = -1) leaves every state row alone and writes a zero output.

Cost model. A step moves B·H·K·V·4 bytes of state in and the same out; q, k, v and o are ~1/K of that. So the
kernel is a streaming pass over the state: every state element is loaded once, updated in registers (one FMA for
the decay and the outer product kᵀv, one FMA for q·S) and stored once. The grid is B·H × V-tiles: each program owns
a [K, BV] slab of one head's state, loads the whole K extent in one go when it fits in registers (all loads of a
program in flight together; a K-loop would serialise load→store rounds) and reduces q·S over K itself, so no
cross-program reduction or atomics are needed. BV shrinks at small batch so that batch 1 × 16 heads still spreads
over the GPU; at batch 64/256 BV = 64 gives 256-byte contiguous rows (wide vector loads).

There is no tl.dot: the update is an outer product and the readout a matrix-vector product, both done on fp32
registers; bf16/fp16 products are exact in fp32, so the only rounding is fp32 accumulation and the final cast of o.

The launcher is registered as ``torch.library.custom_op("lightning_attention::decode_step")`` mutating ``state`` and
``out`` (it returns nothing: an op may not return an alias of its input), with a shape-only fake, so
``torch.compile(fullgraph=True)`` traces through it and ``torch.library.opcheck`` passes. In plain eager mode the
launcher skips the op's dispatcher round trip (see :func:`decode_step_triton`) and, on CUDA, Triton's JIT launch
path too: :class:`LaunchCache` calls the compiled kernel's launcher directly once Triton's own launch has shown,
for the same launch signature (:func:`launch_key`), which compiled kernel it uses and how it calls it; anything
unexpected sends every step back to Triton's launch. Either way a step allocates nothing beyond ``out`` (when not
given), never syncs with the host, and reuses its launch configuration (cached per shape), so a step with ``out=``
can be captured in a CUDA graph.
"""

import contextlib
import functools

import torch
import triton
import triton.language as tl

from lightning_attention.backend import plain_eager
from lightning_attention.ops.lightning.kernels.configs import cdiv, padded_dim
from lightning_attention.ops.lightning.kernels.launch import LaunchCache

# Largest state slab a program keeps in registers: 8192 fp32 values = 32 KB (64 per thread at 4 warps, 32 at 8).
_MAX_TILE = 8192


@triton.jit
def _decode_step_kernel(
    # Pointers
    q,  # [B, H, K] input dtype
    k,  # [B, H, K] input dtype
    v,  # [B, H, V] input dtype
    state,  # [P, H, K, V] float32 (float64 for references), read and written in place
    slope,  # [H] float32, read only if HAS_DECAY
    state_indices,  # [B] int32/int64, read only if HAS_INDICES
    out,  # [B, H, V] input dtype
    # Strides (elements)
    stride_qb,
    stride_qh,
    stride_qk,
    stride_kb,
    stride_kh,
    stride_kk,
    stride_vb,
    stride_vh,
    stride_vv,
    stride_sp,
    stride_sh,
    stride_sk,
    stride_sv,
    stride_ob,
    stride_oh,
    stride_ov,
    scale,
    # Meta-parameters
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,  # K rows per step of the K loop (a power of two >= 16; usually >= K: one step)
    BV: tl.constexpr,  # state columns per program (a power of two >= 16)
    HAS_DECAY: tl.constexpr,
    HAS_INDICES: tl.constexpr,
):
    # One grid axis (up to 2^31 - 1 programs; the others stop at 65535), V tiles fastest: programs that run side by
    # side stream one head's contiguous [K, V] state and share its q and k.
    NV = (V + BV - 1) // BV  # constexpr arithmetic: a compile-time constant
    pid = tl.program_id(0).to(tl.int64)
    i_bh = pid // NV
    i_v = pid % NV
    i_b = i_bh // H
    i_h = i_bh % H
    ACC = state.dtype.element_ty  # float32 (float64 only for references)

    if HAS_INDICES:
        row = tl.load(state_indices + i_b).to(tl.int64)
    else:
        row = i_b
    # A padding slot (-1) masks every state access; the clamp keeps its (never used) addresses inside the pool.
    active = row >= 0
    row = tl.maximum(row, 0)

    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    b_v = tl.load(v + i_b * stride_vb + i_h * stride_vh + o_v * stride_vv, mask=m_v, other=0).to(ACC)
    if HAS_DECAY:
        lam = tl.exp(-tl.load(slope + i_h).to(ACC))

    p_state = state + row * stride_sp + i_h * stride_sh
    b_o = tl.zeros([BV], dtype=ACC)
    # K is a constexpr: for K <= BK this is a single, fully unrolled step.
    for i_k in range(0, tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        b_k = tl.load(k + i_b * stride_kb + i_h * stride_kh + o_k * stride_kk, mask=m_k, other=0).to(ACC)
        b_q = tl.load(q + i_b * stride_qb + i_h * stride_qh + o_k * stride_qk, mask=m_k, other=0).to(ACC)
        p_s = p_state + o_k[:, None] * stride_sk + o_v[None, :] * stride_sv
        m_s = (m_k[:, None] & m_v[None, :]) & active
        b_s = tl.load(p_s, mask=m_s, other=0)
        if HAS_DECAY:
            b_s = b_s * lam
        b_s += b_k[:, None] * b_v[None, :]
        tl.store(p_s, b_s, mask=m_s)
        # Rows past K and a padding slot's slab are zero (masked loads, zero k), so they add nothing.
        b_o += tl.sum(b_q[:, None] * b_s, axis=0)

    b_o = tl.where(active, b_o * scale, 0.0)
    tl.store(out + i_b * stride_ob + i_h * stride_oh + o_v * stride_ov, b_o.to(out.dtype.element_ty), mask=m_v)


@functools.lru_cache(maxsize=None)
def _num_sms(device_index: int | None) -> int:
    """Streaming multiprocessors of a CUDA device; 1 under the CPU interpreter (fewest, largest programs)."""
    if device_index is None:
        return 1
    return torch.cuda.get_device_properties(device_index).multi_processor_count


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


def runtime_args(q, k, v, state, slope, scale, state_indices, out) -> tuple:
    """The kernel's run-time arguments in signature order: 7 pointers, 16 strides, ``scale`` (constexprs follow).

    Unused pointer arguments get a real tensor (q) so the launcher sees a valid pointer; the kernel never reads it.
    """
    return (
        q,
        k,
        v,
        state,
        q if slope is None else slope,
        q if state_indices is None else state_indices,
        out,
        *q.stride(),
        *k.stride(),
        *v.stride(),
        *state.stride(),
        *out.stride(),
        scale,
    )


def constexpr_args(q, v, slope, state_indices, block_k: int, block_v: int) -> tuple:
    """The constexpr tail of the signature: ``(H, K, V, BK, BV, HAS_DECAY, HAS_INDICES)``."""
    _, H, K = q.shape
    return (H, K, v.shape[-1], block_k, block_v, slope is not None, state_indices is not None)


def _grid(q, v, block_v: int) -> tuple[int]:
    B, H, _ = q.shape
    return (B * H * cdiv(v.shape[-1], block_v),)


def launch_decode_step(q, k, v, state, slope, scale, state_indices, out, *, block_k, block_v, num_warps):
    """Launches the kernel through Triton's normal path (``JITFunction.run``) with explicit tiles.

    Shapes as :func:`decode_step_triton`; ``out`` ``[B, H, V]`` is required. Tests use it to cover K loops and
    ragged V tiles. Returns what ``kernel[grid](...)`` returns (the compiled kernel on a GPU).
    """
    args = runtime_args(q, k, v, state, slope, scale, state_indices, out)
    args += constexpr_args(q, v, slope, state_indices, block_k, block_v)
    return _decode_step_kernel[_grid(q, v, block_v)](*args, num_warps=num_warps)


def _decode_step_impl(q, k, v, state, slope, scale, state_indices, out) -> None:
    """Picks the cached launch configuration for this shape and launches through Triton (the body of the op)."""
    B, H, K = q.shape
    device_index = q.device.index if q.is_cuda else None
    block_k, block_v, num_warps = launch_config(B * H, K, v.shape[-1], _num_sms(device_index))
    # Triton launches on the current device and its current stream: switch to q's device when it is another one.
    other_device = q.is_cuda and device_index != torch.cuda.current_device()
    with torch.cuda.device(q.device) if other_device else contextlib.nullcontext():
        launch_decode_step(
            q, k, v, state, slope, scale, state_indices, out, block_k=block_k, block_v=block_v, num_warps=num_warps
        )


@torch.library.custom_op("lightning_attention::decode_step", mutates_args=("state", "out"))
def decode_step_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    state: torch.Tensor,
    slope: torch.Tensor | None,
    scale: float,
    state_indices: torch.Tensor | None,
    out: torch.Tensor,
) -> None:
    """The decode step as a PyTorch operator: updates ``state`` ``[P, H, K, V]`` and writes ``out`` ``[B, H, V]``.

    q, k ``[B, H, K]``, v ``[B, H, V]``, slope ``[H]`` or None, state_indices ``[B]`` or None (P == B).
    """
    _decode_step_impl(q, k, v, state, slope, scale, state_indices, out)


@decode_step_op.register_fake
def _decode_step_fake(q, k, v, state, slope, scale, state_indices, out) -> None:
    # Everything the op produces is written into its mutated arguments, whose metadata does not change.
    return None


# Eager launch fast path: the compiled kernel launched without JITFunction.run (see kernels/launch.py).


def launch_key(device: int, q, v, slope, state_indices, args: tuple) -> tuple:
    """What selects the compiled kernel and the launch configuration of one step (``args`` from :func:`runtime_args`).

    Finer than Triton's own specialisation key, never coarser: the device; q's shape ``[B, H, K]`` and v's
    ``[B, H, V]`` (grid, tiles, num_warps and the constexprs follow from them and the device); whether slope and
    state_indices are given; the dtype and the 16-byte alignment of each of the 7 pointers Triton specialises on;
    the raw values of the 16 integer strides (Triton only looks at ``== 1``, ``% 16 == 0`` and the int32 range).
    ``scale`` is not in it: a Python float is never specialised (the caller only comes here with a float).
    """
    p0, p1, p2, p3, p4, p5, p6 = args[:7]
    return (
        device,
        q.shape,
        v.shape,
        slope is None,
        state_indices is None,
        p0.dtype,
        p1.dtype,
        p2.dtype,
        p3.dtype,
        p4.dtype,
        p5.dtype,
        p6.dtype,
        not p0.data_ptr() & 15,
        not p1.data_ptr() & 15,
        not p2.data_ptr() & 15,
        not p3.data_ptr() & 15,
        not p4.data_ptr() & 15,
        not p5.data_ptr() & 15,
        not p6.data_ptr() & 15,
        args[7:23],
    )


# Host cost of the fast path, measured on CPU (Python 3.11, torch 2.13, triton 3.8, 2-core Xeon VM; B = 1 and 8,
# H = 16, K = V = 128, launcher mocked out): runtime_args + launch_key 2.0 µs, device_for 0.3 µs, launch 0.3 µs, the
# whole eager wrapper (decode_step_triton) 4.6 µs; on a GPU the launcher's own C call and cuLaunchKernel come on top
_LAUNCH_CACHE = LaunchCache(_decode_step_kernel, name="lightning_attn_decode")


def _launch_eager(q, k, v, state, slope, scale, state_indices, out) -> None:
    """One step in plain eager mode: the verified direct launch when :class:`LaunchCache` allows, else Triton's."""
    cache = _LAUNCH_CACHE
    device = cache.device_for(q, scale)
    if device is None:
        _decode_step_impl(q, k, v, state, slope, scale, state_indices, out)
        return
    args = runtime_args(q, k, v, state, slope, scale, state_indices, out)
    key = launch_key(device, q, v, slope, state_indices, args)
    entry = cache.entries.get(key)
    if entry is None:
        B, H, K = q.shape
        block_k, block_v, num_warps = launch_config(B * H, K, v.shape[-1], _num_sms(device))
        meta = constexpr_args(q, v, slope, state_indices, block_k, block_v)
        entry = cache.add(key, _grid(q, v, block_v), {"num_warps": num_warps}, meta)
    cache.launch(entry, args + entry.meta, device)


def decode_step_triton(q, k, v, state, slope, scale, state_indices, out):
    """Triton decode step behind :func:`lightning_attention.lightning_attn_decode` (inputs already validated).

    Args:
        q, k: ``[B, H, K]``; v: ``[B, H, V]`` (float16 / bfloat16 / float32; strided views are used as they are).
        state: ``[P, H, K, V]`` float32 pool, updated in place (rows not named by ``state_indices`` untouched).
        slope: ``[H]`` float32 (λ = exp(-slope)) or ``None`` (no decay).
        scale: Python float.
        state_indices: ``[B]`` int32/int64 pool row per sequence, ``-1`` = padding slot; ``None``: row b.
        out: ``[B, H, V]`` in q.dtype or ``None`` (then allocated: the only allocation of a step).

    Returns:
        o ``[B, H, V]`` in q.dtype (``out`` itself when given).

    Under torch.compile, a dispatch mode (fake tensors, opcheck, flop counters) or a torch-function mode this goes
    through the registered op ``torch.ops.lightning_attention.decode_step``; in plain eager it launches directly
    (:class:`LaunchCache`: the compiled kernel's launcher, once verified, on the current stream) and bumps the
    version counters of ``state`` and ``out`` as the op would (autograd sees the in-place write).
    """
    # The kernel reads slope[h] and state_indices[b] at unit stride; a strided view of these tiny vectors is copied.
    if slope is not None and slope.stride(0) != 1:
        slope = slope.contiguous()
    if state_indices is not None and state_indices.stride(0) != 1:
        state_indices = state_indices.contiguous()
    if out is None:
        out = torch.empty(q.shape[0], q.shape[1], v.shape[-1], device=q.device, dtype=q.dtype)
    if plain_eager():
        _launch_eager(q, k, v, state, slope, scale, state_indices, out)
        torch.autograd.graph.increment_version(state)
        torch.autograd.graph.increment_version(out)
    else:
        decode_step_op(q, k, v, state, slope, scale, state_indices, out)
    return out
