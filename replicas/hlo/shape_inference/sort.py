"""Shape rule of sort."""

from __future__ import annotations

from replicas.hlo.shape_inference.base import (
    PRED,
    Ctx,
    check_scalar_computation,
    rule,
    same_dims,
    tuple_or_single,
)
from replicas.shapes import Shape


@rule("sort")
def _sort(c: Ctx) -> Shape:
    c.count(at_least=1)
    first = c.array(0)
    for i in range(len(c.operands)):
        s = c.array(i)
        if not same_dims(s, first):
            raise c.fail(f"operand {i} {s} must have the dimensions of operand 0 {first}")
    dims = c.int_list("dimensions")
    if len(dims) != 1 or not 0 <= dims[0] < first.rank:
        raise c.fail(f"dimensions {dims} must hold one dimension of the rank {first.rank} operands")
    types = [t for s in c.operands for t in (s.element_type, s.element_type)]
    check_scalar_computation(c, c.computation("to_apply"), types, [PRED], "comparator")
    if len(c.operands) == 1 and c.result is not None and c.result.is_tuple:
        return Shape.tuple(list(c.operands))  # a one-operand sort may also declare a tuple of one
    return tuple_or_single(list(c.operands))
