"""Shape rule of topk (XLA's TopK: the k largest or smallest along the last dimension, and their indices)."""

from __future__ import annotations

from replicas.hlo.shape_inference.base import (
    S32,
    Ctx,
    array_shape,
    rule,
)
from replicas.shapes import Shape


@rule("topk")
def _topk(c: Ctx) -> Shape:
    s = c.array(0)
    k = int(c.attr("k"))
    if s.rank < 1:
        raise c.fail(f"operand {s} must have at least one dimension")
    if not 0 <= k <= s.dimensions[-1]:
        raise c.fail(f"k={k} must be between 0 and the size of the last dimension of {s}")
    dims = list(s.dimensions[:-1]) + [k]
    return Shape.tuple([array_shape(s.element_type, dims), array_shape(S32, dims)])
