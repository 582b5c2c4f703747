"""Inputs and comparisons shared by the element-wise kernel tests.

Floats avoid subnormal values: XLA:CPU flushes them to zero (FTZ/DAZ) and numpy does not, a
difference the kernels deliberately do not emulate.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
from opkit import run_op

from replicas.shapes import PrimitiveType, Shape

BF16 = np.dtype(ml_dtypes.bfloat16)
F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
C64, C128 = np.dtype(np.complex64), np.dtype(np.complex128)
PRED = np.dtype(np.bool_)
FLOATS = [F16, BF16, F32, F64]
COMPLEXES = [C64, C128]
SIGNED = [np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64)]
UNSIGNED = [np.dtype(t) for t in (np.uint8, np.uint16, np.uint32, np.uint64)]
INTS = SIGNED + UNSIGNED

FLOAT_SPECIALS = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5]

# Relative tolerance of XLA's approximations of transcendental functions, by dtype.
RTOL = {F16: 2e-3, BF16: 1.6e-2, F32: 2e-5, F64: 1e-12, C64: 2e-5, C128: 1e-12}


def is_float(dtype: np.dtype) -> bool:
    return PrimitiveType.from_dtype(dtype).is_floating


def floats(dtype: np.dtype, n: int = 96, seed: int = 0, scale: float = 5.0, specials: bool = True) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.uniform(-scale, scale, n)
    x[: n // 4] *= 10.0 ** rng.integers(-2, 3, n // 4)
    if specials:
        x[: len(FLOAT_SPECIALS)] = FLOAT_SPECIALS
    tiny = float(ml_dtypes.finfo(dtype).smallest_normal)
    with np.errstate(over="ignore", invalid="ignore"):
        out = x.astype(dtype)
        out[np.abs(out.astype(F64)) < tiny] = 0
    return out


def complexes(dtype: np.dtype, n: int = 64, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    re, im = rng.uniform(-3, 3, n), rng.uniform(-3, 3, n)
    im[:4] = 0.0
    re[4:6] = 0.0
    return (re + 1j * im).astype(dtype)


def ints(dtype: np.dtype, n: int = 96, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
    x[n // 2:] = rng.integers(max(info.min, -5), 6, n - n // 2).astype(dtype)
    specials = [info.min, info.max, 0, 1, info.max - 1] + ([-1] if info.min < 0 else [])
    x[: len(specials)] = np.array(specials, dtype=dtype)
    return x


def preds(n: int = 64, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2, n).astype(bool)


def values(dtype: np.dtype, n: int = 96, seed: int = 0) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype == PRED:
        return preds(n, seed)
    if dtype.kind == "c":
        return complexes(dtype, n, seed)
    if is_float(dtype):
        return floats(dtype, n, seed)
    return ints(dtype, n, seed)


def run(opcode: str, out_dtype: Any, operands: list[np.ndarray], out_shape: tuple[int, ...] | None = None,
        attrs: dict[str, Any] | None = None) -> np.ndarray:
    shape = operands[0].shape if out_shape is None else out_shape
    result = run_op(opcode, Shape.array(PrimitiveType.from_dtype(out_dtype), shape), operands, attrs)
    assert isinstance(result, np.ndarray), f"{opcode} returned {type(result).__name__}"
    assert result.dtype == np.dtype(out_dtype), f"{opcode} returned dtype {result.dtype}, not {np.dtype(out_dtype)}"
    assert result.shape == shape, f"{opcode} returned shape {result.shape}, not {shape}"
    return result


def assert_exact(got: np.ndarray, want: np.ndarray, what: str = "") -> None:
    """Equal dtype, shape and values; floats bit for bit (so -0.0 != 0.0), any NaN matches any NaN."""
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, want.dtype, got.shape, want.shape)
    if got.dtype.kind == "c":
        assert_exact(got.real.copy(), want.real.copy(), what + " (real)")
        assert_exact(got.imag.copy(), want.imag.copy(), what + " (imag)")
        return
    if is_float(got.dtype):
        g, w = got.astype(F64), want.astype(F64)
        nan = np.isnan(w)
        assert np.array_equal(np.isnan(g), nan), f"{what}: NaN positions differ\n got {got}\nwant {want}"
        bad = ~nan & ((g != w) | (np.signbit(g) != np.signbit(w)))
        assert not bad.any(), f"{what}: got {got[bad]} want {want[bad]} for elements {np.flatnonzero(bad)}"
        return
    bad = got != want
    assert not np.any(bad), f"{what}: got {got[bad]} want {want[bad]} at {np.flatnonzero(bad)}"


def assert_close(got: np.ndarray, want: np.ndarray, rtol: float, what: str = "") -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, want.dtype)
    wide = C128 if got.dtype.kind == "c" else F64
    np.testing.assert_allclose(got.astype(wide), want.astype(wide), rtol=rtol, atol=rtol, equal_nan=True,
                               err_msg=what)
