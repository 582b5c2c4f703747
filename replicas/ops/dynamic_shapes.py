"""get-dimension-size and set-dimension-size.

A dynamically-sized value is the numpy array cut to its dynamic size (a view of the padded
buffer), so every later op sees only the valid elements: a reduction of
`set-dimension-size(v, 5)` sums five elements, as in the document's example.
get-dimension-size reads the array's current size.

Growing a dimension again (up to its static bound) recovers the elements beyond the current size
from the padded buffer the value is a view of; when there is none (the value was computed at its
dynamic size), the new elements are zeros, which is one of the values XLA allows in padding.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from replicas.hlo.ir import Instruction
from replicas.ops.registry import KernelContext, kernel
from replicas.shapes import PrimitiveType


def _dimension(inst: Instruction, rank: int) -> int:
    dims = inst.attrs.get("dimensions")
    if dims is None or len(dims) != 1:
        raise inst.error("needs dimensions=[d]")
    d = int(dims[0])
    if not 0 <= d < rank:
        raise inst.error(f"dimension {d} out of range for rank {rank}")
    return d


@kernel("get-dimension-size")
def make_get_dimension_size(inst: Instruction, ctx: KernelContext) -> Callable[[np.ndarray], np.ndarray]:
    if len(inst.operands) != 1:
        raise inst.error(f"get-dimension-size takes 1 operand, got {len(inst.operands)}")
    (operand,) = ctx.operand_shapes(inst)
    if not operand.is_array:
        raise inst.error(f"operand must be an array, got {operand}")
    d = _dimension(inst, operand.rank)
    if not inst.shape.is_scalar or inst.shape.element_type is not PrimitiveType.S32:
        raise inst.error(f"result must be s32[], got {inst.shape}")
    int32 = np.dtype(np.int32)

    def get_dimension_size(x: np.ndarray) -> np.ndarray:
        return np.asarray(x.shape[d], int32)

    return get_dimension_size


def _grown_from_base(x: np.ndarray, d: int, size: int) -> np.ndarray | None:
    """A view of `x` extended to `size` along `d` if `x` is a prefix view of a larger buffer."""
    start = x.__array_interface__["data"][0]
    base = x.base
    while isinstance(base, np.ndarray):
        if (base.dtype == x.dtype and base.ndim == x.ndim and base.strides == x.strides
                and base.__array_interface__["data"][0] == start and base.shape[d] >= size
                and all(b == n for i, (b, n) in enumerate(zip(base.shape, x.shape)) if i != d)):
            key = tuple(slice(0, size) if i == d else slice(None) for i in range(x.ndim))
            return base[key]
        base = base.base
    return None


@kernel("set-dimension-size")
def make_set_dimension_size(inst: Instruction, ctx: KernelContext) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    if len(inst.operands) != 2:
        raise inst.error(f"set-dimension-size takes 2 operands (operand, size), got {len(inst.operands)}")
    operand, size_shape = ctx.operand_shapes(inst)
    if not operand.is_array:
        raise inst.error(f"operand must be an array, got {operand}")
    if not size_shape.is_scalar or not size_shape.element_type.is_integral:
        raise inst.error(f"size must be an integer scalar, got {size_shape}")
    d = _dimension(inst, operand.rank)
    bound = operand.dimensions[d]
    key_prefix = (slice(None),) * d

    def set_dimension_size(x: np.ndarray, size_value: np.ndarray) -> np.ndarray:
        size = int(size_value)
        if not 0 <= size <= bound:
            raise inst.error(f"dynamic size {size} is out of range [0, {bound}] for dimension {d}")
        current = x.shape[d]
        if size <= current:
            return x[(*key_prefix, slice(0, size))]
        grown = _grown_from_base(x, d, size)
        if grown is not None:
            return grown
        widths = [(0, 0)] * x.ndim
        widths[d] = (0, size - current)
        return np.pad(x, widths)

    return set_dimension_size
