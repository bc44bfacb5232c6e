"""Ahead-of-time GPU builds of the chunk-walk kernels on a machine without a GPU (Triton compiles for any CUDA target
without a driver).

Run as a script with the interpreter off (``tests/ops/test_aot.py`` does it in a subprocess: in a process whose
kernels were decorated under ``TRITON_INTERPRET=1`` Triton's frontend cannot compile them)::

    TRITON_INTERPRET=0 python -m tests.ops.aot_build '[{"cc": 90, "dtype": "bf16", "DK": 128, "DV": 128}]'

Each job compiles every configuration that ``kernels.configs.walk_candidates`` lets the plan pick for that
architecture, dtype and head dims (or only the first / last with ``"which"``), with the kernel flags given in
``"flags"`` (``"pointers": true``: the walk without tensor descriptors, as inputs that miss their alignment run it
on sm_90), and prints one JSON line per build: the configuration, ``metadata.shared`` (the compiler's own number),
the per-block limit and the dispatcher's estimate.
"""

import functools
import json
import sys

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget

from lightning_attention.ops.lightning.device import SHARED_PER_BLOCK as SHARED_LIMITS
from lightning_attention.ops.lightning.kernels.configs import (
    dkdv_candidates,
    dkdv_descriptor_space,
    estimate_dkdv_shared_bytes,
    estimate_resident_shared_bytes,
    estimate_shared_bytes,
    inter_only_config,
    padded_dim,
    state_operand_bytes,
    use_dkdv_walk,
    walk_candidates,
    walk_tile,
)
from lightning_attention.ops.lightning.kernels.dkdv_walk import dkdv_kernel
from lightning_attention.ops.lightning.kernels.scan import lightning_scan_kernel
from lightning_attention.ops.lightning.kernels.walk import walk_kernel
from lightning_attention.ops.lightning.plan import FP32_PRECISION, TMA_MIN_CAPABILITY

ELEM_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
INTER_PREC = {"bf16": "input", "fp16": "tf32", "fp32": FP32_PRECISION}  # as plan.precisions picks them by default
_IO_POINTERS = {"q", "k", "v", "o", "do", "dk", "dv", "x"}
_STATE_POINTERS = {"slope", "h0", "ht", "states", "pieces", "dht", "dh0", "rstates"}
_INT_POINTERS = {"cu_seqlens", "seg_table", "seq_segs"}
# the kernels' stride groups, one tuple argument each: (batch, token, head) of a [B, T, H, D] tensor, and (slot, head,
# row, column) of a state, of which a launch makes the slot and head strides multiples of 16
_TOKEN_STRIDES = {"sq", "sk", "sv", "so", "sdo", "sdk", "sdv", "sx"}
_STATE_STRIDES = {"sh0", "sht", "sst", "sp", "srs"}


def inter_prec(dtype: str, flags: dict) -> str:
    """INTER_PREC as ``plan.precisions`` picks it: with the split precision (flag SPLIT_OPERANDS) bf16 splits the
    state too, fp16 takes q and the state as bf16 halves."""
    if flags.get("SPLIT_OPERANDS") and dtype != "fp32":
        return "split" if dtype == "bf16" else "bf16x3"
    return INTER_PREC[dtype]


def signature(fn, dtype: str) -> dict:
    """Triton signature of a kernel: q/k/v/o in ``dtype``, states fp32, offsets int32, scalars fp32/int32."""
    constexprs = {fn.arg_names[i] for i in fn.constexprs}
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in _IO_POINTERS:
            sig[name] = f"*{dtype}"
        elif name in _STATE_POINTERS:
            sig[name] = "*fp32"
        elif name in _INT_POINTERS:
            sig[name] = "*i32"
        elif name.startswith("scale"):
            sig[name] = "fp32"
        elif name in _TOKEN_STRIDES:
            sig[name] = ("i32",) * 3
        elif name in _STATE_STRIDES:
            sig[name] = ("i32",) * 4
        else:
            sig[name] = "i32"
    return sig


