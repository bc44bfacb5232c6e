"""SRAM-bounded, recompute-heavy backward of Lightning Attention ("Lightning-3", seed 003, with decay).

Selected by ``lightning_attn(..., backward="recompute")``, and by ``"auto"`` on GPUs with under 128 KB of shared
memory per block (the rule lives in :mod:`lightning_attention.ops.lightning.chunk`). Only the inputs q, k, v (and
h0) are saved by the forward; this backward recomputes every intermediate, and its working set is one d×d state
slice plus ``[CBLOCK, d]`` and ``[CBLOCK, CBLOCK]`` tiles, whatever T is.

Derivation (DESIGN §1 semantics; λ = exp(-slope), S₋₁ = h0)::

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

This corrects the seed's pseudo-code: the chunk's own K V / Q dO product enters the state *after* the chunk's
inter term (no double count), dk is ``V Rᵀ`` (not ``R Vᵀ``), dq has its inter term, and decay is everywhere.

Kernel (:mod:`lightning_attention.ops.lightning.kernels.recompute`): one launch running three sequential sweeps
side by side, with disjoint outputs, so no atomics and no partial sums: dq (forward, tiles K, state ``[V, BK]``),
dk (reverse, tiles K, ``[V, BK]``) and dv + dh0 (reverse, tiles V, ``[K, BV]``).

Trade-off against the chunk backward (per token and head, K = V = d, micro-chunk C, NK = d/BK and NV = d/BV
programs per head; numbers for grid (a): d = 128, C = 32, BK = BV = 64 so NK = NV = 2, bf16):

- FLOPs: each sweep rebuilds its state (2d² per token) and applies it (2d²), 12d² in all; the diagonal blocks add
  NK·2Cd (dA recomputed once per K tile) + 2Cd for each of dq and dk, and NV·2Cd + 2Cd for dv:
  12d² + (2NK + NV + 3)·2Cd = 196.6 K + 73.7 K ≈ 270 KFLOP per token-head at d = 128, i.e. 2.75× the forward's
  98 KFLOP (notes/kernel-design.md) and 1.1–1.4× a chunk backward (≈ 2–2.5× the forward): the state is rebuilt
  three times (S once, R twice) instead of being stored once and read back.
- HBM bytes: dq reads k once and v, do NK times; dk reads q once and v, do NK times; dv reads q, k NV times and do
  once; each writes its gradient: 2NK + 2NV + 6 = 14 tensor passes (3.5 KB per token-head in bf16 at d = 128)
  against the floor of 7 (q, k, v, do in; dq, dk, dv out), 12 if the re-reads hit L2 (likely only while all
  programs are resident). ≈ 75 FLOP/byte: memory-bound on an H100 (ridge ≈ 295) once enough programs run.
- Workspace: none. No state ever goes to HBM; only dq, dk, dv and dh0 are allocated.
- Parallelism: (2NK + NV)·N·H programs in one launch, each sequential over T / C micro-chunks. With N·H ≥ 2–4×
  the SM count the kernel is bandwidth-bound, floor ≈ 14/7 = 2× the chunk backward's; at batch 1 and long T
  (grid (a) at T = 64K: 96 programs on 132 SMs, each walking 2048 micro-chunks) it is latency-bound, and the
  chunk backward, parallel over chunks, is faster wherever its shared memory fits.
- Shared memory, the point of this path: bounded by the ``[C, d]`` operand tiles and a d×d state slice capped at
  8192 values, independent of T: at most 69,632 B per block (fp32 with a head dim of 256), at most 36,864 B for
  fp16/bf16 (51,200 B on sm_90), so it runs on every GPU class (sm_86/89/120: 101,376 B). Measured for
  sm_80/86/89/90/120 by compiling ahead of time (``tests/ops/test_recompute_smem.py``,
  ``benchmarks/recompute_smem_table.py``; tables for triton 3.8.0 and 3.6.0 in ``benchmarks/results/``).

Measured on an H100 (2026-11-22, ``benchmarks/results/h100-2026-11-22/``; bf16, H = 16, d = 128, 65,536 tokens per
call), fwd+bwd ms, recompute vs chunk backward (same forward): T = 2K 2.89 vs 2.42 (recompute 19% slower), T = 8K
3.16 vs 3.62 (13% faster: the chunk path's segment pre-passes cost more than the recompute there), T = 32K 3.83 vs
3.78 (level); batch 1, T = 128K: 10.21 vs 9.23 (11% slower). Workspace: 0 vs 1.8–6.3% of one input tensor. So on an
H100 the price of the SRAM bound is within ±20% either way; ``"auto"`` keeps the chunk backward there.
"""

