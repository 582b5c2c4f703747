"""Shape rules of the conversions: convert, bitcast-convert, reduce-precision."""

from __future__ import annotations

from replicas.hlo.shape_inference.base import PRED, Ctx, rule
from replicas.shapes import PrimitiveType, Shape


@rule("convert")
def _convert(c: Ctx) -> Shape | None:
    s = c.array(0)
    r = c.result
    if r is None:
        return None
    if not r.is_array:
        raise c.fail(f"result must be an array, got {r}")
    return s.with_element_type(r.element_type)


@rule("bitcast-convert")
def _bitcast_convert(c: Ctx) -> Shape | None:
    s = c.array(0)
    r = c.result
    if r is None:
        return None
    if not r.is_array:
        raise c.fail(f"result must be an array, got {r}")
    return bitcast_convert_shape(c, s, r.element_type)


def bitcast_convert_shape(c: Ctx, s: Shape, new_type: PrimitiveType) -> Shape:
    old_bits, new_bits = s.element_type.bit_width, new_type.bit_width
    if PRED in (s.element_type, new_type):
        raise c.fail("cannot bitcast-convert to or from pred")
    if s.element_type.is_complex != new_type.is_complex:
        raise c.fail(f"cannot bitcast-convert between complex and non-complex types "
                     f"({s.element_type.value} -> {new_type.value})")
    if old_bits == new_bits:
        return s.with_element_type(new_type)
    if old_bits > new_bits:
        if old_bits % new_bits:
            raise c.fail(f"{s.element_type.value} ({old_bits} bits) is not a multiple of {new_type.value} "
                         f"({new_bits} bits)")
        return Shape.array(new_type, s.dimensions + (old_bits // new_bits,))
    if new_bits % old_bits:
        raise c.fail(f"{new_type.value} ({new_bits} bits) is not a multiple of {s.element_type.value} "
                     f"({old_bits} bits)")
    ratio = new_bits // old_bits
    if not s.dimensions or s.dimensions[-1] != ratio:
        raise c.fail(f"bitcast-convert from {s.element_type.value} to the wider {new_type.value} needs a "
                     f"last dimension of size {ratio}, got {s}")
    return Shape.array(new_type, s.dimensions[:-1])


@rule("reduce-precision")
def _reduce_precision(c: Ctx) -> Shape:
    s = c.array(0)
    if not s.element_type.is_floating:
        raise c.fail(f"expects a floating-point operand, got {s}")
    e, m = int(c.attr("exponent_bits")), int(c.attr("mantissa_bits"))
    if e < 1:
        raise c.fail(f"exponent_bits must be at least 1, got {e}")
    if m < 0:
        raise c.fail(f"mantissa_bits must be non-negative, got {m}")
    return s
