"""jaxlib's LAPACK custom calls on CPU (`lapack_<t><routine>_ffi`), as batched numpy/scipy kernels.

JAX lowers `jnp.linalg` on CPU to these typed-FFI targets, in the lowered and the compiled text.
Operands and results follow jaxlib (`jaxlib/cpu/lapack_kernels.cc`, `jax/_src/lax/linalg.py`):
leading batch dimensions, matrices in the two minor ones (values here are logical arrays: the
column-major layout XLA gives them is storage only), `info` results s32[batch] with LAPACK's
meaning (0 = success, i > 0 = failed at step i), 1-based pivots, and the character attributes
(uplo, side, trans_x, diag, mode) as ASCII codes in backend_config (`{uplo = 76 : ui8}`).

potrf, syevd/heevd, gesdd/gesvd and geqrf go to numpy's batched LAPACK calls; getrf to scipy's
batched LU (its permutation turned back into LAPACK's row swaps); trsm and orgqr/ungqr are
column/row recurrences vectorized over the batch. The other families (`lapack_eigen.py`,
`lapack_householder.py`, `lapack_tridiagonal.py`) call scipy's LAPACK once per matrix
(`each_matrix`), as jaxlib does.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from replicas.hlo.ir import Instruction
from replicas.ops.custom_call import builtin_target
from replicas.ops.linalg import cholesky_lower_nan, solve_lower_left
from replicas.ops.registry import KernelContext
from replicas.shapes import Shape

_TYPES = "sdcz"
_CONFIG_ENTRY = re.compile(r"(\w+)\s*=\s*(?:(-?\d+)\s*(?::\s*\w+)?|\"([^\"]*)\")")


def _targets(*routines: str) -> list[str]:
    names = []
    for routine in routines:
        real, _, complex_ = routine.partition("/")
        for t in _TYPES:
            name = real if t in "sd" or not complex_ else complex_
            names.append(f"lapack_{t}{name}_ffi")
    return names


def _attributes(inst: Instruction) -> dict[str, str]:
    """The FFI attributes of backend_config, each as its character ('L', 'N', ...)."""
    raw = inst.attrs.get("backend_config") or ""
    out = {}
    for key, number, text in _CONFIG_ENTRY.findall(str(raw)):
        out[key] = chr(int(number)) if number else text
    return out


def _char(inst: Instruction, attrs: dict[str, str], key: str, allowed: str, default: str) -> str:
    value = attrs.get(key, default)
    if value not in allowed:
        raise inst.error(f"{inst.attrs.get('custom_call_target')}: attribute {key}={value!r}, expected one "
                         f"of {list(allowed)}")
    return value


def _results(inst: Instruction, count: int) -> list[Shape]:
    shape = inst.shape
    results = list(shape.tuple_shapes) if shape.is_tuple else [shape]
    if len(results) != count:
        raise inst.error(f"{inst.attrs.get('custom_call_target')} has {count} results, the instruction "
                         f"declares {shape}")
    return results


def _matrices(inst: Instruction, shape: Shape, *, square: bool = False) -> tuple[tuple[int, ...], int, int]:
    """(batch dims, m, n) of an operand of matrices in its two minor dimensions."""
    if not shape.is_array or shape.rank < 2 or not (shape.element_type.is_floating
                                                    or shape.element_type.is_complex):
        raise inst.error(f"{inst.attrs.get('custom_call_target')} needs floating-point matrices, got {shape}")
    *batch, m, n = shape.dimensions
    if square and m != n:
        raise inst.error(f"{inst.attrs.get('custom_call_target')} needs square matrices, got {shape}")
    return tuple(batch), m, n


def _adjoint(x: np.ndarray) -> np.ndarray:
    x = np.swapaxes(x, -1, -2)
    return np.conj(x) if x.dtype.kind == "c" else x


def int_attributes(inst: Instruction) -> dict[str, int]:
    """The integer FFI attributes of backend_config (`{high = 4 : i32, low = 1 : i32}`)."""
    raw = inst.attrs.get("backend_config") or ""
    return {key: int(number) for key, number, _ in _CONFIG_ENTRY.findall(str(raw)) if number}


def lapack_routine(name: str, shape: Shape) -> Callable[..., Any]:
    """scipy's wrapper of LAPACK's `name` for the element type of `shape` (jaxlib calls the same
    routines: it takes them from scipy)."""
    import scipy.linalg.lapack  # here, not at the top: it doubles the package's import time

    return scipy.linalg.lapack.get_lapack_funcs(name, dtype=shape.dtype)


def each_matrix(results: list[Shape], batch_rank: int, one: Callable[..., tuple[Any, ...]],
                *operands: np.ndarray) -> tuple[np.ndarray, ...]:
    """`one(*matrices)` for every batch index (one LAPACK call per matrix, as jaxlib makes: scipy's
    wrappers take one), its outputs written into fresh results of the declared shapes; an output
    given as 0 leaves zeros (a part the call was asked not to compute)."""
    outs = [np.zeros(shape.dimensions, shape.dtype) for shape in results]
    count = math.prod(operands[0].shape[:batch_rank])
    flat_in = [x.reshape((count,) + x.shape[batch_rank:]) for x in operands]
    flat_out = [out.reshape((count,) + out.shape[batch_rank:]) for out in outs]
    for i in range(count):
        for out, value in zip(flat_out, one(*(x[i] for x in flat_in))):
            out[i] = value
    return tuple(outs)


def _first_failure(failed: np.ndarray) -> np.ndarray:
    """LAPACK's info from a (batch..., steps) mask of failed steps: 1 + the first failure, else 0."""
    if failed.shape[-1] == 0:
        return np.zeros(failed.shape[:-1], np.int32)
    return np.where(failed.any(axis=-1), failed.argmax(axis=-1) + 1, 0).astype(np.int32)


