"""Data-movement kernels (shape ops, slicing, tuples, constants) against jax.lax and the document's examples."""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax
from opkit import run_module, run_op
from xla_oracle import lax_answer

from replicas.errors import ProgramError
from replicas.hlo.ir import Computation, Instruction, Module
from replicas.shapes import TOKEN, Layout, Shape

DTYPES = [np.float32, np.float64, np.int32, np.int8, np.uint8, np.int64, np.uint64, np.bool_, np.float16,
          ml_dtypes.bfloat16, np.complex64]
FEW_DTYPES = [np.float32, np.int8, ml_dtypes.bfloat16]


def rand(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -1000), min(info.max, 1000), size=shape, endpoint=True).astype(dtype)
    if dtype.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def with_dtypes(cases):
    """Every dtype on the first case, a few on the rest: wide coverage at few JAX compilations."""
    rows = []
    for i, case in enumerate(cases):
        for dtype in DTYPES if i == 0 else FEW_DTYPES:
            rows.append((dtype, *case) if isinstance(case, tuple) else (dtype, case))
    return rows


def shape_str(dtype, dims):
    return str(Shape.array(np.dtype(dtype), dims))


def assert_same(actual, expected):
    expected = np.asarray(expected)
    assert isinstance(actual, np.ndarray)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    np.testing.assert_array_equal(actual, expected)


# -- broadcast ---------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,operand_dims,out_dims,dims", with_dtypes([
    ((), (2, 3), []),
    ((3,), (2, 3), [1]),
    ((2,), (2, 3), [0]),
    ((2, 1), (2, 4), [0, 1]),
    ((1, 3), (5, 2, 3), [1, 2]),
    ((0,), (2, 0), [1]),
    ((4,), (0, 4), [1]),
    ((), (), []),
]))
def test_broadcast_matches_broadcast_in_dim(dtype, operand_dims, out_dims, dims):
    x = rand(operand_dims, dtype)
    got = run_op("broadcast", shape_str(dtype, out_dims), [x], {"dimensions": dims})
    assert_same(got, lax_answer(lax.broadcast_in_dim, x, out_dims, dims))


def test_document_broadcast_examples():
    # Broadcast(f32 1.0, {2, 3}) and BroadcastInDim of a vector along either dimension.
    assert_same(run_op("broadcast", "f32[2,3]", [np.float32(1.0)], {"dimensions": []}), np.ones((2, 3), np.float32))
    x = np.array([1.0, 2.0], np.float32)
    assert_same(run_op("broadcast", "f32[2,3]", [x], {"dimensions": [0]}),
                np.array([[1, 1, 1], [2, 2, 2]], np.float32))
    assert_same(run_op("broadcast", "f32[3,2]", [x], {"dimensions": [1]}),
                np.array([[1, 2], [1, 2], [1, 2]], np.float32))


def test_broadcast_with_unsorted_dimensions_maps_each_operand_dim():
    x = rand((3, 2), np.float32)
    got = run_op("broadcast", "f32[2,5,3]", [x], {"dimensions": [2, 0]})
    expected = np.broadcast_to(x.T[:, None, :], (2, 5, 3))
    assert_same(got, expected)


def test_broadcast_is_a_read_only_view_of_any_operand_layout():
    # A contiguous operand is viewed directly; a strided one (a slice) and a bf16 one go through numpy.
    from replicas.ops.shape_ops import make_broadcast

    class Shapes:
        def __init__(self, shape: str) -> None:
            self.shape = Shape.parse(shape)

        def operand_shapes(self, inst):
            return [self.shape]

    for operand, x in [("f32[4]", np.arange(4, dtype=np.float32)),
                       ("f32[4]", np.arange(8, dtype=np.float32)[::2]),
                       ("bf16[4]", np.arange(4).astype(ml_dtypes.bfloat16)),
                       ("f32[]", np.asarray(np.float32(2.5)))]:
        out = operand.split("[")[0] + "[3,4]"
        inst = Instruction("b", "broadcast", Shape.parse(out), ["x"], {"dimensions": [1] if x.ndim else []})
        got = make_broadcast(inst, Shapes(operand))(x)
        want = np.broadcast_to(x if x.ndim else x.reshape(()), (3, 4))
        assert got.tobytes() == np.ascontiguousarray(want).tobytes() and got.dtype == want.dtype
        assert not got.flags.writeable, operand


