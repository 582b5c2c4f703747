"""convert, bitcast-convert and reduce-precision, as XLA:CPU does them.

convert: integers wrap to narrower integers; floats to integers truncate toward zero, saturate
out-of-range values to the type's min/max and give 0 for NaN; anything to pred is x != 0 (NaN is
true; complex looks at the real part); complex to real keeps the real part. f64 to an f8 type
rounds once (through f32 with round-to-odd), while f64 to bf16 goes through f32 as XLA does.

bitcast-convert reinterprets bytes (little-endian, as XLA:CPU): the same width is a view; a
narrower result type adds a minor dimension of size ratio, a wider one removes the last
dimension, which must have that size.

reduce-precision is XLA's ReducePrecision on the float's bits: round to nearest even at the
mantissa width, then flush exponents below the reduced range to signed zero and above it to
signed infinity; NaN stays NaN.
"""

from __future__ import annotations

import sys

import numpy as np

from replicas.hlo.ir import Instruction
from replicas.ops.elementwise_util import (
    F32,
    F64,
    SUB_BYTE_WIDE,
    Compute,
    finish,
    is_narrow_float,
    operand_types,
    real_dtype_of,
)
from replicas.ops.registry import KernelContext, kernel
from replicas.shapes import PrimitiveType

_U32 = np.dtype(np.uint32)
_BLOCK = 1 << 16  # elements per block of a float -> int conversion (fits in L2 cache)


@kernel("convert")
def make_convert(inst: Instruction, ctx: KernelContext) -> Compute:
    (src,) = operand_types(inst, ctx)
    dst = inst.shape.element_type
    if src is dst:
        return lambda x: x
    if src in SUB_BYTE_WIDE:
        # An 8-bit integer holds every sub-byte value exactly: convert from there.
        wide_src = SUB_BYTE_WIDE[src].dtype
        from_wide = _converter(inst, SUB_BYTE_WIDE[src], dst)
        return finish(inst, lambda x: from_wide(x.astype(wide_src)))
    return finish(inst, _converter(inst, src, dst))


def _converter(inst: Instruction, src: PrimitiveType, dst: PrimitiveType) -> Compute:
    if src is dst:
        return lambda x: x
    dst_dtype = dst.dtype
    real_part = src.is_complex and not dst.is_complex
    if dst is PrimitiveType.PRED:
        if src.is_complex:
            return lambda x: x.real != 0
        if is_narrow_float(src):
            return lambda x: x.astype(F32) != 0
        return lambda x: x != 0
    real = PrimitiveType.from_dtype(real_dtype_of(src.dtype)) if real_part else src
    if real.is_floating and dst.is_integral:
        to_int = _float_to_int(dst, real)
        if real_part:
            return lambda x: to_int(x.real)
        return to_int
    if dst in SUB_BYTE_WIDE:
        # Integers wrap: through 8 bits, whose wrap-around includes the sub-byte one.
        wide = SUB_BYTE_WIDE[dst].dtype
        return lambda x: x.astype(wide).astype(dst_dtype)
    if real is PrimitiveType.F64 and dst.is_floating and dst.bit_width <= 8:
        if real_part:
            return lambda x: _f64_to_f8(x.real, dst_dtype)
        return lambda x: _f64_to_f8(x, dst_dtype)
    if real_part:
        return lambda x: x.real.astype(dst_dtype)
    return lambda x: x.astype(dst_dtype)


def _float_to_int(dst: PrimitiveType, src: PrimitiveType) -> Compute:
    bits = dst.bit_width
    signed = dst.is_signed_integral
    out = dst.dtype
    wide_out = SUB_BYTE_WIDE.get(dst, dst).dtype
    wide = F32 if is_narrow_float(src) else src.dtype
    # Bounds as floats of the source type (powers of two are exact): x >= high saturates to max,
    # x < low to min; anything in between truncates into range.
    high = wide.type(2.0 ** (bits - 1 if signed else bits))
    low = wide.type(-(2.0 ** (bits - 1)) if signed else 0.0)
    int_max = wide_out.type((1 << (bits - 1 if signed else bits)) - 1)
    int_min = wide_out.type(-(1 << (bits - 1)) if signed else 0)

    def fix_range(x: np.ndarray, r: np.ndarray) -> None:
        if x.size and not (np.min(x) >= low and np.max(x) < high):  # NaN fails both tests
            np.copyto(r, int_max, where=x >= high)
            np.copyto(r, int_min, where=x < low)
            np.copyto(r, 0, where=np.isnan(x))

    def to_int(x: np.ndarray) -> np.ndarray:
        if x.dtype != wide:
            x = x.astype(wide)
        r = np.empty(x.shape, wide_out)
        if x.size <= _BLOCK:
            np.copyto(r, x, casting="unsafe")
            fix_range(x, r)
        else:
            # Block by block, so the range check reads the block from cache, not memory.
            flat_x, flat_r = x.reshape(-1), r.reshape(-1)
            for start in range(0, flat_x.size, _BLOCK):
                block_x, block_r = flat_x[start:start + _BLOCK], flat_r[start:start + _BLOCK]
                np.copyto(block_r, block_x, casting="unsafe")
                fix_range(block_x, block_r)
        return r if wide_out == out else r.astype(out)

    return to_int


