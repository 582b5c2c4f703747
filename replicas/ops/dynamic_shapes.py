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


def _dimension(inst: Instruction) -> int:
    return int(inst.attrs["dimensions"][0])


@kernel("get-dimension-size")
def make_get_dimension_size(inst: Instruction, ctx: KernelContext) -> Callable[[np.ndarray], np.ndarray]:
    d = _dimension(inst)
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
    d = _dimension(inst)
    bound = ctx.operand_shapes(inst)[0].dimensions[d]
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
