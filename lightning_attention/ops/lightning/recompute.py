"""SRAM-bounded, recompute-heavy backward of Lightning Attention (the "Lightning-3" backward, with decay).

Selected by ``lightning_attn(..., backward="recompute")``, and by ``"auto"`` on GPUs with under 128 KB of shared
memory per block (``plan.use_recompute_backward``). Only the inputs q, k, v (and h0) are saved by the forward; this
backward recomputes every intermediate, and its working set is one d×d state slice plus ``[CBLOCK, d]`` and
``[CBLOCK, CBLOCK]`` tiles, whatever T is.

Derivation (docs/design.md, "Semantics"; λ = exp(-slope), S₋₁ = h0)::

    S_t = λ S_{t-1} + k_tᵀ v_t,   o_t = scale · q_t S_t,   final = S_{T-1}
    L   = Σ_t o_t · do_t + final · dht

Let G_t = ∂L/∂S_t (total, through every later state). S_t reaches L through o_t and through S_{t+1}, so
G_t = scale · q_tᵀ do_t + λ G_{t+1}, with G_{T-1} = scale · q_{T-1}ᵀ do_{T-1} + dht. Then

    dq_t = scale · do_t S_tᵀ,    dk_t = v_t G_tᵀ,    dv_t = k_t G_t,    dh0 = λ G_0.

In micro-chunks of L ≤ CBLOCK tokens (local positions i, j; S_prev the state before the chunk, R = λ G at the
chunk's right edge, R = dht at the end of the sequence), the token sums split into the diagonal block and the
carried state::

    dq_i = scale · [ Σ_{j≤i} λ^(i-j) (do_i·v_j) k_j + λ^(i+1) do_i S_prevᵀ ]
    dk_j = scale · Σ_{i≥j} λ^(i-j) (v_j·do_i) q_i + λ^(L-1-j) v_j Rᵀ
    dv_j = scale · Σ_{i≥j} λ^(i-j) (k_j·q_i) do_i + λ^(L-1-j) k_j R
    S ← λ^L S + Σ_j λ^(L-1-j) k_jᵀ v_j                   (forward sweep, after dq of the chunk)
    R ← λ^L R + scale · Σ_i λ^(i+1) q_iᵀ do_i            (reverse sweep, after dk, dv of the chunk); dh0 = R at the end

The chunk's own K V / Q dO product enters the state *after* the chunk's inter term (no double count), dk is
``V Rᵀ`` (not ``R Vᵀ``), dq has its inter term, and decay is everywhere.

Kernel (:mod:`lightning_attention.ops.lightning.kernels.recompute`): one launch running three sequential sweeps side
by side, with disjoint outputs, so no atomics and no partial sums: dq (forward, tiles K, state ``[V, BK]``), dk
(reverse, tiles K, ``[V, BK]``) and dv + dh0 (reverse, tiles V, ``[K, BV]``). Its FLOPs, bytes, shared memory and
measured speed against the chunk backward: docs/kernels.md, "The recompute backward".
"""

from dataclasses import dataclass

import torch
import triton.language as tl

from lightning_attention.ops.lightning.kernels.configs import cdiv, padded_dim
from lightning_attention.ops.lightning.kernels.recompute import recompute_bwd_kernel
from lightning_attention.ops.lightning.launch import Launcher
from lightning_attention.ops.lightning.library import last_dim_contiguous, on_device_of, pointers, token_strides
from lightning_attention.ops.lightning.naive import compute_dtype
from lightning_attention.ops.lightning.offsets import offsets_for
from lightning_attention.ops.lightning.plan import FP32_PRECISION

# Register budget of one program's carried state: 8192 fp32 values = 64 registers per thread at 4 warps,
# leaving room for the [CBLOCK, d] operand tiles (d <= 256) without spilling.
STATE_ELEMENTS = 8192


@dataclass(frozen=True)
class RecomputeConfig:
    """Tile sizes and launch options of the recompute kernel (three sweeps) for one (K, V) shape class.

    ``BT``: micro-chunk (CBLOCK) tokens; ``BK``: K tile of the dq/dk sweeps (their state is ``[V_pad, BK]``);
    ``BV``: V tile of the dv sweep (state ``[K_pad, BV]``); ``K_pad``/``V_pad``: head dims padded to a power of two.
    """

    BT: int
    BK: int
    BV: int
    K_pad: int
    V_pad: int
    num_warps: int
    num_stages: int


