"""dot and reduce kernels vs jax.lax (XLA on CPU): dimension numbers in any position, mixed precision,
integer wrap-around, pred; reduce fast paths, NaN propagation, init values, variadic reducers."""

from __future__ import annotations

import zlib

import jax
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opkit import binary_computation, run_op
from xla_oracle import jax_text, jit_answer, lax_answer

from replicas.errors import ProgramError
from replicas.hlo.ir import Computation, Instruction
from replicas.hlo.text import parse_hlo
from replicas.shapes import Shape

BF16 = np.dtype(ml_dtypes.bfloat16)


def random_array(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    if dtype.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def result_shape(value: np.ndarray) -> Shape:
    return Shape.of(value)


def assert_close(got: np.ndarray, expected: np.ndarray, rtol: float, atol: float = 0.0) -> None:
    expected = np.asarray(expected)
    assert got.dtype == expected.dtype, (got.dtype, expected.dtype)
    assert got.shape == expected.shape, (got.shape, expected.shape)
    if expected.dtype.kind in "biu":
        np.testing.assert_array_equal(got, expected)
    else:
        wide = np.complex128 if expected.dtype.kind == "c" else np.float64
        np.testing.assert_allclose(got.astype(wide), expected.astype(wide), rtol=rtol, atol=atol)


# ---------------------------------------------------------------------------------------------- dot


def dot_case(rng, batch, lhs_free, rhs_free, contract, lhs_dtype, rhs_dtype=None, preferred=None):
    """Random operands with the batch / free / contracting dimensions scattered in random positions."""
    rhs_dtype = rhs_dtype or lhs_dtype
    lhs_roles = (
        [("b", i) for i in range(len(batch))]
        + [("f", i) for i in range(len(lhs_free))]
        + [("c", i) for i in range(len(contract))]
    )
    rhs_roles = (
        [("b", i) for i in range(len(batch))]
        + [("f", i) for i in range(len(rhs_free))]
        + [("c", i) for i in range(len(contract))]
    )
    lhs_roles = [lhs_roles[i] for i in rng.permutation(len(lhs_roles))]
    rhs_roles = [rhs_roles[i] for i in rng.permutation(len(rhs_roles))]
    sizes = {"b": batch, "c": contract}

    def dims(roles, free):
        return [free[i] if r == "f" else sizes[r][i] for r, i in roles]

    def positions(roles, kind):
        return [roles.index((kind, i)) for i in range(len(sizes[kind]))]

    lhs = random_array(rng, dims(lhs_roles, lhs_free), lhs_dtype)
    rhs = random_array(rng, dims(rhs_roles, rhs_free), rhs_dtype)
    attrs = {
        "lhs_batch_dims": positions(lhs_roles, "b"),
        "rhs_batch_dims": positions(rhs_roles, "b"),
        "lhs_contracting_dims": positions(lhs_roles, "c"),
        "rhs_contracting_dims": positions(rhs_roles, "c"),
    }
    expected = lax_answer(
        jax.lax.dot_general,
        lhs,
        rhs,
        (
            (attrs["lhs_contracting_dims"], attrs["rhs_contracting_dims"]),
            (attrs["lhs_batch_dims"], attrs["rhs_batch_dims"]),
        ),
        preferred_element_type=preferred,
    )
    got = run_op("dot", result_shape(expected), [lhs, rhs], attrs)
    return got, expected


TOLERANCE = {
    np.dtype(np.float32): 1e-5,
    np.dtype(np.float64): 1e-12,
    np.dtype(np.complex64): 1e-5,
    np.dtype(np.complex128): 1e-12,
    np.dtype(np.float16): 2e-3,
    BF16: 1e-2,
}


@pytest.mark.parametrize(
    "dtype",
    [
        "float32",
        "float64",
        "complex64",
        "complex128",
        "int32",
        "int8",
        "uint8",
        "int64",
        "uint64",
        "uint32",
        "int16",
        "bool",
        "float16",
        BF16,
    ],
)
def test_dot_dtypes_random_dimension_positions(dtype):
    rng = np.random.default_rng(zlib.crc32(str(dtype).encode()))  # the same cases in every run
    for _ in range(3):
        nb, nl, nr, nc = (int(v) for v in rng.integers(0, 3, 4))
        batch = [int(v) for v in rng.integers(1, 4, nb)]
        got, expected = dot_case(
            rng,
            batch,
            [int(v) for v in rng.integers(1, 5, nl)],
            [int(v) for v in rng.integers(1, 5, nr)],
            [int(v) for v in rng.integers(1, 6, nc)],
            dtype,
        )
        if np.dtype(dtype) in TOLERANCE:
            # Sums of up to 100 products of N(0,1) values: absolute slack scaled by the type's epsilon.
            tol = TOLERANCE[np.dtype(dtype)]
            assert_close(got, expected, rtol=tol, atol=tol * 10)
        else:
            assert_close(got, expected, rtol=0)


@settings(max_examples=12, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.lists(st.integers(0, 3), min_size=0, max_size=2),
    st.lists(st.integers(0, 4), max_size=2),
    st.lists(st.integers(0, 4), max_size=2),
    st.lists(st.integers(0, 5), max_size=2),
)
def test_dot_hypothesis_f32_including_empty(seed, batch, lhs_free, rhs_free, contract):
    got, expected = dot_case(np.random.default_rng(seed), batch, lhs_free, rhs_free, contract, np.float32)
    assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "lhs,rhs,preferred",
    [
        (BF16, BF16, np.float32),
        ("float16", "float16", np.float32),
        ("int8", "int8", np.int32),
        ("float32", "float32", np.float64),
        (BF16, BF16, None),
        ("uint8", "uint8", np.uint32),
        (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fn, np.float32),
        (ml_dtypes.float8_e5m2, ml_dtypes.float8_e5m2, None),
        ("int8", "int8", np.float32),
        ("int32", "int32", np.int64),
    ],
)
def test_dot_mixed_precision_result_type(lhs, rhs, preferred):
    rng = np.random.default_rng(3)
    got, expected = dot_case(rng, [2], [5, 3], [4], [33], lhs, rhs, preferred)
    narrow = expected.dtype.itemsize == 1 and expected.dtype.kind not in "iub"
    rtol = 0.25 if narrow else 1e-2 if expected.dtype == BF16 else 1e-5  # 0.25: one f8e5m2 ulp
    assert_close(got, expected, rtol=rtol, atol=1e-2)


