"""jaxlib's remaining LAPACK custom calls (geev, gees, gehrd, geqp3, sytrd/hetrd, gtsv) in s/d/c/z,
against JAX on well- and ill-conditioned inputs, and LAPACK's `info` against LAPACK itself."""

from __future__ import annotations

import numpy as np
import pytest
from xla_oracle import jax_text, jit_answer

import replicas as rp

jax = pytest.importorskip("jax")
jnp = jax.numpy
lax = jax.lax
jsl = jax.scipy.linalg
from jax._src.lax.linalg import geqp3 as jax_geqp3  # noqa: E402 - public in jax.lax.linalg only in some versions

TYPES = [np.float32, np.float64, np.complex64, np.complex128]


def general(shape: tuple[int, ...], dtype, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = rng.normal(size=shape)
    if np.dtype(dtype).kind == "c":
        a = a + 1j * rng.normal(size=shape)
    return a.astype(dtype)


def hilbert(n: int, dtype, batch: int = 2) -> np.ndarray:
    """Condition number ~1e7 at n=6 (float32 loses nearly every digit)."""
    i = np.arange(n)
    h = 1.0 / (i[:, None] + i[None, :] + 1)
    return np.stack([h * (k + 1) for k in range(batch)]).astype(dtype)


def jordan(n: int, dtype) -> np.ndarray:
    """A defective matrix (one eigenvalue, one eigenvector): eigenvectors ill-conditioned."""
    return (2 * np.eye(n) + np.eye(n, k=1))[None].astype(dtype)


def hermitian(a: np.ndarray) -> np.ndarray:
    return (a + np.conj(np.swapaxes(a, -1, -2))) / 2


def tridiagonal_system(dtype, singular: bool) -> list[np.ndarray]:
    n = 5
    dl, d, du = (general((2, n), dtype, seed) for seed in (1, 2, 3))
    dl[:, 0] = 0
    du[:, -1] = 0
    if singular:  # the second system's first 2x2 block is singular: U(2,2) is exactly zero
        d[1, :2], du[1, 0], dl[1, 1], dl[1, 2] = 1, 1, 1, 0
    return [dl, d, du, general((2, n, 3), dtype, 4)]


def eig_values_and_vectors(a):
    w, vl, vr = lax.linalg.eig(a, compute_left_eigenvectors=True)
    return w, vl, vr


CASES = {
    "eig": (lambda a: tuple(jnp.linalg.eig(a)), lambda d: [general((2, 5, 5), d)]),
    "eig_left_right": (eig_values_and_vectors, lambda d: [general((2, 4, 4), d, 1)]),
    "eigvals_jordan": (jnp.linalg.eigvals, lambda d: [jordan(4, d)]),
    "eig_hilbert": (lambda a: tuple(jnp.linalg.eig(a)), lambda d: [hilbert(5, d, batch=1)]),
    "schur": (lambda a: tuple(lax.linalg.schur(a)), lambda d: [general((2, 5, 5), d, 2)]),
    "schur_hilbert": (lambda a: tuple(lax.linalg.schur(a)), lambda d: [hilbert(5, d)]),
    "sqrtm": (jsl.sqrtm, lambda d: [hermitian(general((4, 4), d, 3)) + 4 * np.eye(4, dtype=d)]),
    "hessenberg": (lambda a: tuple(lax.linalg.hessenberg(a)), lambda d: [general((2, 5, 5), d, 4)]),
    "hessenberg_rank_deficient": (lambda a: tuple(lax.linalg.hessenberg(a)),
                                  lambda d: [np.ones((1, 4, 4), d)]),
    "scipy_hessenberg_q": (lambda a: tuple(jsl.hessenberg(a, calc_q=True)), lambda d: [hilbert(5, d, 1)[0]]),
    "qr_pivoting": (lambda a: tuple(jsl.qr(a, pivoting=True)), lambda d: [general((6, 4), d, 5)]),
    "qr_pivoting_hilbert_wide": (lambda a: tuple(jsl.qr(a, pivoting=True, mode="economic")),
                                 lambda d: [hilbert(6, d, 1)[0][:4]]),
    "geqp3_fixed_columns": (lambda a, p: tuple(jax_geqp3(a, p)),
                            lambda d: [general((2, 5, 4), d, 6), np.array([[0, 1, 0, 0], [2, 0, 0, 3]], np.int32)]),
    "tridiagonal": (lambda a: tuple(lax.linalg.tridiagonal(a)), lambda d: [hermitian(general((2, 5, 5), d, 7))]),
    "tridiagonal_upper_hilbert": (lambda a: tuple(lax.linalg.tridiagonal(a, lower=False)),
                                  lambda d: [hilbert(6, d)]),
    "tridiagonal_solve": (lax.linalg.tridiagonal_solve, lambda d: tridiagonal_system(d, singular=False)),
    "tridiagonal_solve_singular": (lax.linalg.tridiagonal_solve, lambda d: tridiagonal_system(d, singular=True)),
}


def close(got: np.ndarray, want: np.ndarray, rtol: float) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    scale = max(1.0, float(np.nanmax(np.abs(want)))) if want.size and not np.isnan(want).all() else 1.0
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale)


