"""reduce-window and select-and-scatter vs jax.lax (XLA on CPU): sizes, strides, base and window
dilation, padding (negative too), fast and generic reducers, variadic windows, the document's examples."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import lax
from jax._src.lax.windowed_reductions import _select_and_scatter, _select_and_scatter_add
from opkit import binary_computation, run_op
from xla_oracle import jax_text, jit_answer, lax_answer

from replicas.errors import ProgramError
from replicas.hlo.ir import Computation, Instruction, make_window
from replicas.hlo.text import parse_hlo
from replicas.shapes import Shape

BF16 = np.dtype(ml_dtypes.bfloat16)
JAX_OPS = {
    "add": lax.add,
    "maximum": lax.max,
    "minimum": lax.min,
    "multiply": lax.mul,
    "and": lax.bitwise_and,
    "or": lax.bitwise_or,
}
IDENTITY = {"add": 0, "maximum": -np.inf, "minimum": np.inf, "multiply": 1, "and": True, "or": False}


def identity(reducer: str, dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    value = IDENTITY[reducer]
    if dtype.kind in "iu" and reducer in ("maximum", "minimum"):
        info = np.iinfo(dtype)
        value = info.min if reducer == "maximum" else info.max
    return np.asarray(value).astype(dtype)


def random_values(rng, shape, dtype):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind in "iu":
        return rng.integers(-50 if dtype.kind == "i" else 0, 50, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def run_reduce_window(x, init, reducer, size, stride, pad, base, win, comp=None):
    comp = comp or binary_computation(reducer, Shape.of(x).element_type.value)
    expected = lax_answer(
        lax.reduce_window,
        x,
        init,
        JAX_OPS[reducer],
        tuple(size),
        tuple(stride),
        tuple(pad),
        base_dilation=tuple(base),
        window_dilation=tuple(win),
    )
    window = make_window(x.ndim, size=size, stride=stride, pad=pad, lhs_dilate=base, rhs_dilate=win)
    got = run_op(
        "reduce-window", Shape.of(expected), [x, init], {"to_apply": comp.name, "window": window}, [comp]
    )
    return got, expected


def check(got, expected, dtype):
    assert got.dtype == expected.dtype and got.shape == expected.shape
    if np.dtype(dtype).kind in "biu":
        np.testing.assert_array_equal(got, expected)
    else:
        rtol = {np.dtype(np.float32): 1e-5, BF16: 1e-2, np.dtype(np.float16): 1e-3}.get(
            np.dtype(dtype), 1e-12
        )
        np.testing.assert_allclose(got.astype(np.float64), expected.astype(np.float64), rtol=rtol, atol=rtol)


def window_params(draw_int, rank):
    size = [draw_int(1, 3) for _ in range(rank)]
    stride = [draw_int(1, 3) for _ in range(rank)]
    pad = [(draw_int(-1, 2), draw_int(-1, 2)) for _ in range(rank)]
    base = [draw_int(1, 2) for _ in range(rank)]
    win = [draw_int(1, 2) for _ in range(rank)]
    return size, stride, pad, base, win


@settings(max_examples=15, deadline=None)
@given(
    st.sampled_from(
        [
            ("add", "float32"),
            ("add", "int32"),
            ("maximum", "float32"),
            ("minimum", "int8"),
            ("maximum", BF16),
            ("add", "float64"),
            ("multiply", "int16"),
            ("or", "bool"),
            ("and", "bool"),
            ("minimum", "float16"),
        ]
    ),
    st.lists(st.integers(1, 6), min_size=1, max_size=3),
    st.integers(0, 2**32 - 1),
    st.data(),
)
def test_reduce_window_fast_paths_match_jax(kind, shape, seed, data):
    reducer, dtype = kind
    size, stride, pad, base, win = window_params(lambda a, b: data.draw(st.integers(a, b)), len(shape))
    dilated = [(n - 1) * b + 1 for n, b in zip(shape, base)]
    if any(d + lo + hi < 0 for d, (lo, hi) in zip(dilated, pad)):
        return
    x = random_values(np.random.default_rng(seed), shape, dtype)
    got, expected = run_reduce_window(x, identity(reducer, dtype), reducer, size, stride, pad, base, win)
    check(got, expected, dtype)


@pytest.mark.parametrize("reducer,dtype,shape,size,stride,pad,base,win", [
    ("add", "float32", (64, 16), (32, 16), (32, 16), ((0, 0), (0, 0)), (1, 1), (1, 1)),  # a sharded mean
    ("add", "float32", (64, 16), (32, 1), (32, 1), ((0, 0), (0, 0)), (1, 1), (1, 1)),
    ("add", "float32", (10, 12), (3, 3), (1, 2), ((1, 2), (0, 1)), (1, 1), (1, 1)),
    ("maximum", "float32", (10, 12), (3, 3), (2, 1), ((1, 2), (-1, 1)), (2, 1), (1, 2)),
    ("multiply", "int32", (7, 9), (2, 3), (1, 1), ((0, 0), (2, 2)), (1, 1), (1, 1)),
    ("add", "float32", (33,), (33,), (1,), ((32, 0),), (1,), (1,)),  # a cumulative sum
    ("add", "float32", (8, 4, 16), (1, 1, 16), (1, 1, 1), ((0, 0), (0, 0), (15, 0)), (1, 1, 1), (1, 1, 1)),  # XLA's
    ("add", "float32", (8, 4), (1, 4), (1, 1), ((0, 0), (4, 0)), (1, 1), (1, 1)),  # blocked cumsum's two steps
    ("maximum", "float32", (5, 33), (1, 33), (1, 1), ((0, 0), (32, 0)), (1, 1), (1, 1)),  # a cumulative max
    ("add", "int32", (12, 3), (12, 1), (2, 1), ((11, 0), (0, 0)), (1, 1), (1, 1)),  # every other prefix
    ("add", "float32", (1, 3), (2, 1), (1, 1), ((2, 0), (0, 0)), (1, 1), (1, 1)),  # a window of padding only
    ("add", "uint8", (16, 16), (4, 4), (4, 4), ((0, 0), (0, 0)), (1, 1), (1, 1)),
    ("or", "bool", (16, 16), (4, 4), (2, 2), ((0, 0), (0, 0)), (1, 1), (1, 1)),
])
def test_reduce_window_many_elements_fold_left_to_right(reducer, dtype, shape, size, stride, pad, base, win):
    """Windows of many elements are folded by one `accumulate`: the bits of XLA's left-to-right fold
    `acc = f(acc, x_k)` from the init, element by element, and XLA's values."""
    x = random_values(np.random.default_rng(7), shape, dtype)
    init = identity(reducer, dtype)
    got, expected = run_reduce_window(x, init, reducer, size, stride, pad, base, win)
    check(got, expected, dtype)
    ufunc = {"add": np.add, "maximum": np.maximum, "multiply": np.multiply, "or": np.logical_or}[reducer]
    full = np.full(tuple((n - 1) * b + 1 + max(lo, 0) + max(hi, 0) for n, b, (lo, hi) in zip(shape, base, pad)),
                   init, x.dtype)
    full[tuple(slice(max(lo, 0), max(lo, 0) + (n - 1) * b + 1, b) for n, b, (lo, _) in zip(shape, base, pad))] = x
    full = full[tuple(slice(-min(lo, 0), full.shape[i] + min(hi, 0)) for i, (lo, hi) in enumerate(pad))]
    acc = np.full(got.shape, init, x.dtype)
    for ks in itertools.product(*(range(s) for s in size)):
        acc = ufunc(acc, full[tuple(slice(k * w, k * w + (n - 1) * st + 1, st)
                                    for k, w, n, st in zip(ks, win, got.shape, stride))]).astype(x.dtype)
    assert got.tobytes() == acc.tobytes()


