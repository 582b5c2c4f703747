"""compare, select and clamp against XLA:CPU itself."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from elementwise_data import (
    BF16,
    C64,
    F16,
    F32,
    F64,
    FLOAT_SPECIALS,
    PRED,
    assert_exact,
    is_float,
    run,
    values,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from xla_oracle import Call, run_many

import replicas as rp
from replicas.errors import ProgramError
from replicas.ops.select import BITWISE_SELECT_MIN

DIRECTIONS = ["EQ", "NE", "GE", "GT", "LE", "LT"]
I8, I32, I64 = np.dtype(np.int8), np.dtype(np.int32), np.dtype(np.int64)
U8, U32, U64 = np.dtype(np.uint8), np.dtype(np.uint32), np.dtype(np.uint64)


def _pairs(dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Every special against every special, then random pairs (with some equal ones)."""
    a, b = values(dtype, 96, seed=1), values(dtype, 96, seed=2)
    b[::7] = a[::7]
    if is_float(dtype):
        specials = np.array(FLOAT_SPECIALS + [-np.nan]).astype(dtype)
        a = np.concatenate([np.repeat(specials, len(specials)), a])
        b = np.concatenate([np.tile(specials, len(specials)), b])
    return a, b


def _compare_attrs(direction: str, kind: str | None) -> str:
    text = f"comparison_direction = #stablehlo<comparison_direction {direction}>"
    if kind is not None:
        text += f", compare_type = #stablehlo<comparison_type {kind}>"
    return "{" + text + "}"


def _kinds(dtype: np.dtype) -> list[str | None]:
    if dtype == PRED:
        return [None, "UNSIGNED"]
    if is_float(dtype):
        return [None, "FLOAT", "TOTALORDER"]
    if dtype.kind == "c":
        return [None]
    return [None, "SIGNED" if dtype.kind == "i" else "UNSIGNED"]


@pytest.mark.parametrize("dtype", [PRED, I8, I32, I64, U8, U32, U64, F16, BF16, F32, F64, C64,
                                   np.dtype(ml_dtypes.float8_e4m3fn)], ids=str)
def test_compare_against_xla(dtype: np.dtype) -> None:
    a, b = _pairs(dtype)
    directions = ["EQ", "NE"] if dtype.kind == "c" else DIRECTIONS
    cases = [(d, k) for k in _kinds(dtype) for d in directions]
    want = run_many([Call("compare", (0, 1), PRED, attrs=_compare_attrs(d, k)) for d, k in cases], [a, b])
    for (direction, kind), w in zip(cases, want):
        attrs = {"comparison_direction": direction} | ({"type": kind} if kind else {})
        assert_exact(run("compare", PRED, [a, b], attrs=attrs), w, f"compare {direction} {kind} {dtype}")


def test_total_order_sorts_like_ieee() -> None:
    ordered = np.array([-np.nan, -np.inf, -1e38, -1.0, -1e-30, -0.0, 0.0, 1e-30, 1.0, np.inf, np.nan], F32)
    ordered[0] = -ordered[-1]
    a, b = np.repeat(ordered, len(ordered)), np.tile(ordered, len(ordered))
    got = run("compare", PRED, [a, b], attrs={"comparison_direction": "LT", "type": "TOTALORDER"})
    i, j = np.repeat(np.arange(len(ordered)), len(ordered)), np.tile(np.arange(len(ordered)), len(ordered))
    np.testing.assert_array_equal(got, i < j)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(width=32), min_size=2, max_size=30))
def test_total_order_is_a_total_order(xs: list[float]) -> None:
    x = np.array(xs, F32)
    a, b = np.repeat(x, len(x)), np.tile(x, len(x))
    lt = run("compare", PRED, [a, b], attrs={"comparison_direction": "LT", "type": "TOTALORDER"})
    eq = run("compare", PRED, [a, b], attrs={"comparison_direction": "EQ", "type": "TOTALORDER"})
    gt = run("compare", PRED, [a, b], attrs={"comparison_direction": "GT", "type": "TOTALORDER"})
    assert np.all(lt.astype(int) + eq.astype(int) + gt.astype(int) == 1)  # trichotomy
    np.testing.assert_array_equal(eq, a.view(np.uint32) == b.view(np.uint32))


def test_compare_scalars_and_errors() -> None:
    got = run("compare", PRED, [np.array(1.0, F32), np.array(np.nan, F32)], attrs={"comparison_direction": "NE"})
    assert got.shape == () and got.dtype == PRED and bool(got)
    with pytest.raises(ProgramError, match="comparison_direction"):
        run("compare", PRED, [np.zeros(2, F32)] * 2, attrs={"comparison_direction": "XX"})
    with pytest.raises(ProgramError, match="SIGNED"):
        run("compare", PRED, [np.zeros(2, U8)] * 2, attrs={"comparison_direction": "LT", "type": "SIGNED"})
    with pytest.raises(ProgramError, match="complex"):
        run("compare", PRED, [np.zeros(2, C64)] * 2, attrs={"comparison_direction": "LT"})


