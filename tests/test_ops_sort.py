"""sort vs jax.lax.sort (XLA on CPU): fast comparators (LT / GT, FLOAT and TOTALORDER), NaN and -0.0,
several operands, any dimension, stability, and generic comparators through the merge sort."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import lax
from opkit import run_op
from xla_oracle import jax_text, lax_answer

from replicas.errors import ProgramError
from replicas.hlo.ir import Computation, Instruction
from replicas.hlo.text import parse_hlo
from replicas.ops.sort import jax_float_comparator
from replicas.shapes import Shape

BF16 = np.dtype(ml_dtypes.bfloat16)
PRED = Shape.scalar("pred")


def comparator(
    element_types: list[str],
    direction: str = "LT",
    total: bool = False,
    swap: bool = False,
    name: str | None = None,
) -> Computation:
    """Compare the first operand's pair of parameters (lhs_0 < rhs_0): the fast path's shape."""
    comp = Computation(
        name
        or f"cmp_{direction}_{'total' if total else 'float'}_{'swap' if swap else ''}"
        + "_".join(element_types)
    )
    params = []
    for i, t in enumerate(element_types):
        for side in ("lhs", "rhs"):
            p = comp.add(
                Instruction(f"{side}{i}", "parameter", Shape.scalar(t), [], {"parameter_number": len(params)})
            )
            params.append(p.name)
    attrs = {"comparison_direction": direction}
    if total:
        attrs["type"] = "TOTALORDER"
    operands = ["rhs0", "lhs0"] if swap else ["lhs0", "rhs0"]
    comp.add(Instruction("r", "compare", PRED, operands, attrs))
    comp.root = "r"
    return comp


def run_sort(operands: list[np.ndarray], comp: Computation, dimension: int, stable: bool = True):
    shape = Shape.of(operands[0]) if len(operands) == 1 else Shape.tuple([Shape.of(o) for o in operands])
    return run_op(
        "sort",
        shape,
        operands,
        {"dimensions": [dimension], "is_stable": stable, "to_apply": comp.name},
        [comp],
    )


def assert_bits_equal(got: np.ndarray, expected: np.ndarray) -> None:
    """Exact equality including the sign of zeros and NaN payloads' positions."""
    got, expected = np.asarray(got), np.asarray(expected)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    if got.dtype.kind in "fcV" and got.dtype != np.bool_:
        unsigned = np.dtype(f"u{got.dtype.itemsize}") if got.dtype.kind != "c" else np.dtype("u8")
        np.testing.assert_array_equal(got.view(unsigned), expected.view(unsigned))
    else:
        np.testing.assert_array_equal(got, expected)


def special_floats(rng, shape, dtype):
    """Values with many ties, both zeros, infinities and NaNs of both signs."""
    pool = np.array([0.0, -0.0, 1.5, -1.5, 2.0, np.inf, -np.inf, np.nan, -np.nan, 3.0], dtype=np.float64)
    return pool[rng.integers(0, len(pool), shape)].astype(dtype)


def random_keys(rng, shape, dtype):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        # Few distinct values (ties) including the extremes.
        pool = np.array([info.min, info.max, 0, 1, info.min + 1, 7], dtype=dtype)
        return pool[rng.integers(0, len(pool), shape)]
    return special_floats(rng, shape, dtype)


@settings(max_examples=30, deadline=None)
@given(
    st.sampled_from(
        ["float32", "float64", "int32", "uint8", "int64", "uint64", "int8", "bool", "float16", BF16]
    ),
    st.lists(st.integers(0, 6), min_size=1, max_size=3),
    st.integers(0, 2**32 - 1),
    st.data(),
)
def test_sort_lt_matches_jax(dtype, shape, seed, data):
    """FLOAT/SIGNED LT is what jax's comparator means: -0 == +0 (stable), NaNs last."""
    dimension = data.draw(st.integers(0, len(shape) - 1))
    rng = np.random.default_rng(seed)
    keys = random_keys(rng, shape, dtype)
    payload = rng.integers(0, 1000, shape).astype(np.int32)
    expected = lax_answer(lax.sort, (keys, payload), dimension=dimension, is_stable=True, num_keys=1)
    t = Shape.of(keys).element_type.value
    got = run_sort([keys, payload], comparator([t, "s32"]), dimension)
    assert_bits_equal(got[0], np.asarray(expected[0]))
    np.testing.assert_array_equal(got[1], np.asarray(expected[1]))


@settings(max_examples=20, deadline=None)
@given(
    st.sampled_from(["float32", "int32", "uint16", "int64", "float64"]),
    st.lists(st.integers(1, 8), min_size=1, max_size=2),
    st.integers(0, 2**32 - 1),
    st.data(),
)
def test_sort_gt_is_stable_descending(dtype, shape, seed, data):
    dimension = data.draw(st.integers(0, len(shape) - 1))
    rng = np.random.default_rng(seed)
    keys = rng.integers(-3 if np.dtype(dtype).kind != "u" else 0, 4, shape).astype(dtype)
    index = np.broadcast_to(
        np.arange(shape[dimension]).reshape([-1 if i == dimension else 1 for i in range(len(shape))]), shape
    )
    index = index.astype(np.int32)
    swap = data.draw(st.booleans())  # "rhs < lhs" written with LT is GT
    comp = comparator([Shape.of(keys).element_type.value, "s32"], "LT" if swap else "GT", swap=swap)
    got = run_sort([keys, index], comp, dimension)
    order = np.argsort(-keys.astype(np.float64), axis=dimension, kind="stable")
    np.testing.assert_array_equal(got[0], np.take_along_axis(keys, order, dimension))
    np.testing.assert_array_equal(got[1], np.take_along_axis(index, order, dimension))


