"""Shape rules of the ops that call computations: call, fusion, while, conditional, map, reduce,
reduce-window, select-and-scatter, sort."""

from __future__ import annotations

from replicas.hlo.shape_inference.base import (
    PRED,
    S32,
    Ctx,
    array_shape,
    check_dims_unique_in_range,
    check_param_shapes,
    check_scalar_computation,
    check_window,
    compatible,
    rule,
    same_dims,
    scalar,
    tuple_or_single,
    window_output_size,
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


def _split_variadic(c: Ctx, what: str) -> tuple[list[Shape], list[Shape]]:
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


def _check_reducer(c: Ctx, inputs: list[Shape], inits: list[Shape]) -> None:
    comp = c.computation("to_apply")
    acc = [s.element_type for s in inits]
    check_scalar_computation(c, comp, acc + [s.element_type for s in inputs], acc, "reducer", loose_from=len(acc))


@rule("reduce")
def _reduce(c: Ctx) -> Shape:
    inputs, inits = _split_variadic(c, "inputs")
    dims = c.int_list("dimensions")
    check_dims_unique_in_range(c, dims, inputs[0].rank, "dimensions")
    _check_reducer(c, inputs, inits)
    kept = [d for i, d in enumerate(inputs[0].dimensions) if i not in dims]
    return tuple_or_single([array_shape(s.element_type, kept) for s in inits])


@rule("reduce-window")
def _reduce_window(c: Ctx) -> Shape:
    inputs, inits = _split_variadic(c, "inputs")
    base = inputs[0]
    w = check_window(c, c.attr("window"), base.rank)
    _check_reducer(c, inputs, inits)
    out = [window_output_size(c, base.dimensions[i], w["size"][i], w["stride"][i], tuple(w["pad"][i]),
                              w["lhs_dilate"][i], w["rhs_dilate"][i], i) for i in range(base.rank)]
    return tuple_or_single([array_shape(s.element_type, out) for s in inits])


@rule("select-and-scatter")
def _select_and_scatter(c: Ctx) -> Shape:
    operand, source, init = c.array(0, "operand"), c.array(1, "source"), c.array(2, "init value")
    if not init.is_scalar or init.element_type is not operand.element_type:
        raise c.fail(f"init value {init} must be a scalar of the operand's element type")
    if source.element_type is not operand.element_type:
        raise c.fail(f"source {source} must have the operand's element type {operand.element_type.value}")
    t = operand.element_type
    check_scalar_computation(c, c.computation("select"), [t, t], [PRED], "select")
    check_scalar_computation(c, c.computation("scatter"), [t, t], [t], "scatter")
    w = check_window(c, c.attr("window"), operand.rank)
    windowed = [window_output_size(c, operand.dimensions[i], w["size"][i], w["stride"][i], tuple(w["pad"][i]),
                                   w["lhs_dilate"][i], w["rhs_dilate"][i], i) for i in range(operand.rank)]
    if list(source.dimensions) != windowed:
        raise c.fail(f"source {source} must have the windowed operand's dimensions {windowed}")
    return operand


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
    return tuple_or_single(list(c.operands))


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
