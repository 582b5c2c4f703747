"""msgpack serialization of a `Module` (the `.msgpack` program format), and of attribute values.

File layout: `MAGIC` (8 bytes), the format version (uint16, little-endian), then one msgpack map
holding the module. Plain data only: nothing in a file is ever executed or imported (no pickle), and
a damaged or hostile file raises `ProgramError`. Every length the unpacker accepts is bounded by the
size of the input, nesting is bounded by `MAX_DEPTH` (`msgpack_bounds`: unpacking within bounds),
and every field's type is checked. Opcodes and
attribute names are not judged here (the verifier does that).

Values that msgpack has no exact form for travel as ext types whose payload is itself msgpack:
tuples (so a list stays a list and a tuple a tuple), `Shape`s, numpy arrays of every XLA element
type (dtype name, dimensions, little-endian row-major bytes), integers beyond 64 bits, complex
numbers, dicts with non-string keys, and the token. Floats keep their exact bits (nan, inf, -0.0).
numpy scalars become the Python scalar of the same value. `encode_value` / `decode_value` (and the
byte-level `pack_value` / `unpack_value`) are public: the runtime reuses them to ship values.
"""

from __future__ import annotations

import re
import struct
from typing import Any

import msgpack
import numpy as np

from replicas import limits
from replicas.errors import ProgramError
from replicas.hlo.ir import NO_ATTRS, Computation, Instruction, Module
from replicas.hlo.msgpack_bounds import (  # noqa: F401  (MAX_BYTES, DECODE_EXPANSION: the format's limits)
    DECODE_EXPANSION,
    MAX_BYTES,
    MAX_DEPTH,
    ModuleReader,
    read_bounded,
    too_deep,
    unpack_bounded,
)
from replicas.layout import from_bytes, to_bytes
from replicas.shapes import TOKEN, Layout, PrimitiveType, Shape, Token

MAGIC = b"\x89RPLMOD\n"  # PNG-style: the high byte and the newline catch text-mode mangling
FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sH")


EXT_TUPLE = 1
EXT_NDARRAY = 2
EXT_SHAPE = 3
EXT_BIGINT = 4
EXT_TOKEN = 5
EXT_DICT = 6
EXT_COMPLEX = 7

_INT_MIN, _INT_MAX = -(1 << 63), (1 << 64) - 1
_BIGINT_RE = re.compile(rb"-?[0-9]{1,4000}")
_MAX_DIMENSION = 1 << 62


# -- values ------------------------------------------------------------------------------------------

def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True, strict_types=True)


def encode_value(value: Any, _depth: int = 0) -> Any:
    """An attribute or runtime value as a msgpack-ready object (see the module docstring)."""
    if _depth > MAX_DEPTH:
        raise too_deep("a value to serialize")
    deeper = _depth + 1
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)  # the plain string of a str subclass (a StrEnum member, say)
    if isinstance(value, bytes):
        return bytes(value)
    if isinstance(value, int):
        return int(value) if _INT_MIN <= value <= _INT_MAX else msgpack.ExtType(EXT_BIGINT, str(value).encode())
    if isinstance(value, float):
        return float(value)
    if isinstance(value, list):
        return [encode_value(v, deeper) for v in value]
    if isinstance(value, tuple):
        return msgpack.ExtType(EXT_TUPLE, _pack([encode_value(v, deeper) for v in value]))
    if isinstance(value, dict):
        if all(type(k) is str for k in value):
            return {k: encode_value(v, deeper) for k, v in value.items()}
        return msgpack.ExtType(EXT_DICT, _pack([[encode_value(k, deeper), encode_value(v, deeper)]
                                                for k, v in value.items()]))
    if isinstance(value, Shape):
        return msgpack.ExtType(EXT_SHAPE, _pack(encode_shape(value)))
    if isinstance(value, np.ndarray):
        return msgpack.ExtType(EXT_NDARRAY, _pack(_encode_array(value)))
    if isinstance(value, Token):
        return msgpack.ExtType(EXT_TOKEN, b"")
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.integer):
        return encode_value(int(value), _depth)
    if isinstance(value, complex | np.complexfloating):
        return msgpack.ExtType(EXT_COMPLEX, _pack([float(value.real), float(value.imag)]))
    if isinstance(value, np.floating):
        return float(value)
    raise ProgramError(f"cannot serialize a value of type {type(value).__name__}: {value!r:.80}")