def specialisations(fn, sig: dict) -> dict:
    """The divisibility that a launch on a GPU gives the compiler (Triton specialises every pointer and every int
    argument not in ``do_not_specialize`` that is a multiple of 16): pointers (torch allocations are 16-byte
    aligned) and the batch / token / head strides and H of the shapes the dispatcher sees. Without it a build
    neither vectorises nor pipelines its loads, and reports less shared memory than the GPU's build uses."""
    skip = {a if isinstance(a, str) else fn.arg_names[a] for a in fn.do_not_specialize or ()}
    aligned = [(i,) for i, name in enumerate(fn.arg_names) if sig[name] == "i32" and name == "H" and name not in skip]
    aligned += [(i,) for i, name in enumerate(fn.arg_names) if isinstance(sig[name], str) and sig[name][0] == "*"]
    aligned += [(i, j) for i, name in enumerate(fn.arg_names) if name in _TOKEN_STRIDES for j in range(3)]
    aligned += [(i, j) for i, name in enumerate(fn.arg_names) if name in _STATE_STRIDES for j in range(2)]
    return {path: [["tt.divisibility", 16]] for path in sorted(aligned)}


def source(fn, dtype: str, constexprs: dict):
    """What ``triton.compile`` builds: ``fn`` with the launch's signature, specialisations and ``constexprs``."""
    sig = signature(fn, dtype)
    return triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=specialisations(fn, sig))


def uses_descriptors(cc: int, flags: dict, pointers: bool) -> bool:
    """Whether a walk launch on ``cc`` moves its tiles by tensor descriptors: on sm_90+ for whole chunks, never in the
    inter-only mode, and not when its inputs miss the descriptors' alignment (``pointers``)."""
    return cc >= TMA_MIN_CAPABILITY and not flags.get("INTER_ONLY", False) and not pointers


def dispatcher_configs(cc: int, dtype: str, DK: int, DV: int, flags: dict, pointers: bool = False):
    """What the plan may launch on ``cc`` (the inter-only mode: its one configuration with BT = flags["BT"])."""
    if flags.get("INTER_ONLY"):
        return [inter_only_config(flags["BT"], DK, DV)]
    return list(walk_candidates(
        DK, DV, ELEM_BYTES[dtype], SHARED_LIMITS[cc], state_only=flags.get("STATE_ONLY", False),
        tma=uses_descriptors(cc, flags, pointers), state_bytes=state_operand_bytes(inter_prec(dtype, flags)),
        rev_states=flags.get("REV_STATES", False),
    ))  # fmt: skip


def _compile(kind: str, fn, cc: int, dtype: str, DK: int, DV: int, BT: int, BV: int, cfg, constexprs: dict,
             flags: dict, estimate: int) -> dict:
    """Builds ``fn`` for ``cc`` with ``constexprs`` (``flags`` on top) and returns the JSON line of the build."""
    constexprs = {**constexprs, **flags}
    src = source(fn, dtype, constexprs)
    options = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    kernel = triton.compile(src, target=GPUTarget("cuda", cc, 32), options=options)
    return {
        "kernel": kind, "cc": cc, "dtype": dtype, "DK": DK, "DV": DV, "BT": BT, "BV": BV, "flags": flags,
        "num_warps": cfg.num_warps, "num_stages": cfg.num_stages, "shared": kernel.metadata.shared,
        "limit": SHARED_LIMITS[cc], "estimate": estimate,
    }  # fmt: skip


def _precision_constexprs(dtype: str, flags: dict) -> dict:
    dot_prec = FP32_PRECISION if dtype == "fp32" else None
    return dict(ACC=tl.float32, DOT_PREC=dot_prec, INTER_PREC=inter_prec(dtype, flags))


