"""XLA shapes: primitive types, array/tuple/token shapes, layouts (the "Shapes and Layout" document).

A `Shape` is immutable plain data. Its HLO spelling (`f32[2,3]{0,1}`, `(f32[2]{0}, s32[])`,
`token[]`, `f32[<=10]`) round-trips through `Shape.parse` and `str`.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

from replicas.errors import ProgramError
from replicas.limits import MAX_NESTING


class PrimitiveType(enum.Enum):
    PRED = "pred"
    S2 = "s2"
    S4 = "s4"
    S8 = "s8"
    S16 = "s16"
    S32 = "s32"
    S64 = "s64"
    U2 = "u2"
    U4 = "u4"
    U8 = "u8"
    U16 = "u16"
    U32 = "u32"
    U64 = "u64"
    F16 = "f16"
    BF16 = "bf16"
    F32 = "f32"
    F64 = "f64"
    C64 = "c64"
    C128 = "c128"
    F8E5M2 = "f8e5m2"
    F8E4M3 = "f8e4m3"
    F8E4M3FN = "f8e4m3fn"
    F8E4M3B11FNUZ = "f8e4m3b11fnuz"
    F8E5M2FNUZ = "f8e5m2fnuz"
    F8E4M3FNUZ = "f8e4m3fnuz"
    F8E3M4 = "f8e3m4"
    F8E8M0FNU = "f8e8m0fnu"
    F4E2M1FN = "f4e2m1fn"
    TOKEN = "token"
    TUPLE = "tuple"

    @property
    def is_array_type(self) -> bool:
        return self not in (PrimitiveType.TOKEN, PrimitiveType.TUPLE)

    @property
    def dtype(self) -> np.dtype:
        try:
            return _DTYPES[self]
        except KeyError:
            raise ProgramError(f"{self.value} has no numpy dtype") from None

    @property
    def bit_width(self) -> int:
        if self is PrimitiveType.PRED:
            return 8
        if self in (PrimitiveType.S2, PrimitiveType.U2):
            return 2
        if self in (PrimitiveType.S4, PrimitiveType.U4, PrimitiveType.F4E2M1FN):
            return 4
        return self.dtype.itemsize * 8

    @property
    def is_integral(self) -> bool:
        return self.value[0] in "su"

    @property
    def is_signed_integral(self) -> bool:
        return self.value[0] == "s"

    @property
    def is_unsigned_integral(self) -> bool:
        return self.value[0] == "u"

    @property
    def is_floating(self) -> bool:
        return self.value[0] == "f" or self is PrimitiveType.BF16

    @property
    def is_complex(self) -> bool:
        return self.value[0] == "c"

    @staticmethod
    def from_dtype(dtype: Any) -> PrimitiveType:
        dt = np.dtype(dtype)
        try:
            return _FROM_DTYPE[dt]
        except KeyError:
            raise ProgramError(f"numpy dtype {dt} has no XLA primitive type") from None

    @staticmethod
    def parse(name: str) -> PrimitiveType:
        try:
            return PrimitiveType(name.lower())
        except ValueError:
            raise ProgramError(f"unknown primitive type {name!r}") from None


_DTYPES: dict[PrimitiveType, np.dtype] = {
    PrimitiveType.PRED: np.dtype(np.bool_),
    PrimitiveType.S2: np.dtype(ml_dtypes.int2),
    PrimitiveType.S4: np.dtype(ml_dtypes.int4),
    PrimitiveType.S8: np.dtype(np.int8),
    PrimitiveType.S16: np.dtype(np.int16),
    PrimitiveType.S32: np.dtype(np.int32),
    PrimitiveType.S64: np.dtype(np.int64),
    PrimitiveType.U2: np.dtype(ml_dtypes.uint2),
    PrimitiveType.U4: np.dtype(ml_dtypes.uint4),
    PrimitiveType.U8: np.dtype(np.uint8),
    PrimitiveType.U16: np.dtype(np.uint16),
    PrimitiveType.U32: np.dtype(np.uint32),
    PrimitiveType.U64: np.dtype(np.uint64),
    PrimitiveType.F16: np.dtype(np.float16),
    PrimitiveType.BF16: np.dtype(ml_dtypes.bfloat16),
    PrimitiveType.F32: np.dtype(np.float32),
    PrimitiveType.F64: np.dtype(np.float64),
    PrimitiveType.C64: np.dtype(np.complex64),
    PrimitiveType.C128: np.dtype(np.complex128),
}
for _name, _ml in [("F8E5M2", "float8_e5m2"), ("F8E4M3", "float8_e4m3"), ("F8E4M3FN", "float8_e4m3fn"),
                   ("F8E4M3B11FNUZ", "float8_e4m3b11fnuz"), ("F8E5M2FNUZ", "float8_e5m2fnuz"),
                   ("F8E4M3FNUZ", "float8_e4m3fnuz"), ("F8E3M4", "float8_e3m4"),
                   ("F8E8M0FNU", "float8_e8m0fnu"), ("F4E2M1FN", "float4_e2m1fn")]:
    if hasattr(ml_dtypes, _ml):
        _DTYPES[PrimitiveType[_name]] = np.dtype(getattr(ml_dtypes, _ml))
_FROM_DTYPE = {dt: pt for pt, dt in _DTYPES.items()}


@dataclass(frozen=True)
class Layout:
    """How an array is laid out in bytes: dimension order and optional padding.

    `minor_to_major[0]` is the fastest-varying dimension. `padded_dimensions`, when given, are the
    sizes the array is padded to (one per dimension) with `padding_value` in the extra elements.
    """

    minor_to_major: tuple[int, ...]
    padded_dimensions: tuple[int, ...] | None = None
    padding_value: float = 0
    extra: str = ""  # tiling / memory-space suffix as printed by XLA (":T(8,128)"); no effect here

    def __str__(self) -> str:
        return "{" + ",".join(map(str, self.minor_to_major)) + self.extra + "}"


@dataclass(frozen=True)
class Shape:
    """An XLA shape: an array (element type + dimensions), a tuple of shapes, or a token."""

    element_type: PrimitiveType
    dimensions: tuple[int, ...] = ()
    layout: Layout | None = None
    dynamic: tuple[bool, ...] = ()
    tuple_shapes: tuple[Shape, ...] = ()
    _hash: int = field(default=0, compare=False, repr=False)

    # -- constructors --------------------------------------------------------------------------
    @staticmethod
    def array(element_type: PrimitiveType | str | Any, dimensions: tuple[int, ...] | list[int] = (),
              layout: Layout | tuple[int, ...] | list[int] | None = None,
              dynamic: tuple[bool, ...] | list[bool] | None = None) -> Shape:
        et = _as_type(element_type)
        if not et.is_array_type:
            raise ProgramError(f"{et.value} is not an array element type")
        dims = tuple(int(d) for d in dimensions)
        if any(d < 0 for d in dims):
            raise ProgramError(f"negative dimension in {list(dims)}")
        if layout is not None and not isinstance(layout, Layout):
            layout = Layout(tuple(int(i) for i in layout))
        if layout is not None:
            _check_layout(layout, dims)
        dyn = tuple(bool(x) for x in dynamic) if dynamic is not None else (False,) * len(dims)
        if len(dyn) != len(dims):
            raise ProgramError("dynamic flags must have one entry per dimension")
        if not any(dyn):
            dyn = (False,) * len(dims)
        return Shape(et, dims, layout, dyn)

    @staticmethod
    def tuple(shapes: list[Shape] | tuple[Shape, ...]) -> Shape:
        return Shape(PrimitiveType.TUPLE, tuple_shapes=tuple(shapes))

    @staticmethod
    def token() -> Shape:
        return Shape(PrimitiveType.TOKEN)

    @staticmethod
    def scalar(element_type: PrimitiveType | str | Any) -> Shape:
        return Shape.array(element_type, ())

    @staticmethod
    def parse(text: str) -> Shape:
        parser = _ShapeParser(text)
        shape = parser.shape()
        parser.skip_ws()
        if parser.pos != len(text):
            raise ProgramError(f"unexpected text after shape at column {parser.pos + 1}: {text!r}")
        return shape

    @staticmethod
    def of(value: Any) -> Shape:
        """The shape of a runtime value: numpy array (or scalar), tuple of values, or a Token."""
        if isinstance(value, tuple):
            return Shape.tuple([Shape.of(v) for v in value])
        if isinstance(value, Token):
            return Shape.token()
        arr = np.asarray(value)
        return Shape.array(PrimitiveType.from_dtype(arr.dtype), arr.shape)

    # -- predicates ----------------------------------------------------------------------------
    @property
    def is_tuple(self) -> bool:
        return self.element_type is PrimitiveType.TUPLE

    @property
    def is_token(self) -> bool:
        return self.element_type is PrimitiveType.TOKEN

    @property
    def is_array(self) -> bool:
        return self.element_type.is_array_type

    @property
    def is_scalar(self) -> bool:
        return self.is_array and not self.dimensions

    @property
    def is_dynamic(self) -> bool:
        return any(self.dynamic)

    @property
    def rank(self) -> int:
        return len(self.dimensions)

    @property
    def true_rank(self) -> int:
        """The number of dimensions whose size is not 1 (the document's "true rank")."""
        return sum(1 for d in self.dimensions if d != 1)

    @property
    def dtype(self) -> np.dtype:
        return self.element_type.dtype

    @property
    def numel(self) -> int:
        n = 1
        for d in self.dimensions:
            n *= d
        return n

    @property
    def minor_to_major(self) -> tuple[int, ...]:
        if self.layout is not None:
            return self.layout.minor_to_major
        return tuple(range(self.rank - 1, -1, -1))

    def dim(self, d: int) -> int:
        """Size of dimension `d`; negative `d` counts from the end as in Python."""
        return self.dimensions[self.canonical_dim(d)]

    def canonical_dim(self, d: int) -> int:
        r = self.rank
        if not -r <= d < r:
            raise ProgramError(f"dimension {d} out of range for rank {r} shape {self}")
        return d + r if d < 0 else d

    def with_layout(self, layout: Layout | tuple[int, ...] | list[int] | None) -> Shape:
        if self.is_tuple:
            raise ProgramError("a tuple shape has no layout of its own")
        return Shape.array(self.element_type, self.dimensions, layout, self.dynamic)

    def without_layout(self) -> Shape:
        if self.is_tuple:
            return Shape.tuple([s.without_layout() for s in self.tuple_shapes])
        if self.layout is None:
            return self
        return Shape(self.element_type, self.dimensions, None, self.dynamic)

    def with_element_type(self, element_type: PrimitiveType | str) -> Shape:
        return Shape.array(element_type, self.dimensions, self.layout, self.dynamic)

    def compatible(self, other: Shape) -> bool:
        """Equal ignoring layouts (and dynamic flags)."""
        if self.element_type is not other.element_type:
            return False
        if self.is_tuple:
            return len(self.tuple_shapes) == len(other.tuple_shapes) and all(
                a.compatible(b) for a, b in zip(self.tuple_shapes, other.tuple_shapes))
        return self.dimensions == other.dimensions

    def leaves(self) -> list[Shape]:
        """Array and token leaves in depth-first order."""
        if self.is_tuple:
            return [leaf for s in self.tuple_shapes for leaf in s.leaves()]
        return [self]

    def __hash__(self) -> int:
        return hash((self.element_type, self.dimensions, self.layout, self.dynamic, self.tuple_shapes))

    def __str__(self) -> str:
        if self.is_tuple:
            return "(" + ", ".join(str(s) for s in self.tuple_shapes) + ")"
        if self.is_token:
            return "token[]"
        dims = ",".join(("<=" if dyn else "") + str(d) for d, dyn in zip(self.dimensions, self.dynamic))
        return f"{self.element_type.value}[{dims}]" + (str(self.layout) if self.layout is not None else "")

    def __repr__(self) -> str:
        return f"Shape({str(self)!r})"


class Token:
    """The runtime value of a token: carries no data, only ordering."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "Token"

    def __reduce__(self):
        return (_token, ())


TOKEN = Token()


def _token() -> Token:
    return TOKEN


def _as_type(t: PrimitiveType | str | Any) -> PrimitiveType:
    if isinstance(t, PrimitiveType):
        return t
    if isinstance(t, str):
        return PrimitiveType.parse(t)
    return PrimitiveType.from_dtype(t)


def _check_layout(layout: Layout, dims: tuple[int, ...]) -> None:
    if sorted(layout.minor_to_major) != list(range(len(dims))):
        raise ProgramError(f"layout {{{','.join(map(str, layout.minor_to_major))}}} is not a permutation "
                           f"of the {len(dims)} dimensions")
    if layout.padded_dimensions is not None:
        if len(layout.padded_dimensions) != len(dims):
            raise ProgramError("padded_dimensions must have one entry per dimension")
        if any(p < d for p, d in zip(layout.padded_dimensions, dims)):
            raise ProgramError(f"padded_dimensions {list(layout.padded_dimensions)} smaller than "
                               f"dimensions {list(dims)}")


_TYPE_RE = re.compile(r"[a-z][a-z0-9]*")


class _ShapeParser:
    """Recursive-descent parser for HLO shape syntax; also used by the HLO text parser."""

    def __init__(self, text: str, pos: int = 0) -> None:
        self.text = text
        self.pos = pos

    def skip_ws(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in " \t\r\n":
            self.pos += 1

    def fail(self, what: str) -> ProgramError:
        return ProgramError(f"bad shape at column {self.pos + 1}: {what} in {self.text[:80]!r}")

    def shape(self, depth: int = 0) -> Shape:
        self.skip_ws()
        if self.text.startswith("(", self.pos):
            if depth >= MAX_NESTING:
                raise self.fail(f"tuple shape nests deeper than {MAX_NESTING} levels")
            self.pos += 1
            elems: list[Shape] = []
            self.skip_ws()
            if self.text.startswith(")", self.pos):
                self.pos += 1
                return Shape.tuple([])
            while True:
                elems.append(self.shape(depth + 1))
                self.skip_ws()
                if self.text.startswith(",", self.pos):
                    self.pos += 1
                    continue
                if self.text.startswith(")", self.pos):
                    self.pos += 1
                    return Shape.tuple(elems)
                raise self.fail("expected ',' or ')' in tuple shape")
        m = _TYPE_RE.match(self.text, self.pos)
        if not m:
            raise self.fail("expected a type")
        name = m.group(0)
        self.pos = m.end()
        if name == "token":
            if self.text.startswith("[]", self.pos):
                self.pos += 2
            return Shape.token()
        try:
            et = PrimitiveType(name)
        except ValueError:
            raise self.fail(f"unknown element type {name!r}") from None
        if not et.is_array_type:
            raise self.fail(f"{name} is not an element type")
        if not self.text.startswith("[", self.pos):
            raise self.fail("expected '['")
        end = self.text.find("]", self.pos)
        if end < 0:
            raise self.fail("unclosed '['")
        body = self.text[self.pos + 1:end].strip()
        self.pos = end + 1
        dims: list[int] = []
        dyn: list[bool] = []
        if body:
            for part in body.split(","):
                part = part.strip()
                is_dyn = part.startswith("<=")
                if is_dyn:
                    part = part[2:].strip()
                if part == "?":
                    raise self.fail("unbounded dynamic dimensions are not supported")
                if not part.isdigit():
                    raise self.fail(f"bad dimension {part!r}")
                dims.append(int(part))
                dyn.append(is_dyn)
        layout = None
        if self.text.startswith("{", self.pos):
            end = self.text.find("}", self.pos)
            if end < 0:
                raise self.fail("unclosed layout '{'")
            body = self.text[self.pos + 1:end]
            self.pos = end + 1
            # Tiling "(8,128)" may contain "}"-free parentheses only, so find() above is enough.
            colon = body.find(":")
            order, extra = (body, "") if colon < 0 else (body[:colon], body[colon:])
            order = order.strip()
            try:
                m2m = tuple(int(x) for x in order.split(",")) if order else ()
            except ValueError:
                raise self.fail(f"bad layout {{{body}}}") from None
            if len(m2m) != len(dims):
                raise self.fail(f"layout {{{body}}} does not match rank {len(dims)}")
            layout = Layout(m2m, extra=extra)
        try:
            return Shape.array(et, dims, layout, dyn)
        except ProgramError as e:
            raise self.fail(str(e)) from None


def dtype_of(element_type: PrimitiveType | str) -> np.dtype:
    return _as_type(element_type).dtype


__all__ = ["PrimitiveType", "Layout", "Shape", "Token", "TOKEN", "dtype_of"]
