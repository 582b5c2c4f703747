"""Element-wise kernels on sub-byte integers (s2, s4, u2, u4), computed in 8 bits, against XLA:CPU."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from elementwise_data import PRED, assert_exact, run
from xla_oracle import Call, run_many

I2, I4 = np.dtype(ml_dtypes.int2), np.dtype(ml_dtypes.int4)
U2, U4 = np.dtype(ml_dtypes.uint2), np.dtype(ml_dtypes.uint4)
BINARY = ["add", "subtract", "multiply", "divide", "remainder", "maximum", "minimum", "and", "or", "xor",
          "shift-left", "shift-right-arithmetic", "shift-right-logical", "power"]


def _all_pairs(dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    info = ml_dtypes.iinfo(dtype)
    every = np.arange(int(info.min), int(info.max) + 1).astype(np.int8).astype(dtype)
    return np.repeat(every, len(every)), np.tile(every, len(every))


@pytest.mark.parametrize("dtype", [I4, U4, I2, U2], ids=str)
def test_sub_byte_binary_and_unary(dtype: np.dtype) -> None:
    a, b = _all_pairs(dtype)
    want = run_many([Call(op, (0, 1), dtype) for op in BINARY], [a, b])
    for op, w in zip(BINARY, want):
        assert_exact(run(op, dtype, [a, b]), w, f"{op} {dtype}")
    unary = ["not", "negate", "popcnt", "count-leading-zeros"] + (["abs", "sign"] if dtype in (I2, I4) else [])
    want = run_many([Call(op, (0,), dtype) for op in unary], [a])
    for op, w in zip(unary, want):
        assert_exact(run(op, dtype, [a]), w, f"{op} {dtype}")
    lt = "{comparison_direction = #stablehlo<comparison_direction LT>}"
    (want,) = run_many([Call("compare", (0, 1), PRED, attrs=lt)], [a, b])
    assert_exact(run("compare", PRED, [a, b], attrs={"comparison_direction": "LT"}), want, f"compare {dtype}")


@pytest.mark.parametrize("dtype", [I4, U4], ids=str)
def test_sub_byte_convert(dtype: np.dtype) -> None:
    f = np.array([np.nan, 100, -100, 7.5, -8.5, 2.7, -2.7, 16, 15.9, -0.5, np.inf], np.float32)
    i = np.array([300, -300, 7, 8, -9, 15, 16, 0], np.int32)
    a, _ = _all_pairs(dtype)
    cases = [(f, dtype), (i, dtype), (a, np.dtype(np.float32)), (a, np.dtype(np.int32)), (a, PRED)]
    for x, dst in cases:
        (want,) = run_many([Call("convert", (0,), dst)], [x])
        assert_exact(run("convert", dst, [x]), want, f"convert {x.dtype} -> {dst}")
