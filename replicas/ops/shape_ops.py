"""Shape ops that move data without arithmetic: broadcast, reshape, bitcast, copy, transpose, reverse, iota.

Results are numpy views wherever numpy allows (broadcast_to, reshape of contiguous data,
transpose, reversed slicing): operands are never written, so sharing their memory is safe, and the
views may be read-only.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from replicas.hlo.ir import Instruction
from replicas.ops.registry import KernelContext, dimension_list, kernel
from replicas.shapes import Shape


@kernel("broadcast")
def make_broadcast(inst: Instruction, ctx: KernelContext) -> Callable[[np.ndarray], np.ndarray]:
    """HLO broadcast is BroadcastInDim: operand dim i becomes result dim dimensions[i]."""
    operand = ctx.operand_shapes(inst)[0]
    out_dims = inst.shape.dimensions
    dims = dimension_list(inst, "dimensions")
    order = sorted(range(len(dims)), key=lambda i: dims[i])
    needs_transpose = order != list(range(len(dims)))
    expanded = [1] * len(out_dims)
    for i, d in enumerate(dims):
        expanded[d] = operand.dimensions[i]
    expanded_shape = tuple(expanded)
    dtype = inst.shape.dtype
    if not needs_transpose and dtype.isbuiltin == 1:
        # The view built directly over a contiguous operand's read-only buffer: what np.broadcast_to
        # makes, without its Python (several times the cost on small arrays).
        source_strides = [dtype.itemsize * math.prod(operand.dimensions[i + 1:]) for i in range(len(dims))]
        strides = [0] * len(out_dims)
        for i, d in enumerate(dims):
            strides[d] = source_strides[i]
        view_strides = tuple(strides)
        source_dims = tuple(operand.dimensions)
        ndarray = np.ndarray

        def broadcast_view(x: np.ndarray) -> np.ndarray:
            if x.shape == source_dims:  # (a scalar computation may be called on whole arrays)
                try:
                    return ndarray(out_dims, dtype, memoryview(x).toreadonly(), 0, view_strides)
                except (BufferError, TypeError, ValueError):  # not contiguous, or not a plain numpy array
                    pass
            return np.broadcast_to(x.reshape(expanded_shape), out_dims)

        return broadcast_view

    def broadcast(x: np.ndarray) -> np.ndarray:
        if needs_transpose:
            x = x.transpose(order)
        return np.broadcast_to(x.reshape(expanded_shape), out_dims)

    return broadcast


@kernel("reshape")
def make_reshape(inst: Instruction, ctx: KernelContext) -> Callable[[np.ndarray], np.ndarray]:
    """Row-major reshape (the document's Reshape/Collapse: the builder emits any transpose first)."""
    out_dims = inst.shape.dimensions

    def reshape(x: np.ndarray) -> np.ndarray:
        return x.reshape(out_dims)

    reshape.reshaped_to = tuple(out_dims)  # type: ignore[attr-defined]  # generated code inlines it
    return reshape


def _is_default_layout(shape: Shape) -> bool:
    return shape.layout is None or shape.layout.minor_to_major == tuple(range(shape.rank - 1, -1, -1))


@kernel("bitcast")
def make_bitcast(inst: Instruction, ctx: KernelContext) -> Callable[[np.ndarray], np.ndarray]:
    """Reinterpret the operand's bytes, in its layout, as the result shape in the result's layout.

    Under default (row-major) layouts and one element type this is a reshape. With other layouts
    the physical order is major-to-minor: the operand is transposed into memory order, flattened,
    and read back in the result's memory order. Padded layouts are not modelled.
    """
    operand = ctx.operand_shapes(inst)[0]
    result = inst.shape
    same_type = operand.element_type is result.element_type
    out_dims = result.dimensions
    if same_type and _is_default_layout(operand) and _is_default_layout(result):
        def bitcast_reshape(x: np.ndarray) -> np.ndarray:
            return x.reshape(out_dims)

        bitcast_reshape.reshaped_to = tuple(out_dims)  # type: ignore[attr-defined]  # generated code inlines it
        return bitcast_reshape

    if operand.rank == 0 and result.rank == 0:
        # A scalar reinterpretation (XLA's sort comparators do this) is also called on whole arrays.
        scalar_dtype = result.dtype

        def bitcast_scalar(x: np.ndarray) -> np.ndarray:
            return x.view(scalar_dtype)

        return bitcast_scalar

    in_memory_order = tuple(reversed(operand.minor_to_major))
    out_memory_order = tuple(reversed(result.minor_to_major))
    out_memory_dims = tuple(out_dims[d] for d in out_memory_order)
    back_to_logical = tuple(np.argsort(out_memory_order))
    out_dtype = result.dtype

    def bitcast(x: np.ndarray) -> np.ndarray:
        flat = np.ascontiguousarray(x.transpose(in_memory_order)).reshape(-1)
        if not same_type:
            flat = flat.view(out_dtype)
        return flat.reshape(out_memory_dims).transpose(back_to_logical)

    return bitcast


@kernel("copy")
def make_copy(inst: Instruction, ctx: KernelContext) -> Callable[[np.ndarray], np.ndarray]:
    """The logical value does not depend on the layout, and values are never written: pass through."""
    def copy(x: np.ndarray) -> np.ndarray:
        return x

    copy.passes_through = True  # type: ignore[attr-defined]  # generated code renames instead of calling
    return copy


@kernel("transpose")
def make_transpose(inst: Instruction, ctx: KernelContext) -> Callable[[np.ndarray], np.ndarray]:
    """Result dimension i is operand dimension dimensions[i] (np.transpose's convention)."""
    perm = tuple(dimension_list(inst, "dimensions"))

    def transpose(x: np.ndarray) -> np.ndarray:
        return x.transpose(perm)

    return transpose


def _identity(x: np.ndarray) -> np.ndarray:
    return x


@kernel("reverse")
def make_reverse(inst: Instruction, ctx: KernelContext) -> Callable[[np.ndarray], np.ndarray]:
    rank = inst.shape.rank
    reversed_dims = set(dimension_list(inst, "dimensions"))
    index = tuple(slice(None, None, -1) if d in reversed_dims else slice(None) for d in range(rank))
    if not reversed_dims:  # also keeps 0-d values arrays (x[()] would give a numpy scalar)
        return _identity

    def reverse(x: np.ndarray) -> np.ndarray:
        return x[index]

    return reverse


IOTA_CHUNK = 1 << 20  # elements; runtime/memory.py declares the temporary


@kernel("iota")
def make_iota(inst: Instruction, ctx: KernelContext) -> Callable[[], np.ndarray]:
    """Counts 0, 1, ... along iota_dimension; computed once at bind time (a read-only constant)."""
    shape = inst.shape
    dim = int(inst.attrs["iota_dimension"])
    n = shape.dimensions[dim]
    dtype = shape.dtype
    # Exact integer counts rounded once to the result type (bf16, f16, f8 round like XLA's convert),
    # a chunk at a time: the wide counts of the whole dimension would take 8 bytes an element.
    wide = np.int64 if dtype.kind in "iub" else np.float64
    counts = np.empty(n, dtype=dtype)
    for start in range(0, n, IOTA_CHUNK):
        stop = min(n, start + IOTA_CHUNK)
        counts[start:stop] = np.arange(start, stop, dtype=wide).astype(dtype)
    view_shape = [1] * shape.rank
    view_shape[dim] = n
    counts.flags.writeable = False
    value = np.broadcast_to(counts.reshape(view_shape), shape.dimensions)

    def iota() -> np.ndarray:
        return value

    return iota