import contextlib
from dataclasses import dataclass

import torch
import triton.language as tl

from lightning_attention.ops.lightning.chunk import backward_outputs_fake, last_dim_contiguous
from lightning_attention.ops.lightning.kernels.configs import cdiv, padded_dim
from lightning_attention.ops.lightning.kernels.recompute import recompute_bwd_kernel
from lightning_attention.ops.lightning.naive import compute_dtype

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
    exceed 65504 on long sequences without decay) and its dot runs as tf32 (10-bit mantissa, like fp16). fp32:
    exact ("ieee") dots. fp64 (interpreter only, for gradcheck): everything fp64.
    """
    if dtype == torch.bfloat16:
        return {"ACC": tl.float32, "STATE_OP": tl.bfloat16, "DOT_PRECISION": "ieee"}
    if dtype == torch.float16:
        return {"ACC": tl.float32, "STATE_OP": tl.float32, "DOT_PRECISION": "tf32"}
    if dtype == torch.float32:
        return {"ACC": tl.float32, "STATE_OP": tl.float32, "DOT_PRECISION": "ieee"}
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
        cu_seqlens_cpu: accepted for the signature shared with the chunk backward; not needed here (the grid depends
            only on N, and the kernels read the offsets on the device).

    Returns:
        ``(dq [B, T, H, K], dk [B, T, H, K], dv [B, T, H, V])`` in the input dtype (contiguous) and
        ``dh0 [N, H, K, V]`` in initial_state's dtype (float32), or ``None`` when ``initial_state`` is None.
    """
    del cu_seqlens_cpu
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
    state_dtype = compute_dtype(q.dtype)

    q, k, v, do = (last_dim_contiguous(x) for x in (q, k, v, do))
    if do.dtype != q.dtype:  # autocast / mixed-precision callers can hand back a gradient in another dtype
        do = do.to(q.dtype)
    if slope is not None:  # read by the kernels as slope[h]
        slope = slope.to(state_dtype).contiguous()
    if dht is not None:
        dht = dht.to(state_dtype).contiguous()
    h0 = None if initial_state is None else initial_state.to(state_dtype).contiguous()

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
    with torch.cuda.device(q.device) if q.is_cuda else contextlib.nullcontext():
        recompute_bwd_kernel[grid](
            q, k, v, do, h0, dht, slope, cu_seqlens, dq, dk, dv, dh0, T, H,
            *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3], float(scale),
            K=K, V=V, BT=cfg.BT, BK=cfg.BK, BV=cfg.BV, K_PAD=cfg.K_pad, V_PAD=cfg.V_pad,
            USE_INITIAL_STATE=h0 is not None, USE_FINAL_STATE_GRADIENT=dht is not None,
            HAS_DECAY=slope is not None, IS_VARLEN=cu_seqlens is not None,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages, **dtypes,
        )  # fmt: skip
    return dq, dk, dv, dh0


@torch.library.custom_op("lightning_attention::recompute_bwd", mutates_args=())
def recompute_bwd_op(
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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`recompute_backward` as a ``torch.library`` op (same schema as ``lightning_attention::chunk_bwd``), so
    ``torch.compile`` treats the launch as opaque; dh0 is an empty ``[0]`` tensor when ``initial_state`` is None."""
    return recompute_bwd_direct(q, k, v, do, dht, slope, initial_state, cu_seqlens, cu_seqlens_cpu, scale)


def recompute_bwd_direct(q, k, v, do, dht, slope, initial_state, cu_seqlens, cu_seqlens_cpu, scale):
    """The ``recompute_bwd`` op's implementation, called directly in plain eager mode (no dispatcher round trip)."""
    dq, dk, dv, dh0 = recompute_backward(
        q, k, v, do, dht, slope, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
        cu_seqlens_cpu=cu_seqlens_cpu,
    )  # fmt: skip
    if dh0 is None:
        dh0 = q.new_empty(0, dtype=compute_dtype(q.dtype))
    return dq, dk, dv, dh0


@recompute_bwd_op.register_fake
def _(q, k, v, do, dht, slope, initial_state, cu_seqlens, cu_seqlens_cpu, scale):
    return backward_outputs_fake(q, v, initial_state, cu_seqlens)
