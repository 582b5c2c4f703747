"""Shape rules of select and clamp."""

from __future__ import annotations

from replicas.hlo.shape_inference.base import PRED, Ctx, rule, same_dims
from replicas.shapes import Shape


@rule("select")
def _select(c: Ctx) -> Shape:
    pred, on_true, on_false = c.array(0, "pred"), c.operands[1], c.operands[2]
    if pred.element_type is not PRED:
        raise c.fail(f"the predicate must have element type pred, got {pred}")
    if not on_true.compatible(on_false):
        raise c.fail(f"on_true {on_true} and on_false {on_false} must have the same shape")
    if not on_true.is_array and not pred.is_scalar:  # a scalar predicate picks a whole tuple
        raise c.fail(f"selecting tuples {on_true} takes a scalar predicate, got {pred}")
    if not pred.is_scalar and not same_dims(pred, on_true):
        raise c.fail(f"the predicate {pred} must have the dimensions of on_true {on_true} (or be a scalar)")
    return on_true


@rule("clamp")
def _clamp(c: Ctx) -> Shape:
    lo, x, hi = c.array(0, "min"), c.array(1, "operand"), c.array(2, "max")
    for what, s in (("min", lo), ("max", hi)):
        if s.element_type is not x.element_type:
            raise c.fail(f"{what} {s} and operand {x} must have the same element type")
        if not s.is_scalar and not same_dims(s, x):
            raise c.fail(f"{what} {s} must be a scalar or have the operand's dimensions {x}")
    if x.element_type.is_complex:
        raise c.fail(f"is not defined on {x.element_type.value} (complex numbers have no order)")
    return x
