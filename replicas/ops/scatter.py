"""scatter: XLA's general (variadic) scatter with full dimension numbers, vectorized.

Each update element goes to `operand[start + window_offset]`; an update window that would leave
the operand anywhere is skipped as a whole (XLA). The kernel builds the flat target index of every
update element (scatter axes first, then window axes, so the flat order is XLA's update order),
drops the skipped windows, then combines:
- `add`/`multiply`/`maximum`/`minimum`/`and`/`or`/`xor` reducers: one unbuffered `ufunc.at`;
- "replace" (the computation returns its update parameters): the last update of each target in
  update order wins;
- any other computation: targets are sorted (stably) and applied in rounds, the k-th update of
  every target in round k, one whole-array call of the computation per round.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from replicas.hlo.ir import Computation, Instruction
from replicas.ops.elementwise_util import quiet
from replicas.ops.gather import (
    batching_grids,
    c_strides,
    index_vectors,
    window_offsets,
)
from replicas.ops.recognize import binary_reducer
from replicas.ops.registry import KernelContext, dimension_list, kernel

_UFUNCS = {
    "add": np.add, "multiply": np.multiply, "maximum": np.maximum, "minimum": np.minimum,
    "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor,
}


def is_replace(comp: Computation, n: int) -> bool:
    """True if `comp(op_0..op_{n-1}, upd_0..upd_{n-1})` returns its update parameters unchanged."""
    params = comp.parameters
    if len(params) != 2 * n:
        return False
    root = comp.root_instruction
    wanted = [p.name for p in params[n:]]
    if n == 1 and root.opcode == "parameter":
        return root.name == wanted[0]
    return root.opcode == "tuple" and list(root.operands) == wanted


def _wants_float_accumulate(dtype: np.dtype) -> bool:
    """ml_dtypes floats (bf16, f8) have no fast `ufunc.at` loop: combine in f32 and round once per
    target (XLA rounds after every combine; for add/multiply the two differ in the last bits)."""
    return dtype.kind == "V" or (dtype.kind == "f" and dtype.itemsize < 2)


@kernel("scatter")
def make_scatter(inst: Instruction, ctx: KernelContext) -> Callable[..., Any]:
    shapes = ctx.operand_shapes(inst)
    n = (len(shapes) - 1) // 2
    operand_shapes, indices_shape, update_shapes = shapes[:n], shapes[n], shapes[n + 1:]
    update_window_dims = dimension_list(inst, "update_window_dims")
    inserted = set(dimension_list(inst, "inserted_window_dims"))
    to_operand = dimension_list(inst, "scatter_dims_to_operand_dims")
    input_batching = dimension_list(inst, "input_batching_dims")
    indices_batching = dimension_list(inst, "scatter_indices_batching_dims")
    index_vector_dim = int(inst.attrs.get("index_vector_dim", indices_shape.rank))
    op_dims = tuple(operand_shapes[0].dimensions)
    upd_dims = tuple(update_shapes[0].dimensions)
    rank = len(op_dims)

    batch_axes_of_indices = [d for d in range(indices_shape.rank) if d != index_vector_dim]
    batch_shape = tuple(indices_shape.dimensions[d] for d in batch_axes_of_indices)
    n_batch = len(batch_shape)
    update_scatter_dims = [d for d in range(len(upd_dims)) if d not in update_window_dims]
    window_dims = [d for d in range(rank) if d not in inserted and d not in input_batching]
    window_extent = tuple(upd_dims[d] for d in update_window_dims)
    # Updates in canonical order (scatter axes..., window axes...): the flat order is the update order.
    canonical_perm = update_scatter_dims + list(update_window_dims)
    identity_perm = canonical_perm == list(range(len(upd_dims)))

    strides = c_strides(op_dims)
    window_offset = window_offsets(n_batch, list(window_extent), [strides[d] for d in window_dims])
    batching_terms = batching_grids(input_batching, indices_batching, batch_axes_of_indices, batch_shape, strides)
    window_size_of = {d: window_extent[i] for i, d in enumerate(window_dims)}
    start_limits = [op_dims[d] - window_size_of.get(d, 1) for d in to_operand]
    start_strides = [strides[d] for d in to_operand]
    window_numel = int(np.prod(window_extent, dtype=np.int64))
    n_windows = int(np.prod(batch_shape, dtype=np.int64))
    nothing_to_do = window_numel == 0 or n_windows == 0 or int(np.prod(op_dims, dtype=np.int64)) == 0

    comp_name = inst.attrs["to_apply"]
    comp_ir = ctx.computation_ir(comp_name)
    out_dtypes = [s.dtype for s in operand_shapes]
    reducer = binary_reducer(comp_ir) if n == 1 else None
    if reducer in ("and", "or", "xor") and out_dtypes[0].kind not in "biu":
        reducer = None
    replace = reducer is None and is_replace(comp_ir, n)
    # The program promises distinct targets: plain assignment, no last-wins search (XLA leaves
    # repeated indices under this promise implementation-defined).
    unique = bool(inst.attrs.get("unique_indices", False))
    apply = ctx.computation(comp_name) if reducer is None and not replace else None

    def targets_of(indices: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Flat operand index of every update element (canonical order) and the kept-window mask."""
        if index_vector_dim == indices.ndim - 1 and (indices.dtype.kind == "i" or indices.dtype.itemsize < 8):
            vectors = indices.astype(np.int64, copy=False)  # the usual layout: no axis to move
        else:
            vectors = index_vectors(indices, index_vector_dim)
        flat_start: Any = 0
        in_bounds = None
        for k, (limit, stride) in enumerate(zip(start_limits, start_strides)):
            start = vectors[..., k]
            # One unsigned comparison checks 0 <= start <= limit (negatives wrap to huge values).
            ok = start.view(np.uint64) <= np.uint64(limit) if limit >= 0 else np.zeros(start.shape, bool)
            in_bounds = ok if in_bounds is None else in_bounds & ok
            flat_start = flat_start + (start if stride == 1 else start * stride)
        for term in batching_terms:
            flat_start = flat_start + term
        if getattr(flat_start, "shape", None) != batch_shape:
            flat_start = np.broadcast_to(flat_start, batch_shape)
        if window_dims:
            targets = (flat_start.reshape(batch_shape + (1,) * len(window_dims)) + window_offset).reshape(-1)
        else:
            targets = flat_start.reshape(-1)
        if in_bounds is None or in_bounds.all():
            return targets, None
        keep = np.broadcast_to(in_bounds.reshape(batch_shape + (1,) * len(window_dims)),
                               batch_shape + window_extent).reshape(-1)
        return targets[keep], keep

    def canonical_updates(update: np.ndarray, keep: np.ndarray | None) -> np.ndarray:
        if not identity_perm:
            update = update.transpose(canonical_perm)
        flat = update.reshape(-1)
        return flat if keep is None else flat[keep]

    def scatter(*args: np.ndarray) -> Any:
        operands, indices, updates = args[:n], args[n], args[n + 1:]
        # order="C": the flat views written below must be views, whatever layout the operand had.
        results = [np.array(o, dtype=dt, copy=True, order="C") for o, dt in zip(operands, out_dtypes)]
        if nothing_to_do:
            return results[0] if n == 1 else tuple(results)
        targets, keep = targets_of(indices)
        values = [canonical_updates(u, keep) for u in updates]
        with quiet():
            if reducer is not None:
                _apply_ufunc(_UFUNCS[reducer], results[0], targets, values[0])
            elif replace and unique:
                for result, value in zip(results, values):
                    result.reshape(-1)[targets] = value.astype(result.dtype, copy=False)
            elif replace:
                _apply_replace(results, targets, values)
            else:
                _apply_in_rounds(apply, results, targets, values, out_dtypes)
        return results[0] if n == 1 else tuple(results)

    return scatter


