"""cholesky and triangular-solve, batched over the leading dimensions.

cholesky: LAPACK through `np.linalg.cholesky` (batched) when every matrix is positive definite;
otherwise (LAPACK refuses the whole batch) a column-by-column algorithm vectorized over the batch;
like XLA:CPU, a matrix that is not positive definite comes out all NaN (no exception). Only the
requested triangle of the input is read and the other triangle of the result is zero.

triangular-solve: substitution over the rows of the (m x m) matrix, each step one batched
matrix-vector product over all right-hand sides; division by a zero diagonal gives inf/NaN as in
XLA. Only the named triangle of `a` is read (and not its diagonal when `unit_diagonal`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from replicas.hlo.ir import Instruction
from replicas.ops.elementwise_util import quiet
from replicas.ops.registry import KernelContext, kernel


def _work_dtype(dtype: np.dtype) -> np.dtype:
    """LAPACK types: f32/f64/c64/c128; narrower floats are computed in f32."""
    if dtype.kind == "c":
        return dtype
    if dtype == np.float64:
        return dtype
    return np.dtype(np.float32)


def _conj_transpose(x: np.ndarray) -> np.ndarray:
    x = np.swapaxes(x, -1, -2)
    return np.conj(x) if x.dtype.kind == "c" else x


def cholesky_lower_nan(a: np.ndarray) -> np.ndarray:
    """Batched lower Cholesky of the lower triangle of `a`; NaN where a matrix is not positive definite."""
    n = a.shape[-1]
    out = np.zeros_like(a)
    with quiet():
        for j in range(n):
            # Column 0 has no earlier columns to subtract. Not an einsum over the empty axis: numpy's
            # kernel for a stride-0 operand (`np.conj` of an empty array) reads its element even when
            # the sum is empty, 0 * whatever the buffer held, NaN after a NaN.
            row = out[..., j, :j]
            diag = (a[..., j, j] - np.einsum("...k,...k->...", row, np.conj(row)) if j else a[..., j, j]).real
            pivot = np.where(diag > 0, np.sqrt(np.maximum(diag, 0)), np.nan)  # XLA: sqrt(<0) is NaN
            out[..., j, j] = pivot
            if j + 1 < n:
                below = a[..., j + 1:, j]
                if j:
                    below = below - np.einsum("...ik,...k->...i", out[..., j + 1:, :j], np.conj(row))
                out[..., j + 1:, j] = below / pivot[..., None]
    return out


@kernel("cholesky")
def make_cholesky(inst: Instruction, ctx: KernelContext) -> Callable[[np.ndarray], np.ndarray]:
    (shape,) = ctx.operand_shapes(inst)
    lower = bool(inst.attrs.get("lower", False))
    out_dtype = inst.shape.dtype
    work = _work_dtype(shape.dtype)
    empty = shape.numel == 0

    def cholesky(a: np.ndarray) -> np.ndarray:
        if empty:
            return np.zeros(shape.dimensions, dtype=out_dtype)
        x = a.astype(work, copy=False)
        if not lower:
            x = _conj_transpose(x)  # the upper triangle of a is the lower triangle of a^H
        try:
            with quiet():
                result = np.linalg.cholesky(x)  # LAPACK reads the lower triangle only
        except np.linalg.LinAlgError:
            result = cholesky_lower_nan(x)
            # XLA:CPU answers a whole matrix of NaN when the factorization fails anywhere in it.
            failed = np.isnan(result).any(axis=(-2, -1))
            result[failed] = np.nan
        if not lower:
            result = _conj_transpose(result)
        return np.ascontiguousarray(result, dtype=out_dtype)

    return cholesky


def solve_lower_left(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """x with a @ x = b for lower-triangular `a` (batched (..., m, m) and (..., m, n)), by forward substitution."""
    m = a.shape[-1]
    x = np.empty(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + b.shape[-2:], dtype=np.result_type(a, b))
    with quiet():
        for i in range(m):
            acc = b[..., i, :]
            if i:
                acc = acc - np.einsum("...k,...kn->...n", a[..., i, :i], x[..., :i, :])
            x[..., i, :] = acc / a[..., i, i][..., None]
    return x


@kernel("triangular-solve")
def make_triangular_solve(inst: Instruction, ctx: KernelContext) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    a_shape, b_shape = ctx.operand_shapes(inst)
    left_side = bool(inst.attrs.get("left_side", False))
    lower = bool(inst.attrs.get("lower", False))
    unit_diagonal = bool(inst.attrs.get("unit_diagonal", False))
    transpose_a = str(inst.attrs.get("transpose_a", "NO_TRANSPOSE")).upper()
    m = a_shape.dimensions[-1]
    out_dtype = inst.shape.dtype
    work = _work_dtype(a_shape.dtype)
    empty = b_shape.numel == 0

    def triangular_solve(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        if empty:
            return np.zeros(b_shape.dimensions, dtype=out_dtype)
        tri = np.tril(a) if lower else np.triu(a)
        tri = tri.astype(work, copy=False)
        if unit_diagonal:
            tri = tri.copy()
            idx = np.arange(m)
            tri[..., idx, idx] = 1
        # op(a) as a matrix; then x op(a) = b is op(a)^T x^T = b^T.
        op = tri
        if transpose_a == "TRANSPOSE":
            op = np.swapaxes(tri, -1, -2)
        elif transpose_a == "ADJOINT":
            op = _conj_transpose(tri)
        rhs = b.astype(work, copy=False)
        if not left_side:
            op = np.swapaxes(op, -1, -2)
            rhs = np.swapaxes(rhs, -1, -2)
        op_is_lower = lower == (transpose_a == "NO_TRANSPOSE") if left_side else lower != (
            transpose_a == "NO_TRANSPOSE")
        if not op_is_lower:
            # Reversing rows and columns turns an upper-triangular system into a lower one.
            x = solve_lower_left(op[..., ::-1, ::-1], rhs[..., ::-1, :])[..., ::-1, :]
        else:
            x = solve_lower_left(op, rhs)
        if not left_side:
            x = np.swapaxes(x, -1, -2)
        return np.ascontiguousarray(x, dtype=out_dtype)

    return triangular_solve