def _encode_array(array: np.ndarray) -> list:
    if array.dtype == object:
        raise ProgramError("cannot serialize a numpy array of Python objects")
    element_type = PrimitiveType.from_dtype(array.dtype)
    dims = [int(d) for d in array.shape]
    return [element_type.value, dims, to_bytes(array, Shape.array(element_type, dims))]


def decode_value(obj: Any, _depth: int = 0) -> Any:
    """The inverse of `encode_value`, checking everything: malformed input raises ProgramError."""
    if _depth > MAX_DEPTH:
        raise too_deep("a serialized value")
    deeper = _depth + 1
    if obj is None or isinstance(obj, (bool, int, float, str, bytes)):
        return obj
    if isinstance(obj, list):
        return [decode_value(v, deeper) for v in obj]
    if isinstance(obj, dict):
        return {_expect(k, str, "a map key"): decode_value(v, deeper) for k, v in obj.items()}
    if isinstance(obj, msgpack.ExtType):
        return _decode_ext(obj.code, obj.data, deeper)
    raise ProgramError(f"unexpected {type(obj).__name__} in serialized data")


def _decode_ext(code: int, data: bytes, depth: int) -> Any:
    if code == EXT_TUPLE:
        items = _expect(unpack_bounded(data, "tuple"), list, "a tuple payload")
        return tuple(decode_value(v, depth) for v in items)
    if code == EXT_DICT:
        pairs = _expect(unpack_bounded(data, "dict"), list, "a dict payload")
        result = {}
        for pair in pairs:
            if not isinstance(pair, list) or len(pair) != 2:
                raise ProgramError("a dict entry must be a [key, value] pair")
            key = decode_value(pair[0], depth)
            try:
                result[key] = decode_value(pair[1], depth)
            except TypeError:
                raise ProgramError(f"unhashable dict key of type {type(key).__name__}") from None
        return result
    if code == EXT_SHAPE:
        return decode_shape(unpack_bounded(data, "shape"), depth)
    if code == EXT_NDARRAY:
        return _decode_array(unpack_bounded(data, "array"), depth)
    if code == EXT_BIGINT:
        if not _BIGINT_RE.fullmatch(data):
            raise ProgramError("malformed big integer")
        return int(data.decode("ascii"))
    if code == EXT_TOKEN:
        if data:
            raise ProgramError("a token carries no data")
        return TOKEN
    if code == EXT_COMPLEX:
        parts = unpack_bounded(data, "complex")
        if not (isinstance(parts, list) and len(parts) == 2 and all(type(p) is float for p in parts)):
            raise ProgramError("a complex number must be [real, imag] floats")
        return complex(parts[0], parts[1])
    raise ProgramError(f"unknown msgpack extension type {code}")


def _decode_array(obj: Any, depth: int) -> np.ndarray:
    if not (isinstance(obj, list) and len(obj) == 3):
        raise ProgramError("an array must be [element type, dimensions, bytes]")
    type_name, dims, data = obj
    element_type = _element_type(type_name)
    dims = _int_list(dims, "array dimensions", low=0, high=_MAX_DIMENSION)
    if not isinstance(data, bytes):
        raise ProgramError("array data must be binary")
    return from_bytes(data, Shape.array(element_type, dims))


def pack_value(value: Any) -> bytes:
    """`value` as msgpack bytes (no file header): for shipping values between processes."""
    return _pack(encode_value(value))


def unpack_value(data: bytes) -> Any:
    """The value `pack_value` packed; damaged bytes raise ProgramError."""
    return decode_value(unpack_bounded(data, "value"))


# -- shapes ------------------------------------------------------------------------------------------

def encode_shape(shape: Shape, _depth: int = 0) -> list:
    """A shape as plain msgpack data: ["token"], ["tuple", [shapes]], or
    [element type, dimensions, dynamic flags, layout] with layout None or
    [minor_to_major, padded_dimensions or None, padding_value, extra]."""
    if _depth > MAX_DEPTH:
        raise too_deep("a shape to serialize")
    if not isinstance(shape, Shape):
        raise ProgramError(f"expected a Shape, got {type(shape).__name__}")
    if shape.is_token:
        return ["token"]
    if shape.is_tuple:
        return ["tuple", [encode_shape(s, _depth + 1) for s in shape.tuple_shapes]]
    layout = shape.layout
    encoded_layout = None
    if layout is not None:
        padded = None if layout.padded_dimensions is None else [int(p) for p in layout.padded_dimensions]
        encoded_layout = [[int(i) for i in layout.minor_to_major], padded, encode_value(layout.padding_value),
                          layout.extra]
    return [shape.element_type.value, [int(d) for d in shape.dimensions], [bool(x) for x in shape.dynamic],
            encoded_layout]