@pytest.mark.parametrize("reducer,dtype,init,shape,size,stride,pad,base,win", [
    ("add", "float32", 1.0, (5,), (8,), (1,), ((7, 0),), (1,), (1,)),  # a cumulative sum from 1
    ("add", "float32", 0.5, (3, 4), (2, 3), (1, 2), ((1, 0), (2, 1)), (1, 1), (1, 1)),
    ("add", "float32", 1.0, (5,), (3,), (1,), ((1, 1),), (2,), (1,)),  # the holes of a base dilation
    ("add", "float32", 1.0, (5,), (2,), (1,), ((2, 1),), (1,), (2,)),
    ("add", "float32", 1.0, (40,), (9,), (1,), ((4, 4),), (1,), (1,)),  # many elements: the accumulate path
    ("multiply", "int32", 2, (6,), (3,), (1,), ((1, 1),), (1,), (1,)),
    ("maximum", "float32", 3.0, (6,), (3,), (2,), ((2, 2),), (1,), (1,)),
    ("add", "int32", -3, (4, 4), (3, 3), (1, 1), ((1, 1), (2, 0)), (2, 1), (1, 1)),
])
def test_reduce_window_folds_only_the_operand_into_an_init_that_is_no_identity(reducer, dtype, init, shape, size,
                                                                             stride, pad, base, win):
    """XLA skips padding and a base dilation's holes: an init that is no identity of the reducer is
    folded in once per window, never once per padding element (JAX's own programs use identities)."""
    x = random_values(np.random.default_rng(11), shape, dtype)
    got, expected = run_reduce_window(x, np.asarray(init, dtype), reducer, size, stride, pad, base, win)
    assert got.dtype == expected.dtype and got.tobytes() == expected.tobytes(), (got, expected)