def test_dot_bf16_accumulates_in_f32_like_xla():
    # 1 + 2048 * 2**-9: a bf16 accumulator would stall at 1 + small increments; XLA sums in f32.
    lhs = np.full((1, 2048), 2.0**-9, dtype=BF16)
    lhs[0, 0] = 1.0
    rhs = np.ones((2048, 1), dtype=BF16)
    expected = lax_answer(jax.lax.dot, lhs, rhs)
    got = run_op(
        "dot",
        Shape.of(expected),
        [lhs, rhs],
        {
            "lhs_contracting_dims": [1],
            "rhs_contracting_dims": [0],
            "lhs_batch_dims": [],
            "rhs_batch_dims": [],
        },
    )
    np.testing.assert_array_equal(got.astype(np.float32), expected.astype(np.float32))
    assert float(got[0, 0]) == 5.0


def test_dot_integer_wraps_in_result_type():
    lhs = np.array([[2**30, 2**30, 7]], dtype=np.int32)
    rhs = np.array([[4], [4], [-3]], dtype=np.int32)
    expected = lax_answer(jax.lax.dot, lhs, rhs)
    got = run_op(
        "dot",
        Shape.of(expected),
        [lhs, rhs],
        {
            "lhs_contracting_dims": [1],
            "rhs_contracting_dims": [0],
            "lhs_batch_dims": [],
            "rhs_batch_dims": [],
        },
    )
    np.testing.assert_array_equal(got, expected)
    assert got[0, 0] == -21