def decode_shape(obj: Any, _depth: int = 0) -> Shape:
    """The inverse of `encode_shape`; a malformed shape raises ProgramError."""
    if _depth > MAX_DEPTH:
        raise too_deep("a serialized shape")
    if not isinstance(obj, list) or not obj:
        raise ProgramError("a shape must be a non-empty list")
    if obj == ["token"]:
        return Shape.token()
    if obj[0] == "tuple":
        if len(obj) != 2 or not isinstance(obj[1], list):
            raise ProgramError("a tuple shape must be ['tuple', [shapes]]")
        return Shape.tuple([decode_shape(s, _depth + 1) for s in obj[1]])
    if len(obj) != 4:
        raise ProgramError("an array shape must be [type, dimensions, dynamic, layout]")
    type_name, dims, dynamic, layout_obj = obj
    element_type = _element_type(type_name)
    dims = _int_list(dims, "shape dimensions", low=0, high=_MAX_DIMENSION)
    if not isinstance(dynamic, list) or not all(type(x) is bool for x in dynamic):
        raise ProgramError("dynamic flags must be a list of booleans")
    if len(dynamic) not in (0, len(dims)):
        raise ProgramError("dynamic flags must have one entry per dimension")
    layout = None if layout_obj is None else _decode_layout(layout_obj, len(dims))
    validated = Shape.array(element_type, dims, layout, dynamic or None)
    # Shape.array canonicalizes the flags; keep them exactly as written (equality compares them).
    return Shape(element_type, validated.dimensions, validated.layout, tuple(dynamic))


def _decode_layout(obj: Any, rank: int) -> Layout:
    if not (isinstance(obj, list) and len(obj) == 4):
        raise ProgramError("a layout must be [minor_to_major, padded_dimensions, padding_value, extra]")
    order, padded, padding_value, extra = obj
    order = _int_list(order, "minor_to_major", low=0, high=max(rank - 1, 0))
    if padded is not None:
        padded = tuple(_int_list(padded, "padded_dimensions", low=0, high=_MAX_DIMENSION))
    if type(padding_value) not in (int, float):
        raise ProgramError("padding_value must be a number")
    return Layout(tuple(order), padded, padding_value, _expect(extra, str, "layout extra"))


def _element_type(name: Any) -> PrimitiveType:
    if not isinstance(name, str):
        raise ProgramError("an element type must be a string")
    try:
        element_type = PrimitiveType(name)
    except ValueError:
        raise ProgramError(f"unknown element type {name!r:.40}") from None
    if not element_type.is_array_type:
        raise ProgramError(f"{name} is not an array element type")
    return element_type


def _int_list(obj: Any, what: str, *, low: int, high: int) -> list[int]:
    if not isinstance(obj, list) or not all(type(x) is int and low <= x <= high for x in obj):
        raise ProgramError(f"{what} must be a list of integers in [{low}, {high}]")
    return obj


def _expect(obj: Any, kind: type, what: str) -> Any:
    if type(obj) is not kind:
        raise ProgramError(f"{what} must be {kind.__name__}, not {type(obj).__name__}")
    return obj


# -- modules -----------------------------------------------------------------------------------------

def _encode_attrs(attrs: dict[str, Any], owner: str) -> dict[str, Any]:
    if not isinstance(attrs, dict) or not all(type(k) is str for k in attrs):
        raise ProgramError(f"attributes of {owner} must be a dict with string keys")
    return {k: encode_value(v) for k, v in attrs.items()}


def _encode_instruction(inst: Instruction) -> dict[str, Any]:
    owner = f"%{inst.name}"
    if inst.line is not None and type(inst.line) is not int:
        raise ProgramError(f"line of {owner} must be an int or None")
    return {"name": inst.name, "opcode": inst.opcode, "shape": encode_shape(inst.shape),
            "operands": list(inst.operands), "attrs": _encode_attrs(inst.attrs, owner), "line": inst.line}


def module_to_bytes(module: Module) -> bytes:
    """The `.msgpack` bytes of `module` (header + msgpack map)."""
    if not isinstance(module, Module):
        raise ProgramError(f"expected a Module, got {type(module).__name__}")
    body = {
        "name": module.name,
        "entry": module.entry,
        "attrs": _encode_attrs(module.attrs, f"module {module.name}"),
        "computations": [
            {"name": comp.name, "root": comp.root, "is_fusion": bool(comp.is_fusion),
             "instructions": [_encode_instruction(inst) for inst in comp.instructions]}
            for comp in module.computations.values()
        ],
    }
    try:
        payload = _pack(body)
    except (TypeError, ValueError, OverflowError) as e:  # a str field that is not a str, say
        raise ProgramError(f"cannot serialize module {module.name}: {e}") from None
    return _HEADER.pack(MAGIC, FORMAT_VERSION) + payload