def build_walk(cc: int, dtype: str, DK: int, DV: int, cfg, flags: dict, pointers: bool = False) -> dict:
    BT, BV = cfg.kwargs["BT"], cfg.kwargs["BV"]
    BK = cfg.kwargs.get("BK", walk_tile(DK))  # the inter-only configuration carries its own
    constexprs = dict(
        DK=DK, DV=DV, BT=BT, BK=BK, BV=BV,
        VARLEN=0, REVERSE=False, HAS_DECAY=True, USE_H0=True, STORE_HT=True, SEG_IN=False, STATE_ONLY=False,
        SKIP_FINAL=False, INTER_ONLY=False, INTER_APART=cfg.kwargs["INTER_APART"], SPLIT_OPERANDS=False,
        REV_STATES=False, REV_ALL=False, **_precision_constexprs(dtype, flags),
    )  # fmt: skip
    inter_only = bool(flags.get("INTER_ONLY", False))
    tma = constexprs["USE_TMA"] = uses_descriptors(cc, flags, pointers)  # as launches.walk_launch decides
    state_bytes = state_operand_bytes(inter_prec(dtype, flags))
    estimate = estimate_shared_bytes(BT, BK, BV, cfg.num_stages, ELEM_BYTES[dtype], inter_only, tma, state_bytes,
                                     state_only=flags.get("STATE_ONLY", False),
                                     rev_states=flags.get("REV_STATES", False))  # fmt: skip
    fn = walk_kernel
    result = _compile("walk", fn, cc, dtype, DK, DV, BT, BV, cfg, constexprs, flags, estimate)
    result["pointers"] = pointers
    result["resident"] = estimate_resident_shared_bytes(BT, BK, BV, cfg.num_stages, ELEM_BYTES[dtype], tma)
    return result


def dkdv_descriptors(cc: int, dtype: str, DK: int, DV: int, pointers: bool) -> bool:
    """Whether the fused dk/dv walk moves its tiles by descriptors on ``cc``, as ``launches.dkdv_launch`` decides."""
    state_bytes = state_operand_bytes(INTER_PREC[dtype])
    return uses_descriptors(cc, {}, pointers) and bool(
        dkdv_descriptor_space(DK, DV, ELEM_BYTES[dtype], state_bytes, SHARED_LIMITS[cc])
    )


def build_dkdv(cc: int, dtype: str, DK: int, DV: int, cfg, flags: dict, pointers: bool = False) -> dict:
    BT, BK, BV = cfg.kwargs["BT"], padded_dim(DK), padded_dim(DV)
    tma = dkdv_descriptors(cc, dtype, DK, DV, pointers)
    constexprs = dict(
        DK=DK, DV=DV, BT=BT, BK=BK, BV=BV, VARLEN=0, HAS_DECAY=True, USE_H0=True, STORE_HT=True, SEG_IN=False,
        INTER_ONLY=False, USE_TMA=tma, **_precision_constexprs(dtype, flags),
    )  # fmt: skip
    state_bytes = state_operand_bytes(INTER_PREC[dtype])
    estimate = estimate_dkdv_shared_bytes(BT, BK, BV, cfg.num_stages, ELEM_BYTES[dtype], state_bytes, tma)
    result = _compile("dkdv", dkdv_kernel, cc, dtype, DK, DV, BT, BV, cfg, constexprs, flags, estimate)
    result["pointers"], result["tma"] = pointers, tma
    return result


def dkdv_jobs(cc: int, dtype: str, DK: int, DV: int, pointers: bool = False) -> list:
    """What the launcher can pick for the fused dk/dv walk on ``cc`` (nothing when it falls back to two walks)."""
    state_bytes = state_operand_bytes(INTER_PREC[dtype])
    if not use_dkdv_walk(DK, DV, ELEM_BYTES[dtype], state_bytes, SHARED_LIMITS[cc]):
        return []
    tma = dkdv_descriptors(cc, dtype, DK, DV, pointers)
    return list(dkdv_candidates(DK, DV, ELEM_BYTES[dtype], state_bytes, SHARED_LIMITS[cc], tma=tma))