def test_broadcast_rejects_incompatible_sizes():
    with pytest.raises(ProgramError, match="does not match result dimension"):
        run_op("broadcast", "f32[2,3]", [np.zeros(2, np.float32)], {"dimensions": [1]})


# -- reshape / bitcast / copy ------------------------------------------------------------------

@pytest.mark.parametrize("dtype,in_dims,out_dims", with_dtypes([
    ((2, 3, 4), (6, 4)), ((2, 3, 4), (24,)), ((24,), (2, 3, 4)), ((), (1, 1)), ((1, 1), ()),
    ((0, 3), (3, 0)), ((5,), (5,)),
]))
def test_reshape_matches_lax(dtype, in_dims, out_dims):
    x = rand(in_dims, dtype, seed=1)
    got = run_op("reshape", shape_str(dtype, out_dims), [x])
    assert_same(got, lax_answer(lax.reshape, x, out_dims))


# The document's Collapse / Reshape example array.
DOC_V = np.array([[[10, 11, 12], [15, 16, 17]], [[20, 21, 22], [25, 26, 27]],
                  [[30, 31, 32], [35, 36, 37]], [[40, 41, 42], [45, 46, 47]]], np.float32)


def test_document_collapse_examples():
    # Collapse(v, {0,1}) and Collapse(v, {1,2}) and Collapse(v, {0,1,2}) are reshapes.
    assert_same(run_op("reshape", "f32[8,3]", [DOC_V]),
                np.array([[10, 11, 12], [15, 16, 17], [20, 21, 22], [25, 26, 27],
                          [30, 31, 32], [35, 36, 37], [40, 41, 42], [45, 46, 47]], np.float32))
    assert_same(run_op("reshape", "f32[4,6]", [DOC_V]),
                np.array([[10, 11, 12, 15, 16, 17], [20, 21, 22, 25, 26, 27],
                          [30, 31, 32, 35, 36, 37], [40, 41, 42, 45, 46, 47]], np.float32))
    assert_same(run_op("reshape", "f32[24]", [DOC_V]),
                np.array([10, 11, 12, 15, 16, 17, 20, 21, 22, 25, 26, 27,
                          30, 31, 32, 35, 36, 37, 40, 41, 42, 45, 46, 47], np.float32))


def test_document_reshape_with_dimensions_is_transpose_then_reshape():
    # Reshape(v, {1,2,0}, {24}) == the builder's transpose(v, {1,2,0}) followed by a row-major reshape.
    m = Module("reshape_dims")
    main = Computation("main")
    main.add(Instruction("v", "parameter", Shape.parse("f32[4,2,3]"), [], {"parameter_number": 0}))
    main.add(Instruction("t", "transpose", Shape.parse("f32[2,3,4]"), ["v"], {"dimensions": [1, 2, 0]}))
    main.add(Instruction("r", "reshape", Shape.parse("f32[24]"), ["t"]))
    main.root = "r"
    m.add(main)
    m.entry = "main"
    expected = np.array([10, 20, 30, 40, 11, 21, 31, 41, 12, 22, 32, 42,
                         15, 25, 35, 45, 16, 26, 36, 46, 17, 27, 37, 47], np.float32)
    assert_same(run_module(m, [DOC_V]), expected)
    # ... and then to {8,3}: Reshape(v, {1,2,0}, {8,3}).
    main.instructions[-1] = Instruction("r", "reshape", Shape.parse("f32[8,3]"), ["t"])
    assert_same(run_module(m, [DOC_V]), expected.reshape(8, 3))
    # Reshape(5, {}, {1,1}) == f32[1x1] {{5}}.
    assert_same(run_op("reshape", "f32[1,1]", [np.float32(5)]), np.array([[5]], np.float32))


