"""The ``lightning_attn`` benchmark op, its providers and its shape sets (docs/design.md, "Benchmark grids").

Providers (all computing the op of docs/design.md, "Semantics", with scale 1 and λ = exp(-slope), except SDPA):

==================  =========================================================================================
``ours-chunk``      ``lightning_attention.lightning_attn(..., backward="chunk")``, Triton kernels (CUDA only)
``ours-recompute``  the same with ``backward="recompute"`` (the SRAM-bounded backward, when it has landed)
``ours-split``      ``ours-chunk`` under the ``precision="split"`` setting (docs/design.md, "Precision")
``torch``           our PyTorch chunked path (``LIGHTNING_ATTENTION_BACKEND=torch``), the CPU training path
``fla``             FLA ``fla.ops.simple_gla.chunk_simple_gla(q, k, v, g_gamma=-slope, scale=1.0)``, ``[B, T, H, K]``
``official``        ``lightning_attn.ops.lightning_attn_func(q, k, v, s)``, ``[b, h, n, d]``, ``s = slope [h, 1, 1]``
``sdpa``            ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)``, FlashAttention-2
                    backend on CUDA, ``[B, H, T, D]``, up to T = 128K (softmax attention: timed, no accuracy)
==================  =========================================================================================

Inputs: q, k, v ~ N(0, 1) in the shape's dtype, do ~ N(0, 1), slopes ``tnl_slopes(H, 0, 1)`` = 2^(-8(h+1)/H)
(from strong, λ ≈ 0.7, to weak, λ ≈ 0.996 at H = 16). Layout conversions happen in ``prepare``, outside the timing.
Packed sequences (a shape with ``lengths``, the varlen grid) come with their offsets on the device and a host copy,
``cu_seqlens`` and ``cu_seqlens_cpu`` (int64), which ours, the PyTorch path and FLA all take.
"""

import contextlib
import itertools

import torch

from lightning_attention import settings
from lightning_attention.bench import metrics
from lightning_attention.bench.registry import (
    BenchOp,
    Prepared,
    Provider,
    Shape,
    ShapeSet,
    module_missing,
    register_op,
    token_budget_shapes,
)
from lightning_attention.ops.decay import tnl_slopes
from lightning_attention.ops.lightning import naive
from lightning_attention.utils.dtypes import dtype_name

GRID_A_BUDGET = 65_536
GRID_A_SEQLENS = (1024, 2048, 4096, 8192, 16384, 32768, 65536)
GRID_B_SEQLENS = (32768, 131072, 524288, 1048576)
GRID_HEADS = 16
SDPA_MAX_SEQLEN = 131072
# The PyTorch path loops over chunks in Python: beyond 128K tokens per sequence it only burns the GPU time budget.
TORCH_PATH_MAX_SEQLEN = 131072

QUICK_BUDGET = 512
QUICK_A_SEQLENS = (64, 128, 256)
QUICK_B_SEQLENS = (128, 512)
QUICK_HEADS = 2
QUICK_HEAD_DIM = 32
# the varlen point: 12 packed sequences from 1 to 16,384 tokens, 65,536 in all (grid (a)'s budget)
VARLEN_LENGTHS = (12288, 7000, 1, 3100, 16384, 515, 64, 9000, 2048, 130, 8192, 6814)
QUICK_VARLEN_LENGTHS = (100, 1, 37, 118)


def make_inputs(shape: Shape, device: torch.device, seed: int) -> dict:
    """Canonical inputs in the library layout: q, k ``[B, T, H, K]``, v and do ``[B, T, H, V]``, slope ``[H]``."""
    gen = torch.Generator(device=device).manual_seed(seed)
    B, T, H = shape.batch, shape.seqlen, shape.heads

    def randn(*size):
        return torch.randn(*size, generator=gen, device=device, dtype=shape.dtype)

    inputs = {
        "q": randn(B, T, H, shape.k_dim),
        "k": randn(B, T, H, shape.k_dim),
        "v": randn(B, T, H, shape.v_dim),
        "do": randn(B, T, H, shape.v_dim),
        "slope": tnl_slopes(H, 0, 1).to(device),
    }
    if shape.lengths is not None:
        offsets = torch.tensor((0, *itertools.accumulate(shape.lengths)), dtype=torch.int64)
        inputs.update(cu_seqlens=offsets.to(device), cu_seqlens_cpu=offsets)
    return inputs


def packed(inputs: dict) -> dict:
    """The keyword arguments that pass packed sequences' offsets (none for a shape without ``lengths``)."""
    return {name: inputs[name] for name in ("cu_seqlens", "cu_seqlens_cpu") if name in inputs}


def reference(inputs: dict) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """float64 ``o`` and ``[dq, dk, dv]`` from the same (rounded) inputs, by the chunked reference (O(T) memory)."""
    q, k, v = (inputs[n].detach().to(torch.float64).requires_grad_() for n in ("q", "k", "v"))
    with torch.autocast(device_type=q.device.type, enabled=False):
        o, _ = naive.chunk_lightning_attn(
            q, k, v, inputs["slope"].to(torch.float64), cu_seqlens=packed(inputs).get("cu_seqlens_cpu")
        )
    o.backward(inputs["do"].to(torch.float64))
    return o.detach(), [q.grad, k.grad, v.grad]


