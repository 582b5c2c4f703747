"""Constant literals in HLO text (`constant({ { 1, 2 }, { 3, 4 } })`), both ways.

A literal becomes a numpy array of the shape's dtype (ml_dtypes for bf16/f8/int4), or a tuple of
them for a tuple shape. Floats print as the shortest text that reads back to the same bits;
`inf`, `-inf`, `nan`, `-nan` and `nan(0x...)` (a NaN with a non-default payload) are accepted.
"""

from __future__ import annotations

import math
import re
from typing import Any

import ml_dtypes
import numpy as np

from replicas.shapes import PrimitiveType, Shape

_TOKEN = re.compile(r"[+-]?nan\(0x[0-9a-fA-F]+\)|[{}(),]|[^\s{}(),]+")
_NAN_PAYLOAD = re.compile(r"([+-]?)nan\(0x([0-9a-fA-F]+)\)")
_INT = re.compile(r"[+-]?(?:0x[0-9a-fA-F]+|[0-9]+)")
_COMMENT = re.compile(r"/\*.*?\*/", re.S)  # XLA prints /*i0=1*/ index comments inside nested literals


class _Tokens:
    """The literal's tokens one at a time (a list of them would hold a Python string per number)."""

    def __init__(self, body: str) -> None:
        if "/*" in body:
            body = _COMMENT.sub(" ", body)
        self._matches = _TOKEN.finditer(body)
        self._peeked = self._advance()

    def _advance(self) -> str:
        m = next(self._matches, None)
        return "" if m is None else m.group(0)

    def next(self) -> str:
        tok = self._peeked
        if not tok:
            raise ValueError("literal ends too early")
        self._peeked = self._advance()
        return tok

    def peek(self) -> str:
        return self._peeked

    def expect(self, tok: str) -> None:
        got = self.next()
        if got != tok:
            raise ValueError(f"expected {tok!r} in literal, got {got!r}")


class _Sink:
    """The scalars' text converted into the result a chunk at a time, so that no more than a chunk
    of Python objects is alive however long the literal is."""

    CHUNK = 1 << 15

    def __init__(self, shape: Shape, count: int) -> None:
        self.shape = shape
        # Pages of np.empty are touched only as they are filled: a short literal of a large declared
        # shape costs what it holds (and the caller bounded `count` by the text's length).
        self.flat = np.empty(count, dtype=shape.dtype)
        self.filled = 0
        self.pending: list[Any] = []

    def append(self, scalar: Any) -> None:
        self.pending.append(scalar)
        if len(self.pending) >= self.CHUNK:
            self.flush()

    def flush(self) -> None:
        n = len(self.pending)
        if self.filled + n > self.flat.size:
            raise ValueError(f"the literal has more than the {self.flat.size} elements of its shape")
        if n:
            self.flat[self.filled:self.filled + n] = _to_array(self.pending, self.shape)
            self.filled += n
            self.pending = []

    def array(self) -> np.ndarray:
        self.flush()
        if self.filled != self.flat.size:
            raise ValueError(f"the literal has {self.filled} elements, its shape {self.flat.size}")
        return self.flat.reshape(self.shape.dimensions)


def parse_literal(body: str, shape: Shape) -> Any:
    """The literal text between `constant(` and `)` for a constant of `shape`."""
    if body.strip() in ("{...}", "..."):
        raise ValueError("the literal was elided as {...}; dump the module with print_large_constants")
    tokens = _Tokens(body)
    value = _literal(tokens, shape, len(body))
    if tokens.peek():
        raise ValueError(f"unexpected {tokens.peek()!r} after the literal")
    return value


