"""gather: XLA's general gather with full dimension numbers, as one vectorized numpy take.

Every output element reads `operand[start + offset]` where `start` comes from `start_indices`
(through `start_index_map` and the batching dims) and is clamped so the whole slice stays in
bounds, and `offset` walks the slice. The kernel builds the flat operand index of every output
element from broadcast integer grids (batch axes first, then slice axes) and takes once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from replicas.hlo.ir import Instruction
from replicas.ops.registry import KernelContext, kernel


def index_vectors(indices: np.ndarray, index_vector_dim: int) -> np.ndarray:
    """`indices` with the index vector as its last axis: shape (batch..., K) as int64.

    Unsigned indices too large for int64 are saturated first (they are out of bounds anyway and
    must stay positive for clamping / bounds checks).
    """
    if index_vector_dim == indices.ndim:
        vectors = indices[..., np.newaxis]
    else:
        vectors = np.moveaxis(indices, index_vector_dim, -1)
    if vectors.dtype.kind == "u" and vectors.dtype.itemsize >= 8:
        vectors = np.minimum(vectors, np.iinfo(np.int64).max)
    return vectors.astype(np.int64, copy=False)


def window_offsets(n_batch: int, sizes: list[int], strides: list[int]) -> np.ndarray:
    """Flat offsets of every element of a window (sizes/strides per window dim), shaped
    (1,) * n_batch + sizes so they broadcast against per-batch start offsets."""
    offsets = np.zeros((1,) * n_batch + tuple(sizes), dtype=np.int64)
    for i, (size, stride) in enumerate(zip(sizes, strides)):
        shape = [1] * (n_batch + len(sizes))
        shape[n_batch + i] = size
        offsets = offsets + (np.arange(size, dtype=np.int64) * stride).reshape(shape)
    return offsets


def batching_grids(operand_dims: list[int], indices_dims: list[int], batch_axes: list[int],
                   batch_shape: tuple[int, ...] | list[int], strides: list[int]) -> list[np.ndarray]:
    """For each operand batching dim, the flat offset of the indices' own batch coordinate."""
    grids = []
    for od, idim in zip(operand_dims, indices_dims):
        axis = batch_axes.index(idim)
        shape = [1] * len(batch_shape)
        shape[axis] = batch_shape[axis]
        grids.append(np.arange(batch_shape[axis], dtype=np.int64).reshape(shape) * strides[od])
    return grids


def c_strides(dims: tuple[int, ...] | list[int]) -> list[int]:
    """Row-major element strides of an array of shape `dims`."""
    strides = [1] * len(dims)
    for d in range(len(dims) - 2, -1, -1):
        strides[d] = strides[d + 1] * dims[d + 1]
    return strides


def dimension_numbers(inst: Instruction, names: list[str]) -> dict[str, list[int]]:
    """The named integer-list attributes (absent: empty); the verifier checked their values."""
    return {name: [int(v) for v in inst.attrs.get(name, [])] for name in names}


