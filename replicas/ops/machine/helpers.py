"""The helpers a machine-code loop (`ops.machine.loops`) calls: numba functions with the Python code's bits.

Imported only when a loop is compiled (it imports numba). Each helper does in machine code what the
per-element Python code (`ops.element_ops`, `ops.python_elements`) does with Python numbers:
rounding to f32 through a C float, bitcasts through struct's packing (a C cast of the double, as
`PyFloat_Pack4`), IEEE division by zero, and the numpy kernel of an op without a Python form called
through the very loop numpy runs (`call_loop`: the ufunc's inner loop for those types), so every
result keeps the numpy kernels' bits.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core.extending import intrinsic

from replicas.ops.element_ops import DEFAULT_NAN, SignalingNaN

_ALWAYS = {"nogil": True, "cache": True, "error_model": "numpy"}


@intrinsic
def _ufunc_loop(typingctx, fn, args, dims, steps, data):  # noqa: ARG001 - numba's intrinsic signature
    """Call numpy's inner loop at address `fn` (`void (char **, npy_intp *, npy_intp *, void *)`)."""
    sig = types.void(types.intp, types.intp, types.intp, types.intp, types.intp)

    def codegen(context, builder, signature, llargs):  # noqa: ARG001
        pointer = ir.IntType(8).as_pointer()
        fnty = ir.FunctionType(ir.VoidType(), [pointer] * 4)
        callee = builder.inttoptr(llargs[0], fnty.as_pointer())
        builder.call(callee, [builder.inttoptr(v, pointer) for v in llargs[1:]])
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _f32_bits(typingctx, x):  # noqa: ARG001
    """The f32 whose bits are the low 32 of the integer `x`, as a float64."""
    sig = types.float64(types.int64)

    def codegen(context, builder, signature, llargs):  # noqa: ARG001
        narrow = builder.bitcast(builder.trunc(llargs[0], ir.IntType(32)), ir.FloatType())
        return builder.fpext(narrow, ir.DoubleType())

    return sig, codegen


@intrinsic
def _bits_of_f32(typingctx, x):  # noqa: ARG001
    """The bits of the float64 `x` cast to f32 (as struct's "f" packing), as an unsigned 32-bit integer."""
    sig = types.int64(types.float64)

    def codegen(context, builder, signature, llargs):  # noqa: ARG001
        bits = builder.bitcast(builder.fptrunc(llargs[0], ir.FloatType()), ir.IntType(32))
        return builder.zext(bits, ir.IntType(64))

    return sig, codegen


@intrinsic
def _f64_bits(typingctx, x):  # noqa: ARG001
    sig = types.float64(types.int64)

    def codegen(context, builder, signature, llargs):  # noqa: ARG001
        return builder.bitcast(llargs[0], ir.DoubleType())

    return sig, codegen


@intrinsic
def _bits_of_f64(typingctx, x):  # noqa: ARG001
    sig = types.int64(types.float64)

    def codegen(context, builder, signature, llargs):  # noqa: ARG001
        return builder.bitcast(llargs[0], ir.IntType(64))

    return sig, codegen


@intrinsic
def _round_f32(typingctx, x):  # noqa: ARG001
    """`x` rounded to f32 (a C float, as `array("f")` stores it) and widened back."""
    sig = types.float64(types.float64)

    def codegen(context, builder, signature, llargs):  # noqa: ARG001
        return builder.fpext(builder.fptrunc(llargs[0], ir.FloatType()), ir.DoubleType())

    return sig, codegen


@njit(**_ALWAYS)
def r32(x):
    return _round_f32(x)


@njit(**_ALWAYS)
def signaling():
    raise SignalingNaN


@njit(**_ALWAYS)
def u32_to_f32(x):
    # struct's unpack keeps an f32 signaling NaN's bits only until Python widens it: such bits leave
    # the compiled code for the numpy kernels, as the Python code's do.
    if (x & 0x7FC00000) == 0x7F800000 and x & 0x3FFFFF:
        raise SignalingNaN
    return _f32_bits(x)


@njit(**_ALWAYS)
def f32_to_u32(x):
    return _bits_of_f32(x)


@njit(**_ALWAYS)
def f32_to_s32(x):
    b = _bits_of_f32(x)
    return b - (1 << 32) if b >= (1 << 31) else b


@njit(**_ALWAYS)
def s64_to_f64(x):
    return _f64_bits(x)


@njit(**_ALWAYS)
def f64_to_s64(x):
    return _bits_of_f64(x)


@njit(**_ALWAYS)
def divide_by_zero(a, b):
    """IEEE's x / 0 (`element_ops.divide_by_zero`)."""
    if a != a:
        return a
    if a == 0:
        return DEFAULT_NAN
    return math.copysign(math.inf, a) * math.copysign(1.0, b)


@njit(**_ALWAYS)
def check_f32(a):
    """Raise SignalingNaN if the f32 array `a` holds a signaling NaN (`python_elements._check_f32`)."""
    bits = a.view(np.uint32)
    for i in range(bits.size):
        if (bits[i] & 0x7FC00000) == 0x7F800000 and bits[i] & 0x3FFFFF:
            raise SignalingNaN


@njit(**_ALWAYS)
def call1(fn, data, a, out, scratch):
    """numpy's inner loop `fn` (of one operand) over the contiguous arrays `a` -> `out`; `scratch`:
    intp[8] for the loop's argument pointers, length and strides."""
    scratch[0] = a.ctypes.data
    scratch[1] = out.ctypes.data
    scratch[3] = out.size
    scratch[4] = a.itemsize
    scratch[5] = out.itemsize
    _ufunc_loop(fn, scratch.ctypes.data, scratch[3:].ctypes.data, scratch[4:].ctypes.data, data)


@njit(**_ALWAYS)
def call2(fn, data, a, b, out, scratch):
    """`call1` for a loop of two operands."""
    scratch[0] = a.ctypes.data
    scratch[1] = b.ctypes.data
    scratch[2] = out.ctypes.data
    scratch[3] = out.size
    scratch[4] = a.itemsize
    scratch[5] = b.itemsize
    scratch[6] = out.itemsize
    _ufunc_loop(fn, scratch.ctypes.data, scratch[3:].ctypes.data, scratch[4:].ctypes.data, data)
