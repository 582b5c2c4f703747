"""Shape rules of cholesky and triangular-solve."""

from __future__ import annotations

from replicas.hlo.shape_inference.base import (
    Ctx,
    rule,
)
from replicas.shapes import Shape


def _check_matrix(c: Ctx, s: Shape, what: str) -> None:
    if s.rank < 2:
        raise c.fail(f"{what} {s} must have rank at least 2")
    if not (s.element_type.is_floating or s.element_type.is_complex):
        raise c.fail(f"{what} {s} must be floating-point or complex")


@rule("cholesky")
def _cholesky(c: Ctx) -> Shape:
    a = c.array(0, "a")
    _check_matrix(c, a, "a")
    if a.dimensions[-1] != a.dimensions[-2]:
        raise c.fail(f"a {a} must be square in its two minor dimensions")
    return a


@rule("triangular-solve")
def _triangular_solve(c: Ctx) -> Shape:
    a, b = c.array(0, "a"), c.array(1, "b")
    _check_matrix(c, a, "a")
    _check_matrix(c, b, "b")
    if a.element_type is not b.element_type:
        raise c.fail(f"a {a} and b {b} must have the same element type")
    if a.rank != b.rank or a.dimensions[:-2] != b.dimensions[:-2]:
        raise c.fail(f"a {a} and b {b} must have the same batch dimensions")
    if a.dimensions[-1] != a.dimensions[-2]:
        raise c.fail(f"a {a} must be square in its two minor dimensions")
    left = bool(c.attr("left_side", False))
    shared = b.dimensions[-2] if left else b.dimensions[-1]
    if shared != a.dimensions[-1]:
        side = "rows" if left else "columns"
        raise c.fail(f"b {b} must have {a.dimensions[-1]} {side} to match a {a} (left_side={left})")
    transpose = c.attr("transpose_a", "NO_TRANSPOSE")
    if transpose not in ("NO_TRANSPOSE", "TRANSPOSE", "ADJOINT"):
        raise c.fail(f"transpose_a must be NO_TRANSPOSE, TRANSPOSE or ADJOINT, got {transpose!r}")
    return b
