"""Test-only shim: Triton's interpreter keeps bfloat16 as raw uint16 bit patterns and runs numpy integer arithmetic
on them (tl.dot, +, *, comparisons, tl.sum give garbage), and truncates fp32->bf16 casts. Decode bf16 -> fp32 for
float arithmetic, comparisons, tl.dot and tl.sum, and re-encode results with round-to-nearest-even like the GPU.
"""

import numpy as np
import triton.language as tl
import triton.runtime.interpreter as _interp

TensorHandle = _interp.TensorHandle


def _dec(a):
    """bf16 bits (uint16) -> float32"""
    return (np.asarray(a).astype(np.uint32) << np.uint32(16)).view(np.float32)


def _enc(f):
    """float32 -> bf16 bits (uint16), round to nearest even; NaN stays NaN"""
    f = np.asarray(f, dtype=np.float32)
    bits = f.view(np.uint32)
    rounded = ((bits + ((bits >> np.uint32(16)) & np.uint32(1)) + np.uint32(0x7FFF)) >> np.uint32(16)).astype(np.uint16)
    nan = np.isnan(f)
    if np.any(nan):
        rounded = np.where(nan, np.uint16(0x7FC0), rounded)
    return rounded


_FLOAT_BIN = {np.add, np.multiply, np.divide, np.fmod, np.subtract, np.minimum, np.maximum, np.fmin, np.fmax,
              np.less, np.greater, np.less_equal, np.greater_equal, np.equal, np.not_equal}

_orig_binary_op = _interp.InterpreterBuilder.binary_op
_orig_unary_op = _interp.InterpreterBuilder.unary_op
_orig_dot = _interp.InterpreterBuilder.create_dot
_orig_sum = _interp.ReduceOps.sum
_orig_cast_impl = _interp.InterpreterBuilder.cast_impl


def binary_op(self, lhs, rhs, op):
    if lhs.dtype.scalar == tl.bfloat16 and rhs.dtype.scalar == tl.bfloat16 and op in _FLOAT_BIN:
        out = op(_dec(lhs.data), _dec(rhs.data))
        if out.dtype == np.bool_:
            return TensorHandle(out, lhs.dtype.scalar)
        return TensorHandle(_enc(out), tl.bfloat16)
    return _orig_binary_op(self, lhs, rhs, op)


def unary_op(self, arg, op):
    if arg.dtype.scalar == tl.bfloat16:
        return TensorHandle(_enc(op(_dec(arg.data))), tl.bfloat16)
    return _orig_unary_op(self, arg, op)


def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
    if a.dtype.scalar == tl.bfloat16:
        a = TensorHandle(_dec(a.data), tl.float32)
    if b.dtype.scalar == tl.bfloat16:
        b = TensorHandle(_dec(b.data), tl.float32)
    return _orig_dot(self, a, b, d, input_precision, max_num_imprecise_acc)


def _sum(self, input):
    if input.dtype == tl.bfloat16:
        s = np.sum(_dec(input.handle.data), axis=self.axis, keepdims=self.keep_dims)
        return self.to_tensor(_enc(s), input.dtype)
    return _orig_sum(self, input)


def cast_impl(self, src, dst_type):
    # the interpreter truncates fp32->bf16; the GPU's `.to(tl.bfloat16)` rounds to nearest even
    if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
        return TensorHandle(_enc(src.data), tl.bfloat16)
    return _orig_cast_impl(self, src, dst_type)


_interp.InterpreterBuilder.binary_op = binary_op
_interp.InterpreterBuilder.unary_op = unary_op
_interp.InterpreterBuilder.create_dot = create_dot
_interp.ReduceOps.sum = _sum
_interp.InterpreterBuilder.cast_impl = cast_impl