def test_sort_total_order_floats():
    x = np.array([1.0, np.nan, -0.0, -np.inf, 0.0, -np.nan, np.inf, -1.0, 0.0, -0.0], dtype=np.float32)
    got = run_sort([x], comparator(["f32"], total=True), 0)
    expected = np.array([-np.nan, -np.inf, -1.0, -0.0, -0.0, 0.0, 0.0, 1.0, np.inf, np.nan], dtype=np.float32)
    assert_bits_equal(got, expected)
    got = run_sort([x], comparator(["f32"], "GT", total=True), 0)
    assert_bits_equal(got, expected[::-1].copy())


@pytest.mark.parametrize("dtype", ["int32", "uint8", "int64", "bool"])
def test_sort_single_integer_operand_both_directions(dtype):
    rng = np.random.default_rng(2)
    x = random_keys(rng, (6, 40), dtype)
    t = Shape.of(x).element_type.value
    for dimension in (0, 1):
        np.testing.assert_array_equal(run_sort([x], comparator([t]), dimension), np.sort(x, axis=dimension))
        descending = np.flip(np.sort(x, axis=dimension), axis=dimension)
        np.testing.assert_array_equal(run_sort([x], comparator([t], "GT"), dimension), descending)


def test_sort_single_operand_returns_array_and_tuple_of_one():
    x = np.array([[3, 1, 2], [0, -1, 5]], dtype=np.int32)
    got = run_sort([x], comparator(["s32"]), 1)
    np.testing.assert_array_equal(got, np.sort(x, axis=1))
    got = run_op(
        "sort",
        Shape.tuple([Shape.of(x)]),
        [x],
        {"dimensions": [0], "is_stable": False, "to_apply": comparator(["s32"]).name},
        [comparator(["s32"])],
    )
    assert isinstance(got, tuple)
    np.testing.assert_array_equal(got[0], np.sort(x, axis=0))


def lexicographic_comparator() -> Computation:
    """(k0, k1) < (k0', k1') lexicographically, three operands (s32 keys, f32 payload)."""
    comp = Computation("lexicographic")
    names = []
    for i, t in enumerate(["s32", "s32", "f32"]):
        for side in ("l", "r"):
            comp.add(
                Instruction(f"{side}{i}", "parameter", Shape.scalar(t), [], {"parameter_number": len(names)})
            )
            names.append(f"{side}{i}")
    comp.add(Instruction("lt0", "compare", PRED, ["l0", "r0"], {"comparison_direction": "LT"}))
    comp.add(Instruction("eq0", "compare", PRED, ["l0", "r0"], {"comparison_direction": "EQ"}))
    comp.add(Instruction("lt1", "compare", PRED, ["l1", "r1"], {"comparison_direction": "LT"}))
    comp.add(Instruction("tie", "and", PRED, ["eq0", "lt1"]))
    comp.add(Instruction("r", "or", PRED, ["lt0", "tie"]))
    comp.root = "r"
    return comp


@settings(max_examples=15, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=2), st.integers(0, 2**32 - 1), st.data())
def test_sort_generic_lexicographic_comparator(shape, seed, data):
    dimension = data.draw(st.integers(0, len(shape) - 1))
    rng = np.random.default_rng(seed)
    k0 = rng.integers(0, 3, shape).astype(np.int32)
    k1 = rng.integers(0, 3, shape).astype(np.int32)
    payload = rng.standard_normal(shape).astype(np.float32)
    expected = lax_answer(lax.sort, (k0, k1, payload), dimension=dimension, is_stable=True, num_keys=2)
    got = run_sort([k0, k1, payload], lexicographic_comparator(), dimension)
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g, np.asarray(e))