def _f64_to_f8(x: np.ndarray, dst: np.dtype) -> np.ndarray:
    """Round f64 to an f8 type once: f32 rounded to odd keeps enough bits for the second rounding."""
    y = x.astype(F32)
    inexact = y.astype(F64) != x
    inexact &= np.isfinite(y)
    bits = y.view(_U32)
    bits |= inexact.astype(_U32)
    return y.astype(dst)


@kernel("bitcast-convert")
def make_bitcast_convert(inst: Instruction, ctx: KernelContext) -> Compute:
    (src,) = operand_types(inst, ctx)
    dst = inst.shape.element_type
    if sys.byteorder != "little":
        raise inst.error("bitcast-convert needs a little-endian host (XLA:CPU's byte order)")
    src_dtype, dst_dtype = src.dtype, dst.dtype
    src_width, dst_width = src_dtype.itemsize, dst_dtype.itemsize
    if src_width == dst_width:
        return lambda x: x.view(dst_dtype)
    if dst_width < src_width:

        def split(x: np.ndarray) -> np.ndarray:
            return np.ascontiguousarray(x.reshape(x.shape + (1,))).view(dst_dtype)

        return split

    def join(x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x).view(dst_dtype).reshape(x.shape[:-1])

    return join


# (exponent bits, mantissa bits, unsigned view) of the formats reduce-precision works on in place.
_FLOAT_BITS = {
    PrimitiveType.F16: (5, 10, np.dtype(np.uint16)), PrimitiveType.BF16: (8, 7, np.dtype(np.uint16)),
    PrimitiveType.F32: (8, 23, np.dtype(np.uint32)), PrimitiveType.F64: (11, 52, np.dtype(np.uint64)),
}


@kernel("reduce-precision")
def make_reduce_precision(inst: Instruction, ctx: KernelContext) -> Compute:
    (t,) = operand_types(inst, ctx)
    exponent_bits = int(inst.attrs["exponent_bits"])
    mantissa_bits = int(inst.attrs["mantissa_bits"])
    if t in _FLOAT_BITS:
        compute = _reduce_precision(t, exponent_bits, mantissa_bits)
        return finish(inst, compute) if compute is not _IDENTITY else compute
    dtype = t.dtype
    in_f32 = _reduce_precision(PrimitiveType.F32, exponent_bits, mantissa_bits)
    return finish(inst, lambda x: in_f32(x.astype(F32)).astype(dtype))


def _IDENTITY(x: np.ndarray) -> np.ndarray:
    return x


def _reduce_precision(t: PrimitiveType, exponent_bits: int, mantissa_bits: int) -> Compute:
    src_exponent_bits, src_mantissa_bits, udt = _FLOAT_BITS[t]
    dtype = t.dtype
    nbits = udt.itemsize * 8
    u = udt.type
    sign_mask = u(1 << (nbits - 1))
    exp_mask = u(((1 << src_exponent_bits) - 1) << src_mantissa_bits)
    round_mantissa = mantissa_bits < src_mantissa_bits
    if round_mantissa:
        shift = src_mantissa_bits - mantissa_bits
        last_bit = u(1 << shift)
        base_bias = u((1 << (shift - 1)) - 1)
        truncation_mask = u(((1 << nbits) - 1) & ~((1 << shift) - 1))
        shift_u = u(shift)
    reduce_exponent = exponent_bits < src_exponent_bits
    if not (round_mantissa or reduce_exponent):
        return _IDENTITY
    if reduce_exponent:
        bias = (1 << (src_exponent_bits - 1)) - 1
        reduced_bias = (1 << (exponent_bits - 1)) - 1
        max_exponent = u((bias + reduced_bias) << src_mantissa_bits)
        min_exponent = u((bias - reduced_bias) << src_mantissa_bits)

    def reduce_precision(x: np.ndarray) -> np.ndarray:
        bits = x.view(udt)
        is_nan = (bits & ~sign_mask) > exp_mask
        if round_mantissa:
            rounding = (bits & last_bit) >> shift_u
            rounding += base_bias
            bits = bits + rounding
            bits &= truncation_mask
        if reduce_exponent:
            exponent = bits & exp_mask
            signed_zero = bits & sign_mask
            bits = np.where(exponent > max_exponent, signed_zero | exp_mask, bits)
            bits = np.where(exponent <= min_exponent, signed_zero, bits)
        result = bits.view(dtype)
        np.copyto(result, x, where=is_nan)
        return result

    return reduce_precision
