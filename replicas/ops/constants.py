"""Parameters and constants (the values a computation starts from).

A constant's literal is returned as is on every execution, so it is made read-only once: a
consumer or a user holding the result can never change the program's constant.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from replicas.hlo.ir import Instruction
from replicas.ops.registry import KernelContext, kernel
from replicas.shapes import TOKEN, Shape


def _frozen(inst: Instruction, shape: Shape, literal: Any) -> Any:
    if shape.is_tuple:
        if not isinstance(literal, (tuple, list)) or len(literal) != len(shape.tuple_shapes):
            raise inst.error(f"literal does not match the tuple shape {shape}")
        return tuple(_frozen(inst, s, v) for s, v in zip(shape.tuple_shapes, literal))
    if shape.is_token:
        return TOKEN
    arr = np.asarray(literal)
    if arr.dtype != shape.dtype:
        arr = arr.astype(shape.dtype)
    if arr.shape != shape.dimensions:
        if arr.size == 1:
            arr = np.broadcast_to(arr.reshape(()), shape.dimensions)
        else:
            raise inst.error(f"literal has shape {list(arr.shape)}, the constant is {shape}")
    if arr.flags.writeable:
        arr = arr.copy()  # the IR's own array stays as its producer left it
        arr.flags.writeable = False
    return arr


@kernel("constant")
def make_constant(inst: Instruction, ctx: KernelContext) -> Callable[[], Any]:
    if "literal" not in inst.attrs:
        raise inst.error("missing attribute literal")
    value = _frozen(inst, inst.shape, inst.attrs["literal"])

    def constant() -> Any:
        return value

    return constant
