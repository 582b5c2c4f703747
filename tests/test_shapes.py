"""Shapes and Layout: parsing, dimension helpers, IndexUtil index maths, array <-> bytes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replicas.errors import ProgramError
from replicas.layout import buffer_dimensions, byte_size, from_bytes, linear_index, multi_index, to_bytes
from replicas.shapes import TOKEN, Layout, PrimitiveType, Shape


def _has_dtype(element_type: PrimitiveType) -> bool:
    try:
        return element_type.dtype is not None
    except ProgramError:
        return False  # an f8 type this ml_dtypes lacks


ARRAY_TYPES = [t for t in PrimitiveType if t.is_array_type and _has_dtype(t)]
SUB_BYTE = {PrimitiveType.S2: (-2, 1), PrimitiveType.U2: (0, 3), PrimitiveType.S4: (-8, 7),
            PrimitiveType.U4: (0, 15)}

# The document's 2x3 array "a b c / d e f", with a..f standing for 1..6.
ABCDEF = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.int32)


def _elements(data: bytes) -> list[int]:
    return np.frombuffer(data, dtype="<i4").tolist()


# -- the document's examples -------------------------------------------------------------------------

def test_document_column_major_layout():
    shape = Shape.array("s32", [2, 3], [0, 1])
    assert _elements(to_bytes(ABCDEF, shape)) == [1, 4, 2, 5, 3, 6]  # a d b e c f


def test_document_row_major_layout():
    shape = Shape.array("s32", [2, 3], [1, 0])
    assert _elements(to_bytes(ABCDEF, shape)) == [1, 2, 3, 4, 5, 6]  # a b c d e f
    # The default layout (no layout at all) is major-to-minor too.
    assert to_bytes(ABCDEF, Shape.array("s32", [2, 3])) == to_bytes(ABCDEF, shape)


def test_document_padded_layout():
    shape = Shape.array("s32", [2, 3], Layout((0, 1), padded_dimensions=(3, 5), padding_value=0))
    data = to_bytes(ABCDEF, shape)
    assert _elements(data) == [1, 4, 0, 2, 5, 0, 3, 6, 0, 0, 0, 0, 0, 0, 0]  # a d 0 b e 0 c f 0 0 0 0 0 0 0
    assert byte_size(shape) == 15 * 4
    back = from_bytes(data, shape)
    assert back.dtype == np.int32 and np.array_equal(back, ABCDEF)


def test_document_padded_layout_index_maths():
    shape = Shape.array("s32", [2, 3], Layout((0, 1), padded_dimensions=(3, 5)))
    assert buffer_dimensions(shape) == (3, 5)
    expected = {(0, 0): 0, (1, 0): 1, (0, 1): 3, (1, 1): 4, (0, 2): 6, (1, 2): 7}
    for index, position in expected.items():
        assert linear_index(shape, index) == position
        assert multi_index(shape, position) == index
    with pytest.raises(ProgramError, match="padding"):
        multi_index(shape, 2)
    assert multi_index(shape, 2, allow_padding=True) == (2, 0)
    assert multi_index(shape, 14, allow_padding=True) == (2, 4)
    assert linear_index(shape, (2, 4), allow_padding=True) == 14
    with pytest.raises(ProgramError):
        linear_index(shape, (2, 0))


def test_padding_value_fills_padding():
    shape = Shape.array("f32", [2, 3], Layout((1, 0), padded_dimensions=(2, 4), padding_value=-1.5))
    values = np.arange(6, dtype=np.float32).reshape(2, 3)
    flat = np.frombuffer(to_bytes(values, shape), dtype="<f4")
    assert flat.tolist() == [0, 1, 2, -1.5, 3, 4, 5, -1.5]
    pred = Shape.array("pred", [1, 1], Layout((0, 1), padded_dimensions=(2, 1), padding_value=1))
    assert to_bytes(np.array([[False]]), pred) == b"\x00\x01"


# -- index maths -------------------------------------------------------------------------------------

def test_index_maths_column_and_row_major():
    column = Shape.array("f32", [2, 3], [0, 1])
    row = Shape.array("f32", [2, 3], [1, 0])
    assert [linear_index(column, (i, j)) for j in range(3) for i in range(2)] == list(range(6))
    assert [linear_index(row, (i, j)) for i in range(2) for j in range(3)] == list(range(6))
    assert linear_index(Shape.scalar("f32"), ()) == 0
    assert multi_index(Shape.scalar("f32"), 0) == ()


@pytest.mark.parametrize("index", [(2, 0), (0, 3), (-1, 0), (0,), (0, 0, 0), (0.0, 1), (True, 0), 3, None])
def test_linear_index_rejects_bad_index(index):
    with pytest.raises(ProgramError):
        linear_index(Shape.array("f32", [2, 3]), index)


@pytest.mark.parametrize("position", [-1, 6, 1.0, "0"])
def test_multi_index_rejects_bad_position(position):
    with pytest.raises(ProgramError):
        multi_index(Shape.array("f32", [2, 3]), position)


def test_index_maths_needs_an_array_shape():
    for shape in (Shape.token(), Shape.tuple([Shape.scalar("f32")])):
        with pytest.raises(ProgramError):
            linear_index(shape, ())
        with pytest.raises(ProgramError):
            multi_index(shape, 0)
    with pytest.raises(ProgramError):
        multi_index(Shape.array("f32", [0, 3]), 0)  # an empty array has no elements


@st.composite
def array_shapes(draw, element_types=ARRAY_TYPES, max_rank=4, max_dim=4):
    rank = draw(st.integers(0, max_rank))
    dims = draw(st.lists(st.integers(0, max_dim), min_size=rank, max_size=rank))
    order = draw(st.permutations(list(range(rank))))
    padded = None
    if draw(st.booleans()):
        padded = tuple(d + draw(st.integers(0, 2)) for d in dims)
    element_type = draw(st.sampled_from(element_types))
    padding_value = draw(st.sampled_from([0, 1]))
    return Shape.array(element_type, dims, Layout(tuple(order), padded, padding_value))


@settings(max_examples=60, deadline=None)
@given(array_shapes(element_types=[PrimitiveType.S32]))
def test_linear_and_multi_index_round_trip(shape):
    total = int(np.prod(buffer_dimensions(shape)))
    logical = set()
    for position in range(total):
        index = multi_index(shape, position, allow_padding=True)
        assert linear_index(shape, index, allow_padding=True) == position
        if all(i < n for i, n in zip(index, shape.dimensions)):
            logical.add(index)
            assert multi_index(shape, position) == index
    assert len(logical) == shape.numel  # every element has exactly one position


@settings(max_examples=60, deadline=None)
@given(array_shapes(element_types=[PrimitiveType.S32]))
def test_linear_index_agrees_with_to_bytes(shape):
    values = np.arange(1, shape.numel + 1, dtype=np.int32).reshape(shape.dimensions)
    buffer = np.frombuffer(to_bytes(values, shape), dtype="<i4")
    for index in np.ndindex(*shape.dimensions):
        assert buffer[linear_index(shape, index)] == values[index]


# -- bytes -------------------------------------------------------------------------------------------

def _random_values(shape: Shape, rng: np.random.Generator) -> np.ndarray:
    et = shape.element_type
    if et is PrimitiveType.PRED:
        return rng.integers(0, 2, shape.dimensions).astype(bool)
    if et in SUB_BYTE:
        low, high = SUB_BYTE[et]
        return rng.integers(low, high + 1, shape.dimensions).astype(shape.dtype)
    # Arbitrary bit patterns: nans, infinities and subnormals included.
    raw = rng.integers(0, 256, shape.numel * shape.dtype.itemsize, dtype=np.uint8).tobytes()
    return np.frombuffer(raw, dtype=shape.dtype).reshape(shape.dimensions).copy()


@settings(max_examples=80, deadline=None)
@given(array_shapes(), st.integers(0, 2**32 - 1))
def test_bytes_round_trip(shape, seed):
    values = _random_values(shape, np.random.default_rng(seed))
    data = to_bytes(values, shape)
    assert len(data) == byte_size(shape)
    back = from_bytes(data, shape)
    assert back.dtype == shape.dtype and back.shape == shape.dimensions
    assert back.tobytes() == values.tobytes()  # bitwise, so nan payloads count
    assert back.flags.writeable
    # Read as a flat buffer, every element sits where the index maths says, and the rest is padding.
    buffer = from_bytes(data, Shape.array(shape.element_type, [byte_size(shape) // shape.dtype.itemsize]))
    positions = set()
    for index in np.ndindex(*shape.dimensions):
        position = linear_index(shape, index)
        positions.add(position)
        assert buffer[position].tobytes() == values[index].tobytes()
    fill = np.asarray(shape.layout.padding_value).astype(shape.dtype).tobytes()
    for position in set(range(buffer.size)) - positions:
        assert buffer[position].tobytes() == fill


def test_bytes_are_little_endian():
    assert to_bytes(np.array(1, np.int32), Shape.scalar("s32")) == b"\x01\x00\x00\x00"
    assert to_bytes(np.array(1.0, np.float32), Shape.scalar("f32")) == b"\x00\x00\x80\x3f"
    bf16 = PrimitiveType.BF16.dtype
    assert to_bytes(np.array(1.0, bf16), Shape.scalar("bf16")) == b"\x80\x3f"
    c64 = to_bytes(np.array(1 + 2j, np.complex64), Shape.scalar("c64"))
    assert c64 == b"\x00\x00\x80\x3f\x00\x00\x00\x40"


def test_sub_byte_types_take_one_byte_per_element():
    s4 = Shape.array("s4", [4])
    values = np.array([-8, -3, 0, 7], dtype=PrimitiveType.S4.dtype)
    data = to_bytes(values, s4)
    assert len(data) == 4
    assert np.array_equal(from_bytes(data, s4).astype(np.int32), [-8, -3, 0, 7])
    # Only the low bits count on reading.
    assert from_bytes(b"\xfd", Shape.array("s4", [1])).astype(np.int32).tolist() == [-3]
    assert from_bytes(b"\xf1", Shape.array("u2", [1])).astype(np.int32).tolist() == [1]
    # Any nonzero byte reads as true, and writing gives 0 or 1.
    pred = from_bytes(b"\x00\x02\xff", Shape.array("pred", [3]))
    assert pred.tolist() == [False, True, True]
    assert to_bytes(pred, Shape.array("pred", [3])) == b"\x00\x01\x01"
    # Writing canonicalizes arrays that carry stray bits (numpy views of foreign bytes).
    stray = np.frombuffer(b"\x00\x02\xfd", dtype=np.bool_)
    assert to_bytes(stray, Shape.array("pred", [3])) == b"\x00\x01\x01"
    stray_s4 = np.frombuffer(b"\xfd\x17", dtype=PrimitiveType.S4.dtype)
    assert to_bytes(stray_s4, Shape.array("s4", [2])) == b"\x0d\x07"


def test_tuple_bytes_are_concatenated_leaves():
    shape = Shape.parse("(s32[2]{0}, (pred[], token[]), u8[0])")
    value = (np.array([1, 2], np.int32), (np.array(True), TOKEN), np.zeros((0,), np.uint8))
    data = to_bytes(value, shape)
    assert data == b"\x01\x00\x00\x00\x02\x00\x00\x00\x01"
    assert byte_size(shape) == 9
    back = from_bytes(data, shape)
    assert isinstance(back, tuple) and isinstance(back[1], tuple)
    assert back[0].tolist() == [1, 2] and back[1][0].shape == () and bool(back[1][0])
    assert back[1][1] is TOKEN and back[2].shape == (0,)
    assert from_bytes(b"", Shape.token()) is TOKEN and to_bytes(TOKEN, Shape.token()) == b""


@pytest.mark.parametrize("value, shape", [
    (np.zeros((2, 3), np.float64), "f32[2,3]"),      # wrong dtype
    (np.zeros((3, 2), np.float32), "f32[2,3]"),      # wrong dimensions
    (np.float32(1), "f32[1]"),                        # wrong rank
    ((np.zeros(2, np.float32),), "f32[2]"),          # tuple for an array
    (np.zeros(2, np.float32), "(f32[2])"),           # array for a tuple
    ((np.zeros(2, np.float32),), "(f32[2], s32[])"),  # wrong tuple length
    (np.zeros(0, np.float32), "token[]"),            # array for a token
    (TOKEN, "f32[]"),                                # token for an array
    (np.array([object()]), "f32[1]"),               # not numeric
])
def test_to_bytes_rejects_mismatches(value, shape):
    with pytest.raises(ProgramError):
        to_bytes(value, Shape.parse(shape))


def test_from_bytes_rejects_wrong_length_and_inputs():
    with pytest.raises(ProgramError, match="takes 24 bytes"):
        from_bytes(b"\x00" * 23, Shape.parse("f32[2,3]"))
    with pytest.raises(ProgramError):
        from_bytes(b"\x00" * 25, Shape.parse("f32[2,3]"))
    with pytest.raises(ProgramError):
        from_bytes(b"\x00", Shape.parse("(pred[], pred[])"))
    with pytest.raises(ProgramError):
        from_bytes("abcd", Shape.parse("u8[4]"))
    with pytest.raises(ProgramError):
        from_bytes(b"", "f32[]")
    with pytest.raises(ProgramError):
        from_bytes(b"", Shape.array("f32", [0, 2**62]))  # numpy cannot even describe it


def test_from_bytes_accepts_buffers_and_copies():
    data = bytearray(b"\x01\x00\x02\x00")
    back = from_bytes(memoryview(data), Shape.parse("u16[2]"))
    data[0] = 9
    assert back.tolist() == [1, 2]


# -- parsing and helpers -----------------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "f32[2,3]{0,1}", "f32[2,3]{1,0}", "f32[2,3]", "(f32[2]{0}, s32[])", "token[]", "pred[]", "f32[<=10]",
    "s32[3,<=4]{0,1}", "((f32[], (token[], u8[1]{0})), bf16[2])", "()", "c64[0]", "f8e4m3fn[2]", "s4[8]",
    "f32[8,128]{1,0:T(8,128)}",
])
def test_shape_parse_str_round_trip(text):
    shape = Shape.parse(text)
    assert str(shape) == text
    assert Shape.parse(str(shape)) == shape


def test_parsed_shape_fields():
    shape = Shape.parse("(f32[2,3]{0,1}, s32[<=10], token[])")
    array, dynamic, token = shape.tuple_shapes
    assert array.minor_to_major == (0, 1) and array.dimensions == (2, 3) and array.dtype == np.float32
    assert dynamic.is_dynamic and dynamic.dynamic == (True,) and dynamic.layout is None
    assert token.is_token and shape.is_tuple and len(shape.leaves()) == 3
    assert Shape.parse("pred[]").is_scalar and Shape.parse("pred[]").dtype == np.bool_


@pytest.mark.parametrize("text", [
    "", "f32", "f32[2", "f32[a]", "f32[-1]", "f33[2]", "tuple[]", "f32[2]{1}", "f32[2,3]{0,0}", "f32[2]{0",
    "(f32[2]", "(f32[2] s32[])", "f32[2] extra", "f32[?]", "f32[2]{x}",
])
def test_bad_shapes_raise(text):
    with pytest.raises(ProgramError):
        Shape.parse(text)


def test_negative_dimension_helpers():
    shape = Shape.parse("f32[2,1,5]")
    assert shape.dim(0) == 2 and shape.dim(-1) == 5 and shape.dim(-3) == 2
    assert shape.canonical_dim(-1) == 2 and shape.canonical_dim(1) == 1
    for bad in (3, -4):
        with pytest.raises(ProgramError):
            shape.canonical_dim(bad)
        with pytest.raises(ProgramError):
            shape.dim(bad)
    assert shape.true_rank == 2 and shape.rank == 3
    assert Shape.scalar("f32").true_rank == 0 and Shape.parse("f32[1,1]").true_rank == 0
    with pytest.raises(ProgramError):
        Shape.scalar("f32").dim(0)


def test_bad_layouts_raise():
    with pytest.raises(ProgramError):
        Shape.array("f32", [2, 3], Layout((0, 1), padded_dimensions=(1, 3)))  # smaller than the array
    with pytest.raises(ProgramError):
        Shape.array("f32", [2, 3], Layout((0, 1), padded_dimensions=(3,)))
    with pytest.raises(ProgramError):
        Shape.array("f32", [2, 3], [0, 2])
