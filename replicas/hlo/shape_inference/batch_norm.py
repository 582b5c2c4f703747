"""Shape rules of batch-norm-training, -inference and -grad."""

from __future__ import annotations

from replicas.hlo.shape_inference.base import (
    Ctx,
    array_shape,
    rule,
)
from replicas.shapes import Shape


def _feature_vector(c: Ctx, i: int, what: str, operand: Shape, feature_index: int) -> None:
    s = c.array(i, what)
    n = operand.dimensions[feature_index]
    if s.rank != 1 or s.dimensions[0] != n or s.element_type is not operand.element_type:
        raise c.fail(f"{what} {s} must be a rank-1 {operand.element_type.value}[{n}] "
                     f"(the size of feature dimension {feature_index})")


def _batch_norm_operand(c: Ctx) -> tuple[Shape, int]:
    x = c.array(0, "operand")
    if not x.element_type.is_floating:
        raise c.fail(f"operand {x} must be floating-point")
    f = int(c.attr("feature_index"))
    if not 0 <= f < x.rank:
        raise c.fail(f"feature_index {f} out of range for rank {x.rank} operand")
    eps = c.attr("epsilon")
    if not isinstance(eps, (int, float)):
        raise c.fail(f"epsilon must be a number, got {eps!r}")
    return x, f


@rule("batch-norm-training")
def _batch_norm_training(c: Ctx) -> Shape:
    x, f = _batch_norm_operand(c)
    _feature_vector(c, 1, "scale", x, f)
    _feature_vector(c, 2, "offset", x, f)
    v = array_shape(x.element_type, [x.dimensions[f]])
    return Shape.tuple([x, v, v])


@rule("batch-norm-inference")
def _batch_norm_inference(c: Ctx) -> Shape:
    x, f = _batch_norm_operand(c)
    for i, what in enumerate(("scale", "offset", "mean", "variance"), start=1):
        _feature_vector(c, i, what, x, f)
    return x


@rule("batch-norm-grad")
def _batch_norm_grad(c: Ctx) -> Shape:
    x, f = _batch_norm_operand(c)
    for i, what in enumerate(("scale", "mean", "variance"), start=1):
        _feature_vector(c, i, what, x, f)
    g = c.array(4, "grad_output")
    if not g.compatible(x):
        raise c.fail(f"grad_output {g} must have the operand's shape {x}")
    v = array_shape(x.element_type, [x.dimensions[f]])
    return Shape.tuple([x, v, v])
