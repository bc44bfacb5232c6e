"""Ahead-of-time compilation of the decode kernel for Hopper (sm_90), without a GPU (Triton compiles for any CUDA
target without a driver).

Run as ``python -m tests.ops.decode_aot`` in a process WITHOUT ``TRITON_INTERPRET`` (the interpreter replaces the
kernel object, so tests/ops/test_decode.py runs this module in a subprocess). For each launch configuration the
dispatcher picks at the benchmark batches, it compiles the kernel with the specialisation a real launch gets
(unit strides of contiguous last dimensions as constants, 16-divisible pointers and strides) and prints, as JSON,
the shared memory and how many 128-bit (v4 of 32-bit) global loads and stores the PTX holds: the fp32 state must
be moved with wide vector accesses for the step to run near the state-bytes floor.
"""

import json
import os
import sys

import triton
import triton.runtime.jit as triton_jit
from triton.backends.compiler import GPUTarget

from lightning_attention.ops.lightning import decode_triton
from lightning_attention.ops.lightning.kernels.decode import decode_step_kernel

UNIT_STRIDES = ("stride_qk", "stride_kk", "stride_vv", "stride_sv", "stride_ov")
META = ("H", "K", "V", "BK", "BV", "HAS_DECAY", "HAS_INDICES")
H100_SMS = 132

# (name, B·H, K, V, dtype): batch 1 / 8 / 64 / 256 at H = 16, K = V = 128, and the K-loop case K = V = 256
CASES = [
    ("batch1", 16, 128, 128, "bf16"),
    ("batch8", 128, 128, 128, "bf16"),
    ("batch64", 1024, 128, 128, "bf16"),
    ("batch256", 4096, 128, 128, "bf16"),
    ("batch64-k256", 1024, 256, 256, "fp16"),
]


def compile_case(num_bh: int, K: int, V: int, dtype: str, heads: int = 16) -> dict:
    fn = decode_step_kernel
    if not isinstance(fn, triton_jit.JITFunction):
        raise RuntimeError("run without TRITON_INTERPRET=1: the interpreter replaced the kernel object")
    block_k, block_v, num_warps = decode_triton.launch_config(num_bh, K, V, H100_SMS)
    signature = {n: f"*{dtype}" for n in ("q", "k", "v", "out")}
    signature.update(state="*fp32", slope="*fp32", state_indices="*i32", scale="fp32", P="i32")
    constexprs = dict(H=heads, K=K, V=V, BK=block_k, BV=block_v, HAS_DECAY=True, HAS_INDICES=True)
    for name in fn.arg_names:
        if name.startswith("stride_"):
            if name in UNIT_STRIDES:
                signature[name], constexprs[name] = "constexpr", 1
            else:
                signature[name] = "i32"
    for name in META:
        signature[name] = "constexpr"
    # K, V multiples of 16 here: every pointer and every remaining stride is 16-divisible, as the launcher sees it
    divisible = [
        n for n in fn.arg_names if signature[n].startswith("*") or n.startswith("stride_") and signature[n] == "i32"
    ]
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in divisible}
    src = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})
    ptx = kernel.asm["ptx"]
    return {
        "config": [block_k, block_v, num_warps],
        "shared": kernel.metadata.shared,
        "ld_v4_b32": ptx.count("ld.global.v4.b32"),
        "st_v4_b32": ptx.count("st.global.v4.b32"),
    }


def main() -> int:
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        print("unset TRITON_INTERPRET to compile for a GPU target", file=sys.stderr)
        return 2
    print(json.dumps({name: compile_case(bh, K, V, dt) for name, bh, K, V, dt in CASES}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