# -- potrf: Cholesky -------------------------------------------------------------------------------

@builtin_target(*_targets("potrf"))
def make_potrf(inst: Instruction, ctx: KernelContext) -> Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]:
    (shape,) = ctx.operand_shapes(inst)
    _matrices(inst, shape, square=True)
    _results(inst, 2)
    lower = _char(inst, _attributes(inst), "uplo", "LU", "L") == "L"
    n = shape.dimensions[-1]
    keep = np.tril(np.ones((n, n), bool)) if lower else np.triu(np.ones((n, n), bool))

    def potrf(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x = a if lower else _adjoint(a)
        try:
            factor = np.linalg.cholesky(x)  # reads the lower triangle only
            info = np.zeros(a.shape[:-2], np.int32)
        except np.linalg.LinAlgError:
            factor = cholesky_lower_nan(x)
            info = _first_failure(np.isnan(np.diagonal(factor, axis1=-2, axis2=-1)))
        if not lower:
            factor = _adjoint(factor)
        # LAPACK leaves the other triangle as it was.
        return np.where(keep, factor, a).astype(a.dtype, copy=False), info

    return potrf


# -- trsm: triangular solve ------------------------------------------------------------------------

@builtin_target(*_targets("trsm"))
def make_trsm(inst: Instruction, ctx: KernelContext) -> Callable[..., np.ndarray]:
    shapes = ctx.operand_shapes(inst)
    if len(shapes) not in (2, 3):
        raise inst.error("lapack trsm takes (a, b) or (a, b, alpha)")
    _, m, _ = _matrices(inst, shapes[0], square=True)
    _matrices(inst, shapes[1])
    attrs = _attributes(inst)
    left = _char(inst, attrs, "side", "LR", "L") == "L"
    lower = _char(inst, attrs, "uplo", "LU", "L") == "L"
    trans = _char(inst, attrs, "trans_x", "NTC", "N")
    unit = _char(inst, attrs, "diag", "UN", "N") == "U"
    if shapes[1].dimensions[-2 if left else -1] != m:
        raise inst.error(f"lapack trsm: b {shapes[1]} does not match a {shapes[0]} on the "
                         f"{'left' if left else 'right'}")
    triangle = np.tril(np.ones((m, m), bool)) if lower else np.triu(np.ones((m, m), bool))
    eye = np.eye(m, dtype=bool)
    # op(a) x = b (left) or x op(a) = b, i.e. op(a)^T x^T = b^T (right): one left-side system with
    # matrix t; it is lower-triangular when exactly one of (lower, transposed once) holds.
    t_lower = lower != ((trans != "N") != (not left))

    def trsm(a: np.ndarray, b: np.ndarray, alpha: Any = None) -> np.ndarray:
        tri = np.where(triangle, a, 0)
        if unit:
            tri = np.where(eye, 1, tri)
        op = tri if trans == "N" else _adjoint(tri) if trans == "C" else np.swapaxes(tri, -1, -2)
        rhs = b if alpha is None else b * alpha
        if not left:
            op, rhs = np.swapaxes(op, -1, -2), np.swapaxes(rhs, -1, -2)
        if t_lower:
            x = solve_lower_left(op, rhs)
        else:  # reversing rows and columns turns an upper-triangular system into a lower one
            x = solve_lower_left(op[..., ::-1, ::-1], rhs[..., ::-1, :])[..., ::-1, :]
        if not left:
            x = np.swapaxes(x, -1, -2)
        return np.asarray(x, dtype=b.dtype, order="C")

    return trsm


# -- getrf: LU with partial pivoting ---------------------------------------------------------------

def lapack_pivots(perm: np.ndarray, steps: int) -> np.ndarray:
    """LAPACK's 1-based row swaps (ipiv) that put original row perm[..., i] at row i, for i < steps."""
    m = perm.shape[-1]
    batch = perm.shape[:-1]
    flat = perm.reshape(-1, m)
    rows = np.arange(flat.shape[0])
    current = np.tile(np.arange(m), (flat.shape[0], 1))  # original row now at each position
    position = current.copy()  # position of each original row
    ipiv = np.empty((flat.shape[0], steps), np.int32)
    for i in range(steps):
        j = position[rows, flat[:, i]]
        ipiv[:, i] = j + 1
        moved = current[rows, i]
        current[rows, j] = moved
        current[rows, i] = flat[:, i]
        position[rows, moved] = j
        position[rows, flat[:, i]] = i
    return ipiv.reshape(batch + (steps,))


@builtin_target(*_targets("getrf"))
def make_getrf(inst: Instruction, ctx: KernelContext) -> Callable[[np.ndarray], tuple[np.ndarray, ...]]:
    (shape,) = ctx.operand_shapes(inst)
    batch, m, n = _matrices(inst, shape)
    _results(inst, 3)
    k = min(m, n)
    import scipy.linalg  # here, not at the top: it doubles the package's import time (every actor's start)

    def getrf(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if a.size == 0:
            return a.copy(), np.ones(batch + (k,), np.int32), np.zeros(batch, np.int32)
        p, lower, upper = scipy.linalg.lu(a, p_indices=True, check_finite=False)
        lu = np.zeros(a.shape, a.dtype)
        lu[..., :k, :] = upper
        lu[..., :, :k] += np.tril(lower, -1)
        diagonal = np.diagonal(upper, axis1=-2, axis2=-1)
        info = _first_failure(diagonal == 0)
        return lu, lapack_pivots(np.argsort(p, axis=-1), k), info

    return getrf


# -- geqrf / orgqr / ungqr: Householder QR ---------------------------------------------------------

@builtin_target(*_targets("geqrf"))
def make_geqrf(inst: Instruction, ctx: KernelContext) -> Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]:
    (shape,) = ctx.operand_shapes(inst)
    batch, m, n = _matrices(inst, shape)
    _results(inst, 2)

    def geqrf(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if a.size == 0:
            return a.copy(), np.zeros(batch + (min(m, n),), a.dtype)
        h, tau = np.linalg.qr(a, mode="raw")  # h is LAPACK's column-major array, transposed
        return np.ascontiguousarray(np.swapaxes(h, -1, -2)).astype(a.dtype, copy=False), tau.astype(a.dtype)

    return geqrf


@builtin_target(*_targets("orgqr/ungqr"))
def make_orgqr(inst: Instruction, ctx: KernelContext) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    a_shape, tau_shape = ctx.operand_shapes(inst)
    _, m, n = _matrices(inst, a_shape)
    k = tau_shape.dimensions[-1] if tau_shape.rank else 0
    if k > n or n > m:
        raise inst.error(f"lapack orgqr needs m >= n >= k, got a {a_shape} and tau {tau_shape}")
    below = np.tri(m, k, -1, dtype=bool)  # where the Householder vectors are stored
    eye = np.eye(m, k, dtype=bool)

    def orgqr(a: np.ndarray, tau: np.ndarray) -> np.ndarray:
        # Q = H_0 ... H_{k-1} applied to the first n columns of I, H_i = I - tau_i v_i v_i^H.
        vectors = np.where(below, a[..., :, :k], 0) + eye
        q = np.broadcast_to(np.eye(m, n, dtype=a.dtype), a.shape).copy()
        for i in range(k - 1, -1, -1):
            v = vectors[..., :, i]
            w = np.einsum("...m,...mn->...n", np.conj(v), q)
            q -= (tau[..., i, None] * v)[..., :, None] * w[..., None, :]
        return q

    return orgqr


# -- syevd / heevd: symmetric (Hermitian) eigendecomposition ---------------------------------------

@builtin_target(*_targets("syevd/heevd"))
def make_syevd(inst: Instruction, ctx: KernelContext) -> Callable[[np.ndarray], tuple[np.ndarray, ...]]:
    (shape,) = ctx.operand_shapes(inst)
    batch, _, n = _matrices(inst, shape, square=True)
    _, w_shape, _ = _results(inst, 3)
    attrs = _attributes(inst)
    vectors = _char(inst, attrs, "mode", "VN", "V") == "V"
    uplo = _char(inst, attrs, "uplo", "LU", "L")

    def syevd(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        info = np.zeros(batch, np.int32)
        try:
            if vectors:
                w, v = np.linalg.eigh(a, UPLO=uplo)
            else:
                w, v = np.linalg.eigvalsh(a, UPLO=uplo), a
        except np.linalg.LinAlgError:  # no convergence (NaN input): JAX turns info != 0 into NaN
            w, v, info = np.full(batch + (n,), np.nan, w_shape.dtype), np.full_like(a, np.nan), info + 1
        return np.asarray(v, a.dtype), np.asarray(w, w_shape.dtype), info

    return syevd


# -- gesdd / gesvd: singular value decomposition ---------------------------------------------------

@builtin_target(*_targets("gesdd", "gesvd"))
def make_gesdd(inst: Instruction, ctx: KernelContext) -> Callable[[np.ndarray], tuple[np.ndarray, ...]]:
    (shape,) = ctx.operand_shapes(inst)
    batch, m, n = _matrices(inst, shape)
    _, s_shape, u_shape, vt_shape, _ = _results(inst, 5)
    mode = _char(inst, _attributes(inst), "mode", "ASON", "A")
    full = mode == "A"
    vectors = mode != "N"

    def gesdd(a: np.ndarray) -> tuple[np.ndarray, ...]:
        info = np.zeros(batch, np.int32)
        u = np.zeros(u_shape.dimensions, u_shape.dtype)
        vt = np.zeros(vt_shape.dimensions, vt_shape.dtype)
        try:
            if vectors and a.size:
                u_, s, vt_ = np.linalg.svd(a, full_matrices=full)
                u[...] = u_
                vt[...] = vt_
            else:
                s = np.linalg.svd(a, compute_uv=False) if a.size else np.zeros(s_shape.dimensions)
        except np.linalg.LinAlgError:
            s = np.full(s_shape.dimensions, np.nan)
            info += 1
        return a.copy(), np.asarray(s, s_shape.dtype), u, vt, info

    return gesdd
