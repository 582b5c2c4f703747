"""stochastic-convert: a float to a signed integer, rounded up or down at random.

XLA's own expansion (`stochastic_convert_decomposer.cc`), step for step: the fractional part of
|x|, scaled by 2^bits of the random operand's type, is compared with the random value; the
magnitude rounds up when the random value is smaller. Values at or beyond the integer type's
range give its min / max.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from replicas.hlo.ir import Instruction
from replicas.ops.convert import _converter
from replicas.ops.registry import KernelContext, kernel
from replicas.shapes import PrimitiveType


@kernel("stochastic-convert")
def make_stochastic_convert(inst: Instruction, ctx: KernelContext) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    operand, random = ctx.operand_shapes(inst)
    # The verifier checked float to signed integer with unsigned random bits of the operand's shape and width.
    src, dst, rnd = operand.element_type, inst.shape.element_type, random.element_type
    fraction_type = PrimitiveType.F32 if src is PrimitiveType.F16 else src
    to_random = _converter(inst, fraction_type, rnd)
    to_int = _converter(inst, src, dst)
    scale = fraction_type.dtype.type(2.0 ** rnd.bit_width)
    bits = dst.bit_width
    low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    low_f, high_f = src.dtype.type(low), src.dtype.type(high)
    out = dst.dtype

    def stochastic_convert(x: np.ndarray, r: np.ndarray) -> np.ndarray:
        magnitude = np.abs(x)
        whole = np.floor(magnitude)
        fraction = (magnitude - whole).astype(fraction_type.dtype, copy=False)
        round_up = r < to_random(fraction * scale)
        result = to_int(whole)
        result = np.where(round_up, result + out.type(1), result)
        result = np.where(x < 0, -result, result)  # sign(x) < 0; NaN is not negative
        result = np.where(x <= low_f, out.type(low), result)
        return np.where(x >= high_f, out.type(high), result).astype(out, copy=False)

    return stochastic_convert
