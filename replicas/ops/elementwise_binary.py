"""Binary element-wise kernels with XLA:CPU semantics.

Integers wrap. divide truncates toward zero, x / 0 is -1 (all bits set) and INT_MIN / -1 is
INT_MIN; remainder has the dividend's sign, x % 0 is x and INT_MIN % -1 is 0 (fmod for floats).
Shifts by an amount >= the bit width (negative amounts count as large unsigned ones) give 0, or
the sign fill for shift-right-arithmetic: numpy's shifts do exactly that. Integer power is
XLA's exponentiation by squaring over the exponent's low 6 bits; a negative exponent gives 0
except for bases 1 and -1. maximum/minimum propagate NaN. pred arithmetic is i8 arithmetic
tested against 0: add and maximum are or, multiply and minimum are and.

Known difference: when maximum/minimum compare -0.0 with +0.0 they return what numpy's SIMD loops
return (the second operand, on x86-64), where XLA:CPU returns +0.0 for maximum and -0.0 for minimum;
fixing the sign costs a pass over the data on the hot path of relu-like code, and the values compare
equal.
"""

from __future__ import annotations

import numpy as np

from replicas.hlo.ir import Instruction
from replicas.ops.elementwise_util import (
    SIGNED_OF,
    UNSIGNED_OF,
    Compute,
    elementwise_kernel,
    finish,
    float_compute,
    operand_types,
)
from replicas.ops.registry import KernelContext, kernel
from replicas.shapes import PrimitiveType

_PRED: dict[str, np.ufunc] = {
    "add": np.logical_or, "maximum": np.logical_or, "or": np.logical_or,
    "multiply": np.logical_and, "minimum": np.logical_and, "and": np.logical_and, "xor": np.logical_xor,
}
_INT_UFUNCS: dict[str, np.ufunc] = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply, "maximum": np.maximum,
    "minimum": np.minimum, "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor,
    "shift-left": np.left_shift,
}
_FLOAT_UFUNCS: dict[str, np.ufunc] = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide,
    "remainder": np.fmod, "power": np.power, "maximum": np.maximum, "minimum": np.minimum,
    "atan2": np.arctan2,
}
_COMPLEX_UFUNCS: dict[str, np.ufunc] = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide, "power": np.power,
}
_INT_SPECIAL = ("divide", "remainder", "power", "shift-right-arithmetic", "shift-right-logical", "mulhi")
_ARITHMETIC = sorted(set(_PRED) | set(_INT_UFUNCS) | set(_FLOAT_UFUNCS) | set(_INT_SPECIAL))


def _binary_type(inst: Instruction, ctx: KernelContext) -> PrimitiveType:
    lhs, rhs = operand_types(inst, ctx)
    if lhs is not rhs:
        raise inst.error(f"{inst.opcode} operands must have one element type, got {lhs.value} and {rhs.value}")
    return lhs


@elementwise_kernel(*_ARITHMETIC)
def make_binary(inst: Instruction, ctx: KernelContext) -> Compute:
    t = _binary_type(inst, ctx)
    op = inst.opcode
    table = (_PRED if t is PrimitiveType.PRED else _COMPLEX_UFUNCS if t.is_complex
             else _FLOAT_UFUNCS if t.is_floating else None)
    if table is not None:
        if op not in table:
            raise inst.error(f"{op} is not defined on {t.value}")
        if t is PrimitiveType.PRED:
            return finish(inst, table[op])
        return finish(inst, float_compute(table[op], t, 2))
    if not t.is_integral or op == "atan2":
        raise inst.error(f"{op} is not defined on {t.value}")
    if op in _INT_UFUNCS:
        return finish(inst, _INT_UFUNCS[op])
    return finish(inst, _INTEGER_KERNELS[op](t.dtype))


def _limits(dtype: np.dtype) -> tuple[bool, np.generic, np.generic]:
    info = np.iinfo(dtype)
    return info.min < 0, dtype.type(info.min), dtype.type(info.max)


def _int_divide(dtype: np.dtype) -> Compute:
    signed, int_min, _ = _limits(dtype)
    all_ones = dtype.type(-1) if signed else dtype.type(np.iinfo(dtype).max)

    def divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        zero = b == 0
        unsafe = zero | ((a == int_min) & (b == -1)) if signed else zero
        safe_b = np.where(unsafe, dtype.type(1), b)  # INT_MIN / 1 is INT_MIN, XLA's answer for INT_MIN / -1
        q = np.floor_divide(a, safe_b)
        if signed:
            # Floor to truncation: step toward zero where the division is inexact and the signs differ.
            inexact = np.multiply(q, safe_b) != a
            inexact &= (a < 0) != (safe_b < 0)
            q += inexact.astype(dtype)
        q[zero] = all_ones
        return q

    return divide


