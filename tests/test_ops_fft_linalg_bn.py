"""fft, cholesky, triangular-solve and batch-norm kernels against XLA:CPU itself (the single StableHLO
operation compiled through jaxlib), jax.numpy and the Operation Semantics formulas."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opkit import run_op
from xla_oracle import GOLDEN, compile_stablehlo, execute, jit_answer, run_stablehlo, tensor_type

from replicas.errors import ProgramError
from replicas.shapes import Shape


@functools.cache
def _compiled_multi(op: str, in_types: tuple[str, ...], out_types: tuple[str, ...], attrs: str):
    params = ", ".join(f"%a{i}: {t}" for i, t in enumerate(in_types))
    args = ", ".join(f"%a{i}" for i in range(len(in_types)))
    outs = ", ".join(out_types)
    text = (f"module @oracle {{\n func.func public @main({params}) -> ({outs}) {{\n"
            f"  %0:{len(out_types)} = \"{op}\"({args}) {attrs} : ({', '.join(in_types)}) -> ({outs})\n"
            f"  return {', '.join(f'%0#{i}' for i in range(len(out_types)))} : {outs}\n }}\n}}\n")
    return compile_stablehlo(text)


def run_stablehlo_multi(op, operands, outs, attrs):
    """Like xla_oracle.run_stablehlo for an operation with several results; `outs` is [(shape, dtype)]."""
    operands = [np.asarray(o) for o in operands]
    program = (op, tuple(tensor_type(o.shape, o.dtype) for o in operands), tuple(tensor_type(s, d) for s, d in outs),
               attrs)
    return GOLDEN.answer(program, operands, lambda: execute(_compiled_multi(*program), operands))


def shape_like(a: np.ndarray) -> Shape:
    return Shape.of(a)


def assert_close(got, expected, dtype):
    assert got.dtype == expected.dtype and got.shape == expected.shape
    tol = 1e-10 if np.dtype(dtype) in (np.float64, np.complex128) else (3e-2 if np.dtype(dtype).itemsize <= 2
                                                                         else 2e-4)
    wide = np.complex128 if got.dtype.kind == "c" else np.float64
    np.testing.assert_allclose(got.astype(wide), expected.astype(wide), rtol=tol, atol=tol)


# -- fft -------------------------------------------------------------------------------------------------

@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), fft_type=st.sampled_from(["FFT", "IFFT", "RFFT", "IRFFT"]),
       n_axes=st.integers(1, 3), wide=st.booleans())
def test_fft_against_xla(seed, fft_type, n_axes, wide):
    rng = np.random.default_rng(seed)
    batch = tuple(int(d) for d in rng.integers(1, 4, int(rng.integers(0, 3))))
    lengths = [int(n) for n in rng.integers(1, 9, n_axes)]
    real = np.float64 if wide else np.float32
    cplx = np.complex128 if wide else np.complex64
    if fft_type == "RFFT":
        x = rng.standard_normal((*batch, *lengths)).astype(real)
        out_dims = (*batch, *lengths[:-1], lengths[-1] // 2 + 1)
        out_dtype = cplx
    else:
        inner = lengths[:-1] + [lengths[-1] // 2 + 1] if fft_type == "IRFFT" else lengths
        x = (rng.standard_normal((*batch, *inner)) + 1j * rng.standard_normal((*batch, *inner))).astype(cplx)
        out_dims = (*batch, *lengths)
        out_dtype = real if fft_type == "IRFFT" else cplx
    attrs = (f"{{fft_type = #stablehlo<fft_type {fft_type}>, "
             f"fft_length = array<i64: {', '.join(map(str, lengths))}>}}")
    expected = run_stablehlo("stablehlo.fft", [x], out_dtype, out_dims, attrs)
    got = run_op("fft", Shape.array(Shape.of(expected).element_type, out_dims), [x],
                 {"fft_type": fft_type, "fft_length": lengths})
    assert_close(got, expected, out_dtype)


def test_fft_matches_jnp_and_checks_shapes():
    x = np.random.default_rng(0).standard_normal((2, 6, 8)).astype(np.float32)
    got = run_op("fft", "c64[2,6,5]", [x], {"fft_type": "RFFT", "fft_length": [6, 8]})
    np.testing.assert_allclose(got, np.asarray(jnp.fft.rfft2(x)), rtol=1e-4, atol=1e-4)
    with pytest.raises(ProgramError, match="must equal fft_length"):
        run_op("fft", "c64[2,6,5]", [x], {"fft_type": "RFFT", "fft_length": [6, 9]})
    with pytest.raises(ProgramError, match="fft_type"):
        run_op("fft", "c64[2,6,5]", [x], {"fft_type": "DCT", "fft_length": [6, 8]})


# -- cholesky --------------------------------------------------------------------------------------------

def random_spd(rng, batch, n, dtype):
    if np.dtype(dtype).kind == "c":
        m = rng.standard_normal((*batch, n, n)) + 1j * rng.standard_normal((*batch, n, n))
    else:
        m = rng.standard_normal((*batch, n, n))
    # Multiples of 1/64, whose products and their sums are exact: the matrix's bytes (which key
    # XLA's recorded answer) do not depend on the order the machine's BLAS sums in.
    m = np.round(m * 64) / 64
    a = m @ np.conj(np.swapaxes(m, -1, -2)) + n * np.eye(n)
    return a.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, np.complex128])
@pytest.mark.parametrize("lower", [True, False])
@pytest.mark.parametrize("batch,n", [((), 5), ((3,), 4), ((2, 2), 7), ((2,), 0)])
def test_cholesky_against_xla(dtype, lower, batch, n):
    rng = np.random.default_rng(n)
    a = random_spd(rng, batch, n, dtype)
    # The other triangle holds garbage: only the requested triangle may be read.
    garbage = rng.standard_normal(a.shape).astype(dtype)
    a = np.where(np.tri(n, dtype=bool) if lower else np.tri(n, dtype=bool).T, a, garbage)
    expected = run_stablehlo("stablehlo.cholesky", [a], dtype, a.shape, f"{{lower = {str(lower).lower()}}}")
    got = run_op("cholesky", shape_like(a), [a], {"lower": lower})
    keep = np.tri(n, dtype=bool) if lower else np.tri(n, dtype=bool).T
    np.testing.assert_array_equal(got[..., ~keep], 0)  # XLA:CPU zeroes the other triangle too
    assert_close(got, expected, dtype)


def test_cholesky_bf16_and_not_positive_definite():
    rng = np.random.default_rng(1)
    a = random_spd(rng, (2,), 4, np.float32)
    got = run_op("cholesky", "bf16[2,4,4]", [a.astype(ml_dtypes.bfloat16)], {"lower": True})
    np.testing.assert_allclose(got.astype(np.float32), np.linalg.cholesky(a), rtol=3e-2, atol=3e-2)
    bad = a.copy()
    bad[1] = -bad[1]
    got = run_op("cholesky", "f32[2,4,4]", [bad], {"lower": True})
    np.testing.assert_allclose(got[0], np.linalg.cholesky(a[0]), rtol=1e-5)
    assert np.isnan(got[1]).all()  # XLA:CPU: the whole failed matrix is NaN
    expected = run_stablehlo("stablehlo.cholesky", [bad], np.float32, bad.shape, "{lower = true}")
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))


# -- triangular-solve ------------------------------------------------------------------------------------

def triangular_case(rng, batch, m, k, left_side, dtype):
    a = rng.standard_normal((*batch, m, m)) + 3 * np.eye(m)
    if np.dtype(dtype).kind == "c":
        a = a + 1j * rng.standard_normal((*batch, m, m))
    b_shape = (*batch, m, k) if left_side else (*batch, k, m)
    return a.astype(dtype), rng.standard_normal(b_shape).astype(dtype)


def run_triangular(a, b, left_side, lower, unit, transpose):
    return run_op("triangular-solve", shape_like(b), [a, b],
                  {"left_side": left_side, "lower": lower, "unit_diagonal": unit, "transpose_a": transpose})


@pytest.mark.parametrize("left_side,lower,unit,transpose,dtype", [
    (True, True, False, "NO_TRANSPOSE", np.float32), (True, False, True, "TRANSPOSE", np.float64),
    (False, True, False, "ADJOINT", np.complex64), (False, False, False, "TRANSPOSE", np.complex128),
    (True, False, False, "ADJOINT", np.complex128), (False, True, True, "NO_TRANSPOSE", np.float64)])
def test_triangular_solve_against_xla(left_side, lower, unit, transpose, dtype):
    a, b = triangular_case(np.random.default_rng(0), (2, 3), 5, 3, left_side, dtype)
    attrs = (f"{{left_side = {str(left_side).lower()}, lower = {str(lower).lower()}, "
             f"unit_diagonal = {str(unit).lower()}, transpose_a = #stablehlo<transpose {transpose}>}}")
    expected = run_stablehlo("stablehlo.triangular_solve", [a, b], dtype, b.shape, attrs)
    assert_close(run_triangular(a, b, left_side, lower, unit, transpose), expected, dtype)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), left_side=st.booleans(), lower=st.booleans(), unit=st.booleans(),
       transpose=st.sampled_from(["NO_TRANSPOSE", "TRANSPOSE", "ADJOINT"]),
       dtype=st.sampled_from([np.float32, np.float64, np.complex64, np.complex128]))
def test_triangular_solve_against_dense_solve(seed, left_side, lower, unit, transpose, dtype):
    """op(a) x = b (or x op(a) = b) with op(a) built explicitly from the named triangle of a."""
    rng = np.random.default_rng(seed)
    batch = tuple(int(d) for d in rng.integers(1, 3, int(rng.integers(0, 3))))
    m, k = int(rng.integers(1, 7)), int(rng.integers(1, 5))
    a, b = triangular_case(rng, batch, m, k, left_side, dtype)
    tri = np.tril(a) if lower else np.triu(a)
    if unit:
        tri = tri.copy()
        idx = np.arange(m)
        tri[..., idx, idx] = 1
    op = {"NO_TRANSPOSE": tri, "TRANSPOSE": np.swapaxes(tri, -1, -2),
          "ADJOINT": np.conj(np.swapaxes(tri, -1, -2))}[transpose].astype(np.complex128)
    if left_side:
        expected = np.linalg.solve(op, b.astype(np.complex128))
    else:
        expected = np.swapaxes(np.linalg.solve(np.swapaxes(op, -1, -2), np.swapaxes(b, -1, -2).astype(np.complex128)),
                               -1, -2)
    got = run_triangular(a, b, left_side, lower, unit, transpose)
    assert got.dtype == np.dtype(dtype) and got.shape == b.shape
    tol = 1e-9 if np.dtype(dtype).itemsize >= 16 or dtype == np.float64 else 1e-4
    np.testing.assert_allclose(got.astype(np.complex128), expected, rtol=tol, atol=tol)


def test_triangular_solve_matches_jax_and_checks_shapes():
    rng = np.random.default_rng(2)
    a = np.tril(rng.standard_normal((3, 5, 5))) + 4 * np.eye(5)
    b = rng.standard_normal((3, 5, 2))
    expected = np.asarray(jax.lax.linalg.triangular_solve(a, b, left_side=True, lower=True))
    got = run_op("triangular-solve", shape_like(b), [a, b], {"left_side": True, "lower": True})
    np.testing.assert_allclose(got, expected, rtol=1e-10)
    with pytest.raises(ProgramError, match="columns to match"):
        run_op("triangular-solve", shape_like(b), [a, b], {"left_side": False, "lower": True})


# -- batch norm ------------------------------------------------------------------------------------------

def bn_attrs(epsilon, feature_index):
    return f"{{epsilon = {float(epsilon)!r} : f32, feature_index = {feature_index} : i64}}"


def reference_training(x, scale, offset, eps, fi):
    axes = tuple(d for d in range(x.ndim) if d != fi)
    shape = [1] * x.ndim
    shape[fi] = -1
    mean = x.mean(axis=axes)
    var = ((x - mean.reshape(shape)) ** 2).mean(axis=axes)
    y = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps) * scale.reshape(shape) + offset.reshape(shape)
    return y, mean, var


CASES = [((4, 3, 5, 2), 1), ((8, 6), 1), ((6, 2, 3), 0), ((2, 3, 4, 5), 3), ((5,), 0)]


@pytest.mark.parametrize("shape,fi", CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_batch_norm_training(shape, fi, dtype):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(shape) * 3 + 1).astype(dtype)
    scale = rng.standard_normal(shape[fi]).astype(dtype)
    offset = rng.standard_normal(shape[fi]).astype(dtype)
    eps = 1e-3
    features = (shape[fi],)
    expected = run_stablehlo_multi("stablehlo.batch_norm_training", [x, scale, offset],
                                   [(shape, dtype), (features, dtype), (features, dtype)], bn_attrs(eps, fi))
    result_shape = Shape.tuple([Shape.of(x), Shape.of(scale), Shape.of(scale)])
    got = run_op("batch-norm-training", result_shape, [x, scale, offset], {"epsilon": eps, "feature_index": fi})
    assert isinstance(got, tuple) and len(got) == 3
    for g, e, r in zip(got, expected, reference_training(x.astype(np.float64), scale, offset, eps, fi)):
        assert_close(g, e, dtype)
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape,fi", CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, ml_dtypes.bfloat16])
def test_batch_norm_inference(shape, fi, dtype):
    rng = np.random.default_rng(4)
    x = rng.standard_normal(shape).astype(dtype)
    f = shape[fi]
    scale, offset, mean = (rng.standard_normal(f).astype(dtype) for _ in range(3))
    var = rng.uniform(0.5, 2, f).astype(dtype)
    eps = 0.01
    expected = run_stablehlo("stablehlo.batch_norm_inference", [x, scale, offset, mean, var], dtype, shape,
                             bn_attrs(eps, fi))
    got = run_op("batch-norm-inference", Shape.of(x), [x, scale, offset, mean, var],
                 {"epsilon": eps, "feature_index": fi})
    assert_close(got, expected, dtype)


@pytest.mark.parametrize("shape,fi", CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_batch_norm_grad(shape, fi, dtype):
    rng = np.random.default_rng(5)
    x = rng.standard_normal(shape).astype(dtype)
    f = shape[fi]
    scale = rng.standard_normal(f).astype(dtype)
    eps = 1e-3
    _, mean, var = reference_training(x.astype(np.float64), scale, scale, eps, fi)
    mean, var = mean.astype(dtype), var.astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    expected = run_stablehlo_multi("stablehlo.batch_norm_grad", [x, scale, mean, var, dy],
                                   [(shape, dtype), ((f,), dtype), ((f,), dtype)], bn_attrs(eps, fi))
    result_shape = Shape.tuple([Shape.of(x), Shape.of(scale), Shape.of(scale)])
    got = run_op("batch-norm-grad", result_shape, [x, scale, mean, var, dy], {"epsilon": eps, "feature_index": fi})
    for g, e in zip(got, expected):
        assert_close(g, e, dtype)
    # The gradient of the training normalization (mean and variance taken from x) is the same thing.
    if dtype == np.float64 and shape == (4, 3, 5, 2):
        def loss(x_, scale_, offset_):
            y, _, _ = reference_training_jnp(x_, scale_, offset_, eps, fi)
            return jnp.sum(y * dy)

        gx, gs, go = jit_answer(jax.grad(loss, argnums=(0, 1, 2)), [x, scale, np.zeros(f)])
        for g, e in zip(got, (gx, gs, go)):
            np.testing.assert_allclose(g, np.asarray(e), rtol=1e-8, atol=1e-8)


def reference_training_jnp(x, scale, offset, eps, fi):
    axes = tuple(d for d in range(x.ndim) if d != fi)
    shape = [1] * x.ndim
    shape[fi] = -1
    mean = x.mean(axis=axes)
    var = ((x - mean.reshape(shape)) ** 2).mean(axis=axes)
    y = (x - mean.reshape(shape)) / jnp.sqrt(var.reshape(shape) + eps) * scale.reshape(shape) + offset.reshape(shape)
    return y, mean, var


def test_batch_norm_errors():
    x = np.zeros((2, 3), np.float32)
    s = np.zeros(3, np.float32)
    with pytest.raises(ProgramError, match="feature_index"):
        run_op("batch-norm-inference", "f32[2,3]", [x, s, s, s, s], {"epsilon": 0.1, "feature_index": 2})
    with pytest.raises(ProgramError, match="offset"):
        run_op("batch-norm-training", "(f32[2,3], f32[3], f32[3])", [x, s, np.zeros(2, np.float32)],
               {"epsilon": 0.1, "feature_index": 1})
    with pytest.raises(ProgramError, match="floating"):
        run_op("batch-norm-training", "(s32[2,3], s32[3], s32[3])",
               [x.astype(np.int32), s.astype(np.int32), s.astype(np.int32)], {"epsilon": 0.1, "feature_index": 1})