def test_reshape_rejects_a_different_element_count():
    with pytest.raises(ProgramError, match="element count changes"):
        run_op("reshape", "f32[7]", [np.zeros((2, 3), np.float32)])


def test_bitcast_under_default_layouts_is_a_reshape():
    x = rand((2, 3, 4), np.int32)
    assert_same(run_op("bitcast", "s32[4,6]", [x]), x.reshape(4, 6))


def test_bitcast_honours_layouts():
    x = rand((2, 3), np.float32)
    m = Module("bitcast_layout")
    main = Computation("main")
    # Column-major f32[2,3] holds x.T's elements in row-major order.
    main.add(Instruction("x", "parameter", Shape.array("f32", (2, 3), Layout((0, 1))), [], {"parameter_number": 0}))
    main.add(Instruction("b", "bitcast", Shape.array("f32", (3, 2), Layout((1, 0))), ["x"]))
    main.root = "b"
    m.add(main)
    m.entry = "main"
    assert_same(run_module(m, [x]), x.T)


def test_bitcast_round_trip_through_a_column_major_layout():
    x = rand((2, 3), np.int32)
    m = Module("bitcast_round_trip")
    main = Computation("main")
    main.add(Instruction("x", "parameter", Shape.array("s32", (2, 3), Layout((0, 1))), [], {"parameter_number": 0}))
    main.add(Instruction("flat", "bitcast", Shape.array("s32", (6,), Layout((0,))), ["x"]))
    main.add(Instruction("back", "bitcast", Shape.array("s32", (2, 3), Layout((0, 1))), ["flat"]))
    main.add(Instruction("out", "tuple", Shape.parse("(s32[6], s32[2,3])"), ["flat", "back"]))
    main.root = "out"
    m.add(main)
    m.entry = "main"
    flat, back = run_module(m, [x])
    assert_same(flat, x.T.reshape(-1))  # column-major memory order
    assert_same(back, x)


def test_bitcast_may_reinterpret_the_element_type():
    x = rand((4,), np.float32)
    assert_same(run_op("bitcast", "s32[4]", [x]), x.view(np.int32))


@pytest.mark.parametrize("dtype", [np.float32, np.int8, ml_dtypes.bfloat16])
def test_copy_keeps_the_value(dtype):
    x = rand((3, 2), dtype)
    assert_same(run_op("copy", shape_str(dtype, (3, 2)), [x]), x)


# -- transpose / reverse / iota ----------------------------------------------------------------

@pytest.mark.parametrize("dtype,dims,perm", with_dtypes([
    ((2, 3, 4), (2, 0, 1)), ((2, 3), (1, 0)), ((), ()), ((0, 3), (1, 0)), ((5,), (0,))]))
def test_transpose_matches_lax(dtype, dims, perm):
    x = rand(dims, dtype, seed=2)
    out = tuple(dims[p] for p in perm)
    got = run_op("transpose", shape_str(dtype, out), [x], {"dimensions": list(perm)})
    assert_same(got, lax_answer(lax.transpose, x, perm))


@pytest.mark.parametrize("dtype,dims,rev", with_dtypes([
    ((2, 3, 4), (0, 2)), ((5,), (0,)), ((2, 3), ()), ((0, 2), (0, 1)), ((), ())]))
def test_reverse_matches_lax(dtype, dims, rev):
    x = rand(dims, dtype, seed=3)
    got = run_op("reverse", shape_str(dtype, dims), [x], {"dimensions": list(rev)})
    assert_same(got, lax_answer(lax.rev, x, rev))


@pytest.mark.parametrize("dtype", [np.float32, np.int32, ml_dtypes.bfloat16, np.uint8, np.float16, np.int64,
                                   np.float64])
@pytest.mark.parametrize("dims,dim", [((5,), 0), ((4, 3), 0), ((4, 3), 1), ((2, 0, 3), 2), ((300,), 0)])
def test_iota_matches_broadcasted_iota(dtype, dims, dim):
    got = run_op("iota", shape_str(dtype, dims), [], {"iota_dimension": dim})
    assert_same(got, lax_answer(lax.broadcasted_iota, dtype, dims, dim))