@pytest.mark.parametrize("init", [0.0, -0.0])
def test_reduce_window_cumulative_sums_of_signed_zeros_keep_the_folds_bits(init):
    """A cumulative sum is one `accumulate` from the init (folding the init into itself gives the
    init): the fold's bits, signed zeros included."""
    x = np.array([-0.0, -0.0, 0.0, -0.0, 2.5, -2.5, -0.0, -0.0], np.float32)
    got, expected = run_reduce_window(x, np.float32(init), "add", [8], [1], [(7, 0)], [1], [1])
    acc, want = np.float32(init), []
    for j in range(8):  # window j: 7 - j paddings, then x[0..j]
        acc = np.float32(init)
        for v in [np.float32(init)] * (7 - j) + list(x[:j + 1]):
            acc = np.float32(acc + v)
        want.append(acc)
    assert got.tobytes() == np.array(want, np.float32).tobytes()
    np.testing.assert_array_equal(got, expected)


def test_reduce_window_document_examples():
    # A 4x6 max with a 2x3 window and stride: one maximum per non-overlapping block.
    x = (np.arange(24).reshape(4, 6) * np.where(np.arange(24) % 5, 1, -1).reshape(4, 6)).astype(np.float32)
    got, expected = run_reduce_window(
        x, np.float32(np.finfo(np.float32).min), "maximum", [2, 3], [2, 3], [(0, 0), (0, 0)], [1, 1], [1, 1]
    )
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(got, x.reshape(2, 2, 2, 3).max(axis=(1, 3)))
    # Min over [10000, 1000, 100, 10, 1], window 3, stride 2: valid -> [100, 1]; same -> [1000, 10, 1].
    v = np.array([10000, 1000, 100, 10, 1], dtype=np.float32)
    big = np.float32(np.finfo(np.float32).max)
    valid, _ = run_reduce_window(v, big, "minimum", [3], [2], [(0, 0)], [1], [1])
    same, _ = run_reduce_window(v, big, "minimum", [3], [2], [(1, 1)], [1], [1])
    assert valid.tolist() == [100, 1]
    assert same.tolist() == [1000, 10, 1]


def test_reduce_window_max_pool_2x2_nhwc():
    x = np.random.default_rng(1).standard_normal((2, 8, 8, 3)).astype(np.float32)
    got, expected = run_reduce_window(
        x, np.float32(-np.inf), "maximum", [1, 2, 2, 1], [1, 2, 2, 1], [(0, 0)] * 4, [1] * 4, [1] * 4
    )
    np.testing.assert_array_equal(got, expected)