def test_dot_rejects_mismatched_contracting_sizes():
    with pytest.raises(ProgramError, match="contracting"):
        run_op(
            "dot",
            "f32[2,2]",
            [np.zeros((2, 3), np.float32), np.zeros((4, 2), np.float32)],
            {
                "lhs_contracting_dims": [1],
                "rhs_contracting_dims": [0],
                "lhs_batch_dims": [],
                "rhs_batch_dims": [],
            },
        )
    with pytest.raises(ProgramError, match="does not match the inferred shape"):
        run_op(
            "dot",
            "f32[3,3]",
            [np.zeros((2, 3), np.float32), np.zeros((3, 2), np.float32)],
            {
                "lhs_contracting_dims": [1],
                "rhs_contracting_dims": [0],
                "lhs_batch_dims": [],
                "rhs_batch_dims": [],
            },
        )


# ------------------------------------------------------------------------------------------- reduce

JAX_REDUCERS = {
    "add": jax.lax.add,
    "multiply": jax.lax.mul,
    "maximum": jax.lax.max,
    "minimum": jax.lax.min,
    "and": jax.lax.bitwise_and,
    "or": jax.lax.bitwise_or,
    "xor": jax.lax.bitwise_xor,
}


def run_reduce(x, init, reducer, dims):
    comp = binary_computation(reducer, Shape.of(x).element_type.value)
    jax_reducer = reducer
    if x.dtype == np.bool_:  # XLA's pred add/multiply/max/min are or/and/or/and (jax refuses pred sums)
        jax_reducer = {"add": "or", "multiply": "and", "maximum": "or", "minimum": "and"}.get(
            reducer, reducer
        )
    expected = lax_answer(jax.lax.reduce, x, np.asarray(init, x.dtype), JAX_REDUCERS[jax_reducer], tuple(dims))
    got = run_op(
        "reduce",
        Shape.of(expected),
        [x, np.asarray(init, x.dtype)],
        {"to_apply": comp.name, "dimensions": list(dims)},
        [comp],
    )
    return got, expected


REDUCE_CASES = [
    ("add", "float32", 0.0),
    ("add", "float64", 0.0),
    ("add", "int32", 0),
    ("add", "uint8", 0),
    ("add", "int64", 0),
    ("add", BF16, 0.0),
    ("add", "float16", 0.0),
    ("add", "complex64", 0),
    ("multiply", "int16", 1),
    ("multiply", "float32", 1.0),
    ("multiply", "uint32", 1),
    ("maximum", "float32", -np.inf),
    ("maximum", "int8", -128),
    ("maximum", BF16, -np.inf),
    ("minimum", "float64", np.inf),
    ("minimum", "uint16", 65535),
    ("minimum", "float32", np.inf),
    ("and", "bool", True),
    ("or", "bool", False),
    ("xor", "bool", False),
    ("and", "int32", -1),
    ("or", "uint64", 0),
    ("xor", "int8", 0),
    ("maximum", "bool", False),
    ("add", "bool", False),
]


@pytest.mark.parametrize("reducer,dtype,init", REDUCE_CASES)
def test_reduce_fast_paths(reducer, dtype, init):
    rng = np.random.default_rng(7)
    for shape, dims in [((4, 5, 6), (0, 2)), ((4, 5, 6), (0, 1, 2)), ((3, 0, 2), (1,)), ((33, 2), (0,))]:
        x = random_array(rng, shape, dtype)
        if reducer == "multiply" and np.dtype(dtype).kind == "f":
            x = (1 + 0.1 * x).astype(dtype)
        got, expected = run_reduce(x, init, reducer, dims)
        rtol = {
            np.dtype(np.float32): 1e-5,
            np.dtype(np.complex64): 1e-5,
            BF16: 2e-2,
            np.dtype(np.float16): 1e-2,
        }.get(np.dtype(dtype), 1e-12)
        assert_close(got, expected, rtol=rtol, atol=rtol * 10)


@pytest.mark.parametrize(
    "reducer,dtype,init",
    [("add", "float64", 1.5), ("add", "int32", 3), ("minimum", "float32", 0.5), ("xor", "int8", 5)],
)
def test_reduce_non_identity_init_is_combined_once(reducer, dtype, init):
    # (XLA on CPU may combine the init more than once when it splits long reductions; on these
    # small shapes it combines it once, as the document's sequential definition does.)
    rng = np.random.default_rng(5)
    for dims in [(1,), (0, 2), (0, 1, 2)]:
        x = random_array(rng, (4, 5, 6), dtype)
        got, expected = run_reduce(x, init, reducer, dims)
        assert_close(got, expected, rtol=1e-5)