@pytest.mark.parametrize("dtype", TYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("name", CASES)
def test_like_jax(name: str, dtype) -> None:
    f, make = CASES[name]
    single = np.dtype(dtype) in (np.float32, np.complex64)
    with jax.enable_x64(True):
        args = make(dtype)
        program = rp.parse_hlo(jax_text(f, args, "compiled" if "hilbert" in name else "lowered"))
        got = rp.run(program, args, num_replicas=1, backend="threads")[0]
        want = jit_answer(f, args)
    got_leaves = list(got) if isinstance(got, tuple) else [got]
    assert len(got_leaves) == len(want)
    ill = "hilbert" in name or "jordan" in name or "deficient" in name
    rtol = (2e-3 if ill else 2e-4) if single else (1e-6 if ill else 1e-9)
    for g, w in zip(got_leaves, want):
        close(np.asarray(g), w, rtol)


def _custom_call(target: str, operands: list[np.ndarray], result: str, config: str = "") -> tuple:
    params = "\n".join(f"  p{i} = {rp.Shape.of(x)} parameter({i})" for i, x in enumerate(operands))
    names = ", ".join(f"p{i}" for i in range(len(operands)))
    text = (f"HloModule m\n\nENTRY e {{\n{params}\n  ROOT r = {result} custom-call({names}), "
            f'custom_call_target="{target}", api_version=API_VERSION_TYPED_FFI{config}\n}}\n')
    return rp.run(text, operands, num_replicas=1, backend="threads")[0]


def test_gtsv_info_names_the_zero_pivot_like_lapack() -> None:
    import scipy.linalg.lapack as lapack

    dl, d, du, b = tridiagonal_system(np.float64, singular=True)
    got = _custom_call("lapack_dgtsv_ffi", [dl, d, du, b], "(f64[2,5], f64[2,5], f64[2,5], f64[2,5,3], s32[2])")
    for k in range(2):
        want = lapack.dgtsv(dl[k, 1:], d[k], du[k, :-1], b[k])
        assert got[4][k] == want[4]
        if want[4] == 0:
            np.testing.assert_allclose(got[3][k], want[3])
            np.testing.assert_array_equal(got[0][k], np.concatenate([dl[k, :1], want[0]]))
    assert list(got[4]) == [0, 2]


def test_geev_info_and_nan_input_like_lapack() -> None:
    import scipy.linalg.lapack as lapack

    a = np.stack([general((4, 4), np.float64), np.full((4, 4), np.nan)])
    got = _custom_call("lapack_dgeev_ffi", [a], "(f64[2,4], f64[2,4], c128[2,4,4], c128[2,4,4], s32[2])",
                       ", backend_config={compute_left = 78 : ui8, compute_right = 86 : ui8}")
    for k in range(2):
        assert got[4][k] == lapack.dgeev(a[k], compute_vl=0)[4]
    assert got[4][0] == 0


@pytest.mark.parametrize("target,result", [
    ("lapack_sgehrd_ffi", "(f32[3,3], f32[2], s32[])"),
    ("lapack_zgees_ffi", "(c128[3,3], c128[3,3], c128[3], s32[], s32[])"),
    ("lapack_csytrd_ffi", "(c64[3,3], f32[3], f32[2], c64[2], s32[])"),
])
def test_info_is_zero_on_a_good_matrix_and_bad_signatures_are_program_errors(target: str, result: str) -> None:
    dtype = {"s": np.float32, "z": np.complex128, "c": np.complex64}[target[7]]
    a = hermitian(general((3, 3), dtype, 9)) + 3 * np.eye(3, dtype=dtype)
    if target == "lapack_csytrd_ffi":  # jaxlib names the complex tridiagonal reduction hetrd
        with pytest.raises(rp.errors.ProgramError, match="csytrd"):
            _custom_call(target, [a], result)
        return
    assert _custom_call(target, [a], result)[-1] == 0
    with pytest.raises(rp.errors.ProgramError, match=target):
        _custom_call(target, [a], "(f32[3,3], s32[])")


def test_every_cpu_custom_call_jaxlib_registers_has_a_kernel_or_a_documented_refusal() -> None:
    from replicas.ops.custom_call import _BUILTIN_TARGETS
    from replicas.ops.jaxlib_targets import REFUSED, jaxlib_cpu_targets

    targets = jaxlib_cpu_targets()
    assert {"lapack_sgeev_ffi", "lapack_zgtsv_ffi", "lapack_chetrd_ffi", "dce_sink"} <= targets  # the listing works
    missing = sorted(t for t in targets if t not in _BUILTIN_TARGETS and t not in REFUSED)
    assert not missing, f"jaxlib CPU targets with neither a kernel nor a refusal: {missing}"
    assert all(len(why) > 40 and "rp.jax" in why for why in REFUSED.values())


def test_ormqr_sparse_matmul_and_dce_sink_run_like_jax() -> None:
    from jax._src.lax.linalg import geqrf, ormqr
    from jax.experimental import sparse

    rng = np.random.default_rng(11)
    with jax.enable_x64(True):
        for dtype in (np.float32, np.complex128):
            a, c = general((2, 5, 4), dtype, 12), general((2, 5, 3), dtype, 13)
            h, tau = (np.asarray(v) for v in geqrf(a))
            for transpose in (False, True):
                f = lambda h, tau, c, t=transpose: ormqr(h, tau, c, left=True, transpose=t)  # noqa: E731
                got = rp.run(jax.jit(f).lower(h, tau, c).as_text(dialect="hlo"), [h, tau, c], backend="threads")[0]
                close(got, np.asarray(f(h, tau, c)), 1e-5)
        dense = rng.normal(size=(5, 4)) * (rng.random((5, 4)) < 0.5)
        matrix = sparse.BCSR.fromdense(dense)
        for rhs in (rng.normal(size=4), rng.normal(size=(4, 3))):
            text = jax.jit(lambda m, x: m @ x).lower(matrix, rhs).as_text(dialect="hlo")
            assert "cpu_csr_sparse_dense_ffi" in text
            got = rp.run(text, [*jax.tree.leaves(matrix), rhs], backend="threads")[0]
            np.testing.assert_allclose(got, dense @ rhs, rtol=1e-12)
        sink = lambda x: (jax.lax.dce_sink(x, prevent_mlir_dce=True), x * 2)[1]  # noqa: E731
        text = jax.jit(sink).lower(dense).as_text(dialect="hlo")
        assert "dce_sink" in text
        np.testing.assert_array_equal(rp.run(text, [dense], backend="threads")[0], dense * 2)


@pytest.mark.parametrize("dtype", TYPES, ids=lambda t: np.dtype(t).name)
def test_perturbed_tridiagonal_solve_like_jax_even_when_singular(dtype) -> None:
    f = lambda dl, d, du, b: lax.linalg.tridiagonal_solve(dl, d, du, b, perturb_singular=True)  # noqa: E731
    single = np.dtype(dtype) in (np.float32, np.complex64)
    with jax.enable_x64(True):
        for singular in (False, True):
            args = tridiagonal_system(dtype, singular)
            if singular:  # and a zero diagonal of a one-row system, and an exactly singular 3x3
                args[1][0, :] = 0
            got = rp.run(rp.parse_hlo(jax_text(f, args)), args, num_replicas=1, backend="threads")[0]
            (want,) = jit_answer(f, args)
            assert np.isfinite(got).all() == np.isfinite(want).all()
            close(got, want, 1e-3 if single else 1e-9)