# -- select --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [PRED, I8, U64, BF16, F32, C64], ids=str)
@pytest.mark.parametrize("shape", [(), (0,), (3, 5)], ids=str)
def test_select_against_xla(dtype: np.dtype, shape: tuple[int, ...]) -> None:
    n = int(np.prod(shape))
    pred = values(PRED, 16, seed=5)[:n].reshape(shape)
    t, f = values(dtype, 16, seed=6)[:n].reshape(shape), values(dtype, 16, seed=7)[:n].reshape(shape)
    (want,) = run_many([Call("select", (0, 1, 2), dtype, shape)], [pred, t, f])
    assert_exact(run("select", dtype, [pred, t, f], shape), want, f"select {dtype}{list(shape)}")


@pytest.mark.parametrize("dtype", [PRED, I8, BF16, F32, F64, C64], ids=str)
def test_a_large_select_picks_the_bits_a_small_one_picks(dtype: np.dtype) -> None:
    # From BITWISE_SELECT_MIN elements on, select picks the operands' bits under a mask instead of
    # calling np.where (the form checked against XLA above): every bit must be the same.
    shape = (96, 128)
    assert np.prod(shape) >= BITWISE_SELECT_MIN
    n = int(np.prod(shape))
    pred = values(PRED, n, seed=5).reshape(shape)
    t, f = values(dtype, n, seed=6).reshape(shape), values(dtype, n, seed=7).reshape(shape)
    want = np.where(pred, t, f)
    assert run("select", dtype, [pred, t, f], shape).tobytes() == want.tobytes()


def test_a_large_select_of_a_transposed_and_a_broadcast_operand() -> None:
    module = rp.parse_hlo("""HloModule s
ENTRY e {
  p = pred[128,96] parameter(0)
  t = f32[96,128] parameter(1)
  tt = f32[128,96] transpose(t), dimensions={1,0}
  z = f32[] constant(-0)
  zb = f32[128,96] broadcast(z), dimensions={}
  ROOT s = f32[128,96] select(p, tt, zb)
}
""")
    pred, t = values(PRED, 128 * 96, seed=3).reshape(128, 96), values(F32, 96 * 128, seed=4).reshape(96, 128)
    want = np.where(pred, t.T, np.float32(-0.0))
    assert rp.evaluate(module, [pred, t]).tobytes() == want.tobytes()


def test_select_with_scalar_pred_picks_a_whole_operand() -> None:
    t, f = np.arange(6, dtype=np.int32).reshape(2, 3), -np.arange(6, dtype=np.int32).reshape(2, 3)
    np.testing.assert_array_equal(run("select", I32, [np.array(True), t, f], (2, 3)), t)
    np.testing.assert_array_equal(run("select", I32, [np.array(False), t, f], (2, 3)), f)


def test_select_of_tuples() -> None:
    from opkit import run_op

    from replicas.shapes import Shape

    t = (np.arange(3, dtype=np.float32), np.array(7, np.int32))
    f = (np.zeros(3, np.float32), np.array(-1, np.int32))
    shape = Shape.of(t)
    for pred, want in ((True, t), (False, f)):
        got = run_op("select", shape, [np.array(pred), t, f])
        assert isinstance(got, tuple) and len(got) == 2
        np.testing.assert_array_equal(got[0], want[0])
        assert got[1].shape == () and got[1] == want[1]


def test_select_errors() -> None:
    x = np.zeros(3, F32)
    with pytest.raises(ProgramError, match="pred"):
        run("select", F32, [x, x, x])
    with pytest.raises(ProgramError, match="select"):
        run("select", F32, [np.zeros(2, bool), x, x])


# -- clamp ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [PRED, I8, I32, U32, F16, BF16, F32, F64], ids=str)
def test_clamp_against_xla(dtype: np.dtype) -> None:
    lo, x, hi = values(dtype, 96, seed=1), values(dtype, 96, seed=2), values(dtype, 96, seed=3)
    if is_float(dtype):
        # The kernel returns numpy's choice among equal +-0 bounds; compare values, not zero signs.
        lo[lo == 0], x[x == 0], hi[hi == 0] = 0, 0, 0
    scalar_lo, scalar_hi = lo[:1].reshape(()), hi[1:2].reshape(())
    calls = [Call("clamp", (0, 1, 2), dtype), Call("clamp", (3, 1, 4), dtype, x.shape)]
    want = run_many(calls, [lo, x, hi, scalar_lo, scalar_hi])
    assert_exact(run("clamp", dtype, [lo, x, hi]), want[0], f"clamp {dtype}")
    assert_exact(run("clamp", dtype, [scalar_lo, x, scalar_hi], x.shape), want[1], f"clamp scalar bounds {dtype}")


def test_clamp_nan_and_scalar() -> None:
    lo = np.array([0.0, np.nan, 1.0], F32)
    x = np.array([np.nan, 0.5, 2.0], F32)
    hi = np.array([1.0, 1.0, np.nan], F32)
    assert np.isnan(run("clamp", F32, [lo, x, hi])).all()
    got = run("clamp", I64, [np.array(1), np.array(5), np.array(3)])
    assert got.shape == () and got == 3
