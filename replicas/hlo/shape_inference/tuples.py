"""Shape rules of tuples, tokens and pass-through ops: tuple, get-tuple-element, after-all, add-dependency,
opt-barrier, domain, copy-start/copy-done."""

from __future__ import annotations

from replicas.hlo.shape_inference.base import (
    U32,
    Ctx,
    rule,
    scalar,
    second_of_start,
)
from replicas.shapes import Shape


@rule("copy-start")
def _copy_start(c: Ctx) -> Shape | None:
    s = c.operands[0]
    return None if c.result is not None else Shape.tuple([s, s, scalar(U32)])


@rule("copy-done")
def _copy_done(c: Ctx) -> Shape:
    return second_of_start(c)


@rule("after-all")
def _after_all(c: Ctx) -> Shape:
    # XLA takes any operands (a token after a value orders the two, as add-dependency does).
    return Shape.token()


@rule("add-dependency")
def _add_dependency(c: Ctx) -> Shape:
    c.token(1, "operand 1 (the token)")
    return c.operands[0]


@rule("opt-barrier", "domain")
def _identity(c: Ctx) -> Shape:
    return c.operands[0]


@rule("tuple")
def _tuple(c: Ctx) -> Shape:
    return Shape.tuple(list(c.operands))


@rule("get-tuple-element")
def _gte(c: Ctx) -> Shape:
    s = c.operands[0]
    if not s.is_tuple:
        raise c.fail(f"operand must be a tuple, got {s}")
    i = c.attr("index")
    if not isinstance(i, int) or not 0 <= i < len(s.tuple_shapes):
        raise c.fail(f"index {i} out of range for a {len(s.tuple_shapes)}-element tuple {s}")
    return s.tuple_shapes[i]