def _int_remainder(dtype: np.dtype) -> Compute:
    signed, int_min, _ = _limits(dtype)

    def remainder(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        zero = b == 0
        unsafe = zero | ((a == int_min) & (b == -1)) if signed else zero
        r = np.fmod(a, np.where(unsafe, dtype.type(1), b))  # C remainder: the dividend's sign
        np.copyto(r, a, where=zero)
        return r

    return remainder


def _int_power(dtype: np.dtype) -> Compute:
    unsigned = UNSIGNED_OF[dtype]
    signed = SIGNED_OF[dtype]
    one = dtype.type(1)
    minus_one = np.array(-1).astype(dtype)[()]

    def power(base: np.ndarray, exponent: np.ndarray) -> np.ndarray:
        # XLA unrolls 6 squaring steps: only the exponent's low 6 bits count (2**6 > any
        # exponent that does not overflow 64 bits for |base| >= 2).
        base, exponent = np.broadcast_arrays(base, exponent)
        acc = np.ones(base.shape, dtype)
        square = base.copy()
        bits = exponent.view(unsigned).copy()
        for _ in range(6):
            odd = (bits & 1).astype(np.bool_)
            np.multiply(acc, square, out=acc, where=odd)
            np.multiply(square, square, out=square)
            bits >>= 1
        negative = exponent.view(signed) < 0
        if negative.any():
            unit = (base == one) | (base == minus_one)
            acc[negative & ~unit] = 0
        return acc

    return power


def _shift_right(dtype: np.dtype, view: np.dtype) -> Compute:
    """numpy's right shift on `view` (signed: sign fill, unsigned: zero fill) of `dtype`'s bits."""
    if view == dtype:
        return np.right_shift

    def shift_right(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.right_shift(a.view(view), b.view(view)).view(dtype)

    return shift_right


def _shift_right_logical(dtype: np.dtype) -> Compute:
    return _shift_right(dtype, UNSIGNED_OF[dtype])


def _shift_right_arithmetic(dtype: np.dtype) -> Compute:
    # On unsigned types too, XLA fills with the top bit.
    return _shift_right(dtype, SIGNED_OF[dtype])


def _mulhi(dtype: np.dtype) -> Compute:
    """The high half of the double-width product."""
    bits = dtype.itemsize * 8
    signed = np.iinfo(dtype).min < 0
    if bits <= 32:
        wide = np.dtype(np.int64) if signed else np.dtype(np.uint64)

        def mulhi_narrow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
            return (np.multiply(a, b, dtype=wide) >> bits).astype(dtype)

        return mulhi_narrow
    u64 = np.dtype(np.uint64)
    low_mask, shift = np.uint64(0xFFFFFFFF), np.uint64(32)

    def mulhi_64(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        ua, ub = a.view(u64), b.view(u64)
        a_lo, a_hi, b_lo, b_hi = ua & low_mask, ua >> shift, ub & low_mask, ub >> shift
        lo_lo = a_lo * b_lo
        mid1 = a_hi * b_lo + (lo_lo >> shift)
        mid2 = a_lo * b_hi + (mid1 & low_mask)
        high = a_hi * b_hi + (mid1 >> shift) + (mid2 >> shift)
        if signed:
            # Signed high half: subtract b where a < 0 and a where b < 0 (mod 2**64).
            high -= np.where(a < 0, ub, np.uint64(0))
            high -= np.where(b < 0, ua, np.uint64(0))
        return high.view(dtype)

    return mulhi_64


_INTEGER_KERNELS = {
    "divide": _int_divide, "remainder": _int_remainder, "power": _int_power,
    "shift-right-logical": _shift_right_logical, "shift-right-arithmetic": _shift_right_arithmetic,
    "mulhi": _mulhi,
}


@kernel("complex")
def make_complex(inst: Instruction, ctx: KernelContext) -> Compute:
    t = _binary_type(inst, ctx)
    if t not in (PrimitiveType.F32, PrimitiveType.F64):
        raise inst.error(f"complex takes f32 or f64 operands, got {t.value}")
    dtype = inst.shape.dtype

    def make(real: np.ndarray, imag: np.ndarray) -> np.ndarray:
        # Not real + 1j * imag: that turns an infinite imaginary part into NaN.
        out = np.empty(np.broadcast_shapes(real.shape, imag.shape), dtype)
        out.real = real
        out.imag = imag
        return out

    return finish(inst, make)