def test_document_iota_examples():
    # Iota(s32, 4) == [0, 1, 2, 3]; Iota(s32[4x8], 0) has rows of equal values, dimension 1 counts columns.
    assert_same(run_op("iota", "s32[4]", [], {"iota_dimension": 0}), np.arange(4, dtype=np.int32))
    assert_same(run_op("iota", "s32[4,8]", [], {"iota_dimension": 0}),
                np.repeat(np.arange(4, dtype=np.int32)[:, None], 8, axis=1))
    assert_same(run_op("iota", "s32[4,8]", [], {"iota_dimension": 1}),
                np.repeat(np.arange(8, dtype=np.int32)[None, :], 4, axis=0))


# -- slice / dynamic-slice / dynamic-update-slice -----------------------------------------------

@pytest.mark.parametrize("dtype,dims,spec", with_dtypes([
    ((10,), [(2, 9, 3)]),
    ((4, 6), [(1, 4, 1), (0, 6, 2)]),
    ((4, 6), [(2, 2, 1), (5, 6, 4)]),
    ((0, 3), [(0, 0, 1), (1, 3, 1)]),
    ((), []),
]))
def test_slice_matches_lax(dtype, dims, spec):
    x = rand(dims, dtype, seed=4)
    starts = [s[0] for s in spec]
    limits = [s[1] for s in spec]
    strides = [s[2] for s in spec]
    expected = lax_answer(lax.slice, x, starts, limits, strides)
    got = run_op("slice", shape_str(dtype, expected.shape), [x], {"slice": spec})
    assert_same(got, expected)


def test_document_slice_examples():
    a = np.array([0.0, 1.0, 2.0, 3.0, 4.0], np.float32)
    assert_same(run_op("slice", "f32[2]", [a], {"slice": [(2, 4, 1)]}), np.array([2.0, 3.0], np.float32))
    b = np.arange(12, dtype=np.float32).reshape(4, 3)
    assert_same(run_op("slice", "f32[2,2]", [b], {"slice": [(2, 4, 1), (1, 3, 1)]}), b[2:4, 1:3])


def test_slice_out_of_range_is_a_program_error():
    with pytest.raises(ProgramError, match="out of bounds"):
        run_op("slice", "f32[3]", [np.zeros(4, np.float32)], {"slice": [(2, 5, 1)]})


@pytest.mark.parametrize("dtype,index_dtype", [(d, np.int32) for d in DTYPES]
                         + [(np.float32, np.int64), (np.float32, np.uint32), (np.int8, np.uint8)])
def test_dynamic_slice_clamps_like_lax(dtype, index_dtype):
    x = rand((5, 7), dtype, seed=5)
    sizes = (2, 3)
    signed = np.dtype(index_dtype).kind == "i"
    for starts in [(0, 0), (1, 2), (4, 6), (100, 3)] + ([(-3, -1), (-100, 9)] if signed else []):
        idx = [np.asarray(s, index_dtype) for s in starts]
        got = run_op("dynamic-slice", shape_str(dtype, sizes), [x, *idx], {"dynamic_slice_sizes": list(sizes)})
        assert_same(got, lax_answer(lax.dynamic_slice, x, idx, sizes, allow_negative_indices=False))


def test_document_dynamic_slice_examples():
    a = np.array([0.0, 1.0, 2.0, 3.0, 4.0], np.float32)
    got = run_op("dynamic-slice", "f32[2]", [a, np.int32(2)], {"dynamic_slice_sizes": [2]})
    assert_same(got, np.array([2.0, 3.0], np.float32))
    b = np.array([[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]], np.float32)
    got = run_op("dynamic-slice", "f32[2,2]", [b, np.int32(2), np.int32(1)], {"dynamic_slice_sizes": [2, 2]})
    assert_same(got, np.array([[7, 8], [10, 11]], np.float32))
    # Start indices are clamped so that the slice stays inside: start = clamp(start, 0, dim - size).
    got = run_op("dynamic-slice", "f32[2]", [a, np.int32(4)], {"dynamic_slice_sizes": [2]})
    assert_same(got, np.array([3.0, 4.0], np.float32))


