"""Shape rule of the binary element-wise ops (arithmetic, logical, shifts, atan2, complex)."""

from __future__ import annotations

from replicas.hlo.shape_inference.base import PRED, Ctx, rule, same_dims
from replicas.shapes import PrimitiveType, Shape

_ARITHMETIC = ("add", "subtract", "multiply", "divide", "remainder", "maximum", "minimum", "power")


_LOGICAL = ("and", "or", "xor")


_SHIFTS = ("shift-left", "shift-right-arithmetic", "shift-right-logical", "mulhi")


def binary_operands(c: Ctx) -> tuple[Shape, Shape]:
    lhs, rhs = c.array(0, "lhs"), c.array(1, "rhs")
    if not same_dims(lhs, rhs):
        raise c.fail(f"operands must have the same dimensions, got {lhs} and {rhs} "
                     "(HLO element-wise ops do not broadcast)")
    if lhs.element_type is not rhs.element_type:
        raise c.fail(f"operands must have the same element type, got {lhs.element_type.value} and "
                     f"{rhs.element_type.value}")
    return lhs, rhs


@rule(*_ARITHMETIC, *_LOGICAL, *_SHIFTS, "atan2", "complex")
def _binary(c: Ctx) -> Shape:
    lhs, _ = binary_operands(c)
    t = lhs.element_type
    op = c.opcode
    if op in _LOGICAL and not (t is PRED or t.is_integral):
        raise c.fail(f"expects pred or integer operands, got {t.value}")
    if op in _SHIFTS and not t.is_integral:
        raise c.fail(f"expects integer operands, got {t.value}")
    if op == "atan2" and not (t.is_floating or t.is_complex):
        raise c.fail(f"expects floating-point or complex operands, got {t.value}")
    if op == "complex":
        if t is PrimitiveType.F32:
            return lhs.with_element_type(PrimitiveType.C64)
        if t is PrimitiveType.F64:
            return lhs.with_element_type(PrimitiveType.C128)
        raise c.fail(f"expects f32 or f64 operands, got {t.value}")
    if op in ("divide", "remainder", "power") and t is PRED:
        raise c.fail("is not defined on pred operands")
    return lhs