def jax_style_comparator(nan_first: bool = True) -> Computation:
    """The comparator jax emits for lax.sort on f32: canonicalize NaN and zero, then TOTALORDER LT.

    With nan_first=False the two canonicalizations are nested the other way round: the same order,
    but not the pattern the kernel recognizes, so the generic merge sort evaluates it.
    """
    f32 = Shape.scalar("f32")
    comp = Computation(f"jax_lt_{nan_first}")
    comp.add(Instruction("a", "parameter", f32, [], {"parameter_number": 0}))
    comp.add(Instruction("b", "parameter", f32, [], {"parameter_number": 1}))
    comp.add(Instruction("nan", "constant", f32, [], {"literal": np.asarray(np.nan, np.float32)}))
    comp.add(Instruction("zero", "constant", f32, [], {"literal": np.asarray(0.0, np.float32)}))
    for v in ("a", "b"):
        comp.add(Instruction(f"{v}_isnan", "compare", PRED, [v, v], {"comparison_direction": "NE"}))
        comp.add(Instruction(f"{v}_iszero", "compare", PRED, [v, "zero"], {"comparison_direction": "EQ"}))
        if nan_first:
            comp.add(Instruction(f"{v}_z", "select", f32, [f"{v}_iszero", "zero", v]))
            comp.add(Instruction(f"{v}_c", "select", f32, [f"{v}_isnan", "nan", f"{v}_z"]))
        else:
            comp.add(Instruction(f"{v}_n", "select", f32, [f"{v}_isnan", "nan", v]))
            comp.add(Instruction(f"{v}_c", "select", f32, [f"{v}_iszero", "zero", f"{v}_n"]))
    attrs = {"comparison_direction": "LT", "type": "TOTALORDER"}
    comp.add(Instruction("r", "compare", PRED, ["a_c", "b_c"], attrs))
    comp.root = "r"
    return comp


def test_jax_comparator_is_recognized_and_its_variant_is_not():
    assert jax_float_comparator(jax_style_comparator(True)) == ("lt", False)
    assert jax_float_comparator(jax_style_comparator(False)) is None


@pytest.mark.parametrize("nan_first", [True, False])
@pytest.mark.parametrize(
    "shape,dimension", [((50,), 0), ((7, 13), 1), ((9, 4), 0), ((3, 1, 5), 2), ((2, 0), 1)]
)
def test_sort_jax_comparator_with_nan_and_zeros(shape, dimension, nan_first):
    x = special_floats(np.random.default_rng(sum(shape)), shape, np.float32)
    expected = lax_answer(lax.sort, x, dimension=dimension, is_stable=True)
    got = run_sort([x], jax_style_comparator(nan_first), dimension)
    assert_bits_equal(got, expected)


def test_sort_of_jax_lowered_hlo_text():
    """End to end: the HLO jax lowers lax.sort to (two operands, its own comparator), parsed and run."""
    from replicas.runtime.interpreter import evaluate

    x = special_floats(np.random.default_rng(8), (4, 300), np.float32)
    payload = np.arange(1200, dtype=np.int32).reshape(4, 300)

    def f(keys, values):
        return lax.sort((keys, values), dimension=1, is_stable=True, num_keys=1)

    module = parse_hlo(jax_text(f, [x, payload]))
    got = evaluate(module, [x, payload])
    expected = lax_answer(f, x, payload)
    assert_bits_equal(got[0], np.asarray(expected[0]))
    np.testing.assert_array_equal(got[1], np.asarray(expected[1]))


@pytest.mark.parametrize("descending", [False, True])
def test_a_symmetric_key_comparator_sorts_by_its_key_as_xla_and_the_merge_sort(descending, monkeypatch):
    """XLA's compiled float comparator orders the canonicalized floats' bits (bitcast, xor): its key
    function runs once on the whole operand; the result is XLA's and the merge sort's, bit for bit."""
    import jax
    import jax.numpy as jnp

    import replicas as rp
    from replicas.ops import sort
    from replicas.ops.recognize import symmetric_key
    from replicas.runtime.interpreter import Interpreter

    x = special_floats(np.random.default_rng(3), (5, 64), np.float32)

    def f(keys):
        return jnp.argsort(keys, axis=1, descending=descending), jnp.sort(keys, axis=1, descending=descending)

    module = rp.jax.compile_jax(f, x).module
    comparators = [c for c in module.computations.values() if c.root_instruction.opcode == "compare"
                   and len(c.parameters) >= 2]
    assert comparators and all(symmetric_key(c) is not None for c in comparators)
    got = Interpreter(module).run([x])
    expected = jax.jit(f)(x)
    np.testing.assert_array_equal(got[0], np.asarray(expected[0]))
    assert_bits_equal(got[1], np.asarray(expected[1]))
    monkeypatch.setattr(sort, "_keyed_sort", lambda *args: None)
    merged = Interpreter(module).run([x])
    np.testing.assert_array_equal(merged[0], got[0])
    assert_bits_equal(merged[1], got[1])


def test_a_comparator_of_two_different_functions_has_no_symmetric_key():
    from replicas.ops.recognize import symmetric_key

    text = """HloModule m

cmp {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  na = f32[] negate(a)
  ROOT lt = pred[] compare(na, b), direction=LT
}

ENTRY e {
  x = f32[8] parameter(0)
  ROOT s = f32[8] sort(x), dimensions={0}, to_apply=cmp
}
"""
    module = parse_hlo(text)
    assert symmetric_key(module.computation("cmp")) is None
    x = np.array([3, -1, 2, 0, 5, -4, 1, 1], np.float32)
    from replicas.runtime.interpreter import evaluate

    assert evaluate(module, [x]).shape == (8,)  # the merge sort runs it


def test_sort_rejects_bad_comparator_arity_and_dimension():
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(ProgramError, match="parameters"):
        run_sort([x, x], comparator(["f32"]), 0)
    with pytest.raises(ProgramError, match="dimension"):
        run_sort([x], comparator(["f32"]), 2)
