"""convert, bitcast-convert and reduce-precision against XLA:CPU itself."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from elementwise_data import BF16, C64, C128, F16, F32, F64, PRED, assert_exact, floats, is_float, run, values
from hypothesis import given, settings
from hypothesis import strategies as st
from xla_oracle import Call, run_many

from replicas.errors import ProgramError

F8E4M3FN = np.dtype(ml_dtypes.float8_e4m3fn)
F8E5M2 = np.dtype(ml_dtypes.float8_e5m2)
I8, I32, I64 = np.dtype(np.int8), np.dtype(np.int32), np.dtype(np.int64)
U8, U16, U32, U64 = np.dtype(np.uint8), np.dtype(np.uint16), np.dtype(np.uint32), np.dtype(np.uint64)
TYPES = [PRED, I8, I32, I64, U8, U32, U64, F16, BF16, F32, F64, C64, C128, F8E4M3FN, F8E5M2]

# Values that leave the integer ranges, sit on their edges, or round at halves.
_EDGES = [np.nan, np.inf, -np.inf, 3e9, -3e9, 1e19, 2e19, -1e19, 255.5, 256.0, -129.0, 128.0, 127.5,
          -128.5, 2.0**31, -(2.0**31), 2.0**63, -(2.0**63), 2.0**64, 2.0**32, 65519.0, 65520.0, 0.5, -0.5,
          -0.0, 2.7, -2.7, 1 + 2.0**-4 + 2.0**-30, 1 + 2.0**-8 + 2.0**-40, 448.0, 464.0, 57344.0, 61440.0]


def _source_values(dtype: np.dtype) -> np.ndarray:
    if dtype.kind == "c":
        z = values(dtype, 64, seed=7)
        z.real[: len(_EDGES)] = np.array(_EDGES).astype(z.real.dtype)
        return z
    if is_float(dtype):
        x = floats(dtype, 96, seed=7, scale=300.0)
        with np.errstate(over="ignore", invalid="ignore"):
            edges = np.array(_EDGES).astype(dtype)
        x[len(x) - len(edges):] = edges
        return x
    return values(dtype, 96, seed=7)


def _oracle_ok(src: np.dtype, dst: np.dtype) -> bool:
    # StableHLO has no complex -> integer/pred conversion to compare with.
    return not (src.kind == "c" and dst.kind != "c" and not is_float(dst))


@pytest.mark.parametrize("src", TYPES, ids=str)
def test_convert_against_xla(src: np.dtype) -> None:
    x = _source_values(src)
    targets = [d for d in TYPES if d != src and _oracle_ok(src, d)]
    want = run_many([Call("convert", (0,), d) for d in targets], [x])
    for dst, w in zip(targets, want):
        assert_exact(run("convert", dst, [x]), w, f"convert {src} -> {dst}")


def test_convert_complex_to_integer_and_pred() -> None:
    z = np.array([1.5 + 7j, -3e10 + 0j, complex(np.nan, 1), 0 + 1j, -0.5 - 2j], C64)
    np.testing.assert_array_equal(run("convert", I32, [z]), [1, np.iinfo(np.int32).min, 0, 0, 0])
    np.testing.assert_array_equal(run("convert", PRED, [z]), [True, True, True, False, True])


def test_convert_to_the_same_type_returns_the_operand() -> None:
    x = np.arange(6, dtype=np.float32)
    assert run("convert", F32, [x]) is x


@pytest.mark.parametrize("shape", [(), (0,), (2, 3)], ids=str)
def test_convert_shapes(shape: tuple[int, ...]) -> None:
    n = int(np.prod(shape))
    x = _source_values(F32)[:n].reshape(shape)
    for dst in (I32, U8, BF16, PRED, C64):
        (w,) = run_many([Call("convert", (0,), dst)], [x])
        assert_exact(run("convert", dst, [x]), w, f"convert f32{list(shape)} -> {dst}")


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(allow_subnormal=False, width=64), min_size=1, max_size=20))
def test_float_to_int_saturates(xs: list[float]) -> None:
    x = np.array(xs, F64)
    for dst in (I8, I64, U32, U64):
        info = np.iinfo(dst)
        got = run("convert", dst, [x])
        for value, out in zip(xs, got.tolist()):
            if np.isnan(value):
                assert out == 0
            elif value >= info.max + 1:
                assert out == info.max
            elif value <= info.min - 1:
                assert out == info.min
            else:
                assert out == int(value)  # truncation toward zero


# -- bitcast-convert ---------------------------------------------------------------------------------------

_BITCASTS = [
    (F32, (3,), U8, (3, 4)), (U8, (2, 4), F32, (2,)), (F64, (2,), I32, (2, 2)), (I32, (5,), F32, (5,)),
    (BF16, (4,), np.dtype(np.int16), (4,)), (F32, (), U8, (4,)), (U16, (2,), F32, ()), (U64, (2, 3), F16, (2, 3, 4)),
    (F16, (3, 4), U64, (3,)), (I8, (0, 2), F16, (0,)),
]


@pytest.mark.parametrize("src,shape,dst,out_shape", _BITCASTS, ids=str)
def test_bitcast_convert(src: np.dtype, shape: tuple[int, ...], dst: np.dtype, out_shape: tuple[int, ...]) -> None:
    n = int(np.prod(shape))
    x = np.random.default_rng(3).integers(0, 256, max(n, 1) * src.itemsize, dtype=np.uint8)
    x = x.view(src)[:n].reshape(shape)
    (want,) = run_many([Call("bitcast-convert", (0,), dst, out_shape)], [x])
    got = run("bitcast-convert", dst, [x], out_shape)
    assert got.tobytes() == want.tobytes()


def test_bitcast_convert_bad_shape_is_a_program_error() -> None:
    with pytest.raises(ProgramError, match="bitcast-convert"):
        run("bitcast-convert", U8, [np.zeros(3, np.float32)], (3, 2))
    with pytest.raises(ProgramError, match="bitcast-convert"):
        run("bitcast-convert", F32, [np.zeros((3, 2), np.uint8)], (3,))


# -- reduce-precision --------------------------------------------------------------------------------------

_FORMATS = [(5, 10), (8, 7), (8, 23), (4, 3), (5, 2), (2, 1), (1, 0), (5, 0), (11, 52), (3, 30), (11, 4),
            (6, 12), (8, 0)]


def _precision_attrs(e: int, m: int) -> str:
    return f"{{exponent_bits = {e} : i32, mantissa_bits = {m} : i32}}"


@pytest.mark.parametrize("dtype", [F16, BF16, F32, F64], ids=str)
def test_reduce_precision_against_xla(dtype: np.dtype) -> None:
    x = floats(dtype, 200, seed=11, scale=1e4)
    # Halfway cases, values near the reduced formats' limits, and NaNs of both signs.
    extra = [1 + 2.0**-11, 1 + 3 * 2.0**-11, 65504.0, 65520.0, 6.1e-5, 3e-5, 240.0, 1 / 3, -np.nan, 1e300]
    with np.errstate(over="ignore"):
        x[-len(extra):] = np.array(extra).astype(dtype)
    want = run_many([Call("reduce-precision", (0,), dtype, attrs=_precision_attrs(e, m)) for e, m in _FORMATS], [x])
    for (e, m), w in zip(_FORMATS, want):
        got = run("reduce-precision", dtype, [x], attrs={"exponent_bits": e, "mantissa_bits": m})
        assert_exact(got, w, f"reduce-precision e{e}m{m} {dtype}")


def test_reduce_precision_matches_the_f16_round_trip() -> None:
    x = floats(F32, 300, seed=5, scale=1e3)
    got = run("reduce-precision", F32, [x], attrs={"exponent_bits": 5, "mantissa_bits": 10})
    with np.errstate(over="ignore"):
        via_f16 = x.astype(np.float16).astype(np.float32)
    normal = np.abs(via_f16) >= np.finfo(np.float16).smallest_normal  # reduce-precision flushes subnormals
    assert_exact(got[normal], via_f16[normal], "e5m10 vs f16")


def test_reduce_precision_scalar_and_errors() -> None:
    got = run("reduce-precision", F32, [np.array(1 / 3, F32)], attrs={"exponent_bits": 8, "mantissa_bits": 7})
    assert got.shape == () and got == np.float32(np.array(1 / 3, F32).astype(BF16))
    with pytest.raises(ProgramError, match="exponent_bits"):
        run("reduce-precision", F32, [np.zeros(2, F32)], attrs={"exponent_bits": 0, "mantissa_bits": 3})
    with pytest.raises(ProgramError, match="floating-point"):
        run("reduce-precision", I32, [np.zeros(2, I32)], attrs={"exponent_bits": 5, "mantissa_bits": 3})


def test_convert_large_arrays_block_by_block() -> None:
    rng = np.random.default_rng(4)
    x = rng.uniform(-3e9, 3e9, 200_001).astype(np.float32)
    x[::997] = np.nan
    x[5:70_000] = rng.uniform(-100, 100, 69_995)  # whole blocks in range, others not
    x = x.reshape(3, -1)[:, ::-1]  # not contiguous
    want = run_many([Call("convert", (0,), d) for d in (I32, U8, I64)], [np.ascontiguousarray(x)])
    for dst, w in zip((I32, U8, I64), want):
        assert_exact(run("convert", dst, [x]), w, f"convert f32 -> {dst}")