def test_dynamic_slice_accepts_the_vector_index_form():
    x = rand((5, 7), np.float32)
    got = run_op("dynamic-slice", "f32[2,3]", [x, np.array([9, -2], np.int32)], {"dynamic_slice_sizes": [2, 3]})
    assert_same(got, x[3:5, 0:3])


def test_dynamic_slice_of_a_scalar_and_an_empty_slice():
    assert_same(run_op("dynamic-slice", "f32[]", [np.float32(3)], {"dynamic_slice_sizes": []}), np.float32(3))
    x = rand((4,), np.int32)
    got = run_op("dynamic-slice", "s32[0]", [x, np.int32(2)], {"dynamic_slice_sizes": [0]})
    assert_same(got, np.zeros(0, np.int32))


@pytest.mark.parametrize("dtype", DTYPES)
def test_dynamic_update_slice_clamps_like_lax(dtype):
    x = rand((5, 7), dtype, seed=6)
    u = rand((2, 3), dtype, seed=7)
    x_before = x.copy()
    for starts in [(0, 0), (1, 2), (4, 6), (-1, 100), (3, -5)]:
        idx = [np.asarray(s, np.int32) for s in starts]
        got = run_op("dynamic-update-slice", shape_str(dtype, (5, 7)), [x, u, *idx])
        assert_same(got, lax_answer(lax.dynamic_update_slice, x, u, idx, allow_negative_indices=False))
    assert_same(x, x_before)  # the operand is never written


def test_document_dynamic_update_slice_examples():
    a = np.array([0.0, 1.0, 2.0, 3.0, 4.0], np.float32)
    u = np.array([5.0, 6.0], np.float32)
    assert_same(run_op("dynamic-update-slice", "f32[5]", [a, u, np.int32(2)]),
                np.array([0.0, 1.0, 5.0, 6.0, 4.0], np.float32))
    b = np.array([[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]], np.float32)
    s = np.array([[12, 13], [14, 15], [16, 17]], np.float32)
    assert_same(run_op("dynamic-update-slice", "f32[4,3]", [b, s, np.int32(1), np.int32(1)]),
                np.array([[0, 1, 2], [3, 12, 13], [6, 14, 15], [9, 16, 17]], np.float32))


def test_dynamic_update_slice_works_on_read_only_operands():
    x = np.zeros((3,), np.int32)
    x.flags.writeable = False
    got = run_op("dynamic-update-slice", "s32[3]", [x, np.array([7], np.int32), np.int32(1)])
    assert_same(got, np.array([0, 7, 0], np.int32))


# -- pad ---------------------------------------------------------------------------------------

PAD_CASES = [
    ((5,), [(1, 2, 0)]),
    ((5,), [(0, 0, 2)]),
    ((5,), [(-1, -2, 0)]),
    ((5,), [(-2, 3, 1)]),
    ((5,), [(-6, 0, 1)]),
    ((3, 4), [(1, -1, 1), (-2, 2, 2)]),
    ((0, 2), [(2, 1, 3), (0, 0, 0)]),
    ((2, 3), [(0, 0, 0), (0, 0, 0)]),
    ((), []),
    ((4,), [(-4, 0, 0)]),
    ((3,), [(-1, -1, 3)]),
]


@pytest.mark.parametrize("dtype,dims,config", with_dtypes(PAD_CASES))
def test_pad_matches_lax(dtype, dims, config):
    x = rand(dims, dtype, seed=8)
    value = rand((), dtype, seed=9)
    expected = lax_answer(lax.pad, x, value, config)
    got = run_op("pad", shape_str(dtype, expected.shape), [x, value], {"padding": config})
    assert_same(got, expected)


