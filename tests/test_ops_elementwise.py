"""Unary and binary element-wise kernels against XLA:CPU itself (StableHLO compiled by jaxlib)."""

from __future__ import annotations

import numpy as np
import pytest
from elementwise_data import (
    BF16,
    C64,
    C128,
    COMPLEXES,
    F16,
    F32,
    F64,
    FLOATS,
    INTS,
    PRED,
    RTOL,
    SIGNED,
    UNSIGNED,
    assert_close,
    assert_exact,
    floats,
    run,
    values,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from xla_oracle import Call, run_many

# Unary ops on floats: (opcode, exact?) -- exact ones are correctly rounded in XLA as in numpy.
UNARY_FLOAT = [
    ("abs", True), ("negate", True), ("sign", True), ("ceil", True), ("floor", True),
    ("round-nearest-afz", True), ("round-nearest-even", True), ("sqrt", True), ("is-finite", True),
    ("exponential", False), ("exponential-minus-one", False), ("log", False), ("log-plus-one", False),
    ("logistic", False), ("rsqrt", False), ("cbrt", False), ("sine", False), ("cosine", False),
    ("tan", False), ("tanh", False), ("erf", False), ("real", True), ("imag", True),
    ("atan", False), ("sinh", False), ("cosh", False), ("asinh", False), ("acos", False),
    ("asin", False), ("atanh", False), ("acosh", False),
]
UNARY_COMPLEX = ["negate", "sign", "sqrt", "exponential", "exponential-minus-one", "log", "log-plus-one",
                 "logistic", "rsqrt", "sine", "cosine", "tan", "tanh"]
UNARY_INT = ["abs", "negate", "sign", "not", "popcnt", "count-leading-zeros"]


def _out_dtype(opcode: str, dtype: np.dtype) -> np.dtype:
    if opcode == "is-finite":
        return PRED
    if opcode in ("abs", "real", "imag") and dtype.kind == "c":
        return F32 if dtype == C64 else F64
    return dtype


def _check_unary(opcodes: list[str], x: np.ndarray, exact: set[str], rtol: float) -> None:
    want = run_many([Call(op, (0,), _out_dtype(op, x.dtype)) for op in opcodes], [x])
    for op, w in zip(opcodes, want):
        got = run(op, _out_dtype(op, x.dtype), [x])
        if op in exact:
            assert_exact(got, w, f"{op} {x.dtype}")
        else:
            assert_close(got, w, rtol, f"{op} {x.dtype}")


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_unary_float(dtype: np.dtype) -> None:
    x = floats(dtype)
    # XLA's approximations and libm differ at the infinities of a few inverse functions: the
    # specials are checked for the exactly rounded ops, the approximations on finite inputs.
    finite = x[np.isfinite(x.astype(F64))]
    exact = {op for op, is_exact in UNARY_FLOAT if is_exact}
    _check_unary(sorted(exact), x, exact, 0)
    approximate = [op for op, is_exact in UNARY_FLOAT if not is_exact]
    if dtype in (F16, BF16):  # XLA computes these in f32 like f32 itself: a sample keeps the test fast
        approximate = ["exponential", "log", "logistic", "rsqrt", "tanh", "erf", "sine", "cbrt"]
    _check_unary(approximate, finite, set(), RTOL[dtype])


@pytest.mark.parametrize("dtype", COMPLEXES, ids=str)
def test_unary_complex(dtype: np.dtype) -> None:
    z = values(dtype)
    _check_unary(["negate", "real", "imag"], z, {"negate", "real", "imag"}, 0)
    _check_unary(["abs"], z, set(), RTOL[dtype])
    nonzero = z[z != 0]
    _check_unary([op for op in UNARY_COMPLEX if op != "negate"], nonzero, set(), RTOL[dtype] * 10)


@pytest.mark.parametrize("dtype", SIGNED + UNSIGNED, ids=str)
def test_unary_int(dtype: np.dtype) -> None:
    ops = [op for op in UNARY_INT if not (op in ("sign", "abs") and dtype in UNSIGNED)]  # StableHLO forbids them
    _check_unary(ops, values(dtype), set(ops), 0)


def test_unary_pred() -> None:
    _check_unary(["not"], values(PRED), {"not"}, 0)


BINARY_FLOAT = ["add", "subtract", "multiply", "divide", "remainder", "maximum", "minimum", "power", "atan2"]
BINARY_INT = ["add", "subtract", "multiply", "divide", "remainder", "maximum", "minimum", "power", "and", "or",
              "xor", "shift-left", "shift-right-arithmetic", "shift-right-logical"]


def _binary_operands(dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    a = values(dtype, seed=1)
    b = values(dtype, seed=2)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        # Divisions by zero and INT_MIN / -1, and shifts by every amount up to past the width.
        pairs = [(info.min, -1), (info.min, 0), (7, 0), (info.max, 0), (0, 0), (-7, 2), (7, -2), (-7, -2)]
        bits = dtype.itemsize * 8
        pairs += [(-3, s) for s in range(bits + 3)] + [(5, -1), (-5, info.min), (1, bits * 3)]
        for i, (x, y) in enumerate(pairs):
            a[i] = np.array(x).astype(dtype)
            b[i] = np.array(y).astype(dtype)
    return a, b


def _check_binary(opcodes: list[str], a: np.ndarray, b: np.ndarray, rtol: float, exact: set[str]) -> None:
    want = run_many([Call(op, (0, 1), a.dtype) for op in opcodes], [a, b])
    for op, w in zip(opcodes, want):
        got = run(op, a.dtype, [a, b])
        if op in exact:
            assert_exact(got, w, f"{op} {a.dtype}")
        else:
            assert_close(got, w, rtol, f"{op} {a.dtype}")


@pytest.mark.parametrize("dtype", [t for t in INTS if t.itemsize != 2], ids=str)
def test_binary_int(dtype: np.dtype) -> None:
    a, b = _binary_operands(dtype)
    _check_binary(BINARY_INT, a, b, 0, set(BINARY_INT))


@pytest.mark.parametrize("dtype", SIGNED[1:3] + UNSIGNED[2:], ids=str)
def test_integer_power_exponent_range(dtype: np.dtype) -> None:
    rng = np.random.default_rng(5)
    base = rng.integers(-4, 5, 400).astype(dtype)
    exponent = rng.integers(-70, 140, 400).astype(dtype)
    exponent[:8] = np.array([0, 1, 63, 64, 65, 127, 128, -1]).astype(dtype)
    _check_binary(["power"], base, exponent, 0, {"power"})


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_binary_float(dtype: np.dtype) -> None:
    a, b = floats(dtype, seed=1), floats(dtype, seed=2)
    b[:13] = b[:13][::-1]  # specials meet other specials
    exact = {"add", "subtract", "multiply", "divide", "remainder"}
    _check_binary(sorted(exact), a, b, 0, exact)
    _check_binary(["maximum", "minimum"], a, b, 0, set())
    _check_binary(["power", "atan2"], a, b, RTOL[dtype], set())


@pytest.mark.parametrize("dtype", COMPLEXES, ids=str)
def test_binary_complex(dtype: np.dtype) -> None:
    a, b = values(dtype, seed=1), values(dtype, seed=2)
    _check_binary(["add", "subtract", "multiply"], a, b, RTOL[dtype], {"add", "subtract"})  # XLA may fuse multiply-adds
    _check_binary(["divide", "power"], a, b, RTOL[dtype] * 10, set())


def test_binary_pred() -> None:
    a = np.array([False, False, True, True])
    b = np.array([False, True, False, True])
    ops = ["add", "multiply", "maximum", "minimum", "and", "or", "xor"]
    _check_binary(ops, a, b, 0, set(ops))


@pytest.mark.parametrize("dtype", [F32, F64], ids=str)
def test_complex_from_parts(dtype: np.dtype) -> None:
    re, im = floats(dtype, seed=1), floats(dtype, seed=2)
    out = C64 if dtype == F32 else C128
    (want,) = run_many([Call("complex", (0, 1), out)], [re, im])
    assert_exact(run("complex", out, [re, im]), want, "complex")


@pytest.mark.parametrize("shape", [(), (0,), (0, 3), (3, 4)], ids=str)
@pytest.mark.parametrize("dtype", [np.dtype(np.int32), np.dtype(np.uint8), F32, BF16, PRED], ids=str)
def test_shapes(shape: tuple[int, ...], dtype: np.dtype) -> None:
    n = int(np.prod(shape))
    a, b = values(dtype, 16, seed=3)[:n].reshape(shape), values(dtype, 16, seed=4)[:n].reshape(shape)
    ops = ["add", "maximum"] + (["xor"] if dtype.kind in "biu" else ["multiply", "divide"])
    want = run_many([Call(op, (0, 1), dtype) for op in ops], [a, b])
    for op, w in zip(ops, want):
        assert_exact(run(op, dtype, [a, b]), w, f"{op} {dtype}{list(shape)}")
    unary = "not" if dtype.kind in "b" else "negate" if dtype.kind in "iu" else "exponential"
    (want,) = run_many([Call(unary, (0,), dtype)], [a])
    assert_close(run(unary, dtype, [a]), want, RTOL.get(dtype, 0), unary)


def test_documented_integer_edge_cases() -> None:
    i32 = np.int32
    info = np.iinfo(i32)
    a = np.array([7, -7, info.min, info.min, 7, -7], i32)
    b = np.array([0, 0, -1, 0, -2, 2], i32)
    np.testing.assert_array_equal(run("divide", i32, [a, b]), [-1, -1, info.min, -1, -3, -3])
    np.testing.assert_array_equal(run("remainder", i32, [a, b]), [7, -7, 0, info.min, 1, -1])
    u = np.array([7, 0], np.uint32)
    np.testing.assert_array_equal(run("divide", np.uint32, [u, np.zeros(2, np.uint32)]), [2**32 - 1] * 2)
    np.testing.assert_array_equal(run("abs", i32, [np.array([info.min], i32)]), [info.min])
    np.testing.assert_array_equal(run("negate", np.uint8, [np.array([0, 1, 255], np.uint8)]), [0, 255, 1])
    x = np.array([1, -8, -8, 1], i32)
    s = np.array([32, 40, -1, -1], i32)
    np.testing.assert_array_equal(run("shift-left", i32, [x, s]), [0, 0, 0, 0])
    np.testing.assert_array_equal(run("shift-right-arithmetic", i32, [x, s]), [0, -1, -1, 0])
    np.testing.assert_array_equal(run("shift-right-logical", i32, [x, s]), [0, 0, 0, 0])
    base = np.array([2, -1, -1, 1, 0, 5, 2], i32)
    exponent = np.array([-1, -3, -4, -9, 0, 0, 64], i32)
    np.testing.assert_array_equal(run("power", i32, [base, exponent]), [0, -1, 1, 1, 1, 1, 1])


def test_documented_float_edge_cases() -> None:
    x = np.array([-0.0, 0.0, np.nan, -2.5, 2.5, 0.49999997, -0.5], F32)
    sign = run("sign", F32, [x])
    assert np.signbit(sign[0]) and not np.signbit(sign[1]) and np.isnan(sign[2])
    np.testing.assert_array_equal(run("round-nearest-afz", F32, [x])[3:], [-3, 3, 0, -1])
    np.testing.assert_array_equal(run("round-nearest-even", F32, [x])[3:], [-2, 2, 0, -0.0])
    nan = np.array([np.nan, 1.0], F32)
    one = np.array([1.0, np.nan], F32)
    assert np.isnan(run("maximum", F32, [nan, one])).all()
    assert np.isnan(run("minimum", F32, [nan, one])).all()
    z = np.array([3 + 4j, 0j], C64)
    np.testing.assert_allclose(run("sign", C64, [z]), [0.6 + 0.8j, 0j], rtol=1e-6)
    np.testing.assert_array_equal(run("imag", F32, [np.array([1.0, -2.0], F32)]), [0, 0])


def test_mulhi_matches_python_integers() -> None:
    rng = np.random.default_rng(9)
    for dtype in (np.int32, np.uint32, np.int64, np.uint64, np.int8):
        info = np.iinfo(dtype)
        a = rng.integers(info.min, info.max, 200, dtype=dtype, endpoint=True)
        b = rng.integers(info.min, info.max, 200, dtype=dtype, endpoint=True)
        a[:3], b[:3] = [info.min, info.max, info.min], [info.min, info.max, info.max]
        bits = np.dtype(dtype).itemsize * 8
        want = np.array([((int(x) * int(y)) >> bits) for x, y in zip(a, b)], dtype=object)
        want = np.array([int(w) % (1 << bits) for w in want], dtype=object)
        got = run("mulhi", dtype, [a, b]).astype(object) % (1 << bits)
        np.testing.assert_array_equal(got, want)


def test_narrow_floats_round_once() -> None:
    a = np.array([1, 1e-3, 3e38, 256], BF16)
    b = np.array([3e-3, 1, 3e38, 1], BF16)
    (want,) = run_many([Call("add", (0, 1), BF16)], [a, b])
    assert_exact(run("add", BF16, [a, b]), want, "bf16 add")
    h = np.array([65504, 0.1, 2049], F16)
    (want,) = run_many([Call("multiply", (0, 1), F16)], [h, h])
    assert_exact(run("multiply", F16, [h, h]), want, "f16 multiply")


@pytest.mark.parametrize("opcode,dtype", [("subtract", PRED), ("and", F32), ("shift-left", F32),
                                          ("remainder", C64), ("maximum", C64), ("atan2", np.dtype(np.int32)),
                                          ("popcnt", F32), ("round-nearest-afz", np.dtype(np.int32)),
                                          ("cbrt", C64), ("is-finite", C64)])
def test_undefined_type_is_a_program_error(opcode: str, dtype: np.dtype) -> None:
    from replicas.errors import ProgramError

    x = np.zeros(2, dtype)
    operands = [x] if opcode in ("popcnt", "round-nearest-afz", "cbrt", "is-finite") else [x, x]
    out = PRED if opcode == "is-finite" else dtype
    with pytest.raises(ProgramError, match=opcode):
        run(opcode, out, operands)


def test_mismatched_result_type_is_a_program_error() -> None:
    from replicas.errors import ProgramError

    x = np.zeros(2, np.float32)
    with pytest.raises(ProgramError, match="add"):
        run("add", np.float64, [x, x])


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2"])
def test_float8_arithmetic_rounds_once(name: str) -> None:
    import ml_dtypes

    dtype = np.dtype(getattr(ml_dtypes, name))
    a, b = floats(dtype, seed=1, scale=20.0), floats(dtype, seed=2, scale=20.0)
    exact = ["add", "subtract", "multiply", "divide", "maximum", "minimum"]
    _check_binary(exact, a, b, 0, set(exact) - {"maximum", "minimum"})
    _check_unary(["negate", "abs", "floor", "sqrt"], a, {"negate", "abs", "floor", "sqrt"}, 0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(-(2**31), 2**31 - 1), st.integers(-(2**31), 2**31 - 1)), min_size=1,
                max_size=30))
