"""dynamic-reshape: a reshape whose result dimensions are given at run time by scalar operands.

Dynamically-sized values are numpy arrays of their current size (see dynamic_shapes.py), so the
result is the operand reshaped to the given sizes, each within the result's static bound.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from replicas.hlo.ir import Instruction
from replicas.ops.registry import KernelContext, kernel


@kernel("dynamic-reshape")
def make_dynamic_reshape(inst: Instruction, ctx: KernelContext) -> Callable[..., np.ndarray]:
    result = inst.shape  # the verifier checked the operand and one integer scalar per dimension
    bounds = result.dimensions

    def dynamic_reshape(x: np.ndarray, *size_values: np.ndarray) -> np.ndarray:
        dims = tuple(int(s) for s in size_values)
        if any(not 0 <= d <= b for d, b in zip(dims, bounds)) or int(np.prod(dims)) != x.size:
            raise inst.error(f"dynamic-reshape of {x.size} elements ({list(x.shape)}) to "
                               f"sizes {list(dims)} within {result}")
        return x.reshape(dims)

    return dynamic_reshape
