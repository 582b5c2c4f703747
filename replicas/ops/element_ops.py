"""One element of an element-wise op as a Python expression, with numpy's bits (`ops.python_elements`).

Integers are Python ints in their type's range, wrapped after each op; shifts by an amount outside
[0, width) give 0 (or the sign fill), as numpy's do. f64 is Python's float. An f32 op is computed in
f64 from f32 operands and rounded once to f32 by the caller (`rounds`): exact for + - * / and sqrt,
whose f64 result rounds to the same f32 as the f32 op (53 >= 2 * 24 + 2 bits). pred is bool.
Ops without such an expression return None: their numpy kernel runs instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from replicas.hlo.ir import Instruction
from replicas.shapes import PrimitiveType

P = PrimitiveType
INTS = frozenset({P.S8, P.S16, P.S32, P.S64, P.U8, P.U16, P.U32, P.U64})
TYPES = INTS | {P.PRED, P.F32, P.F64}
# bitcast-convert between these: struct's codes of the same width, little-endian as XLA:CPU.
BITCAST = {P.F32: "f", P.F64: "d", P.U32: "I", P.S32: "i", P.U64: "Q", P.S64: "q"}
_COMPARE = {"EQ": "==", "NE": "!=", "GE": ">=", "GT": ">", "LE": "<=", "LT": "<"}

Writer = Callable[[list[str]], str]

# The NaN the processor makes of an invalid operation (0 / 0, sqrt(-1)): negative on x86, as numpy's.
with np.errstate(all="ignore"):
    DEFAULT_NAN = float(np.divide(np.zeros(1), np.zeros(1))[0])


def rounds(op: str, types: list[PrimitiveType]) -> bool:
    """Whether an f32 result of `op` needs rounding from its f64 computation."""
    if op in ("negate", "abs", "select", "maximum", "minimum", "copy"):
        return False
    if op == "convert" and types[0] in (P.F32, P.PRED) or (op == "convert" and types[0] in INTS
                                                           and types[0].bit_width <= 16):
        return False
    return op != "bitcast-convert"


def _wrap(t: PrimitiveType, e: str) -> str:
    bits = t.bit_width
    mask = (1 << bits) - 1
    if t.is_unsigned_integral:
        return f"(({e}) & {mask})"
    half = 1 << (bits - 1)
    return f"(((({e}) + {half}) & {mask}) - {half})"


def writer(inst: Instruction, types: list[PrimitiveType]) -> Writer | None:
    """The Python expression of one element of `inst`, or None to use its numpy kernel."""
    op = inst.opcode
    t = inst.shape.element_type
    src = types[0] if types else t
    if op == "compare":
        if inst.attrs.get("type") == "TOTALORDER" or src not in TYPES:
            return None
        symbol = _COMPARE[inst.attrs["comparison_direction"]]
        return lambda a: f"({a[0]} {symbol} {a[1]})"
    if op == "select":
        return lambda a: f"({a[1]} if {a[0]} else {a[2]})"
    if op == "convert":
        return _convert(src, t)
    if op == "bitcast-convert":
        if src not in BITCAST or t not in BITCAST or src.bit_width != t.bit_width:
            return None
        if t is P.F32 and src is not P.F32:
            # A Python float cannot hold an f32 signaling NaN (f32 -> f64 quiets it): such bits leave
            # the Python code (`SignalingNaN`) for the numpy kernels, which keep them as XLA does.
            return lambda a: (f"(_unpack_f(_pack_{BITCAST[src]}({a[0]}))[0] if ({a[0]} & 0x7fc00000) != 0x7f800000 "
                              f"or not {a[0]} & 0x3fffff else _signaling())")
        return lambda a: f"_unpack_{BITCAST[t]}(_pack_{BITCAST[src]}({a[0]}))[0]"
    if t is P.PRED:
        symbols = {"and": "&", "or": "|", "xor": "^", "add": "|", "maximum": "|", "multiply": "&", "minimum": "&"}
        if op in symbols:
            symbol = symbols[op]
            return lambda a: f"({a[0]} {symbol} {a[1]})"
        if op == "not":
            return lambda a: f"(not {a[0]})"
        return None
    if t in INTS:
        return _integer(op, t)
    if t in (P.F32, P.F64):
        return _floating(op)
    return None


def _integer(op: str, t: PrimitiveType) -> Writer | None:
    arith = {"add": "+", "subtract": "-", "multiply": "*"}
    if op in arith:
        symbol = arith[op]
        # x + 0 and 0 + x are x, already in range: no statement of their own.
        return lambda a: (a[1] if op == "add" and a[0] == "0" else a[0] if op in ("add", "subtract") and a[1] == "0"
                          else _wrap(t, f"{a[0]} {symbol} {a[1]}"))
    bitwise = {"and": "&", "or": "|", "xor": "^"}
    if op in bitwise:
        symbol = bitwise[op]
        return lambda a: (a[1] if op != "and" and a[0] == "0" else a[0] if op != "and" and a[1] == "0"
                          else f"({a[0]} {symbol} {a[1]})")
    if op == "not":
        return lambda a: _wrap(t, f"~{a[0]}")
    if op == "negate":
        return lambda a: _wrap(t, f"-{a[0]}")
    if op == "abs":
        return lambda a: _wrap(t, f"abs({a[0]})")
    if op == "maximum":
        return lambda a: f"({a[0]} if {a[0]} >= {a[1]} else {a[1]})"
    if op == "minimum":
        return lambda a: f"({a[0]} if {a[0]} <= {a[1]} else {a[1]})"
    # Shift amounts count as unsigned: a negative one is out of range, as is one >= the width.
    if op in ("shift-left", "shift-right-logical", "shift-right-arithmetic"):
        return lambda a: _shift(op, t, a[0], a[1])
    return None


def _shift(op: str, t: PrimitiveType, x: str, amount: str) -> str:
    """A shift of `x` by `amount`, its range test left out when the amount is a literal."""
    bits = t.bit_width
    mask = (1 << bits) - 1
    literal = int(amount) if amount.lstrip("-").isdigit() else None
    inside = literal is not None and 0 <= literal < bits
    test = "" if literal is not None else f" if 0 <= {amount} < {bits}"
    if op == "shift-right-arithmetic":
        signed = x if t.is_signed_integral else f"((({x} + {1 << (bits - 1)}) & {mask}) - {1 << (bits - 1)})"
        by = amount if inside else str(bits - 1) if literal is not None else f"({amount}{test} else {bits - 1})"
        return f"({signed} >> {by})" if t.is_signed_integral else f"(({signed} >> {by}) & {mask})"
    if literal is not None and not inside:
        return "0"
    if op == "shift-left":
        shifted = _wrap(t, f"{x} << {amount}")
    elif t.is_unsigned_integral:
        shifted = f"({x} >> {amount})"
    else:
        shifted = _wrap(t, f"({x} & {mask}) >> {amount}")
    return f"({shifted}{test} else 0)" if test else shifted


def _floating(op: str) -> Writer | None:
    arith = {"add": "+", "subtract": "-", "multiply": "*"}
    if op in arith:
        symbol = arith[op]
        return lambda a: f"({a[0]} {symbol} {a[1]})"
    if op == "divide":  # IEEE division by zero, which Python raises on
        return lambda a: f"({a[0]} / {a[1]} if {a[1]} else _divide_by_zero({a[0]}, {a[1]}))"
    if op == "negate":
        return lambda a: f"(-{a[0]})"
    if op == "abs":
        return lambda a: f"abs({a[0]})"
    if op == "sqrt":
        return lambda a: f"(_sqrt({a[0]}) if {a[0]} >= 0 else {a[0]} if {a[0]} != {a[0]} else _nan)"
    # numpy's maximum/minimum: the first operand when it wins or is NaN, else the second.
    if op == "maximum":
        return lambda a: f"({a[0]} if {a[0]} > {a[1]} or {a[0]} != {a[0]} else {a[1]})"
    if op == "minimum":
        return lambda a: f"({a[0]} if {a[0]} < {a[1]} or {a[0]} != {a[0]} else {a[1]})"
    return None


def _convert(src: PrimitiveType, dst: PrimitiveType) -> Writer | None:
    if dst is P.PRED:
        return lambda a: f"({a[0]} != 0)"
    if src is P.PRED:
        return (lambda a: f"(1 if {a[0]} else 0)") if dst in INTS else (lambda a: f"(1.0 if {a[0]} else 0.0)")
    if src in INTS and dst in INTS:
        if src is dst or (dst.bit_width > src.bit_width and (dst.is_signed_integral or src.is_unsigned_integral)):
            return lambda a: a[0]
        return lambda a: _wrap(dst, a[0])
    if src in INTS and dst in (P.F32, P.F64) and src.bit_width <= 32:
        return lambda a: f"float({a[0]})"  # exact in f64; rounded once more for f32
    if src in (P.F32, P.F64) and dst in (P.F32, P.F64):
        return lambda a: a[0]
    return None  # float to integer: the kernel's saturation and NaN rules


class SignalingNaN(Exception):
    """An f32 signaling NaN met by per-element Python code: the numpy kernels run the call instead."""


def signaling() -> float:
    raise SignalingNaN


def has_signaling_f32(a: np.ndarray) -> bool:
    bits = np.ascontiguousarray(a, np.float32).view(np.uint32)
    return bool((((bits & 0x7FC00000) == 0x7F800000) & ((bits & 0x3FFFFF) != 0)).any())


def divide_by_zero(a: float, b: float) -> float:
    """IEEE's x / 0 (b is +0.0 or -0.0): NaN for 0 / 0 and NaN / 0, else an infinity of the signs' product."""
    if a != a:
        return a
    if a == 0:
        return DEFAULT_NAN
    return math.copysign(math.inf, a) * math.copysign(1.0, b)
