"""Shape rules of parameter and constant (the instruction declares the shape; the literal must fit)."""

from __future__ import annotations

import numpy as np

from replicas.hlo.shape_inference.base import Ctx, rule
from replicas.shapes import Shape


@rule("parameter")
def _parameter(c: Ctx) -> None:
    n = c.attr("parameter_number")
    if not isinstance(n, int) or n < 0:
        raise c.fail(f"parameter_number must be a non-negative integer, got {n!r}")
    return None


def _literal_matches(shape: Shape, literal: object) -> bool:
    if shape.is_tuple:
        return (isinstance(literal, (tuple, list)) and len(literal) == len(shape.tuple_shapes)
                and all(_literal_matches(s, v) for s, v in zip(shape.tuple_shapes, literal)))
    if shape.is_token:
        return True
    arr = np.asarray(literal)
    return tuple(arr.shape) == shape.dimensions


@rule("constant")
def _constant(c: Ctx) -> None:
    literal = c.attrs.get("literal")
    if c.result is not None and literal is not None and not _literal_matches(c.result, literal):
        got = np.asarray(literal).shape if not isinstance(literal, tuple) else "a tuple"
        raise c.fail(f"literal of shape {got} does not match the declared shape {c.result}")
    return None
