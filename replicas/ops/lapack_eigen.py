"""jaxlib's general (non-symmetric) eigen and Schur custom calls: `lapack_?geev_ffi`
(`jnp.linalg.eig`, `lax.linalg.eig`) and `lapack_?gees_ffi` (`jax.scipy.linalg.schur`, `sqrtm`).

Each matrix of the batch goes to scipy's LAPACK wrapper of the routine jaxlib calls (jaxlib also
calls LAPACK once per matrix); real `geev` eigenvectors come back in LAPACK's packed form (a
complex pair shares two real columns) and are unpacked as jaxlib does, column-wise.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from replicas.hlo.ir import Instruction
from replicas.ops.custom_call import builtin_target
from replicas.ops.lapack import _attributes, _char, _matrices, _results, _targets, each_matrix, lapack_routine
from replicas.ops.registry import KernelContext


def unpack_eigenvectors(wi: np.ndarray, v: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """LAPACK's real eigenvector columns -> complex ones: for a pair (wi[j] > 0), column j is
    v[:, j] + i v[:, j+1] and column j+1 its conjugate."""
    first = wi > 0
    second = np.zeros_like(first)
    second[1:] = first[:-1]
    after = np.zeros_like(v)
    after[:, :-1] = v[:, 1:]
    before = np.zeros_like(v)
    before[:, 1:] = v[:, :-1]
    out = v.astype(dtype)
    out = np.where(first, v + 1j * after, out)
    return np.where(second, before - 1j * v, out).astype(dtype, copy=False)


@builtin_target(*_targets("geev"))
def make_geev(inst: Instruction, ctx: KernelContext) -> Callable[[np.ndarray], tuple[np.ndarray, ...]]:
    (shape,) = ctx.operand_shapes(inst)
    batch, _, _ = _matrices(inst, shape, square=True)
    real = not shape.element_type.is_complex
    results = _results(inst, 5 if real else 4)
    attrs = _attributes(inst)
    left = _char(inst, attrs, "compute_left", "VN", "N") == "V"
    right = _char(inst, attrs, "compute_right", "VN", "V") == "V"
    routine = lapack_routine("geev", shape)
    vector_dtype = results[-2].dtype

    def one(a: np.ndarray) -> tuple[object, ...]:
        if real:
            wr, wi, vl, vr, info = routine(a, compute_vl=left, compute_vr=right)
            return (wr, wi, unpack_eigenvectors(wi, vl, vector_dtype) if left else 0,
                    unpack_eigenvectors(wi, vr, vector_dtype) if right else 0, info)
        w, vl, vr, info = routine(a, compute_vl=left, compute_vr=right)
        return w, vl if left else 0, vr if right else 0, info

    def geev(a: np.ndarray) -> tuple[np.ndarray, ...]:
        return each_matrix(results, len(batch), one, a)

    return geev


@builtin_target(*_targets("gees"))
def make_gees(inst: Instruction, ctx: KernelContext) -> Callable[[np.ndarray], tuple[np.ndarray, ...]]:
    (shape,) = ctx.operand_shapes(inst)
    batch, _, _ = _matrices(inst, shape, square=True)
    real = not shape.element_type.is_complex
    results = _results(inst, 6 if real else 5)
    attrs = _attributes(inst)
    vectors = _char(inst, attrs, "mode", "VN", "V") == "V"
    if _char(inst, attrs, "sort", "NS", "N") == "S":
        raise inst.error(f"{inst.attrs.get('custom_call_target')} with sort=S (eigenvalue selection by a "
                         "callback) is not supported: JAX's CPU lowering never asks for it")
    routine = lapack_routine("gees", shape)

    def no_selection(*_: object) -> int:
        return 0

    def one(a: np.ndarray) -> tuple[object, ...]:
        if real:
            t, sdim, wr, wi, vs, _, info = routine(no_selection, a, compute_v=vectors, sort_t=0)
            return t, vs if vectors else 0, wr, wi, sdim, info
        t, sdim, w, vs, _, info = routine(no_selection, a, compute_v=vectors, sort_t=0)
        return t, vs if vectors else 0, w, sdim, info

    def gees(a: np.ndarray) -> tuple[np.ndarray, ...]:
        return each_matrix(results, len(batch), one, a)

    return gees