def build_scan(cc: int, varlen: int) -> dict:
    fn = lightning_scan_kernel
    constexprs = dict(
        DK=128, DV=128, BK=64, BV=64, VARLEN=varlen, REVERSE=True, HAS_DECAY=True, USE_H0=True, STORE_HT=True,
        ACC=tl.float32,
    )  # fmt: skip
    src = source(fn, "fp32", constexprs)
    kernel = triton.compile(src, target=GPUTarget("cuda", cc, 32), options={"num_warps": 4, "num_stages": 1})
    return {"kernel": "scan", "cc": cc, "shared": kernel.metadata.shared, "limit": SHARED_LIMITS[cc]}


def build_ws(kind: str, cc: int, DK: int, DV: int, flags: dict) -> dict:
    """A two-warpgroup kernel (Gluon: ``kind`` "walk_ws" or "state_ws", the walk and pre-pass of
    ``kernels/walk_ws.py``, or "dkdv_ws", the fused dk/dv walk of ``kernels/dkdv_ws.py``) as
    ``launches._two_warpgroup_walk`` / ``_two_warpgroup_prepass`` / ``_two_warpgroup_dkdv`` launch it, with ``flags``
    over the defaults (the forward's for the walk)."""
    from triton.experimental.gluon._runtime import GluonASTSource

    from lightning_attention.ops.lightning.kernels import dkdv_ws, walk_ws

    if kind == "dkdv_ws":
        BV = dkdv_ws.DKDV_WS_BV
        fn = dkdv_ws.lightning_dkdv_ws_kernel
        constexprs = dict(DK=DK, DV=DV, BT=walk_ws.WS_BT, BV=BV, STAGES=dkdv_ws.DKDV_WS_STAGES, HAS_DECAY=True,
                          USE_H0=True, STORE_HT=True, SEG_IN=False)  # fmt: skip
    else:
        BV = walk_ws.value_tile(DK, DV)
        constexprs = dict(DK=DK, DV=DV, BT=walk_ws.WS_BT, BV=BV, REVERSE=False, HAS_DECAY=True, SPLIT=False)
    if kind == "walk_ws":
        fn = walk_ws.lightning_walk_ws_kernel
        constexprs.update(STAGES=walk_ws.WS_STAGES, USE_H0=True, STORE_HT=True, SEG_IN=False)
    elif kind == "state_ws":
        fn = walk_ws.lightning_state_ws_kernel
        constexprs.update(STAGES=walk_ws.WS_STATE_STAGES, SKIP_FINAL=False)
    constexprs.update(flags)
    sig = signature(fn, "bf16")
    src = GluonASTSource(fn, sig, constexprs, specialisations(fn, sig))
    kernel = triton.compile(src, target=GPUTarget("cuda", cc, 32), options={"num_warps": walk_ws.WS_WARPS})
    return {
        "kernel": kind, "cc": cc, "dtype": "bf16", "DK": DK, "DV": DV, "BV": BV, "flags": flags,
        "num_warps": kernel.metadata.num_warps, "shared": kernel.metadata.shared, "limit": SHARED_LIMITS[cc],
    }  # fmt: skip


def run_job(job: dict) -> list[dict]:
    if job.get("kernel") == "scan":
        return [build_scan(job["cc"], varlen) for varlen in (0, 2)]
    if job.get("kernel") in ("walk_ws", "state_ws", "dkdv_ws"):
        return [build_ws(job["kernel"], job["cc"], job["DK"], job["DV"], job.get("flags", {}))]
    which = job.get("which", "all")
    flags = job.get("flags", {})
    pointers = job.get("pointers", False)
    if job.get("kernel") == "dkdv":
        cfgs = dkdv_jobs(job["cc"], job["dtype"], job["DK"], job["DV"], pointers)
        build_one = functools.partial(build_dkdv, pointers=pointers)
    else:
        cfgs = dispatcher_configs(job["cc"], job["dtype"], job["DK"], job["DV"], flags, pointers)
        build_one = functools.partial(build_walk, pointers=pointers)
    cfgs = cfgs[:1] if which == "first" else cfgs[-1:] if which == "last" else cfgs
    return [build_one(job["cc"], job["dtype"], job["DK"], job["DV"], c, flags) for c in cfgs]


def main(argv: list[str]) -> int:
    for job in json.loads(argv[0]):
        for result in run_job(job):
            print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