def _literal(tokens: _Tokens, shape: Shape, length: int) -> Any:
    if shape.is_tuple:
        tokens.expect("(")
        elems = []
        for k, sub in enumerate(shape.tuple_shapes):
            if k:
                tokens.expect(",")
            elems.append(_literal(tokens, sub, length))
        tokens.expect(")")
        return tuple(elems)
    if shape.is_token:
        raise ValueError("a token has no literal")
    count = math.prod(shape.dimensions)
    if count > length // 2 + 1:  # each element takes a character and a separator
        raise ValueError(f"{length} characters cannot hold the {count} elements of the shape")
    scalars = _Sink(shape, count)
    is_complex = shape.element_type.is_complex
    if shape.rank == 0:
        # XLA also accepts a rank-0 literal written as a one-element list.
        braced = tokens.peek() == "{"
        if braced:
            tokens.next()
        _scalar(tokens, is_complex, scalars)
        if braced:
            tokens.expect("}")
    else:
        _nested(tokens, shape.dimensions, 0, is_complex, scalars)
    return scalars.array()


def _scalar(tokens: _Tokens, is_complex: bool, out: _Sink) -> None:
    if is_complex:
        tokens.expect("(")
        re_part = tokens.next()
        tokens.expect(",")
        im_part = tokens.next()
        tokens.expect(")")
        out.append((re_part, im_part))
        return
    tok = tokens.next()
    if tok in "{}(),":
        raise ValueError(f"expected a number in literal, got {tok!r}")
    out.append(tok)


def _nested(tokens: _Tokens, dims: tuple[int, ...], level: int, is_complex: bool, out: _Sink) -> None:
    tokens.expect("{")
    count = 0
    if tokens.peek() != "}":
        while True:
            if level + 1 < len(dims):
                _nested(tokens, dims, level + 1, is_complex, out)
            else:
                _scalar(tokens, is_complex, out)
            count += 1
            if tokens.peek() == ",":
                tokens.next()
                continue
            break
    tokens.expect("}")
    if count != dims[level]:
        raise ValueError(f"dimension {level} of the literal has {count} elements, the shape says {dims[level]}")
    if count == 0 and level + 1 < len(dims) and dims[level] != 0:
        raise ValueError("empty literal level")


def _to_array(scalars: list[Any], shape: Shape) -> np.ndarray:
    et = shape.element_type
    dtype = shape.dtype
    if et is PrimitiveType.PRED:
        return np.array([_pred(t) for t in scalars], dtype=np.bool_)
    if et.is_integral:
        return _int_array(scalars, dtype, et)
    if et.is_complex:
        part = np.float32 if et is PrimitiveType.C64 else np.float64
        flat = np.empty(len(scalars), dtype=dtype)
        flat.real = _float_array([t[0] for t in scalars], np.dtype(part))
        flat.imag = _float_array([t[1] for t in scalars], np.dtype(part))
        return flat
    return _float_array(scalars, dtype)


def _pred(tok: str) -> bool:
    if tok in ("true", "1"):
        return True
    if tok in ("false", "0"):
        return False
    raise ValueError(f"bad pred literal {tok!r}")


def _int_array(tokens: list[str], dtype: np.dtype, et: PrimitiveType) -> np.ndarray:
    values = []
    for tok in tokens:
        if not _INT.fullmatch(tok):
            raise ValueError(f"bad integer literal {tok!r}")
        digits = tok.lstrip("+-")
        magnitude = int(digits[2:], 16) if digits.startswith("0x") else int(digits)
        values.append(-magnitude if tok.startswith("-") else magnitude)
    bits = et.bit_width
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if et.is_signed_integral else (0, (1 << bits) - 1)
    for v in values:
        if not lo <= v <= hi:
            raise ValueError(f"{v} does not fit in {et.value}")
    return np.array(values, dtype=np.int64 if et.is_signed_integral else np.uint64).astype(dtype)


def _float_array(tokens: list[str], dtype: np.dtype) -> np.ndarray:
    values = []
    payloads: list[tuple[int, bool, int]] = []
    for k, tok in enumerate(tokens):
        m = _NAN_PAYLOAD.fullmatch(tok)
        if m is not None:
            payloads.append((k, m.group(1) == "-", int(m.group(2), 16)))
            values.append(float("nan"))
            continue
        try:
            values.append(float(tok))
        except ValueError:
            raise ValueError(f"bad floating-point literal {tok!r}") from None
    arr = np.array(values, dtype=np.float64)
    with np.errstate(all="ignore"):
        out = arr.astype(dtype)
    if payloads:
        uint = np.dtype(f"u{dtype.itemsize}")
        nmant = _mantissa_bits(dtype)
        total = dtype.itemsize * 8
        bits = out.view(uint)
        for k, negative, payload in payloads:
            if payload == 0 or payload >> nmant:
                raise ValueError(f"NaN payload 0x{payload:x} does not fit the {nmant}-bit mantissa")
            exponent_mask = ((1 << (total - 1)) - 1) ^ ((1 << nmant) - 1)
            bits[k] = (1 << (total - 1) if negative else 0) | exponent_mask | payload
    return out