def _apply_ufunc(ufunc: np.ufunc, result: np.ndarray, targets: np.ndarray, values: np.ndarray) -> None:
    flat = result.reshape(-1)
    if _wants_float_accumulate(result.dtype):
        # Rounds once per target instead of once per combine; ml_dtypes has no fast ufunc.at loop.
        acc = flat.astype(np.float32)
        ufunc.at(acc, targets, values.astype(np.float32))
        flat[...] = acc.astype(result.dtype)
    else:
        ufunc.at(flat, targets, values.astype(result.dtype, copy=False))


def _last_occurrence(targets: np.ndarray) -> np.ndarray:
    """Positions (into `targets`) of the last update of each distinct target."""
    reversed_targets = targets[::-1]
    _, first_in_reversed = np.unique(reversed_targets, return_index=True)
    return len(targets) - 1 - first_in_reversed


def _apply_replace(results: list[np.ndarray], targets: np.ndarray, values: list[np.ndarray]) -> None:
    winners = _last_occurrence(targets)
    chosen = targets[winners]
    for result, value in zip(results, values):
        result.reshape(-1)[chosen] = value[winners].astype(result.dtype, copy=False)


def _apply_in_rounds(apply: Callable[..., Any], results: list[np.ndarray], targets: np.ndarray,
                     values: list[np.ndarray], dtypes: list[np.dtype]) -> None:
    if targets.size == 0:
        return
    order = np.argsort(targets, kind="stable")
    sorted_targets = targets[order]
    starts_group = np.empty(len(order), dtype=bool)
    starts_group[0] = True
    np.not_equal(sorted_targets[1:], sorted_targets[:-1], out=starts_group[1:])
    group_start = np.maximum.accumulate(np.where(starts_group, np.arange(len(order)), 0))
    rank_in_group = np.arange(len(order)) - group_start
    flats = [r.reshape(-1) for r in results]
    sorted_values = [v[order] for v in values]
    n = len(results)
    for k in range(int(rank_in_group.max()) + 1):
        picked = rank_in_group == k
        where = sorted_targets[picked]
        current = [np.ascontiguousarray(f[where]) for f in flats]
        new = apply(*current, *[np.ascontiguousarray(v[picked]) for v in sorted_values])
        if n == 1 and not isinstance(new, tuple):
            new = (new,)
        for f, value, dt in zip(flats, new, dtypes):
            f[where] = np.asarray(value).astype(dt, copy=False)
