"""jaxlib's Householder reductions beyond plain QR: `lapack_?gehrd_ffi` (Hessenberg form,
`jax.scipy.linalg.hessenberg`), `lapack_?sytrd_ffi` / `lapack_?hetrd_ffi` (tridiagonal form,
`lax.linalg.tridiagonal`) and `lapack_?geqp3_ffi` (QR with column pivoting, `qr(pivoting=True)`).

Results are LAPACK's own: the reflectors stored in the matrix, their `tau`, and `info`; each
matrix of the batch goes to scipy's wrapper of the routine jaxlib calls, as jaxlib loops too.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np

from replicas.hlo.ir import Instruction
from replicas.ops.custom_call import builtin_target
from replicas.ops.lapack import (
    _attributes,
    _char,
    _matrices,
    _results,
    _targets,
    each_matrix,
    int_attributes,
    lapack_routine,
)
from replicas.ops.registry import KernelContext


@builtin_target(*_targets("gehrd"))
def make_gehrd(inst: Instruction, ctx: KernelContext) -> Callable[[np.ndarray], tuple[np.ndarray, ...]]:
    (shape,) = ctx.operand_shapes(inst)
    batch, n, _ = _matrices(inst, shape, square=True)
    results = _results(inst, 3)
    numbers = int_attributes(inst)
    low, high = numbers.get("low", 1), numbers.get("high", n)
    if n and not 1 <= low <= max(high, 1) <= n:
        raise inst.error(f"{inst.attrs.get('custom_call_target')}: low={low}, high={high} outside 1..{n}")
    routine = lapack_routine("gehrd", shape)

    def one(a: np.ndarray) -> tuple[object, ...]:
        h, tau, info = routine(a, lo=low - 1, hi=high - 1)
        return h, tau[:max(n - 1, 0)], info

    def gehrd(a: np.ndarray) -> tuple[np.ndarray, ...]:
        if n == 0:
            return a.copy(), *(np.zeros(r.dimensions, r.dtype) for r in results[1:])
        return each_matrix(results, len(batch), one, a)

    return gehrd


@builtin_target(*_targets("sytrd/hetrd"))
def make_sytrd(inst: Instruction, ctx: KernelContext) -> Callable[[np.ndarray], tuple[np.ndarray, ...]]:
    (shape,) = ctx.operand_shapes(inst)
    batch, n, _ = _matrices(inst, shape, square=True)
    results = _results(inst, 5)
    lower = _char(inst, _attributes(inst), "uplo", "LU", "L") == "L"
    routine = lapack_routine("hetrd" if shape.element_type.is_complex else "sytrd", shape)

    def one(a: np.ndarray) -> tuple[object, ...]:
        c, d, e, tau, info = routine(a, lower=lower)
        return c, d, e[:max(n - 1, 0)], tau[:max(n - 1, 0)], info

    def sytrd(a: np.ndarray) -> tuple[np.ndarray, ...]:
        if n == 0:
            return a.copy(), *(np.zeros(r.dimensions, r.dtype) for r in results[1:])
        return each_matrix(results, len(batch), one, a)

    return sytrd


@builtin_target(*_targets("geqp3"))
def make_geqp3(inst: Instruction, ctx: KernelContext) -> Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, ...]]:
    a_shape, _ = ctx.operand_shapes(inst)
    batch, m, n = _matrices(inst, a_shape)
    results = _results(inst, 3)
    geqp3_routine = lapack_routine("geqp3", a_shape)
    geqrf_routine = lapack_routine("geqrf", a_shape)
    ormqr_routine = lapack_routine("unmqr" if a_shape.element_type.is_complex else "ormqr", a_shape)
    adjoint = "C" if a_shape.element_type.is_complex else "T"

    def one(a: np.ndarray, jpvt: np.ndarray) -> tuple[object, ...]:
        fixed = np.flatnonzero(jpvt != 0)
        if fixed.size == 0:  # every column free: LAPACK's own pivoting from the start
            qr, pivots, tau, _, _ = geqp3_routine(a)
            return qr, pivots, tau
        # LAPACK moves the fixed columns (jpvt != 0) to the front in order, factors them without
        # pivoting, and pivots the rest on the updated trailing rows: the same steps here.
        free = np.flatnonzero(jpvt == 0)
        k = min(fixed.size, m)
        out = np.empty_like(a)
        qr_fixed, tau_fixed, _, _ = geqrf_routine(a[:, fixed])
        out[:, :fixed.size] = qr_fixed
        rest = a[:, free]
        if free.size and k:
            rest = ormqr_routine("L", adjoint, qr_fixed[:, :k], tau_fixed[:k], rest, max(1, free.size))[0]
        tau = np.zeros(min(m, n), a.dtype)
        tau[:k] = tau_fixed[:k]
        order = np.arange(free.size)
        if free.size and m > k:
            trailing, pivots, tau_rest, _, _ = geqp3_routine(rest[k:])
            order = pivots - 1
            rest = np.concatenate([rest[:k][:, order], trailing])
            tau[k:] = tau_rest[:min(m, n) - k]
        out[:, fixed.size:] = rest
        return out, np.concatenate([fixed, free[order]]) + 1, tau

    def geqp3(a: np.ndarray, jpvt: np.ndarray) -> tuple[np.ndarray, ...]:
        if a.size == 0:
            return a.copy(), np.broadcast_to(np.arange(1, n + 1, dtype=np.int32), jpvt.shape).copy(), \
                np.zeros(results[2].dimensions, results[2].dtype)
        return each_matrix(results, len(batch), one, a, jpvt)

    return geqp3


_FLAG = re.compile(r"(\w+)\s*=\s*(true|false)")


@builtin_target(*_targets("ormqr/unmqr"))
def make_ormqr(inst: Instruction, ctx: KernelContext) -> Callable[..., np.ndarray]:
    """Q c, Q^H c, c Q or c Q^H for the Q whose reflectors `a` and `tau` hold (`lax.linalg.ormqr`)."""
    shapes = ctx.operand_shapes(inst)
    if len(shapes) != 3:
        raise inst.error(f"{inst.attrs.get('custom_call_target')} takes (a, tau, c), got {len(shapes)} operands")
    a_shape, _, c_shape = shapes
    batch, _, _ = _matrices(inst, a_shape)
    _matrices(inst, c_shape)
    (result,) = _results(inst, 1)
    flags = {key: value == "true" for key, value in _FLAG.findall(str(inst.attrs.get("backend_config") or ""))}
    side = "L" if flags.get("left", True) else "R"
    complex_ = a_shape.element_type.is_complex
    trans = ("C" if complex_ else "T") if flags.get("transpose", False) else "N"
    routine = lapack_routine("unmqr" if complex_ else "ormqr", a_shape)

    def one(a: np.ndarray, tau: np.ndarray, c: np.ndarray) -> tuple[object, ...]:
        k = tau.shape[-1]
        out, _, info = routine(side, trans, a[:, :k], tau, c, max(1, c.shape[0], c.shape[1]) * 64)
        return (out,)

    def ormqr(a: np.ndarray, tau: np.ndarray, c: np.ndarray) -> np.ndarray:
        if c.size == 0 or tau.shape[-1] == 0:
            return c.copy()
        return each_matrix([result], len(batch), one, a, tau, c)[0]

    return ormqr