# -- printing --------------------------------------------------------------------------------------


def format_literal(value: Any, shape: Shape) -> str:
    if shape.is_tuple:
        return "( " + ", ".join(format_literal(v, s) for v, s in zip(value, shape.tuple_shapes)) + " )"
    arr = np.asarray(value, dtype=shape.dtype).reshape(shape.dimensions)
    strings = _scalar_strings(arr.reshape(-1), shape.element_type)
    if arr.ndim == 0:
        return strings[0]
    return _nest(strings, arr.shape)


def _nest(strings: list[str], dims: tuple[int, ...]) -> str:
    if len(dims) == 1:
        return "{" + ", ".join(strings) + "}"
    strides = [1] * len(dims)
    for level in range(len(dims) - 2, -1, -1):
        strides[level] = strides[level + 1] * dims[level + 1]

    def level_text(offset: int, level: int) -> str:
        n = dims[level]
        if n == 0:
            return "{}"
        if level == len(dims) - 1:
            parts = strings[offset:offset + n]
        else:
            parts = [level_text(offset + i * strides[level], level + 1) for i in range(n)]
        return "{ " + ", ".join(parts) + " }"

    return level_text(0, 0)


def _scalar_strings(flat: np.ndarray, et: PrimitiveType) -> list[str]:
    if et is PrimitiveType.PRED:
        return ["true" if v else "false" for v in flat.tolist()]
    if et.is_integral:
        return [str(int(v)) for v in flat.astype(np.int64 if et.is_signed_integral else np.uint64).tolist()]
    if et.is_complex:
        re_s = float_strings(np.ascontiguousarray(flat.real))
        im_s = float_strings(np.ascontiguousarray(flat.imag))
        return [f"({r}, {i})" for r, i in zip(re_s, im_s)]
    return float_strings(flat)


def float_strings(flat: np.ndarray) -> list[str]:
    """Shortest decimal text of each element that reads back (via float64) to the same bits."""
    dtype = flat.dtype
    native = dtype in (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
    with np.errstate(all="ignore"):
        as_f64 = flat.astype(np.float64)
    out = [str(v) for v in flat] if native else [repr(x) for x in as_f64.tolist()]
    uint = np.dtype(f"u{dtype.itemsize}")
    bits = flat.view(uint)
    isnan = np.isnan(as_f64)
    # Verify the short forms read back exactly; fall back to the float64 repr, which always does.
    with np.errstate(all="ignore"):
        back = np.array([float(s) if not n else 0.0 for s, n in zip(out, isnan)], dtype=np.float64).astype(dtype)
    bad = (back.view(uint) != bits) & ~isnan
    for k in np.flatnonzero(bad).tolist():
        out[k] = repr(float(as_f64[k]))
    if isnan.any():
        default = np.array([np.nan], dtype=np.float64).astype(dtype).view(uint)[0]
        sign_bit = 1 << (dtype.itemsize * 8 - 1)
        nmant = _mantissa_bits(dtype)
        for k in np.flatnonzero(isnan).tolist():
            b = int(bits[k])
            sign = "-" if b & sign_bit else ""
            out[k] = f"{sign}nan" if (b & ~sign_bit) == int(default) & ~sign_bit else \
                f"{sign}nan(0x{b & ((1 << nmant) - 1):x})"
    return [s[:-2] if s.endswith(".0") else s for s in out]


def _mantissa_bits(dtype: np.dtype) -> int:
    if dtype in (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)):
        return int(np.finfo(dtype).nmant)
    return int(ml_dtypes.finfo(dtype).nmant)