def wrapped_add(element_type: str) -> Computation:
    """add(a, b) * 1: not a recognized reducer, so the generic path evaluates it."""
    s = Shape.scalar(element_type)
    comp = Computation(f"add_times_one_{element_type}")
    comp.add(Instruction("a", "parameter", s, [], {"parameter_number": 0}))
    comp.add(Instruction("b", "parameter", s, [], {"parameter_number": 1}))
    comp.add(Instruction("one", "constant", s, [], {"literal": np.asarray(1, s.dtype)}))
    comp.add(Instruction("sum", "add", s, ["a", "b"]))
    comp.add(Instruction("r", "multiply", s, ["sum", "one"]))
    comp.root = "r"
    return comp


def test_reduce_window_generic_computation_skips_padding():
    x = random_values(np.random.default_rng(12), (6,), "float32")
    got, expected = run_reduce_window(x, np.float32(1.0), "add", [3], [1], [(2, 1)], [2], [1],
                                      comp=wrapped_add("f32"))
    assert got.tobytes() == expected.tobytes(), (got, expected)


@settings(max_examples=10, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=3), st.integers(0, 2**32 - 1), st.data())
def test_reduce_window_generic_computation(shape, seed, data):
    size, stride, pad, base, win = window_params(lambda a, b: data.draw(st.integers(a, b)), len(shape))
    dilated = [(n - 1) * b + 1 for n, b in zip(shape, base)]
    if any(d + lo + hi < 0 for d, (lo, hi) in zip(dilated, pad)):
        return
    x = random_values(np.random.default_rng(seed), shape, "int32")
    got, expected = run_reduce_window(x, np.int32(0), "add", size, stride, pad, base, win, wrapped_add("s32"))
    np.testing.assert_array_equal(got, expected)


def test_reduce_window_variadic_argmax():
    v, i = Shape.scalar("f32"), Shape.scalar("s32")
    comp = Computation("window_argmax")
    for n, (name, s) in enumerate([("m", v), ("a", i), ("x", v), ("k", i)]):
        comp.add(Instruction(name, "parameter", s, [], {"parameter_number": n}))
    comp.add(Instruction("take", "compare", Shape.scalar("pred"), ["x", "m"], {"comparison_direction": "GT"}))
    comp.add(Instruction("nm", "select", v, ["take", "x", "m"]))
    comp.add(Instruction("na", "select", i, ["take", "k", "a"]))
    comp.add(Instruction("out", "tuple", Shape.tuple([v, i]), ["nm", "na"]))
    comp.root = "out"
    rng = np.random.default_rng(4)
    values = rng.integers(0, 5, (6, 7)).astype(np.float32)
    index = np.arange(42, dtype=np.int32).reshape(6, 7)
    inits = (np.float32(-np.inf), np.int32(-1))

    def reducer(acc, item):
        take = item[0] > acc[0]
        return lax.select(take, item[0], acc[0]), lax.select(take, item[1], acc[1])

    expected = lax_answer(lax.reduce_window, (values, index), inits, reducer, (2, 3), (1, 2), ((1, 0), (0, 1)))
    window = make_window(2, size=[2, 3], stride=[1, 2], pad=[(1, 0), (0, 1)])
    got = run_op(
        "reduce-window",
        Shape.tuple([Shape.of(np.asarray(e)) for e in expected]),
        [values, index, np.asarray(inits[0]), np.asarray(inits[1])],
        {"to_apply": comp.name, "window": window},
        [comp],
    )
    np.testing.assert_array_equal(got[0], np.asarray(expected[0]))
    np.testing.assert_array_equal(got[1], np.asarray(expected[1]))