def test_pad_random_configurations_match_lax():
    rng = np.random.default_rng(10)
    for trial in range(20):
        rank = int(rng.integers(1, 4))
        dims = tuple(int(d) for d in rng.integers(0, 5, size=rank))
        config = []
        for n in dims:
            interior = int(rng.integers(0, 3))
            spread = n + (n - 1) * interior if n else 0
            lo = int(rng.integers(-spread, 4))
            hi = int(rng.integers(-(spread + lo), 4))  # the result size lo + spread + hi stays >= 0
            config.append((lo, hi, interior))
        x = rand(dims, np.int32, seed=trial)
        expected = lax_answer(lax.pad, x, np.int32(-7), config)
        got = run_op("pad", shape_str(np.int32, expected.shape), [x, np.int32(-7)], {"padding": config})
        assert_same(got, expected)


def test_pad_to_a_negative_size_is_a_program_error():
    with pytest.raises(ProgramError, match="negative"):
        run_op("pad", "f32[0]", [np.zeros(2, np.float32), np.float32(0)], {"padding": [(-2, -1, 0)]})


# -- concatenate -------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,dims_list,axis", with_dtypes([
    ([(2, 3), (4, 3)], 0), ([(2, 3), (2, 1), (2, 0)], 1), ([(5,)], 0), ([(0,), (0,)], 0), ([(1, 2, 3)] * 3, 2),
]))
def test_concatenate_matches_lax(dtype, dims_list, axis):
    xs = [rand(d, dtype, seed=i) for i, d in enumerate(dims_list)]
    expected = lax_answer(lax.concatenate, xs, axis)
    got = run_op("concatenate", shape_str(dtype, expected.shape), xs, {"dimensions": [axis]})
    assert_same(got, expected)


def test_document_concatenate_examples():
    vectors = [np.array(v, np.float32) for v in ([2, 3], [4, 5], [6, 7])]
    assert_same(run_op("concatenate", "f32[6]", vectors, {"dimensions": [0]}),
                np.array([2, 3, 4, 5, 6, 7], np.float32))
    a, b = np.array([[1, 2], [3, 4], [5, 6]], np.float32), np.array([[7, 8]], np.float32)
    assert_same(run_op("concatenate", "f32[4,2]", [a, b], {"dimensions": [0]}),
                np.array([[1, 2], [3, 4], [5, 6], [7, 8]], np.float32))


def test_concatenate_rejects_mismatched_operands():
    with pytest.raises(ProgramError, match="differs"):
        run_op("concatenate", "f32[4,3]", [np.zeros((2, 3), np.float32), np.zeros((2, 2), np.float32)],
               {"dimensions": [0]})


# -- tuples, tokens, pass-through --------------------------------------------------------------

def _module(build) -> Module:
    m = Module("m")
    main = Computation("main")
    build(main)
    m.add(main)
    m.entry = "main"
    return m


def test_tuple_and_get_tuple_element():
    a, b = rand((2,), np.float32), rand((), np.int32)

    def build(c):
        c.add(Instruction("a", "parameter", Shape.parse("f32[2]"), [], {"parameter_number": 0}))
        c.add(Instruction("b", "parameter", Shape.parse("s32[]"), [], {"parameter_number": 1}))
        c.add(Instruction("t", "tuple", Shape.parse("(f32[2], s32[])"), ["a", "b"]))
        c.add(Instruction("g1", "get-tuple-element", Shape.parse("s32[]"), ["t"], {"index": 1}))
        c.add(Instruction("g0", "get-tuple-element", Shape.parse("f32[2]"), ["t"], {"index": 0}))
        c.add(Instruction("r", "tuple", Shape.parse("(s32[], f32[2], (f32[2], s32[]))"), ["g1", "g0", "t"]))
        c.root = "r"

    got = run_module(_module(build), [a, b])
    assert isinstance(got, tuple) and len(got) == 3
    assert_same(got[0], b)
    assert_same(got[1], a)
    assert_same(got[2][0], a)
    assert_same(got[2][1], b)


def test_get_tuple_element_index_out_of_range():
    with pytest.raises(ProgramError, match="out of range"):
        run_op("get-tuple-element", "f32[]", [(np.float32(1),)], {"index": 1})


