"""Shape rule of stochastic-convert (a float operand and unsigned random bits of its width)."""

from __future__ import annotations

from replicas.hlo.shape_inference.base import Ctx, rule, same_dims
from replicas.shapes import Shape


@rule("stochastic-convert")
def _stochastic_convert(c: Ctx) -> Shape | None:
    s, rand = c.array(0), c.array(1)
    if not same_dims(s, rand):
        raise c.fail(f"random operand {rand} must have the operand's dimensions {s}")
    dst = c.result.element_type if c.result is not None and c.result.is_array else None
    if (not s.element_type.is_floating or not rand.element_type.is_unsigned_integral
            or (dst is not None and not dst.is_signed_integral)):
        raise c.fail(f"stochastic-convert converts floats to signed integers with unsigned random bits, "
                     f"got {s} and {rand} to {c.result}")
    if rand.element_type.bit_width != s.element_type.bit_width:
        raise c.fail(f"the random operand {rand} must have the bit width of {s}")
    return None if c.result is None else s.with_element_type(c.result.element_type)
