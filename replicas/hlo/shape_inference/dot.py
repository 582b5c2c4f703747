"""Shape rule of dot (dot_general), and the operand/result type rules shared with convolution."""

from __future__ import annotations

from replicas.hlo.shape_inference.base import (
    Ctx,
    array_shape,
    check_dims_unique_in_range,
    rule,
)
from replicas.shapes import PrimitiveType, Shape


def operand_types_agree(a: PrimitiveType, b: PrimitiveType) -> bool:
    # XLA compares dot/convolution operand types ignoring floating-point precision.
    return a is b or (a.is_floating and b.is_floating)


def result_type(c: Ctx, lhs: Shape) -> PrimitiveType:
    # The result element type may differ from the operands' (preferred_element_type); the
    # instruction's declared type then decides.
    if c.result is not None and c.result.is_array:
        return c.result.element_type
    return lhs.element_type


@rule("dot")
def _dot(c: Ctx) -> Shape:
    lhs, rhs = c.array(0, "lhs"), c.array(1, "rhs")
    if not operand_types_agree(lhs.element_type, rhs.element_type):
        raise c.fail(f"lhs {lhs} and rhs {rhs} must have the same element type")
    lb, rb = c.int_list("lhs_batch_dims", []), c.int_list("rhs_batch_dims", [])
    lc, rc = c.int_list("lhs_contracting_dims", []), c.int_list("rhs_contracting_dims", [])
    if len(lb) != len(rb):
        raise c.fail(f"lhs_batch_dims {lb} and rhs_batch_dims {rb} must have the same length")
    if len(lc) != len(rc):
        raise c.fail(f"lhs_contracting_dims {lc} and rhs_contracting_dims {rc} must have the same length")
    check_dims_unique_in_range(c, lb + lc, lhs.rank, "lhs batch and contracting dimensions")
    check_dims_unique_in_range(c, rb + rc, rhs.rank, "rhs batch and contracting dimensions")
    for a, b in zip(lb, rb):
        if lhs.dimensions[a] != rhs.dimensions[b]:
            raise c.fail(f"batch dimension sizes differ: lhs dimension {a} is {lhs.dimensions[a]}, "
                         f"rhs dimension {b} is {rhs.dimensions[b]}")
    for a, b in zip(lc, rc):
        if lhs.dimensions[a] != rhs.dimensions[b]:
            raise c.fail(f"contracting dimension sizes differ: lhs dimension {a} is {lhs.dimensions[a]}, "
                         f"rhs dimension {b} is {rhs.dimensions[b]}")
    # Result dimension order: batch, then lhs free dimensions, then rhs free dimensions.
    dims = [lhs.dimensions[a] for a in lb]
    dims += [d for i, d in enumerate(lhs.dimensions) if i not in lb and i not in lc]
    dims += [d for i, d in enumerate(rhs.dimensions) if i not in rb and i not in rc]
    return array_shape(result_type(c, lhs), dims)
