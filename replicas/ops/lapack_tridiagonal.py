"""jaxlib's tridiagonal solve `lapack_?gtsv_ffi` (`lax.linalg.tridiagonal_solve`).

Operands dl, d, du (batch..., n) and b (batch..., n, nrhs), as JAX passes them: dl[0] and du[n-1]
lie outside the matrix. Like jaxlib, LAPACK sees dl[1:] and du[:-1]; the results are LAPACK's
overwritten diagonals (dl[0] and du[n-1] unchanged), the solution, and `info` (i > 0: the
pivot U(i,i) is exactly zero and the solution was not computed). One LAPACK call per system of
the batch, as jaxlib makes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from replicas.hlo.ir import Instruction
from replicas.ops.custom_call import builtin_target
from replicas.ops.lapack import _results, _targets, each_matrix, lapack_routine
from replicas.ops.registry import KernelContext


@builtin_target(*_targets("gtsv"))
def make_gtsv(inst: Instruction, ctx: KernelContext) -> Callable[..., tuple[np.ndarray, ...]]:
    shapes = ctx.operand_shapes(inst)
    if len(shapes) != 4:
        raise inst.error(f"{inst.attrs.get('custom_call_target')} takes (dl, d, du, b), got {len(shapes)} operands")
    dl_shape, d_shape, du_shape, b_shape = shapes
    diagonal = d_shape.dimensions
    if not (d_shape.is_array and d_shape.rank >= 1 and b_shape.is_array and b_shape.rank == d_shape.rank + 1
            and dl_shape.dimensions == du_shape.dimensions == diagonal and b_shape.dimensions[:-1] == diagonal
            and (b_shape.element_type.is_floating or b_shape.element_type.is_complex)):
        raise inst.error(f"{inst.attrs.get('custom_call_target')} needs dl, d, du of (batch..., n) and b of "
                         f"(batch..., n, nrhs), got {', '.join(map(str, shapes))}")
    results = _results(inst, 5)
    n = diagonal[-1]
    routine = lapack_routine("gtsv", b_shape)

    def one(dl: np.ndarray, d: np.ndarray, du: np.ndarray, b: np.ndarray) -> tuple[object, ...]:
        dl2, d2, du2, x, info = routine(dl[1:], d, du[:-1], b)
        return np.concatenate([dl[:1], dl2]), d2, np.concatenate([du2, du[-1:]]), x, info

    def gtsv(dl: np.ndarray, d: np.ndarray, du: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, ...]:
        if n == 0 or b.shape[-1] == 0:
            return dl.copy(), d.copy(), du.copy(), b.copy(), np.zeros(results[4].dimensions, np.int32)
        return each_matrix(results, d.ndim - 1, one, dl, d, du, b)

    return gtsv


# -- tridiagonal_solve_perturbed_ffi: jaxlib's own solver (no LAPACK) ------------------------------

def _perturb_pivots(perturb: np.ndarray, pivot: np.ndarray, row: np.ndarray, limits: tuple[float, float]) -> None:
    """jaxlib's MaybePerturbPivot for a batch of pivots (in place): grow a pivot of magnitude below
    1 by `perturb` (doubling) until neither 1/pivot nor row/pivot can overflow, or scale both."""
    safemin, bignum = limits
    size = np.abs(pivot)
    active = size < 1
    if not active.any():
        return
    perturb = np.copysign(np.maximum(np.abs(perturb), safemin), pivot.real)
    largest = np.abs(row).max(axis=-1, initial=0)
    while active.any():
        tiny = size < safemin
        grow = active & np.where(tiny, (size == 0) | (largest * safemin > size), largest > size * bignum)
        scale = active & tiny & ~grow
        pivot += np.where(grow, perturb, 0).astype(pivot.dtype)
        perturb = np.where(grow, perturb * 2, perturb)
        pivot *= np.where(scale, bignum, 1).astype(pivot.dtype)
        row *= np.where(scale, bignum, 1)[:, None].astype(row.dtype)
        size = np.abs(pivot)
        active = grow & (size < 1)


@builtin_target("tridiagonal_solve_perturbed_ffi")
def make_tridiagonal_solve_perturbed(inst: Instruction, ctx: KernelContext) -> Callable[..., np.ndarray]:
    """`lax.linalg.tridiagonal_solve(..., perturb_singular=True)`: LU with row pivoting (LAPACK's
    xLAGTF + xLAGTS, as jaxlib writes them) whose tiny pivots are perturbed by eps * max|U| instead
    of failing. One step per row, every system of the batch at once."""
    shapes = ctx.operand_shapes(inst)
    b_shape = shapes[-1]
    if len(shapes) != 4 or b_shape.rank < 2 or any(s.dimensions != b_shape.dimensions[:-1] for s in shapes[:3]) \
            or not b_shape.compatible(inst.shape) or not (b_shape.element_type.is_floating
                                                         or b_shape.element_type.is_complex):
        raise inst.error("tridiagonal_solve_perturbed_ffi takes dl, d, du of (batch..., n) and b of (batch..., "
                         f"n, nrhs) and returns b's shape, got {', '.join(map(str, shapes))} -> {inst.shape}")
    info = np.finfo(b_shape.dtype)
    tiny, small = float(info.tiny), 1 / float(info.max)
    safemin = tiny if small < tiny else small * (1 + float(info.eps))
    limits = (safemin, 1 / safemin)
    eps = float(info.eps)

    def solve(dl: np.ndarray, d: np.ndarray, du: np.ndarray, b: np.ndarray) -> np.ndarray:
        n, k = b.shape[-2:]
        if n == 0 or b.size == 0:
            return b.copy()
        dl, d, du = (v.reshape(-1, n) for v in (dl, d, du))
        rhs = b.reshape(-1, n, k)
        x = rhs.copy()
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            if n == 1:
                p, row = d[:, 0].copy(), x[:, 0].copy()
                _perturb_pivots(eps * np.abs(p), p, row, limits)
                return (row / p[:, None]).reshape(b.shape)
            u = np.zeros(d.shape + (3,), b.dtype)
            u[:, 0, 0], u[:, 0, 1] = d[:, 0], du[:, 0]
            largest = np.maximum(np.abs(u[:, 0, 0]), np.abs(u[:, 0, 1]))
            scale1 = np.abs(u[:, 0, 0]) + np.abs(u[:, 0, 1])
            for i in range(n - 1):
                below, last = dl[:, i + 1], i == n - 2
                u[:, i + 1, 0] = d[:, i + 1]
                scale2 = np.abs(below) + np.abs(d[:, i + 1]) + (0 if last else np.abs(du[:, i + 1]))
                piv1 = np.where(u[:, i, 0] == 0, 0, np.abs(u[:, i, 0]) / scale1)
                keep = (below == 0) | (np.abs(below) / scale2 <= piv1)  # no row swap
                factor = np.where(below == 0, 0, np.where(keep, below / u[:, i, 0], u[:, i, 0] / below))
                swapped_next = u[:, i, 1] - factor * d[:, i + 1]
                x_next = np.where(keep[:, None], rhs[:, i + 1] - factor[:, None] * x[:, i],
                                  x[:, i] - factor[:, None] * rhs[:, i + 1])
                x[:, i] = np.where(keep[:, None], x[:, i], rhs[:, i + 1])
                x[:, i + 1] = x_next
                u[:, i + 1, 0] = np.where(keep, d[:, i + 1] - factor * u[:, i, 1], swapped_next)
                u[:, i, 0] = np.where(keep, u[:, i, 0], below)
                u[:, i, 1] = np.where(keep, u[:, i, 1], d[:, i + 1])
                if last:
                    u[:, i + 1, 1] = np.where(keep, du[:, i + 1], u[:, i + 1, 1])
                else:
                    u[:, i, 2] = np.where(keep, 0, du[:, i + 1])
                    u[:, i + 1, 1] = np.where(keep, du[:, i + 1], -factor * du[:, i + 1])
                    largest = np.maximum(largest, np.abs(u[:, i]).max(axis=-1))
                scale1 = np.where(keep, scale2, np.abs(u[:, i + 1, 0]) + np.abs(u[:, i + 1, 1]))
            perturb = eps * np.maximum(largest, np.abs(u[:, n - 1, 0]))
            for i in range(n - 1, -1, -1):
                p, row = u[:, i, 0].copy(), x[:, i].copy()
                if i < n - 1:
                    row -= u[:, i, 1][:, None] * x[:, i + 1]
                if i < n - 2:
                    row -= u[:, i, 2][:, None] * x[:, i + 2]
                _perturb_pivots(perturb, p, row, limits)
                x[:, i] = row * (1 / p)[:, None]
        return x.reshape(b.shape)

    return solve
