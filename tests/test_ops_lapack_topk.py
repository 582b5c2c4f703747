"""jnp.linalg and lax.top_k on CPU: JAX's LAPACK custom calls and XLA:CPU's TopK, against JAX."""

from __future__ import annotations

import numpy as np
import pytest
from xla_oracle import jax_text, jit_answer

import replicas as rp

jax = pytest.importorskip("jax")
jnp = jax.numpy


def _spd(rng: np.random.Generator, shape: tuple[int, ...], dtype) -> np.ndarray:
    # Multiples of 1/64, whose products and their sums are exact even in float32: the matrix's bytes
    # (which key XLA's recorded answer) do not depend on the order the machine's BLAS sums in.
    a = np.round(_general(rng, shape, dtype) * 64) / 64
    eye = np.eye(shape[-1], dtype=dtype)
    return (a @ np.conj(np.swapaxes(a, -1, -2)) + shape[-1] * eye).astype(dtype)


def _general(rng: np.random.Generator, shape: tuple[int, ...], dtype) -> np.ndarray:
    a = rng.normal(size=shape)
    if np.dtype(dtype).kind == "c":
        a = a + 1j * rng.normal(size=shape)
    return a.astype(dtype)


CASES = [
    ("cholesky", jnp.linalg.cholesky, lambda r, d: [_spd(r, (2, 3, 5, 5), d)]),
    ("solve", jnp.linalg.solve, lambda r, d: [_general(r, (3, 4, 4), d), _general(r, (3, 4, 2), d)]),
    ("inv", jnp.linalg.inv, lambda r, d: [_general(r, (2, 5, 5), d)]),
    ("det", jnp.linalg.det, lambda r, d: [_general(r, (4, 3, 3), d)]),
    ("slogdet", lambda a: tuple(jnp.linalg.slogdet(a)), lambda r, d: [_general(r, (2, 6, 6), d)]),
    ("qr", lambda a: tuple(jnp.linalg.qr(a)), lambda r, d: [_general(r, (2, 6, 4), d)]),
    ("qr_full", lambda a: tuple(jnp.linalg.qr(a, mode="complete")), lambda r, d: [_general(r, (3, 5, 3), d)]),
    ("qr_wide", lambda a: tuple(jnp.linalg.qr(a)), lambda r, d: [_general(r, (2, 3, 5), d)]),
    ("eigh", lambda a: tuple(jnp.linalg.eigh(a)), lambda r, d: [_spd(r, (2, 5, 5), d)]),
    ("eigvalsh", jnp.linalg.eigvalsh, lambda r, d: [_spd(r, (3, 4, 4), d)]),
    ("svd", lambda a: tuple(jnp.linalg.svd(a, full_matrices=False)), lambda r, d: [_general(r, (2, 6, 4), d)]),
    ("svd_full", lambda a: tuple(jnp.linalg.svd(a)), lambda r, d: [_general(r, (2, 3, 5), d)]),
    ("svdvals", lambda a: jnp.linalg.svd(a, compute_uv=False), lambda r, d: [_general(r, (2, 4, 4), d)]),
    ("lstsq_like", lambda a, b: jnp.linalg.pinv(a) @ b, lambda r, d: [_general(r, (5, 3), d), _general(r, (5, 2), d)]),
    ("triangular", lambda a, b: jax.scipy.linalg.solve_triangular(a, b, lower=False, trans=1),
     lambda r, d: [_spd(r, (2, 4, 4), d), _general(r, (2, 4, 3), d)]),
]


# Singular and eigen vectors are unique up to a sign (a phase): (leaf, axis along which a vector runs).
VECTORS = {"eigh": {1: -2}, "svd": {0: -2, 2: -1}, "svd_full": {0: -2, 2: -1}}


def _align(got: np.ndarray, want: np.ndarray, axis: int) -> np.ndarray:
    """`got` with each vector multiplied by the unit phase that best matches it to `want`'s."""
    inner = np.sum(np.conj(got) * want, axis=axis, keepdims=True)
    return got * np.where(inner == 0, 1, inner / np.maximum(np.abs(inner), 1e-30))


def _check(f, args, form: str, rtol: float, vectors: dict[int, int] | None = None) -> None:
    got = rp.run(rp.parse_hlo(jax_text(f, args, form)), args, num_replicas=1, backend="threads")[0]
    got_leaves = list(got) if isinstance(got, tuple) else [got]
    want_leaves = jit_answer(f, args)
    assert len(got_leaves) == len(want_leaves)
    for k, (g, w) in enumerate(zip(got_leaves, want_leaves)):
        if k in (vectors or {}):
            assert g.shape == w.shape and g.dtype == w.dtype
            g = _align(g, w, vectors[k])
        assert g.shape == w.shape and g.dtype == w.dtype
        scale = max(1.0, float(np.max(np.abs(w))) if w.size else 1.0)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * scale)