def test_reduce_window_rejects_wrong_result_shape():
    comp = binary_computation("add", "f32")
    with pytest.raises(ProgramError, match="window"):
        run_op(
            "reduce-window",
            "f32[3]",
            [np.zeros(4, np.float32), np.float32(0)],
            {"to_apply": comp.name, "window": make_window(1, size=[2], stride=[2])},
            [comp],
        )


# -------------------------------------------------------------------------------- select-and-scatter


def select_computation(direction: str, element_type: str) -> Computation:
    return binary_computation(
        "compare", element_type, name=f"select_{direction}_{element_type}", comparison_direction=direction
    )


JAX_COMPARE = {
    "GE": lambda a, b: a >= b,
    "GT": lambda a, b: a > b,
    "LE": lambda a, b: a <= b,
    "LT": lambda a, b: a < b,
}


def reference_select_and_scatter(operand, source, init, direction, size, stride, pad):
    """The document's definition, element by element (test oracle only): padding is never selected."""
    out = np.full(operand.shape, init, operand.dtype)
    for o in itertools.product(*[range(n) for n in source.shape]):
        kept = None
        for k in itertools.product(*[range(s) for s in size]):
            idx = tuple(oi * st + ki - lo for oi, st, ki, (lo, _) in zip(o, stride, k, pad))
            if all(0 <= i < n for i, n in zip(idx, operand.shape)):
                if kept is None or not JAX_COMPARE[direction](operand[kept], operand[idx]):
                    kept = idx
        if kept is not None:
            out[kept] += source[o]
    return out


def select_and_scatter_oracle(operand, source, init, direction, size, stride, pad):
    """XLA on CPU through jax. XLA:CPU's own padded select-and-scatter disagrees with the document
    (jax never emits it on CPU: it pads the operand with -inf / +inf instead), so padded windows use
    jax's max/min-pool gradient (GE / LE) or the document's definition (GT / LT)."""
    if all(p == (0, 0) for p in pad):
        return lax_answer(
            _select_and_scatter,
            operand,
            JAX_COMPARE[direction],
            tuple(size),
            tuple(stride),
            tuple(pad),
            source,
            np.asarray(init, operand.dtype),
            lax.add,
        )
    if direction in ("GE", "LE") and init == 0:
        prim = lax.ge_p if direction == "GE" else lax.le_p
        return lax_answer(_select_and_scatter_add, source, operand, prim, tuple(size), tuple(stride), tuple(pad))
    return reference_select_and_scatter(operand, source, init, direction, size, stride, pad)


def run_select_and_scatter(operand, source, init, direction, size, stride, pad, scatter="add"):
    dtype = operand.dtype
    select = select_computation(direction, Shape.of(operand).element_type.value)
    scatter_comp = (
        scatter
        if isinstance(scatter, Computation)
        else binary_computation(scatter, Shape.of(operand).element_type.value)
    )
    expected = select_and_scatter_oracle(operand, source, init, direction, size, stride, pad)
    window = make_window(operand.ndim, size=size, stride=stride, pad=pad)
    got = run_op(
        "select-and-scatter",
        Shape.of(operand),
        [operand, source, np.asarray(init, dtype)],
        {"select": select.name, "scatter": scatter_comp.name, "window": window},
        [select, scatter_comp],
    )
    return got, expected


def test_select_and_scatter_document_example_overlapping_windows():
    # Overlapping 3x3 windows with stride 2: an element that is the maximum of two windows receives the
    # sum of both windows' source values (the document's 9 <- 2 + 6).
    operand = np.array(
        [[7, 2, 5, 3, 8], [3, 8, 9, 3, 4], [1, 5, 7, 5, 6], [0, 6, 2, 10, 2]], dtype=np.float32
    )
    source = np.array([[2, 6], [3, 1]], dtype=np.float32)
    got, expected = run_select_and_scatter(operand, source, 0.0, "GE", [3, 3], [2, 2], [(0, 1), (0, 0)])
    np.testing.assert_array_equal(got, expected)
    assert got[1, 2] == 8.0  # 9 selected by both top windows
    assert got.sum() == source.sum()