def test_reduce_of_single_elements_is_a_reshape_like_xla():
    """No reduced dimension, or only size-1 ones: XLA rewrites the reduce to a reshape (init unused)."""
    x = np.arange(12, dtype=np.float32).reshape(3, 1, 4)
    for dims in [(), (1,)]:
        got, expected = run_reduce(x, 100.0, "add", dims)
        np.testing.assert_array_equal(got, expected)
        np.testing.assert_array_equal(got, x.reshape(expected.shape))
    got, expected = run_reduce(np.asarray(np.float32(2.5)), 1.0, "multiply", ())
    assert got.shape == () and float(got) == float(expected) == 2.5


def test_reduce_max_min_propagate_nan():
    x = np.array([[1.0, np.nan, 3.0], [np.inf, -np.inf, 0.0]], dtype=np.float32)
    for reducer in ("maximum", "minimum"):
        got, expected = run_reduce(x, np.nan if reducer == "maximum" else 0.0, reducer, (1,))
        np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
        np.testing.assert_array_equal(got[~np.isnan(got)], expected[~np.isnan(expected)])
        assert np.isnan(got[0])


def test_reduce_document_examples():
    # The 2x3 and 4x2x3 examples of the Operation Semantics page, with add.
    x2 = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.float32)
    assert run_reduce(x2, 0.0, "add", (0,))[0].tolist() == [5, 7, 9]
    assert run_reduce(x2, 0.0, "add", (1,))[0].tolist() == [6, 15]
    x3 = np.broadcast_to(np.array([[1, 2, 3], [4, 5, 6]], dtype=np.float32), (4, 2, 3)).copy()
    assert run_reduce(x3, 0.0, "add", (0,))[0].tolist() == [[4, 8, 12], [16, 20, 24]]
    assert run_reduce(x3, 0.0, "add", (2,))[0].tolist() == [[6, 15]] * 4
    assert run_reduce(x3, 0.0, "add", (0, 1))[0].tolist() == [20, 28, 36]
    assert float(run_reduce(x3, 0.0, "add", (0, 1, 2))[0]) == 84


def argmax_computation(value_type: str, index_type: str, direction: str = "GE") -> Computation:
    """The document's f(max, argmax, value, index): value `direction` max ? (value, index) : (max, argmax)."""
    v, i = Shape.scalar(value_type), Shape.scalar(index_type)
    comp = Computation(f"argmax_{direction}_{value_type}")
    comp.add(Instruction("max", "parameter", v, [], {"parameter_number": 0}))
    comp.add(Instruction("arg", "parameter", i, [], {"parameter_number": 1}))
    comp.add(Instruction("value", "parameter", v, [], {"parameter_number": 2}))
    comp.add(Instruction("index", "parameter", i, [], {"parameter_number": 3}))
    comp.add(
        Instruction(
            "take", "compare", Shape.scalar("pred"), ["value", "max"], {"comparison_direction": direction}
        )
    )
    comp.add(Instruction("new_max", "select", v, ["take", "value", "max"]))
    comp.add(Instruction("new_arg", "select", i, ["take", "index", "arg"]))
    comp.add(Instruction("out", "tuple", Shape.tuple([v, i]), ["new_max", "new_arg"]))
    comp.root = "out"
    return comp


def jax_argmax_reducer(direction):
    def reducer(acc, item):
        (m, a), (v, i) = acc, item
        take = v >= m if direction == "GE" else v > m
        return jax.lax.select(take, v, m), jax.lax.select(take, i, a)

    return reducer


