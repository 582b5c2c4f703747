"""Shape rules of the element-wise ops: unary, binary, compare, select, clamp, conversions."""

from __future__ import annotations

from replicas.hlo.shape_inference.base import PRED, Ctx, rule, same_dims
from replicas.shapes import PrimitiveType, Shape

_FLOAT_ONLY = ("floor", "ceil", "erf", "round-nearest-afz", "round-nearest-even", "is-finite")
_FLOAT_OR_COMPLEX = ("cosine", "sine", "exponential", "exponential-minus-one", "log", "log-plus-one",
                     "logistic", "rsqrt", "sqrt", "cbrt", "tan", "tanh",
                     # Not XLA HLO opcodes, but kernels exist for them (CHLO-style decompositions).
                     "acos", "acosh", "asin", "asinh", "atan", "atanh", "cosh", "sinh")
_COMPLEX_COMPONENT = {PrimitiveType.C64: PrimitiveType.F32, PrimitiveType.C128: PrimitiveType.F64}


def _signed(t: PrimitiveType) -> bool:
    return t.is_signed_integral or t.is_floating


@rule("abs", "negate", "sign", "not", "count-leading-zeros", "popcnt", "real", "imag", "copy", *_FLOAT_ONLY,
      *_FLOAT_OR_COMPLEX)
def _unary(c: Ctx) -> Shape:
    op = c.opcode
    s = c.operands[0]
    if op == "copy":
        return s
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


_ARITHMETIC = ("add", "subtract", "multiply", "divide", "remainder", "maximum", "minimum", "power")
_LOGICAL = ("and", "or", "xor")
_SHIFTS = ("shift-left", "shift-right-arithmetic", "shift-right-logical", "mulhi")


def _binary_operands(c: Ctx) -> tuple[Shape, Shape]:
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
    lhs, _ = _binary_operands(c)
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


_DIRECTIONS = ("EQ", "NE", "GE", "GT", "LE", "LT")


def comparison_type_for(t: PrimitiveType) -> str:
    if t.is_floating or t.is_complex:
        return "FLOAT"
    if t.is_signed_integral:
        return "SIGNED"
    return "UNSIGNED"


@rule("compare")
def _compare(c: Ctx) -> Shape:
    lhs, _ = _binary_operands(c)
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
    if t.is_complex and direction not in ("EQ", "NE") and ctype != "TOTALORDER":
        raise c.fail(f"complex operands can only be compared with EQ or NE, got {direction}")
    return lhs.with_element_type(PRED)


@rule("select")
def _select(c: Ctx) -> Shape:
    pred, on_true, on_false = c.array(0, "pred"), c.operands[1], c.operands[2]
    if pred.element_type is not PRED:
        raise c.fail(f"the predicate must have element type pred, got {pred}")
    if not on_true.compatible(on_false):
        raise c.fail(f"on_true {on_true} and on_false {on_false} must have the same shape")
    if not on_true.is_array:
        raise c.fail(f"on_true and on_false must be arrays, got {on_true}")
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
    if x.element_type is PRED:
        raise c.fail("is not defined on pred operands")
    return x


@rule("convert")
def _convert(c: Ctx) -> Shape | None:
    s = c.array(0)
    r = c.result
    if r is None:
        return None
    if not r.is_array:
        raise c.fail(f"result must be an array, got {r}")
    if s.element_type.is_complex and not r.element_type.is_complex:
        raise c.fail(f"cannot convert complex {s.element_type.value} to real {r.element_type.value} "
                     "(take real or imag first)")
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
    if PRED in (s.element_type, new_type) and s.element_type is not new_type:
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


@rule("stochastic-convert")
def _stochastic_convert(c: Ctx) -> Shape | None:
    s, rand = c.array(0), c.array(1)
    if not same_dims(s, rand):
        raise c.fail(f"random operand {rand} must have the operand's dimensions {s}")
    return None if c.result is None else s.with_element_type(c.result.element_type)
