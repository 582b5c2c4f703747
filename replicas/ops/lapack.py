"""jaxlib's LAPACK custom calls on CPU (`lapack_<t><routine>_ffi`), as batched numpy/scipy kernels.

JAX lowers `jnp.linalg` on CPU to these typed-FFI targets, in the lowered and the compiled text.
Operands and results follow jaxlib (`jaxlib/cpu/lapack_kernels.cc`, `jax/_src/lax/linalg.py`):
leading batch dimensions, matrices in the two minor ones (values here are logical arrays: the
column-major layout XLA gives them is storage only), `info` results s32[batch] with LAPACK's
meaning (0 = success, i > 0 = failed at step i), 1-based pivots, and the character attributes
(uplo, side, trans_x, diag, mode) as ASCII codes in backend_config (`{uplo = 76 : ui8}`).

syevd/heevd, gesdd/gesvd and geqrf go to numpy's batched LAPACK calls; potrf, getrf and trsm to
LAPACK's and BLAS's own routines once per matrix (the bits jaxlib's calls give); orgqr/ungqr is a
column/row recurrence vectorized over the batch. The other families (`lapack_eigen.py`,
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
    batch, _, _ = _matrices(inst, shape, square=True)
    results = _results(inst, 2)
    lower = int(_char(inst, _attributes(inst), "uplo", "LU", "L") == "L")
    routine = lapack_routine("potrf", shape)  # LAPACK's own, one call per matrix, as jaxlib makes it

    def potrf(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if a.size == 0:
            return a.copy(), np.zeros(batch, np.int32)
        # clean=0: LAPACK leaves the other triangle as it was (and a failed step's rest as it stood).
        return each_matrix(results, len(batch), lambda x: routine(x, lower=lower, clean=0), a)

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
    import scipy.linalg.blas  # here, not at the top: it doubles the package's import time

    # BLAS's own trsm, one call per matrix, as jaxlib makes it (it takes the routine from scipy): op(a)
    # x = alpha b (left) or x op(a) = alpha b. The triangle it does not name is never read.
    routine = scipy.linalg.blas.get_blas_funcs("trsm", dtype=shapes[1].dtype)
    flags = dict(side=0 if left else 1, lower=int(lower), trans_a="NTC".index(trans), diag=int(unit))
    batch_rank = len(shapes[1].dimensions) - 2
    results = [shapes[1]]

    def trsm(a: np.ndarray, b: np.ndarray, alpha: Any = None) -> np.ndarray:
        scale = 1.0 if alpha is None else np.asarray(alpha).item()
        if b.size == 0:
            return np.zeros(b.shape, b.dtype)
        a = np.broadcast_to(a, b.shape[:batch_rank] + a.shape[-2:])
        return each_matrix(results, batch_rank, lambda x, y: (routine(scale, x, y, **flags),), a, b)[0]

    return trsm


# -- getrf: LU with partial pivoting ---------------------------------------------------------------

@builtin_target(*_targets("getrf"))
def make_getrf(inst: Instruction, ctx: KernelContext) -> Callable[[np.ndarray], tuple[np.ndarray, ...]]:
    (shape,) = ctx.operand_shapes(inst)
    batch, m, n = _matrices(inst, shape)
    results = _results(inst, 3)
    k = min(m, n)
    routine = lapack_routine("getrf", shape)  # LAPACK's own, one call per matrix, as jaxlib makes it

    def one(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        lu, piv, info = routine(a)
        return lu, piv[:k] + 1, info  # LAPACK's 1-based row swaps (scipy gives them 0-based)

    def getrf(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if a.size == 0:
            return a.copy(), np.ones(batch + (k,), np.int32), np.zeros(batch, np.int32)
        return each_matrix(results, len(batch), one, a)

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