def _fields(obj: Any, keys: tuple[str, ...], what: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise ProgramError(f"{what} must be a map")
    if set(obj) != set(keys):
        missing = sorted(set(keys) - set(obj))
        extra = sorted(set(obj) - set(keys))
        raise ProgramError(f"{what} has missing fields {missing} or unknown fields {extra}")
    return obj


def _decode_attrs(obj: Any, what: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise ProgramError(f"attributes of {what} must be a map")
    return {k: decode_value(v, 1) for k, v in obj.items()}


def _decode_instruction(obj: Any, computation: str) -> Instruction:
    fields = _fields(obj, ("name", "opcode", "shape", "operands", "attrs", "line"),
                     f"an instruction of computation {computation}")
    name = _expect(fields["name"], str, "an instruction name")
    what = f"instruction %{name}"
    operands = fields["operands"]
    if not isinstance(operands, list) or not all(type(o) is str for o in operands):
        raise ProgramError(f"operands of {what} must be a list of names")
    line = fields["line"]
    if line is not None and type(line) is not int:
        raise ProgramError(f"line of {what} must be an int or null")
    try:
        shape = decode_shape(fields["shape"])
        attrs = _decode_attrs(fields["attrs"], what)
    except ProgramError as e:
        raise ProgramError(str(e), instruction=f"%{name} in computation {computation}", line=line) from None
    return Instruction(name=name, opcode=_expect(fields["opcode"], str, f"opcode of {what}"),
                       shape=shape, operands=operands, attrs=attrs or NO_ATTRS, line=line)


def _decode_module(body: Any) -> Module:
    fields = _fields(body, ("name", "entry", "attrs", "computations"), "the module")
    module = Module(name=_expect(fields["name"], str, "the module name"),
                    entry=_expect(fields["entry"], str, "the entry computation name"),
                    attrs=_decode_attrs(fields["attrs"], "the module"))
    computations = _expect(fields["computations"], list, "the computations")
    for comp_obj in computations:
        comp_fields = _fields(comp_obj, ("name", "root", "is_fusion", "instructions"), "a computation")
        name = _expect(comp_fields["name"], str, "a computation name")
        comp = Computation(name=name, root=_expect(comp_fields["root"], str, f"the root of {name}"),
                           is_fusion=_expect(comp_fields["is_fusion"], bool, f"is_fusion of {name}"))
        for inst_obj in _expect(comp_fields["instructions"], list, f"the instructions of {name}"):
            comp.add(_decode_instruction(inst_obj, name))
        module.add(comp)
    return module


def module_from_bytes(data: bytes | bytearray | memoryview) -> Module:
    """The module in `.msgpack` bytes. Anything damaged, foreign or hostile raises ProgramError."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ProgramError(f"expected bytes, got {type(data).__name__}")
    try:
        data = memoryview(data).cast("B")
    except TypeError:
        raise ProgramError("expected a contiguous byte buffer") from None
    limits.check_program_size(len(data), "the .msgpack module")
    if len(data) < _HEADER.size or data[:len(MAGIC)] != MAGIC:
        raise ProgramError("not a replicas .msgpack module (bad magic number)")
    _, version = _HEADER.unpack_from(data)
    if version != FORMAT_VERSION:
        raise ProgramError(f"unsupported .msgpack module format version {version} "
                           f"(this version of replicas reads version {FORMAT_VERSION})")
    body_bytes = data[_HEADER.size:]  # a view: big constants are not copied first
    body = read_bounded(body_bytes, "module", lambda unpacker: ModuleReader(unpacker, body_bytes).module())
    try:
        return _decode_module(body)
    except ProgramError:
        raise
    except (ValueError, TypeError, OverflowError, MemoryError, RecursionError) as e:
        # A value numpy or the IR refuses in a way the checks above did not foresee: still a bad file.
        raise ProgramError(f"damaged module: {type(e).__name__}: {e}") from None


__all__ = ["MAGIC", "FORMAT_VERSION", "MAX_DEPTH", "module_to_bytes", "module_from_bytes", "encode_value",
           "decode_value", "pack_value", "unpack_value", "encode_shape", "decode_shape"]