def _leaves(inputs: dict, transpose: bool = False) -> list[torch.Tensor]:
    xs = [inputs[n] for n in ("q", "k", "v")]
    if transpose:  # [B, T, H, D] -> [B, H, T, D], materialised: both baselines need contiguous rows
        xs = [x.transpose(1, 2).contiguous() for x in xs]
    return [x.detach().requires_grad_() for x in xs]


def _same_layout(x: torch.Tensor) -> torch.Tensor:
    return x


def _from_bhtd(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(1, 2)


def forced_backend(name: str):
    """Run the public API on one backend (a settings override: it takes effect at the next call)."""
    return settings.override(backend=name)


def _needs_cuda(device: torch.device, what: str) -> str | None:
    if device.type != "cuda":
        return f"{what}: needs a CUDA GPU (Triton's CPU interpreter is a test tool, far too slow to benchmark)"
    return None


def _ours_available(device: torch.device) -> str | None:
    return _needs_cuda(device, "the Triton kernels") or (
        "Triton cannot be imported here" if module_missing("lightning_attention.ops.lightning.ops") else None
    )


def _prepare_ours(backward: str, precision: str | None = None):
    """``precision``: a ``precision`` setting that the forward and its backward run under (the override costs
    microseconds of host time per call: the default provider runs without one)."""

    def prepare(inputs: dict) -> Prepared:
        from lightning_attention import lightning_attn

        q, k, v = _leaves(inputs)
        slope, offsets = inputs["slope"], packed(inputs)
        return Prepared(
            forward=lambda: lightning_attn(q, k, v, slope, backward=backward, **offsets)[0],
            grad_output=inputs["do"],
            leaves=[q, k, v],
            to_library_layout=_same_layout,
            context=contextlib.nullcontext if precision is None else lambda: settings.override(precision=precision),
        )

    return prepare


def _prepare_torch(inputs: dict) -> Prepared:
    from lightning_attention import lightning_attn

    q, k, v = _leaves(inputs)
    slope, offsets = inputs["slope"], packed(inputs)

    def forward():
        with forced_backend("torch"):
            return lightning_attn(q, k, v, slope, **offsets)[0]

    return Prepared(forward, inputs["do"], [q, k, v], _same_layout)


def _fla_available(device: torch.device) -> str | None:
    return module_missing("fla") or _needs_cuda(device, "FLA")


def _prepare_fla(inputs: dict) -> Prepared:
    from fla.ops.simple_gla import chunk_simple_gla

    q, k, v = _leaves(inputs)
    g_gamma = -inputs["slope"]  # FLA's per-head log decay: λ = exp(g_gamma)
    offsets = packed(inputs)
    return Prepared(
        forward=lambda: chunk_simple_gla(q, k, v, g_gamma=g_gamma, scale=1.0, **offsets)[0],
        grad_output=inputs["do"],
        leaves=[q, k, v],
        to_library_layout=_same_layout,
    )


def _official_available(device: torch.device) -> str | None:
    return module_missing("lightning_attn") or _needs_cuda(device, "the official lightning_attn package")


def _prepare_official(inputs: dict) -> Prepared:
    from lightning_attn.ops import lightning_attn_func

    q, k, v = _leaves(inputs, transpose=True)
    s = inputs["slope"].reshape(-1, 1, 1).contiguous()
    return Prepared(
        forward=lambda: lightning_attn_func(q, k, v, s),
        grad_output=inputs["do"].transpose(1, 2).contiguous(),
        leaves=[q, k, v],
        to_library_layout=_from_bhtd,
    )


def _sdpa_available(device: torch.device) -> str | None:
    return None


def _prepare_sdpa(inputs: dict) -> Prepared:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = _leaves(inputs, transpose=True)
    # FlashAttention-2 on CUDA and nothing else: a silent fall-back to the math kernel would time something else.
    # On CPU (smoke runs) PyTorch picks its own kernel.
    context = (lambda: sdpa_kernel([SDPBackend.FLASH_ATTENTION])) if q.is_cuda else contextlib.nullcontext

    def forward():
        with context():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    return Prepared(forward, inputs["do"].transpose(1, 2).contiguous(), [q, k, v], _from_bhtd)


LIGHTNING_ATTN = register_op(
    BenchOp(
        name="lightning_attn",
        make_inputs=make_inputs,
        flops=metrics.lightning_flops,
        io_bytes=metrics.attention_io_bytes,
        reference=reference,
    )
)

for _provider in (
    Provider(
        "ours-chunk",
        "ours (chunk bwd)",
        "ours",
        _prepare_ours("chunk"),
        _ours_available,
        cold_start=True,
        varlen=True,
    ),
    Provider(
        "ours-recompute",
        "ours (recompute bwd)",
        "ours",
        _prepare_ours("recompute"),
        _ours_available,
        cold_start=True,
        varlen=True,
    ),
    Provider(
        "ours-split",
        "ours (split precision)",
        "ours",
        _prepare_ours("chunk", precision="split"),
        _ours_available,
        cold_start=True,
        varlen=True,
    ),
    Provider(
        "torch",
        "ours (PyTorch path)",
        "reference",
        _prepare_torch,
        lambda device: None,
        max_seqlen=TORCH_PATH_MAX_SEQLEN,
        varlen=True,
    ),
    Provider("fla", "FLA chunk_simple_gla", "baseline", _prepare_fla, _fla_available, cold_start=True, varlen=True),
    Provider("official", "official lightning_attn2", "baseline", _prepare_official, _official_available),
    Provider(
        "sdpa",
        "SDPA causal",
        "baseline",
        _prepare_sdpa,
        _sdpa_available,
        max_seqlen=SDPA_MAX_SEQLEN,
        computes_op=False,
        flops=metrics.softmax_attention_flops,
    ),
):
    LIGHTNING_ATTN.register_provider(_provider)

OURS = ("chunk", "recompute", "split", "torch")  # --ours choices -> provider names below
OURS_PROVIDER = {"chunk": "ours-chunk", "recompute": "ours-recompute", "split": "ours-split", "torch": "torch"}
BASELINES = ("fla", "official", "sdpa")


def grid_a(head_dim: int, budget: int = GRID_A_BUDGET, seqlens=GRID_A_SEQLENS, heads=GRID_HEADS, dtype=torch.bfloat16):
    """Grid (a): a fixed token budget per call, batch = budget / T."""
    return ShapeSet(
        f"a-d{head_dim}",
        f"grid (a): {budget} tokens per call, batch = {budget}/T, H = {heads}, K = V = {head_dim}, "
        f"{dtype_name(dtype)}",
        token_budget_shapes(budget, seqlens, heads, head_dim, head_dim, dtype),
    )


def grid_b(head_dim: int, seqlens=GRID_B_SEQLENS, heads=GRID_HEADS, dtype=torch.bfloat16):
    """Grid (b): batch 1, long sequences (the 'constant speed' claim)."""
    return ShapeSet(
        f"b-d{head_dim}",
        f"grid (b): batch 1, H = {heads}, K = V = {head_dim}, {dtype_name(dtype)}",
        tuple(Shape(1, t, heads, head_dim, head_dim, dtype) for t in seqlens),
    )


def varlen_grid(head_dim: int, lengths: tuple[int, ...] = VARLEN_LENGTHS, heads=GRID_HEADS,
                dtype=torch.bfloat16) -> ShapeSet:  # fmt: skip
    """The varlen point: packed sequences of mixed lengths in one call (batch 1, ``cu_seqlens``)."""
    T = sum(lengths)
    return ShapeSet(
        f"varlen-d{head_dim}",
        f"varlen: {len(lengths)} packed sequences of {min(lengths)} to {max(lengths)} tokens, {T} in all, "
        f"H = {heads}, K = V = {head_dim}, {dtype_name(dtype)}",
        (Shape(1, T, heads, head_dim, head_dim, dtype, lengths=tuple(lengths)),),
    )


def quick_grid_a(head_dim: int = QUICK_HEAD_DIM) -> ShapeSet:
    s = grid_a(head_dim, QUICK_BUDGET, QUICK_A_SEQLENS, QUICK_HEADS)
    return ShapeSet(f"quick-{s.name}", f"--quick {s.description}", s.shapes)


def quick_grid_b(head_dim: int = QUICK_HEAD_DIM) -> ShapeSet:
    s = grid_b(head_dim, QUICK_B_SEQLENS, QUICK_HEADS)
    return ShapeSet(f"quick-{s.name}", f"--quick {s.description}", s.shapes)


def quick_varlen_grid(head_dim: int = QUICK_HEAD_DIM) -> ShapeSet:
    s = varlen_grid(head_dim, QUICK_VARLEN_LENGTHS, QUICK_HEADS)
    return ShapeSet(f"quick-{s.name}", f"--quick {s.description}", s.shapes)


def accuracy_shape(head_dim: int, quick: bool) -> Shape:
    """The small size of the accuracy column (an odd T in quick mode exercises the ragged tail)."""
    if quick:
        return Shape(1, 100, QUICK_HEADS, head_dim, head_dim, torch.bfloat16)
    return Shape(2, 1024, GRID_HEADS, head_dim, head_dim, torch.bfloat16)


for _dim in (64, 128, 256):
    LIGHTNING_ATTN.register_shape_set(grid_a(_dim))
LIGHTNING_ATTN.register_shape_set(grid_b(128))
LIGHTNING_ATTN.register_shape_set(varlen_grid(128))
LIGHTNING_ATTN.register_shape_set(quick_grid_a())
LIGHTNING_ATTN.register_shape_set(quick_grid_b())
LIGHTNING_ATTN.register_shape_set(quick_varlen_grid())
