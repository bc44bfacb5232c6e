"""Shared memory of the recompute-backward kernel, measured by compiling it ahead of time for CUDA targets.

Triton compiles for any CUDA target on a machine without a GPU (no driver needed); ``.metadata.shared`` of the
compiled kernel is its shared memory per block in bytes. Used by ``tests/ops/test_recompute_smem.py`` (CI: fails if
a configuration exceeds its target's limit) and ``benchmarks/recompute_smem_table.py`` (prints the table).
The configurations are exactly those :func:`lightning_attention.ops.lightning.recompute.recompute_config` picks.
"""

from dataclasses import asdict, dataclass

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from lightning_attention.ops.lightning.kernels.recompute import recompute_bwd_kernel
from lightning_attention.ops.lightning.recompute import kernel_dtypes, recompute_config
from lightning_attention.utils.dtypes import dtype_name

# Opt-in shared memory per block (bytes) of each compute capability (CUDA programming guide, "Technical
# Specifications per Compute Capability"): 227 KB on sm_90, 163 KB on sm_80, 99 KB on sm_86 / sm_89 / sm_120.
SMEM_LIMITS = {80: 166_912, 86: 101_376, 89: 101_376, 90: 232_448, 120: 101_376}

_TRITON_PTR = {torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.float32: "*fp32"}
# Pointer arguments that hold fp32 data whatever the input dtype; everything else not listed is an input tensor.
_FP32_POINTERS = {"h0", "dht", "dh0", "slope"}
KERNEL = "recompute_bwd_kernel"
_INT_ARGS = {"T", "H"}
_STRIDE_GROUPS = {"sq", "sk", "sv", "sdo"}  # one tuple argument each: strides (batch, token, head)


@dataclass(frozen=True)
class SmemRow:
    kernel: str
    dtype: str
    K: int
    V: int
    BT: int
    BK: int
    BV: int
    num_warps: int
    num_stages: int
    decay: bool
    cc: int
    shared: int
    limit: int
    method: str = "cubin"  # "cubin": full compile; "llir": stopped after LLVM IR (see measure)

    @property
    def fits(self) -> bool:
        return self.shared <= self.limit

    def as_dict(self) -> dict:
        return {**asdict(self), "fits": self.fits}


def _signature_and_constexprs(dtype: torch.dtype, K: int, V: int, decay: bool):
    """ASTSource arguments for the launch :func:`recompute_backward` makes (every optional tensor present)."""
    cfg = recompute_config(K, V, dtype)
    constexprs = {
        "K": K,
        "V": V,
        "BT": cfg.BT,
        "BK": cfg.BK,
        "BV": cfg.BV,
        "K_PAD": cfg.K_pad,
        "V_PAD": cfg.V_pad,
        "USE_INITIAL_STATE": True,
        "USE_FINAL_STATE_GRADIENT": True,
        "HAS_DECAY": decay,
        "IS_VARLEN": True,
        **kernel_dtypes(dtype),
    }
    signature = {}
    for arg in recompute_bwd_kernel.arg_names:
        if arg in constexprs:
            signature[arg] = "constexpr"
        elif arg == "cu_seqlens":
            signature[arg] = "*i32"
        elif arg in _INT_ARGS:
            signature[arg] = "i32"
        elif arg in _STRIDE_GROUPS:
            signature[arg] = ("i32",) * 3
        elif arg == "scale":
            signature[arg] = "fp32"
        elif arg in _FP32_POINTERS:
            signature[arg] = "*fp32"
        else:
            signature[arg] = _TRITON_PTR[dtype]
    return signature, constexprs, cfg


def _shared_after_llir(src: ASTSource, target: GPUTarget, options: dict) -> int:
    """Shared memory as fixed by the TritonGPU -> LLVM lowering, without generating PTX or running ptxas.

    Mirrors the stage loop of ``triton.compiler.compiler.compile`` (triton 3.8) and stops after the "llir" stage,
    which is where ``metadata["shared"]`` is set; that is about a third of the full compile time. It uses compiler
    internals, so :func:`measure` falls back to the full compile when they differ.
    """
    from triton._C.libtriton import ir
    from triton.compiler.compiler import make_backend

    backend = make_backend(target)
    opts = backend.parse_options(dict(options, **src.parse_options()))
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    module = src.make_ir(target, opts, backend.get_codegen_implementation(opts), backend.get_module_map(), context)
    stages = {}
    backend.add_stages(stages, opts, src.language)
    metadata = {"target": target, **opts.__dict__}
    names = list(stages)
    for name in names[names.index(src.ext) :]:
        module = stages[name](module, metadata)
        if name == "llir":
            return int(metadata["shared"])
    raise RuntimeError(f"no llir stage among {names}")


def measure(dtype: torch.dtype, K: int, V: int, cc: int, decay: bool = True, *, fast: bool = False) -> SmemRow:
    """Compiles the recompute kernel for (dtype, K, V) and compute capability ``cc``; returns its shared memory.

    ``fast=True`` stops after LLVM IR (same number, no PTX/ptxas; falls back to the full compile if the compiler
    internals it relies on are not there). The default compiles to a cubin, which also proves ptxas accepts it.
    """
    signature, constexprs, cfg = _signature_and_constexprs(dtype, K, V, decay)
    src = ASTSource(fn=recompute_bwd_kernel, signature=signature, constexprs=constexprs)
    target = GPUTarget("cuda", cc, 32)
    options = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    shared, method = None, "cubin"
    if fast:
        try:
            shared, method = _shared_after_llir(src, target, options), "llir"
        except (AttributeError, TypeError, ValueError, KeyError, ImportError, RuntimeError):
            shared = None
    if shared is None:
        shared = int(triton.compile(src, target=target, options=options).metadata.shared)
    return SmemRow(
        kernel=KERNEL,
        dtype=dtype_name(dtype),
        K=K,
        V=V,
        BT=cfg.BT,
        BK=cfg.BK,
        BV=cfg.BV,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        decay=decay,
        cc=cc,
        shared=shared,
        limit=SMEM_LIMITS[cc],
        method=method,
    )


def markdown_table(rows: list[SmemRow]) -> str:
    """One line per (kernel, dtype, K, V, decay), one column of bytes per target; ``!`` marks an overflow."""
    ccs = sorted({r.cc for r in rows})
    keys = sorted({(r.kernel, r.dtype, r.K, r.V, r.decay) for r in rows}, key=lambda x: (x[2], x[3], x[1], x[4]))
    by_key = {(r.kernel, r.dtype, r.K, r.V, r.decay, r.cc): r for r in rows}
    head = (
        "| kernel | dtype | K | V | decay | BT | BK | BV | warps | stages | "
        + " | ".join(f"sm_{c}" for c in ccs)
        + " |"
    )
    lines = [head, "|" + "---|" * (10 + len(ccs))]
    for key in keys:
        first = next(by_key[key + (c,)] for c in ccs if key + (c,) in by_key)
        cells = []
        for c in ccs:
            r = by_key.get(key + (c,))
            cells.append("-" if r is None else f"{r.shared:,}" + ("" if r.fits else " !"))
        lines.append(
            f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {'yes' if key[4] else 'no'} | {first.BT} | {first.BK} | "
            f"{first.BV} | {first.num_warps} | {first.num_stages} | " + " | ".join(cells) + " |"
        )
    limits = " · ".join(f"sm_{c} {SMEM_LIMITS[c]:,} B" for c in ccs)
    return "\n".join(lines) + f"\n\nPer-block limits: {limits}. `!` = over the limit."
