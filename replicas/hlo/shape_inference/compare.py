"""Shape rule of compare, and the comparison type XLA gives each element type."""

from __future__ import annotations

from replicas.hlo.shape_inference.base import PRED, Ctx, rule
from replicas.hlo.shape_inference.elementwise_binary import binary_operands
from replicas.shapes import PrimitiveType, Shape

_DIRECTIONS = ("EQ", "NE", "GE", "GT", "LE", "LT")


def comparison_type_for(t: PrimitiveType) -> str:
    if t.is_floating or t.is_complex:
        return "FLOAT"
    if t.is_signed_integral:
        return "SIGNED"
    return "UNSIGNED"


@rule("compare")
def _compare(c: Ctx) -> Shape:
    lhs, _ = binary_operands(c)
    direction = c.attr("comparison_direction")
    if direction not in _DIRECTIONS:
        raise c.fail(f"comparison_direction must be one of {', '.join(_DIRECTIONS)}, got {direction!r}")
    t = lhs.element_type
    ctype = c.attrs.get("type")
    if ctype is not None:
        allowed = {"FLOAT": ("FLOAT", "TOTALORDER", "PARTIALORDER"), "SIGNED": ("SIGNED",),
                   "UNSIGNED": ("UNSIGNED",)}[comparison_type_for(t)]
        if ctype not in allowed:
            raise c.fail(f"comparison type {ctype} does not fit {t.value} operands (expected "
                         f"{' or '.join(allowed)})")
    if t.is_complex and direction not in ("EQ", "NE"):
        raise c.fail(f"complex operands can only be compared with EQ or NE, got {direction}")
    return lhs.with_element_type(PRED)