def recompute_config(K: int, V: int, dtype: torch.dtype) -> RecomputeConfig:
    """The configuration the launcher uses for head dims K, V (any 1..256; K ≠ V allowed).

    No autotuning (cold start stays at one compile per shape class and dtype). The smem test and
    ``benchmarks/recompute_smem_table.py`` compile exactly these.
    """
    K_pad = padded_dim(K)
    V_pad = padded_dim(V)
    BK = min(K_pad, max(16, STATE_ELEMENTS // V_pad))
    BV = min(V_pad, max(16, STATE_ELEMENTS // K_pad))
    # Two pipeline stages double the buffered [BT, d] loads: with 4-byte operands at d = 256 that is 104 KB, over
    # the 99 KB of sm_86/89/120 (measured), so fp32 (not the fast path anyway) runs unpipelined.
    num_stages = 1 if dtype in (torch.float32, torch.float64) else 2
    return RecomputeConfig(BT=32, BK=BK, BV=BV, K_pad=K_pad, V_pad=V_pad, num_warps=4, num_stages=num_stages)


def kernel_dtypes(dtype: torch.dtype) -> dict:
    """Accumulator, state-operand and fp32-dot precision constexprs for inputs of ``dtype``.

    bf16: the state operand is rounded to bf16 (same exponent range as fp32). fp16: the state stays fp32 (it can
    exceed 65504 on long sequences without decay) and its dot runs as tf32 (10-bit mantissa, like fp16). fp32: the
    walks' fp32 products (``plan.FP32_PRECISION``). fp64 (interpreter only, for gradcheck): everything fp64.
    """
    if dtype == torch.bfloat16:
        return {"ACC": tl.float32, "STATE_OP": tl.bfloat16, "DOT_PRECISION": "ieee"}
    if dtype == torch.float16:
        return {"ACC": tl.float32, "STATE_OP": tl.float32, "DOT_PRECISION": "tf32"}
    if dtype == torch.float32:
        return {"ACC": tl.float32, "STATE_OP": tl.float32, "DOT_PRECISION": FP32_PRECISION}
    if dtype == torch.float64:
        return {"ACC": tl.float64, "STATE_OP": tl.float64, "DOT_PRECISION": "ieee"}
    raise TypeError(f"q must be float16, bfloat16 or float32, got {dtype}")


def recompute_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    do: torch.Tensor,
    dht: torch.Tensor | None,
    slope: torch.Tensor | None,
    *,
    scale: float,
    initial_state: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
    cu_seqlens_cpu: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Gradients of ``L = (o · do).sum() + (final_state · dht).sum()`` by the recompute-heavy backward.

    Args:
        q, k: ``[B, T, H, K]``; v, do: ``[B, T, H, V]``; one dtype (float16 / bfloat16 / float32; float64 only
            under the Triton interpreter). Strided views are fine when ``stride(-1) == 1``.
        dht: ``[N, H, K, V]`` gradient of the final state (float32), or ``None`` (zero).
        slope: ``[H]`` float32 (λ = exp(-slope)) or ``None`` (no decay).
        scale: the forward's output scale.
        initial_state: ``[N, H, K, V]`` float32 h0 of the forward, or ``None`` (zeros; then no dh0).
        cu_seqlens: ``[N + 1]`` int32/int64 offsets of packed sequences (B == 1), or ``None`` (N = B).
        cu_seqlens_cpu: optional host copy of ``cu_seqlens``; when given, the kernels read its offsets (a device copy
            kept per distinct offsets: ops/lightning/offsets.py), as the forward does.

    Returns:
        ``(dq [B, T, H, K], dk [B, T, H, K], dv [B, T, H, V])`` in the input dtype (contiguous) and
        ``dh0 [N, H, K, V]`` in initial_state's dtype (float32), or ``None`` when ``initial_state`` is None.
    """
    cu_seqlens = offsets_for(cu_seqlens, cu_seqlens_cpu, q.device)
    B, T, H, K = q.shape
    V = v.shape[-1]
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    if do.shape != v.shape:
        raise ValueError(f"do must have the shape of v {tuple(v.shape)}, got {tuple(do.shape)}")
    if dht is not None and tuple(dht.shape) != (N, H, K, V):
        raise ValueError(f"dht must have shape [N, H, K, V] = {(N, H, K, V)}, got {tuple(dht.shape)}")
    if q.dtype == torch.float64 and q.is_cuda:
        raise TypeError("float64 runs only on the PyTorch path or under the Triton interpreter")
    dtypes = kernel_dtypes(q.dtype)
    sdt = compute_dtype(q.dtype)

    q, k, v, do = (last_dim_contiguous(x) for x in (q, k, v, do))
    if do.dtype != q.dtype:  # autocast / mixed-precision callers can hand back a gradient in another dtype
        do = do.to(q.dtype)
    if slope is not None:  # read by the kernels as slope[h]
        slope = slope.to(sdt).contiguous()
    if dht is not None:
        dht = dht.to(sdt).contiguous()
    h0 = None if initial_state is None else initial_state.to(sdt).contiguous()

    dq = torch.empty(B, T, H, K, dtype=q.dtype, device=q.device)
    dk = torch.empty(B, T, H, K, dtype=q.dtype, device=q.device)
    dv = torch.empty(B, T, H, V, dtype=q.dtype, device=q.device)
    dh0 = None if initial_state is None else torch.empty(N, H, K, V, dtype=initial_state.dtype, device=q.device)
    if T == 0 or N * H == 0:  # no token: the final state is h0, so dh0 = dht
        if dh0 is not None:
            dh0 = dht.to(dh0.dtype).clone() if dht is not None else torch.zeros_like(dh0)
        return dq, dk, dv, dh0

    cfg = recompute_config(K, V, q.dtype)
    # N·H on axis 0 (up to 2^31 - 1 programs; axis 1 stops at 65,535); axis 1: dq, dk (K tiles) and dv (V tiles)
    grid = (N * H, 2 * cdiv(K, cfg.BK) + cdiv(V, cfg.BV))
    args = (
        q, k, v, do, *pointers(q, h0, dht, slope, cu_seqlens), dq, dk, dv, *pointers(q, dh0),
        T, H, *token_strides(q, k, v, do), float(scale),
    )  # fmt: skip
    constexprs = dict(
        K=K, V=V, BT=cfg.BT, BK=cfg.BK, BV=cfg.BV, K_PAD=cfg.K_pad, V_PAD=cfg.V_pad,
        USE_INITIAL_STATE=h0 is not None, USE_FINAL_STATE_GRADIENT=dht is not None,
        HAS_DECAY=slope is not None, IS_VARLEN=cu_seqlens is not None,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **dtypes,
    )  # fmt: skip
    with on_device_of(q):
        _LAUNCHER(grid, args, constexprs, q)
    return dq, dk, dv, dh0


_LAUNCHER = Launcher(recompute_bwd_kernel, "lightning_attn recompute backward")