@kernel("gather")
def make_gather(inst: Instruction, ctx: KernelContext) -> Callable[..., Any]:
    operand_shape, indices_shape = ctx.operand_shapes(inst)
    dn = dimension_numbers(inst, ["offset_dims", "collapsed_slice_dims", "start_index_map",
                                        "operand_batching_dims", "start_indices_batching_dims", "slice_sizes"])
    offset_dims = dn["offset_dims"]
    collapsed = set(dn["collapsed_slice_dims"])
    start_index_map = dn["start_index_map"]
    operand_batching = dn["operand_batching_dims"]
    indices_batching = dn["start_indices_batching_dims"]
    slice_sizes = dn["slice_sizes"]
    index_vector_dim = int(inst.attrs["index_vector_dim"])
    op_dims = tuple(operand_shape.dimensions)
    rank = len(op_dims)
    out_shape = tuple(inst.shape.dimensions)
    out_dtype = inst.shape.dtype

    # The verifier checked the dimension numbers against the shapes (hlo/shape_inference/gather.py).
    # The batch axes of the indices (all but index_vector_dim), in order.
    batch_axes_of_indices = [d for d in range(indices_shape.rank) if d != index_vector_dim]
    batch_shape = tuple(indices_shape.dimensions[d] for d in batch_axes_of_indices)
    n_batch = len(batch_shape)
    # Operand dims that are walked by the slice (become offset dims of the output), in order.
    window_dims = [d for d in range(rank) if d not in collapsed and d not in operand_batching]
    out_batch_positions = [d for d in range(len(out_shape)) if d not in offset_dims]
    # Canonical result layout: (batch..., window...) -> output dim order.
    canonical_axis_of_output = [0] * len(out_shape)
    for i, d in enumerate(out_batch_positions):
        canonical_axis_of_output[d] = i
    for i, d in enumerate(offset_dims):
        canonical_axis_of_output[d] = n_batch + i
    canonical_shape = batch_shape + tuple(slice_sizes[d] for d in window_dims)
    identity_transpose = canonical_axis_of_output == list(range(len(out_shape)))

    # Trailing operand dims taken whole by every slice are copied as contiguous rows: index in units
    # of those rows (one `take` along axis 0 moves row-sized blocks instead of single elements).
    n_row_dims = 0
    while (n_row_dims < rank and (d := rank - 1 - n_row_dims) in window_dims
           and slice_sizes[d] == op_dims[d]):
        n_row_dims += 1
    row = int(np.prod(op_dims[rank - n_row_dims:], dtype=np.int64))
    row_dims = set(range(rank - n_row_dims, rank))
    strides = [s // row for s in c_strides(op_dims)] if row else c_strides(op_dims)
    prefix_window = [d for d in window_dims if d not in row_dims]
    # The slice part of the flat index: sum over window dims of arange * stride, shaped to broadcast.
    window_offset = window_offsets(n_batch, [slice_sizes[d] for d in prefix_window],
                                   [strides[d] for d in prefix_window])
    # The batch coordinate grids for operand batching dims (start index = the indices' batch coordinate).
    batching_terms = batching_grids(operand_batching, indices_batching, batch_axes_of_indices, batch_shape,
                                    strides)
    # A start index into a row dim always clamps to 0, so only the others take part.
    used = [(k, op_dims[d] - slice_sizes[d], strides[d]) for k, d in enumerate(start_index_map) if d not in row_dims]
    empty = int(np.prod(out_shape, dtype=np.int64)) == 0

    indices_rank = indices_shape.rank
    flat_shape = batch_shape + (1,) * len(prefix_window)

    def gather(operand: np.ndarray, indices: np.ndarray) -> np.ndarray:
        if empty:
            return np.zeros(out_shape, dtype=out_dtype)
        if index_vector_dim == indices_rank - 1:  # the usual layout: no axis to move
            vectors = indices
            if vectors.dtype.kind == "u" and vectors.dtype.itemsize >= 8:
                vectors = np.minimum(vectors, np.iinfo(np.int64).max)
        else:
            vectors = index_vectors(indices, index_vector_dim)
        flat_start = None
        for k, limit, stride in used:
            start = vectors[..., k].astype(np.int64)  # a copy of its own, clamped in place
            np.maximum(start, 0, out=start)
            np.minimum(start, limit, out=start)
            if stride != 1:
                np.multiply(start, stride, out=start)
            if flat_start is None:
                flat_start = start
            else:
                np.add(flat_start, start, out=flat_start)
        if flat_start is None:
            flat_start = np.zeros(batch_shape, dtype=np.int64)
        for term in batching_terms:
            flat_start = flat_start + term
        flat = flat_start.reshape(flat_shape) + window_offset if prefix_window else flat_start
        if row == 1:
            result = np.take(operand.reshape(-1), flat)
        else:
            result = np.take(operand.reshape(-1, row), flat, axis=0)
        result = result.reshape(canonical_shape)
        if not identity_transpose:
            result = result.transpose(canonical_axis_of_output)
        # asarray, not ascontiguousarray: that one turns a 0-d result into shape (1,).
        return np.asarray(result, dtype=out_dtype, order="C")

    return gather
