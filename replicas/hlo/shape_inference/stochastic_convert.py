"""Shape rule of stochastic-convert (a float operand and unsigned random bits of its width)."""

from __future__ import annotations

from replicas.hlo.shape_inference.base import Ctx, rule, same_dims
from replicas.shapes import Shape


@rule("stochastic-convert")
def _stochastic_convert(c: Ctx) -> Shape | None:
    s, rand = c.array(0), c.array(1)
    if not same_dims(s, rand):
        raise c.fail(f"random operand {rand} must have the operand's dimensions {s}")
    return None if c.result is None else s.with_element_type(c.result.element_type)
