"""Test-only shim: Triton's interpreter computes every ``tl.dot`` exactly in its operands' dtype, whatever
``input_precision`` says. On a GPU a ``"tf32x3"`` product of fp32 operands is three tf32 tensor-core products
(Triton's F32DotTC rewrite): each operand x splits into big = x rounded to tf32 (``cvt.rna``: to nearest, ties away
from zero) and small = x - big, and a·b = small_a·big_b + big_a·small_b + big_a·big_b, where the tensor cores read
each fp32 operand's top 19 bits (small's lower bits are cut) and a NaN of the two small products (from an infinite
operand, inf - inf) is dropped so the big product alone carries the non-finite value. Emulated here, so that the fp32
walks' CPU tests check the precision the GPU runs. A plain ``"tf32"`` product of fp32 operands reads the top 19 bits
of each (the fp16 walks' inter product and the recompute backward's fp16 products run so).
"""

import numpy as np
import triton.language as tl
import triton.runtime.interpreter as _interp
from triton._C.libtriton import ir

TensorHandle = _interp.TensorHandle
_TF32_DROPPED = np.uint32(0x1FFF)  # the 13 low significand bits that tf32 does not carry

_orig_dot = _interp.InterpreterBuilder.create_dot


def _round_to_tf32(x: np.ndarray) -> np.ndarray:
    """fp32 -> the nearest tf32 value (ties away from zero), kept in fp32; inf and NaN stay as they are."""
    bits = x.view(np.uint32)
    rounded = ((bits + np.uint32(0x1000)) & ~_TF32_DROPPED).view(np.float32)
    return np.where(np.isfinite(x), rounded, x)


def _cut_to_tf32(x: np.ndarray) -> np.ndarray:
    """What a tf32 tensor-core product reads of an fp32 operand: its top 19 bits."""
    return (x.view(np.uint32) & ~_TF32_DROPPED).view(np.float32)


def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
    tf32 = input_precision in (ir.INPUT_PRECISION.TF32, ir.INPUT_PRECISION.TF32x3)
    if not tf32 or a.dtype.scalar != tl.float32 or b.dtype.scalar != tl.float32:
        return _orig_dot(self, a, b, d, input_precision, max_num_imprecise_acc)
    x, y = a.data.astype(np.float32), b.data.astype(np.float32)
    if input_precision == ir.INPUT_PRECISION.TF32:
        out = np.matmul(_cut_to_tf32(x), _cut_to_tf32(y)) + d.data
        return TensorHandle(out.astype(d.data.dtype), d.dtype.scalar)
    with np.errstate(invalid="ignore", over="ignore"):
        x_big, y_big = _round_to_tf32(x), _round_to_tf32(y)
        x_small, y_small = _cut_to_tf32(x - x_big), _cut_to_tf32(y - y_big)
        small = np.matmul(x_small, y_big) + np.matmul(x_big, y_small)
        small = np.where(np.isnan(small), np.float32(0), small)
        out = np.matmul(x_big, y_big) + small + d.data
    return TensorHandle(out.astype(d.data.dtype), d.dtype.scalar)


_interp.InterpreterBuilder.create_dot = create_dot