@settings(max_examples=10, deadline=None)
@given(
    st.sampled_from(["GE", "GT", "LE", "LT"]),
    st.sampled_from(["float32", "int32", "float64"]),
    st.lists(st.integers(1, 6), min_size=1, max_size=3),
    st.integers(0, 2**32 - 1),
    st.data(),
)
def test_select_and_scatter_matches_jax(direction, dtype, shape, seed, data):
    rank = len(shape)
    size = [data.draw(st.integers(1, 3)) for _ in range(rank)]
    stride = [data.draw(st.integers(1, 3)) for _ in range(rank)]
    pad = [(data.draw(st.integers(0, 2)), data.draw(st.integers(0, 2))) for _ in range(rank)]
    out_dims = [
        max(0, (n + lo + hi - s) // st_ + 1) if n + lo + hi >= s else 0
        for n, s, st_, (lo, hi) in zip(shape, size, stride, pad)
    ]
    rng = np.random.default_rng(seed)
    operand = rng.integers(0, 4, shape).astype(dtype)  # ties: XLA keeps the first selected in window order
    source = random_values(rng, out_dims, dtype)
    got, expected = run_select_and_scatter(operand, source, 0, direction, size, stride, pad)
    check(got, expected, dtype)


def test_select_and_scatter_generic_scatter_computation():
    rng = np.random.default_rng(9)
    operand = rng.integers(0, 3, (9, 8)).astype(np.int32)
    source = rng.integers(-9, 9, (4, 4)).astype(np.int32)
    got, expected = run_select_and_scatter(
        operand, source, 5, "GE", [3, 3], [2, 2], [(0, 1), (1, 1)], scatter=wrapped_add("s32")
    )
    np.testing.assert_array_equal(got, expected)


def test_select_and_scatter_generic_select_computation():
    # A TOTALORDER compare is not the numpy fast path: the select computation is called.
    rng = np.random.default_rng(10)
    operand = rng.standard_normal((6, 6)).astype(np.float32)
    source = rng.standard_normal((3, 3)).astype(np.float32)
    select = binary_computation(
        "compare", "f32", name="select_total", comparison_direction="GE", type="TOTALORDER"
    )
    add = binary_computation("add", "f32")
    window = (2, 2), (2, 2), ((0, 0), (0, 0))
    expected = lax_answer(_select_and_scatter, operand, JAX_COMPARE["GE"], *window, source, np.float32(0), lax.add)
    got = run_op(
        "select-and-scatter",
        Shape.of(operand),
        [operand, source, np.float32(0)],
        {"select": select.name, "scatter": add.name, "window": make_window(2, size=[2, 2], stride=[2, 2])},
        [select, add],
    )
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_select_and_scatter_rejects_bad_source_shape():
    select = select_computation("GE", "f32")
    add = binary_computation("add", "f32")
    with pytest.raises(ProgramError, match="source"):
        run_op(
            "select-and-scatter",
            "f32[4]",
            [np.zeros(4, np.float32), np.zeros(3, np.float32), np.float32(0)],
            {"select": select.name, "scatter": add.name, "window": make_window(1, size=[2], stride=[2])},
            [select, add],
        )


def test_max_pool_and_its_gradient_from_jax_lowered_hlo_text():
    """End to end: jax's max-pool and its gradient (select-and-scatter on CPU), parsed from HLO text."""
    from replicas.runtime.interpreter import evaluate

    x = np.random.default_rng(12).integers(0, 5, (2, 7, 6, 3)).astype(np.float32)  # ties

    def pool(v):
        return lax.reduce_window(v, -np.inf, lax.max, (1, 3, 2, 1), (1, 2, 2, 1), "SAME")

    def grad(v):
        return jax.grad(
            lambda w: (pool(w) * jnp.arange(1.0, 1.0 + pool(w).size).reshape(pool(w).shape)).sum()
        )(v)

    for f in (pool, grad):
        module = parse_hlo(jax_text(f, [x]))
        got = evaluate(module, [x])
        np.testing.assert_array_equal(got, jit_answer(f, [x])[0])