def test_tokens_and_ordering_ops_pass_values_through():
    x = rand((3,), np.float32)

    def build(c):
        c.add(Instruction("x", "parameter", Shape.parse("f32[3]"), [], {"parameter_number": 0}))
        c.add(Instruction("t0", "after-all", Shape.token(), []))
        c.add(Instruction("t1", "after-all", Shape.token(), ["t0", "t0"]))
        c.add(Instruction("d", "add-dependency", Shape.parse("f32[3]"), ["x", "t1"]))
        c.add(Instruction("tt", "tuple", Shape.parse("(f32[3], token[])"), ["d", "t1"]))
        c.add(Instruction("ob", "opt-barrier", Shape.parse("(f32[3], token[])"), ["tt"]))
        c.add(Instruction("g", "get-tuple-element", Shape.parse("f32[3]"), ["ob"], {"index": 0}))
        c.add(Instruction("dom", "domain", Shape.parse("f32[3]"), ["g"]))
        c.add(Instruction("cs", "copy-start", Shape.parse("(f32[3], f32[3], u32[])"), ["dom"]))
        c.add(Instruction("cd", "copy-done", Shape.parse("f32[3]"), ["cs"]))
        c.add(Instruction("tok", "get-tuple-element", Shape.token(), ["ob"], {"index": 1}))
        c.add(Instruction("r", "tuple", Shape.parse("(f32[3], token[])"), ["cd", "tok"]))
        c.root = "r"

    value, token = run_module(_module(build), [x])
    assert_same(value, x)
    assert token is TOKEN


# -- constants ---------------------------------------------------------------------------------

def test_constant_literals_are_read_only_and_tuples_work():
    literal = np.arange(3, dtype=np.int32)

    def build(c):
        c.add(Instruction("k", "constant", Shape.parse("s32[3]"), [], {"literal": literal}))
        c.add(Instruction("kt", "constant", Shape.parse("(f32[], (s32[2]))"), [],
                          {"literal": (np.asarray(1.5, np.float32), (np.array([4, 5], np.int32),))}))
        c.add(Instruction("r", "tuple", Shape.parse("(s32[3], (f32[], (s32[2])))"), ["k", "kt"]))
        c.root = "r"

    k, (f, (s,)) = run_module(_module(build), [])
    assert_same(k, literal)
    assert not k.flags.writeable
    assert literal.flags.writeable  # the IR's own array is left alone
    assert_same(f, np.asarray(1.5, np.float32))
    assert_same(s, np.array([4, 5], np.int32))


def test_jax_oracle_is_used_on_the_cpu():
    assert jnp.zeros(1).devices().pop().platform == "cpu"


def test_kernels_accept_read_only_operands_and_leave_them_alone():
    x = rand((3, 4), np.float32)
    x.flags.writeable = False
    before = x.copy()
    pad_value = np.asarray(0, np.float32)
    pad_value.flags.writeable = False
    cases = [
        ("broadcast", "f32[2,3,4]", [x], {"dimensions": [1, 2]}),
        ("reshape", "f32[12]", [x], {}),
        ("transpose", "f32[4,3]", [x], {"dimensions": [1, 0]}),
        ("reverse", "f32[3,4]", [x], {"dimensions": [0]}),
        ("slice", "f32[2,2]", [x], {"slice": [(1, 3, 1), (0, 4, 2)]}),
        ("dynamic-slice", "f32[2,2]", [x, np.int32(1), np.int32(1)], {"dynamic_slice_sizes": [2, 2]}),
        ("dynamic-update-slice", "f32[3,4]", [x, np.zeros((1, 2), np.float32), np.int32(1), np.int32(1)], {}),
        ("pad", "f32[5,4]", [x, pad_value], {"padding": [(1, 1, 0), (-1, -2, 1)]}),
        ("concatenate", "f32[6,4]", [x, x], {"dimensions": [0]}),
    ]
    for opcode, result, operands, attrs in cases:
        got = run_op(opcode, result, operands, attrs)
        assert got.shape == Shape.parse(result).dimensions, opcode
    assert_same(x, before)
