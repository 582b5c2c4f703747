"""Shape rule of the unary element-wise ops."""

from __future__ import annotations

from replicas.hlo.shape_inference.base import PRED, Ctx, rule
from replicas.shapes import PrimitiveType, Shape

_FLOAT_ONLY = ("floor", "ceil", "erf", "round-nearest-afz", "round-nearest-even", "is-finite", "cbrt")


_FLOAT_OR_COMPLEX = ("cosine", "sine", "exponential", "exponential-minus-one", "log", "log-plus-one",
                     "logistic", "rsqrt", "sqrt", "tan", "tanh",
                     # Not XLA HLO opcodes, but kernels exist for them (CHLO-style decompositions).
                     "acos", "acosh", "asin", "asinh", "atan", "atanh", "cosh", "sinh")


_COMPLEX_COMPONENT = {PrimitiveType.C64: PrimitiveType.F32, PrimitiveType.C128: PrimitiveType.F64}


def _signed(t: PrimitiveType) -> bool:
    return t.is_signed_integral or t.is_floating


@rule("abs", "negate", "sign", "not", "count-leading-zeros", "popcnt", "real", "imag", *_FLOAT_ONLY,
      *_FLOAT_OR_COMPLEX)
def _unary(c: Ctx) -> Shape:
    op = c.opcode
    s = c.array(0)
    t = s.element_type
    name = t.value

    def bad(kinds: str) -> Exception:
        return c.fail(f"expects a {kinds} element type, got {name}")

    if op in _FLOAT_ONLY:
        if not t.is_floating:
            raise bad("floating-point")
        return s.with_element_type(PRED) if op == "is-finite" else s
    if op in _FLOAT_OR_COMPLEX:
        if not (t.is_floating or t.is_complex):
            raise bad("floating-point or complex")
        return s
    if op in ("real", "imag"):
        if t.is_complex:
            return s.with_element_type(_COMPLEX_COMPONENT[t])
        if t.is_floating:
            return s
        raise bad("floating-point or complex")
    if op == "abs":
        if t.is_complex:
            return s.with_element_type(_COMPLEX_COMPONENT[t])
        if _signed(t):
            return s
        raise bad("signed integer, floating-point or complex")
    if op == "negate":
        if t is PRED:
            raise bad("integer, floating-point or complex")
        return s
    if op == "sign":
        if not (_signed(t) or t.is_complex):
            raise bad("signed integer, floating-point or complex")
        return s
    if op == "not":
        if not (t is PRED or t.is_integral):
            raise bad("pred or integer")
        return s
    # count-leading-zeros, popcnt
    if not t.is_integral:
        raise bad("integer")
    return s
