"""select and clamp.

select(pred, on_true, on_false): an array pred picks element-wise (np.where, or the operands' bits
under a mask for large arrays); a scalar pred picks a whole operand, which may then be a tuple (no
copy: values are never modified in place).
clamp(min, operand, max) is min(max(operand, min), max) with XLA's maximum/minimum, so NaN in
any argument propagates; min and max may be scalars broadcast over the operand.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replicas.hlo.ir import Instruction
from replicas.ops.elementwise_util import F32, Compute, elementwise_kernel, finish, is_narrow_float
from replicas.ops.registry import KernelContext, kernel
from replicas.shapes import PrimitiveType


@kernel("select")
def make_select(inst: Instruction, ctx: KernelContext) -> Compute:
    pred = ctx.operand_shapes(inst)[0]
    if pred.rank == 0 and not (inst.shape.is_array and inst.shape.rank == 0):
        def pick(p: np.ndarray, t: Any, f: Any) -> Any:
            return t if p else f

        return pick
    unsigned = _SAME_SIZE_UNSIGNED.get(inst.shape.dtype.itemsize) if inst.shape.is_array else None
    if unsigned is None:
        return finish(inst, np.where)

    def select(p: np.ndarray, t: np.ndarray, f: np.ndarray) -> np.ndarray:
        if t.size < BITWISE_SELECT_MIN or not p.shape == t.shape == f.shape or t.dtype != f.dtype:
            return np.where(p, t, f)
        return _bitwise_select(p, t, f, unsigned)

    return finish(inst, select)


# np.where branches per element on large arrays (a random predicate mispredicts half of them);
# picking bits with a mask is a few branch-free passes. Below this many elements the extra ufunc
# calls cost more than they save.
BITWISE_SELECT_MIN = 8192
_SAME_SIZE_UNSIGNED = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32),
                       8: np.dtype(np.uint64)}


def _bitwise_select(p: np.ndarray, t: np.ndarray, f: np.ndarray, unsigned: np.dtype) -> np.ndarray:
    """`np.where(p, t, f)` exactly (every bit: NaN payloads, -0), as f ^ ((t ^ f) & mask) on the
    operands' bits, with mask all ones where p is true."""
    tb, fb = t.view(unsigned), f.view(unsigned)
    mask = np.subtract(unsigned.type(0), p.view(np.uint8), dtype=unsigned)  # 0 - 1 wraps to all ones
    bits = np.bitwise_xor(tb, fb)
    np.bitwise_and(bits, mask, out=bits)
    np.bitwise_xor(bits, fb, out=bits)
    return bits.view(t.dtype)


@elementwise_kernel("clamp")
def make_clamp(inst: Instruction, ctx: KernelContext) -> Compute:
    t = ctx.operand_shapes(inst)[1].element_type
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