def test_integer_division_truncates(pairs: list[tuple[int, int]]) -> None:
    a = np.array([p[0] for p in pairs], np.int32)
    b = np.array([p[1] for p in pairs], np.int32)
    quotient, remainder = run("divide", np.int32, [a, b]), run("remainder", np.int32, [a, b])
    for x, y, q, r in zip(a.tolist(), b.tolist(), quotient.tolist(), remainder.tolist()):
        if y == 0:
            assert (q, r) == (-1, x)
        elif (x, y) == (-(2**31), -1):
            assert (q, r) == (x, 0)
        else:
            want_q = abs(x) // abs(y) * (1 if (x < 0) == (y < 0) else -1)
            assert (q, r) == (want_q, x - want_q * y)


def test_large_chains_reuse_dead_buffers_without_changing_live_values():
    """(a+b)*c - a on arrays big enough for buffer reuse: the sum's buffer may hold the product,
    but a value read twice (s feeds both the product and the root tuple) is never overwritten."""
    from opkit import run_module

    from replicas.hlo.text import parse_hlo

    n = 1 << 17
    m = parse_hlo(f"""HloModule chain
ENTRY main {{
  a = f32[{n}] parameter(0)
  b = f32[{n}] parameter(1)
  c = f32[{n}] parameter(2)
  s = f32[{n}] add(a, b)
  p = f32[{n}] multiply(s, c)
  q = f32[{n}] subtract(p, a)
  t = f32[{n}] add(a, c)
  u = f32[{n}] multiply(t, t)
  ROOT r = (f32[{n}], f32[{n}], f32[{n}]) tuple(q, s, u)
}}""")
    rng = np.random.default_rng(0)
    a, b, c = (rng.normal(size=n).astype(np.float32) for _ in range(3))
    keep = [x.copy() for x in (a, b, c)]
    q, s, u = run_module(m, [a, b, c])
    np.testing.assert_array_equal(q, (a + b) * c - a)
    np.testing.assert_array_equal(s, a + b)
    np.testing.assert_array_equal(u, (a + c) * (a + c))
    for x, k in zip((a, b, c), keep):
        np.testing.assert_array_equal(x, k)  # parameters are never written
