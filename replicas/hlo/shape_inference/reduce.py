"""Shape rule of reduce, and the variadic operand/init split shared with reduce-window."""

from __future__ import annotations

from replicas.hlo.shape_inference.base import (
    Ctx,
    array_shape,
    check_dims_unique_in_range,
    check_scalar_computation,
    rule,
    same_dims,
    tuple_or_single,
)
from replicas.shapes import Shape


def split_variadic(c: Ctx, what: str) -> tuple[list[Shape], list[Shape]]:
    n = len(c.operands)
    if n < 2 or n % 2:
        raise c.fail(f"expects N {what} followed by N init values, got {n} operands")
    inputs, inits = c.operands[: n // 2], c.operands[n // 2:]
    for i, s in enumerate(inputs):
        if not s.is_array:
            raise c.fail(f"input {i} must be an array, got {s}")
        if not same_dims(s, inputs[0]):
            raise c.fail(f"input {i} {s} must have the dimensions of input 0 {inputs[0]}")
    for i, s in enumerate(inits):
        if not (s.is_array and s.is_scalar):
            raise c.fail(f"init value {i} must be a scalar, got {s}")
    return inputs, inits


def check_reducer(c: Ctx, inputs: list[Shape], inits: list[Shape]) -> None:
    comp = c.computation("to_apply")
    acc = [s.element_type for s in inits]
    check_scalar_computation(c, comp, acc + [s.element_type for s in inputs], acc, "reducer", loose_from=len(acc))


@rule("reduce")
def _reduce(c: Ctx) -> Shape:
    inputs, inits = split_variadic(c, "inputs")
    dims = c.int_list("dimensions")
    check_dims_unique_in_range(c, dims, inputs[0].rank, "dimensions")
    check_reducer(c, inputs, inits)
    kept = [d for i, d in enumerate(inputs[0].dimensions) if i not in dims]
    return tuple_or_single([array_shape(s.element_type, kept) for s in inits])
