"""Index maths and literal bytes for any layout (the "Layout" and "Indexing into arrays" sections
of the Shapes and Layout document), built on `replicas.shapes`."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from replicas.errors import ProgramError
from replicas.shapes import TOKEN, PrimitiveType, Shape, Token


def _array_shape(shape: Shape, what: str) -> Shape:
    if not isinstance(shape, Shape):
        raise ProgramError(f"{what}: expected a Shape, got {type(shape).__name__}")
    if not shape.is_array:
        raise ProgramError(f"{what}: {shape} is not an array shape")
    return shape


def buffer_dimensions(shape: Shape) -> tuple[int, ...]:
    """The per-dimension sizes of the buffer holding an array: `padded_dimensions` if the layout pads,
    else the dimensions. Listed in dimension order (not layout order)."""
    shape = _array_shape(shape, "buffer_dimensions")
    layout = shape.layout
    if layout is not None and layout.padded_dimensions is not None:
        return tuple(layout.padded_dimensions)
    return shape.dimensions


def _as_index(value: Any, what: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ProgramError(f"{what} must be an integer, got {value!r}")
    return int(value)


def linear_index(shape: Shape, multi_index: Any, *, allow_padding: bool = False) -> int:
    """The position of element `multi_index` in the buffer of `shape` (XLA's IndexUtil).

    The index runs over the padded buffer when the layout has `padded_dimensions`, so with
    dimensions [2,3], padded_dimensions [3,5] and minor_to_major [0,1], element (1,2) is at 7.
    Entries must lie inside the dimensions; `allow_padding=True` also accepts positions in the padding.
    """
    shape = _array_shape(shape, "linear_index")
    try:
        entries = list(multi_index)
    except TypeError:
        raise ProgramError(f"a multi-dimensional index must be a sequence, got {multi_index!r}") from None
    index = [_as_index(i, "a multi-dimensional index entry") for i in entries]
    if len(index) != shape.rank:
        raise ProgramError(f"index {index} has {len(index)} entries; {shape} has rank {shape.rank}")
    sizes = buffer_dimensions(shape)
    bounds = sizes if allow_padding else shape.dimensions
    for d, (i, bound) in enumerate(zip(index, bounds)):
        if not 0 <= i < bound:
            raise ProgramError(f"index {index} is out of bounds in dimension {d} of {shape}")
    linear = 0
    scale = 1
    for d in shape.minor_to_major:
        linear += index[d] * scale
        scale *= sizes[d]
    return linear


def multi_index(shape: Shape, linear: Any, *, allow_padding: bool = False) -> tuple[int, ...]:
    """The inverse of `linear_index`: the multi-dimensional index of buffer position `linear`.

    A position in the padding raises ProgramError unless `allow_padding=True` (then the returned index
    reaches into the padded dimensions).
    """
    shape = _array_shape(shape, "multi_index")
    position = _as_index(linear, "a linear index")
    sizes = buffer_dimensions(shape)
    total = 1
    for s in sizes:
        total *= s
    if not 0 <= position < total:
        raise ProgramError(f"linear index {position} is out of bounds for {shape} (buffer of {total} elements)")
    index = [0] * shape.rank
    rest = position
    for d in shape.minor_to_major:
        rest, index[d] = divmod(rest, sizes[d])
    if not allow_padding and any(i >= n for i, n in zip(index, shape.dimensions)):
        raise ProgramError(f"linear index {position} of {shape} lies in the padding (index {index})")
    return tuple(index)


def byte_size(shape: Shape) -> int:
    """Bytes of `to_bytes` for `shape`: padded buffer elements times element size (sub-byte types take a
    whole byte each); a tuple is the sum of its leaves; a token has none."""
    if not isinstance(shape, Shape):
        raise ProgramError(f"byte_size: expected a Shape, got {type(shape).__name__}")
    if shape.is_tuple:
        return sum(byte_size(s) for s in shape.tuple_shapes)
    if shape.is_token:
        return 0
    n = shape.dtype.itemsize
    for s in buffer_dimensions(shape):
        n *= s
    return n


# Sub-byte types live one element per byte in the low bits; the other bits are zero.
_SUB_BYTE_MASKS = {PrimitiveType.S2: 0x03, PrimitiveType.U2: 0x03, PrimitiveType.S4: 0x0F, PrimitiveType.U4: 0x0F}


def _swap_to_little(buffer: np.ndarray) -> np.ndarray:
    """`buffer` (C-contiguous) with little-endian element bytes: a no-op on little-endian hosts."""
    if sys.byteorder == "little" or buffer.dtype.itemsize == 1:
        return buffer
    component = buffer.dtype.itemsize // 2 if buffer.dtype.kind == "c" else buffer.dtype.itemsize
    return buffer.view(np.dtype(f"u{component}")).byteswap().view(buffer.dtype)


def _padding_fill(shape: Shape) -> np.ndarray:
    value = shape.layout.padding_value if shape.layout is not None else 0
    try:
        with np.errstate(all="ignore"):
            return np.asarray(value).astype(shape.dtype)
    except (TypeError, ValueError) as e:
        raise ProgramError(f"padding value {value!r} does not convert to {shape.element_type.value}: {e}") from None


def _layout_axes(shape: Shape) -> tuple[int, ...]:
    # numpy's C order is major-to-minor, the reverse of minor_to_major.
    return tuple(reversed(shape.minor_to_major))


def _leaf_to_bytes(value: Any, shape: Shape) -> bytes:
    if shape.is_token:
        if not isinstance(value, Token):
            raise ProgramError(f"to_bytes: expected a token for {shape}, got {type(value).__name__}")
        return b""
    if isinstance(value, (tuple, Token)) or (isinstance(value, np.ndarray) and value.dtype == object):
        raise ProgramError(f"to_bytes: expected an array for {shape}, got {type(value).__name__}")
    array = np.asarray(value)
    if array.dtype != shape.dtype:
        raise ProgramError(f"to_bytes: array of dtype {array.dtype} does not match {shape}")
    if array.shape != shape.dimensions:
        raise ProgramError(f"to_bytes: array of shape {list(array.shape)} does not match {shape}")
    padded = buffer_dimensions(shape)
    if padded != shape.dimensions:
        buffer = np.empty(padded, dtype=shape.dtype)
        buffer[...] = _padding_fill(shape)
        buffer[tuple(slice(0, n) for n in shape.dimensions)] = array
        array = buffer
    laid_out = np.ascontiguousarray(np.transpose(array, _layout_axes(shape)))
    if shape.element_type is PrimitiveType.PRED:
        return (laid_out.view(np.uint8) != 0).tobytes()  # 0 or 1, whatever bits a bool view carried
    if shape.element_type in _SUB_BYTE_MASKS:
        return (laid_out.view(np.uint8) & _SUB_BYTE_MASKS[shape.element_type]).tobytes()
    return _swap_to_little(laid_out).tobytes()


def _leaf_from_bytes(data: memoryview, shape: Shape) -> Any:
    if shape.is_token:
        return TOKEN
    element_type = shape.element_type
    padded = buffer_dimensions(shape)
    extent = shape.dtype.itemsize
    for n in padded:
        extent *= max(n, 1)
    if extent > np.iinfo(np.intp).max:  # numpy refuses such dimensions even when one of them is 0
        raise ProgramError(f"from_bytes: {shape} is too large for numpy")
    axes = _layout_axes(shape)
    if element_type is PrimitiveType.PRED or element_type in _SUB_BYTE_MASKS:
        # Canonicalize the bits: any nonzero byte is true; only the low bits of a sub-byte element count.
        raw = np.frombuffer(data, dtype=np.uint8)
        if element_type is PrimitiveType.PRED:
            flat = raw != 0
        else:
            flat = (raw & _SUB_BYTE_MASKS[element_type]).view(shape.dtype)
    else:
        flat = _swap_to_little(np.frombuffer(data, dtype=shape.dtype))
    laid_out = flat.reshape([padded[d] for d in axes])
    logical = np.transpose(laid_out, np.argsort(axes))
    logical = logical[tuple(slice(0, n) for n in shape.dimensions)]
    return np.array(logical, dtype=shape.dtype, copy=True, order="C")


def to_bytes(value: Any, shape: Shape) -> bytes:
    """The bytes of `value` laid out as `shape` says: elements in `minor_to_major` order, each
    little-endian, padded dimensions filled with the layout's `padding_value`.

    `value` must be an array with exactly the shape's dimensions and dtype (a dynamic dimension is
    stored at its bound). A tuple value (for a tuple shape) becomes the concatenation of its leaves'
    bytes, depth first; a token has no bytes. Sub-byte types (s2/u2/s4/u4) take one byte per element,
    in the byte's low bits; pred is one byte, 0 or 1.
    """
    if not isinstance(shape, Shape):
        raise ProgramError(f"to_bytes: expected a Shape, got {type(shape).__name__}")
    if shape.is_tuple:
        if not isinstance(value, tuple) or len(value) != len(shape.tuple_shapes):
            raise ProgramError(f"to_bytes: expected a tuple of {len(shape.tuple_shapes)} values for {shape}")
        return b"".join(to_bytes(v, s) for v, s in zip(value, shape.tuple_shapes))
    return _leaf_to_bytes(value, shape)


def from_bytes(data: bytes | bytearray | memoryview, shape: Shape) -> Any:
    """The value stored in `data` as laid out by `to_bytes`: a fresh writable numpy array with the
    shape's dtype and (logical, unpadded) dimensions; a tuple of values for a tuple shape; TOKEN for a
    token. The byte length must be exactly `byte_size(shape)`; padding bytes are ignored.
    """
    if not isinstance(shape, Shape):
        raise ProgramError(f"from_bytes: expected a Shape, got {type(shape).__name__}")
    try:
        view = memoryview(data).cast("B")
    except TypeError:
        raise ProgramError(f"from_bytes: expected bytes, got {type(data).__name__}") from None
    expected = byte_size(shape)
    if len(view) != expected:
        raise ProgramError(f"from_bytes: {shape} takes {expected} bytes, got {len(view)}")
    return _from_view(view, shape)


def _from_view(view: memoryview, shape: Shape) -> Any:
    if not shape.is_tuple:
        return _leaf_from_bytes(view, shape)
    values = []
    offset = 0
    for s in shape.tuple_shapes:
        size = byte_size(s)
        values.append(_from_view(view[offset:offset + size], s))
        offset += size
    return tuple(values)
