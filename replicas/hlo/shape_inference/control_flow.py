"""Shape rules of the ops that call computations: call, fusion, while, conditional, map, async-*."""

from __future__ import annotations

from replicas.hlo.shape_inference.base import (
    PRED,
    S32,
    Ctx,
    array_shape,
    check_param_shapes,
    check_scalar_computation,
    compatible,
    rule,
    same_dims,
    scalar,
    second_of_start,
)
from replicas.shapes import Shape


@rule("call", "fusion")
def _call(c: Ctx) -> Shape:
    comp = c.computation("to_apply" if c.opcode == "call" else "calls")
    check_param_shapes(c, comp, c.operands, "computation")
    return comp.result_shape.without_layout()


@rule("while")
def _while(c: Ctx) -> Shape:
    state = c.operands[0]
    cond, body = c.computation("condition"), c.computation("body")
    check_param_shapes(c, cond, [state], "condition")
    check_param_shapes(c, body, [state], "body")
    if not compatible(cond.result_shape, scalar(PRED)):
        raise c.fail(f"condition {cond.name} must return pred[], returns {cond.result_shape}")
    if not compatible(body.result_shape, state):
        raise c.fail(f"body {body.name} returns {body.result_shape}, but the loop state is {state}")
    return state


@rule("conditional")
def _conditional(c: Ctx) -> Shape:
    c.count(at_least=1)
    selector = c.array(0, "branch selector")
    if "branch_computations" in c.attrs and c.attrs["branch_computations"] is not None:
        names = list(c.attrs["branch_computations"])
        if not (selector.is_scalar and selector.element_type is S32):
            raise c.fail(f"the branch index must be an s32 scalar, got {selector}")
        if not names:
            raise c.fail("needs at least one branch computation")
    else:
        names = [c.attr("true_computation"), c.attr("false_computation")]
        if not (selector.is_scalar and selector.element_type is PRED):
            raise c.fail(f"the predicate must be a pred scalar, got {selector}")
    if len(c.operands) != len(names) + 1:
        raise c.fail(f"{len(names)} branches need {len(names)} branch operands, got {len(c.operands) - 1}")
    result = None
    for i, name in enumerate(names):
        comp = c.computation_named(name, f"branch {i}")
        check_param_shapes(c, comp, [c.operands[i + 1]], f"branch {i}")
        if result is None:
            result = comp.result_shape.without_layout()
        elif not compatible(comp.result_shape, result):
            raise c.fail(f"branch {i} ({name}) returns {comp.result_shape}, but branch 0 returns {result}")
    assert result is not None
    return result


@rule("scan")
def _scan(c: Ctx) -> Shape | None:
    """Parses with its declared shape; the verifier refuses it (opcodes.py: no kernel yet)."""
    c.computation("to_apply")
    return None


@rule("map")
def _map(c: Ctx) -> Shape:
    c.count(at_least=1)
    first = c.array(0)
    for i in range(len(c.operands)):
        s = c.array(i)
        if not same_dims(s, first):
            raise c.fail(f"operand {i} {s} must have the dimensions of operand 0 {first}")
    dims = c.int_list("dimensions", list(range(first.rank)))
    if dims != list(range(first.rank)):
        raise c.fail(f"dimensions {dims} must be all the operand dimensions in order")
    comp = c.computation("to_apply")
    check_scalar_computation(c, comp, [s.element_type for s in c.operands], None, "computation")
    out = comp.result_shape
    if not (out.is_array and out.is_scalar):
        raise c.fail(f"computation {comp.name} must return a scalar, returns {out}")
    return array_shape(out.element_type, first.dimensions)


@rule("async-start")
def _async_start(c: Ctx) -> None:
    comp = c.computation("calls")
    check_param_shapes(c, comp, c.operands, "wrapped computation")
    r = c.result
    if r is not None:
        want0 = Shape.tuple(list(c.operands))
        if not r.is_tuple or len(r.tuple_shapes) < 2:
            raise c.fail(f"result must be ((operands...), result, context...), got {r}")
        if not compatible(r.tuple_shapes[0], want0) or not compatible(r.tuple_shapes[1], comp.result_shape):
            raise c.fail(f"result {r} must start with ({want0}, {comp.result_shape})")
    return None


@rule("async-update")
def _async_update(c: Ctx) -> Shape:
    return c.operands[0]


@rule("async-done")
def _async_done(c: Ctx) -> Shape:
    return second_of_start(c)
