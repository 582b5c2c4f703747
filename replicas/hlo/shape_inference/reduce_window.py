"""Shape rules of reduce-window and select-and-scatter."""

from __future__ import annotations

from replicas.hlo.shape_inference.base import (
    PRED,
    Ctx,
    array_shape,
    check_scalar_computation,
    check_window,
    rule,
    tuple_or_single,
    window_output_size,
)
from replicas.hlo.shape_inference.reduce import check_reducer, split_variadic
from replicas.shapes import Shape


def _window(c: Ctx, rank: int) -> dict:
    window = c.attr("window")
    if isinstance(window, dict) and any(window.get("window_reversal") or []):
        raise c.fail("window reversal is only meaningful for convolution")
    return check_window(c, window, rank)


@rule("reduce-window")
def _reduce_window(c: Ctx) -> Shape:
    inputs, inits = split_variadic(c, "inputs")
    base = inputs[0]
    w = _window(c, base.rank)
    check_reducer(c, inputs, inits)
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
    w = _window(c, operand.rank)
    if any(d != 1 for d in w["lhs_dilate"]):
        raise c.fail("select-and-scatter does not support base dilation")
    windowed = [window_output_size(c, operand.dimensions[i], w["size"][i], w["stride"][i], tuple(w["pad"][i]),
                                   w["lhs_dilate"][i], w["rhs_dilate"][i], i) for i in range(operand.rank)]
    if list(source.dimensions) != windowed:
        raise c.fail(f"source {source} must have the windowed operand's dimensions {windowed}")
    return operand
