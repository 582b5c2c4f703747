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
    """The literal as read-only arrays of the shape (the verifier checked that it has the shape)."""
    if shape.is_tuple:
        return tuple(_frozen(inst, s, v) for s, v in zip(shape.tuple_shapes, literal))
    if shape.is_token:
        return TOKEN
    arr = np.asarray(literal)
    if arr.dtype != shape.dtype:
        arr = arr.astype(shape.dtype)
    if arr.flags.writeable:
        arr = arr.copy()  # the IR's own array stays as its producer left it
        arr.flags.writeable = False
    return arr


@kernel("constant")
def make_constant(inst: Instruction, ctx: KernelContext) -> Callable[[], Any]:
    if inst.attrs.get("literal") is None:  # the verifier checks shapes of IR without data too
        raise inst.error("missing attribute literal")
    value = _frozen(inst, inst.shape, inst.attrs["literal"])

    def constant() -> Any:
        return value

    return constant