@pytest.mark.parametrize("form", ["lowered", "compiled"])
@pytest.mark.parametrize("name,f,make", CASES, ids=[c[0] for c in CASES])
def test_jnp_linalg_runs_like_jax_in_float32(name, f, make, form):
    _check(f, make(np.random.default_rng(len(name)), np.float32), form, rtol=2e-4, vectors=VECTORS.get(name))


@pytest.mark.parametrize("dtype", [np.float64, np.complex64])
@pytest.mark.parametrize("name", ["cholesky", "solve", "det", "qr", "eigh", "svd"])
def test_jnp_linalg_runs_like_jax_in_other_types(name, dtype):
    f, make = next((c[1], c[2]) for c in CASES if c[0] == name)
    with jax.enable_x64(True):
        _check(f, make(np.random.default_rng(7), dtype), "compiled", rtol=2e-4 if dtype == np.complex64 else 1e-10,
               vectors=VECTORS.get(name))


def test_cholesky_of_a_matrix_that_is_not_positive_definite_is_nan_like_jax():
    a = np.stack([np.eye(3, dtype=np.float32), -np.eye(3, dtype=np.float32)])
    for form in ("lowered", "compiled"):
        got = rp.run(rp.parse_hlo(jax_text(jnp.linalg.cholesky, [a], form)), [a], num_replicas=1,
                     backend="threads")[0]
        np.testing.assert_array_equal(got, jit_answer(jnp.linalg.cholesky, [a])[0], err_msg=form)


def test_the_triangular_recurrences_never_ask_einsum_for_an_empty_sum(monkeypatch):
    # numpy's einsum kernel for a stride-0 operand (`np.conj` of an empty array) reads its element even
    # when the sum is empty: 0 * whatever that buffer held, NaN after a NaN. The Cholesky fallback's first
    # column once came out NaN so, now and then. The recurrences skip their empty first step instead.
    from replicas.ops.linalg import cholesky_lower_nan, solve_lower_left

    einsum = np.einsum

    def nonempty_einsum(subscripts, *operands, **kwargs):
        assert all(np.size(o) for o in operands), f"einsum {subscripts!r} of an empty operand"
        return einsum(subscripts, *operands, **kwargs)

    monkeypatch.setattr(np, "einsum", nonempty_einsum)
    a = np.stack([np.eye(3, dtype=np.float32), -np.eye(3, dtype=np.float32)])
    factor = cholesky_lower_nan(a)
    np.testing.assert_array_equal(factor[0], np.eye(3, dtype=np.float32))
    assert np.isnan(factor[1].diagonal()).all()
    lower = np.tril(np.arange(1, 10, dtype=np.float64).reshape(3, 3))
    np.testing.assert_allclose(lower @ solve_lower_left(lower, np.eye(3)), np.eye(3), atol=1e-12)


def test_det_of_a_singular_matrix_is_zero_like_jax():
    a = np.array([[[1, 2], [2, 4]], [[1, 0], [0, 3]]], dtype=np.float32)
    _check(jnp.linalg.det, [a], "compiled", rtol=1e-6)


@pytest.mark.parametrize("form", ["lowered", "compiled"])
@pytest.mark.parametrize("k", [1, 3])
def test_top_k_runs_like_jax(k, form):
    rng = np.random.default_rng(k)
    x = rng.integers(-3, 3, size=(2, 3, 9)).astype(np.float32)  # ties: lower index first
    x[0, 0, 4] = np.nan
    x[1, 2, 0] = -np.inf
    f = lambda v: jax.lax.top_k(v, k)  # noqa: E731
    got = rp.run(rp.parse_hlo(jax_text(f, [x], form)), [x], num_replicas=1, backend="threads")[0]
    want = jit_answer(f, [x])
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def test_top_k_of_integers_runs_like_jax():
    x = np.random.default_rng(3).integers(-100, 100, size=(4, 12)).astype(np.int32)
    f = lambda v: jax.lax.top_k(v, 4)  # noqa: E731
    got = rp.run(rp.parse_hlo(jax_text(f, [x])), [x], num_replicas=1, backend="threads")[0]
    np.testing.assert_array_equal(got[1], jit_answer(f, [x])[1])
