"""select and clamp.

select(pred, on_true, on_false): an array pred picks element-wise (np.where); a scalar pred picks
a whole operand, which may then be a tuple (no copy: values are never modified in place).
clamp(min, operand, max) is min(max(operand, min), max) with XLA's maximum/minimum, so NaN in
any argument propagates; min and max may be scalars broadcast over the operand.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replicas.hlo.ir import Instruction
from replicas.ops.elementwise_util import F32, Compute, expect_result_type, finish, is_narrow_float, sub_byte_kernel
from replicas.ops.registry import KernelContext, kernel
from replicas.shapes import PrimitiveType


@kernel("select")
def make_select(inst: Instruction, ctx: KernelContext) -> Compute:
    shapes = ctx.operand_shapes(inst)
    if len(shapes) != 3:
        raise inst.error(f"select takes 3 operands (pred, on_true, on_false), got {len(shapes)}")
    pred, on_true, on_false = shapes
    if not pred.is_array or pred.element_type is not PrimitiveType.PRED:
        raise inst.error(f"select's first operand must be a pred array, got {pred}")
    if not on_true.compatible(on_false):
        raise inst.error(f"select's branches differ: {on_true} and {on_false}")
    if not on_true.compatible(inst.shape):
        raise inst.error(f"select's branches are {on_true} but its result is {inst.shape}")
    if pred.rank == 0 and not (inst.shape.is_array and inst.shape.rank == 0):
        def pick(p: np.ndarray, t: Any, f: Any) -> Any:
            return t if p else f

        return pick
    if not on_true.is_array:
        raise inst.error(f"select with an array predicate needs array branches, got {on_true}")
    if pred.dimensions != on_true.dimensions:
        raise inst.error(f"select's predicate {pred} does not match its branches {on_true}")
    return finish(inst, np.where)


@kernel("clamp")
def make_clamp(inst: Instruction, ctx: KernelContext) -> Compute:
    sub_byte = sub_byte_kernel(inst, ctx, make_clamp)
    if sub_byte is not None:
        return sub_byte
    shapes = ctx.operand_shapes(inst)
    if len(shapes) != 3:
        raise inst.error(f"clamp takes 3 operands (min, operand, max), got {len(shapes)}")
    low, operand, high = shapes
    if not all(s.is_array for s in shapes):
        raise inst.error("clamp operands must be arrays")
    t = operand.element_type
    for s in (low, high):
        if s.element_type is not t:
            raise inst.error(f"clamp bounds must have the operand's type {t.value}, got {s}")
        if s.rank != 0 and s.dimensions != operand.dimensions:
            raise inst.error(f"clamp bound {s} must be a scalar or match the operand {operand}")
    if inst.shape.dimensions != operand.dimensions:
        raise inst.error(f"clamp's result {inst.shape} must have the operand's shape {operand}")
    expect_result_type(inst, t)
    if t.is_complex:
        raise inst.error(f"clamp is not defined on {t.value}")

    if t is PrimitiveType.PRED:
        def clamp_pred(lo: np.ndarray, x: np.ndarray, hi: np.ndarray) -> np.ndarray:
            return np.logical_and(np.logical_or(x, lo), hi)

        return finish(inst, clamp_pred)

    def clamp(lo: np.ndarray, x: np.ndarray, hi: np.ndarray) -> np.ndarray:
        r = np.maximum(x, lo)
        return np.minimum(r, hi, out=r)

    if is_narrow_float(t):
        dtype = t.dtype

        def clamp_narrow(lo: np.ndarray, x: np.ndarray, hi: np.ndarray) -> np.ndarray:
            return clamp(lo.astype(F32), x.astype(F32), hi.astype(F32)).astype(dtype)

        return finish(inst, clamp_narrow)
    # Scalar bounds broadcast against the operand, which is at least 1-d here (finish views a 0-d
    # operand as 1-d), so np.maximum returns a fresh array that `out=` may reuse.
    return finish(inst, clamp)