@pytest.mark.parametrize("direction", ["GE", "GT"])
def test_reduce_variadic_argmax_document_example(direction):
    rng = np.random.default_rng(11)
    comp = argmax_computation("f32", "s32", direction)
    for shape, dims in [
        ((6,), (0,)),
        ((5, 9), (1,)),
        ((5, 9), (0,)),
        ((3, 4, 5), (0, 2)),
        ((4, 0), (1,)),
        ((17,), (0,)),
    ]:
        values = rng.integers(0, 4, shape).astype(np.float32)  # many ties: the tie-breaking must match
        index = np.broadcast_to(np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape), shape).copy()
        inits = (np.float32(-np.inf), np.int32(-1))
        expected = lax_answer(jax.lax.reduce, (values, index), inits, jax_argmax_reducer(direction), dims)
        got = run_op(
            "reduce",
            Shape.tuple([Shape.of(e) for e in expected]),
            [values, index, np.asarray(inits[0]), np.asarray(inits[1])],
            {"to_apply": comp.name, "dimensions": list(dims)},
            [comp],
        )
        assert isinstance(got, tuple) and len(got) == 2
        np.testing.assert_array_equal(got[0], expected[0])
        np.testing.assert_array_equal(got[1], expected[1])
    # The document's sequential reading: ties keep the last index with >=, the first with >.
    v = np.array([1, 5, 2, 5, 5, 0], dtype=np.float32)
    got = run_op(
        "reduce",
        "(f32[], s32[])",
        [v, np.arange(6, dtype=np.int32), np.float32(-np.inf), np.int32(-1)],
        {"to_apply": comp.name, "dimensions": [0]},
        [comp],
    )
    assert (float(got[0]), int(got[1])) == (5.0, 4 if direction == "GE" else 1)


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**32 - 1), st.lists(st.integers(0, 6), min_size=1, max_size=3), st.data())
def test_reduce_generic_path_equals_fast_path(seed, shape, data):
    """A reducer wrapped so it is not recognized (add then multiply by one) takes the tree path."""
    rng = np.random.default_rng(seed)
    dims = data.draw(st.lists(st.integers(0, len(shape) - 1), unique=True))
    s = Shape.scalar("s32")
    comp = Computation("add_times_one")
    comp.add(Instruction("a", "parameter", s, [], {"parameter_number": 0}))
    comp.add(Instruction("b", "parameter", s, [], {"parameter_number": 1}))
    comp.add(Instruction("one", "constant", s, [], {"literal": np.asarray(1, np.int32)}))
    comp.add(Instruction("sum", "add", s, ["a", "b"]))
    comp.add(Instruction("r", "multiply", s, ["sum", "one"]))
    comp.root = "r"
    x = rng.integers(-(2**31), 2**31 - 1, shape, dtype=np.int32)
    expected = lax_answer(jax.lax.reduce, x, np.int32(0), jax.lax.add, tuple(dims))
    got = run_op(
        "reduce", Shape.of(expected), [x, np.int32(0)], {"to_apply": comp.name, "dimensions": dims}, [comp]
    )
    np.testing.assert_array_equal(got, expected)


def test_reduce_errors_name_the_instruction():
    comp = binary_computation("add", "f32")
    with pytest.raises(ProgramError, match="dimensions"):
        run_op(
            "reduce",
            "f32[2]",
            [np.zeros((2, 3), np.float32), np.float32(0)],
            {"to_apply": comp.name, "dimensions": [2]},
            [comp],
        )
    with pytest.raises(ProgramError, match="does not match the inferred shape"):
        run_op(
            "reduce",
            "f32[3]",
            [np.zeros((2, 3), np.float32), np.float32(0)],
            {"to_apply": comp.name, "dimensions": [1]},
            [comp],
        )


def test_argmax_and_matmul_from_jax_lowered_hlo_text():
    """End to end: jnp.argmax (a variadic reduce with jax's NaN-aware comparator) and a batched
    matmul, parsed from the HLO text jax lowers them to."""
    import jax.numpy as jnp

    from replicas.runtime.interpreter import evaluate

    x = np.random.default_rng(13).integers(0, 4, (3, 5, 40)).astype(np.float32)
    x[0, 0, 7] = np.nan
    x[1, 2, 3] = -np.inf
    for f in (
        lambda v: jnp.argmax(v, axis=2),
        lambda v: jnp.argmin(v, axis=1),
        lambda v: jnp.einsum("bij,bkj->bik", v, v),
    ):
        module = parse_hlo(jax_text(f, [x]))
        (expected,) = jit_answer(f, [x])
        got = evaluate(module, [x])
        assert got.dtype == expected.dtype
        np.testing.assert_allclose(got, expected, rtol=1e-6)
