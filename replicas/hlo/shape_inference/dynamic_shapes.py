"""Shape rules of get-dimension-size and set-dimension-size."""

from __future__ import annotations

from replicas.hlo.shape_inference.base import S32, Ctx, rule
from replicas.shapes import Shape


@rule("get-dimension-size")
def _get_dimension_size(c: Ctx) -> Shape:
    s = c.array(0)
    dims = c.int_list("dimensions")
    if len(dims) != 1 or not 0 <= dims[0] < s.rank:
        raise c.fail(f"dimensions {dims} must hold one dimension of the rank {s.rank} operand")
    return Shape.scalar(S32)


@rule("set-dimension-size")
def _set_dimension_size(c: Ctx) -> Shape:
    s, size = c.array(0), c.array(1, "size")
    dims = c.int_list("dimensions")
    if len(dims) != 1 or not 0 <= dims[0] < s.rank:
        raise c.fail(f"dimensions {dims} must hold one dimension of the rank {s.rank} operand")
    if not (size.is_scalar and size.element_type is S32):
        raise c.fail(f"size must be an s32 scalar, got {size}")
    dyn = list(s.dynamic) if s.dynamic else [False] * s.rank
    dyn[dims[0]] = True
    return Shape.array(s.element_type, s.dimensions, None, dyn)
