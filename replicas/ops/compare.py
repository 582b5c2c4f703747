"""compare: comparison_direction EQ/NE/GE/GT/LE/LT with an optional comparison type.

FLOAT (and PARTIALORDER) compare as IEEE: NaN is unordered, -0.0 == +0.0. TOTALORDER orders
-NaN < -Inf < ... < -0.0 < +0.0 < ... < +Inf < +NaN: the float's bits, with the magnitude bits
flipped for negative numbers, compare as signed integers (one whole-array bit trick). SIGNED and
Integers must use their own SIGNED/UNSIGNED type (pred is UNSIGNED), as XLA's verifier demands.
Complex values compare only for EQ/NE.
"""

from __future__ import annotations

import numpy as np

from replicas.hlo.ir import Instruction
from replicas.ops.elementwise_util import (
    F32,
    INT_OF_WIDTH,
    Compute,
    elementwise_kernel,
    finish,
    is_narrow_float,
    native_loop,
    operand_types,
)
from replicas.ops.registry import KernelContext

_DIRECTIONS: dict[str, np.ufunc] = {
    "EQ": np.equal, "NE": np.not_equal, "GE": np.greater_equal, "GT": np.greater,
    "LE": np.less_equal, "LT": np.less,
}
_TYPES = ("FLOAT", "TOTALORDER", "PARTIALORDER", "SIGNED", "UNSIGNED")


def total_order_keys(x: np.ndarray) -> np.ndarray:
    """Signed integers that order like the floats `x` under IEEE totalOrder."""
    itype = INT_OF_WIDTH[x.dtype.itemsize]
    bits = x.view(itype)
    flip = np.right_shift(bits, itype.itemsize * 8 - 1)  # -1 for negative floats, else 0
    flip &= np.iinfo(itype).max
    return np.bitwise_xor(bits, flip, out=flip)


@elementwise_kernel("compare")
def make_compare(inst: Instruction, ctx: KernelContext) -> Compute:
    t = operand_types(inst, ctx)[0]
    direction = inst.attrs["comparison_direction"]
    ufunc = _DIRECTIONS[direction]
    kind = inst.attrs.get("type")

    if t.is_floating:
        if kind == "TOTALORDER":
            def total_order(a: np.ndarray, b: np.ndarray) -> np.ndarray:
                return ufunc(total_order_keys(a), total_order_keys(b))

            return finish(inst, total_order)
        if is_narrow_float(t) and not native_loop(ufunc, t.dtype, 2, np.dtype(np.bool_)):
            return finish(inst, lambda a, b: ufunc(a.astype(F32), b.astype(F32)))
        return finish(inst, ufunc)

    return finish(inst, ufunc)  # integers, pred, and complex (EQ, NE only: the shape rule says so)
