"""Shape ops that move data without arithmetic: broadcast, reshape, bitcast, copy, transpose, reverse, iota.

Results are numpy views wherever numpy allows (broadcast_to, reshape of contiguous data,
transpose, reversed slicing): operands are never written, so sharing their memory is safe, and the
views may be read-only.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from replicas.hlo.ir import Instruction
from replicas.ops.registry import KernelContext, dimension_list, kernel
from replicas.shapes import Shape


def _array_operand(inst: Instruction, ctx: KernelContext, count: int = 1) -> Shape:
    if len(inst.operands) != count:
        raise inst.error(f"{inst.opcode} takes {count} operand{'s' if count != 1 else ''}, got {len(inst.operands)}")
    shape = ctx.operand_shapes(inst)[0]
    if not shape.is_array:
        raise inst.error(f"{inst.opcode} operand must be an array, got {shape}")
    if not inst.shape.is_array:
        raise inst.error(f"{inst.opcode} result must be an array, got {inst.shape}")
    return shape


def _dimension_list(inst: Instruction, rank: int, name: str = "dimensions") -> list[int]:
    return dimension_list(inst, name, rank, required=True)


def _check_same_type(inst: Instruction, operand: Shape) -> None:
    if operand.element_type is not inst.shape.element_type:
        raise inst.error(f"result type {inst.shape.element_type.value} differs from operand type "
                         f"{operand.element_type.value}")


@kernel("broadcast")
def make_broadcast(inst: Instruction, ctx: KernelContext) -> Callable[[np.ndarray], np.ndarray]:
    """HLO broadcast is BroadcastInDim: operand dim i becomes result dim dimensions[i]."""
    operand = _array_operand(inst, ctx)
    _check_same_type(inst, operand)
    out_dims = inst.shape.dimensions
    dims = _dimension_list(inst, len(out_dims))
    if len(dims) != operand.rank:
        raise inst.error(f"dimensions {dims} must have one entry per operand dimension ({operand.rank})")
    for i, d in enumerate(dims):
        if operand.dimensions[i] not in (1, out_dims[d]):
            raise inst.error(f"operand dimension {i} (size {operand.dimensions[i]}) cannot broadcast to result "
                             f"dimension {d} (size {out_dims[d]})")
    order = sorted(range(len(dims)), key=lambda i: dims[i])
    needs_transpose = order != list(range(len(dims)))
    expanded = [1] * len(out_dims)
    for i, d in enumerate(dims):
        expanded[d] = operand.dimensions[i]
    expanded_shape = tuple(expanded)

    def broadcast(x: np.ndarray) -> np.ndarray:
        if needs_transpose:
            x = x.transpose(order)
        return np.broadcast_to(x.reshape(expanded_shape), out_dims)

    return broadcast


@kernel("reshape")
def make_reshape(inst: Instruction, ctx: KernelContext) -> Callable[[np.ndarray], np.ndarray]:
    """Row-major reshape (the document's Reshape/Collapse: the builder emits any transpose first)."""
    operand = _array_operand(inst, ctx)
    _check_same_type(inst, operand)
    out_dims = inst.shape.dimensions
    if operand.numel != inst.shape.numel:
        raise inst.error(f"cannot reshape {operand} ({operand.numel} elements) to {inst.shape} "
                         f"({inst.shape.numel} elements)")

    def reshape(x: np.ndarray) -> np.ndarray:
        return x.reshape(out_dims)

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
    operand = _array_operand(inst, ctx)
    result = inst.shape
    in_bytes = operand.numel * operand.dtype.itemsize
    out_bytes = result.numel * result.dtype.itemsize
    if in_bytes != out_bytes:
        raise inst.error(f"bitcast from {operand} ({in_bytes} bytes) to {result} ({out_bytes} bytes) changes "
                         "the size")
    same_type = operand.element_type is result.element_type
    out_dims = result.dimensions
    if same_type and _is_default_layout(operand) and _is_default_layout(result):
        def bitcast_reshape(x: np.ndarray) -> np.ndarray:
            return x.reshape(out_dims)

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
    if len(inst.operands) != 1:
        raise inst.error(f"copy takes 1 operand, got {len(inst.operands)}")

    def copy(x: np.ndarray) -> np.ndarray:
        return x

    return copy


@kernel("transpose")
def make_transpose(inst: Instruction, ctx: KernelContext) -> Callable[[np.ndarray], np.ndarray]:
    """Result dimension i is operand dimension dimensions[i] (np.transpose's convention)."""
    operand = _array_operand(inst, ctx)
    _check_same_type(inst, operand)
    perm = tuple(_dimension_list(inst, operand.rank))
    if len(perm) != operand.rank:
        raise inst.error(f"dimensions {list(perm)} is not a permutation of the operand's {operand.rank} dimensions")
    expected = tuple(operand.dimensions[p] for p in perm)
    if expected != inst.shape.dimensions:
        raise inst.error(f"result shape {inst.shape} does not match the transposed dimensions {list(expected)}")

    def transpose(x: np.ndarray) -> np.ndarray:
        return x.transpose(perm)

    return transpose


def _identity(x: np.ndarray) -> np.ndarray:
    return x


@kernel("reverse")
def make_reverse(inst: Instruction, ctx: KernelContext) -> Callable[[np.ndarray], np.ndarray]:
    operand = _array_operand(inst, ctx)
    _check_same_type(inst, operand)
    reversed_dims = set(_dimension_list(inst, operand.rank))
    index = tuple(slice(None, None, -1) if d in reversed_dims else slice(None) for d in range(operand.rank))
    if not reversed_dims:  # also keeps 0-d values arrays (x[()] would give a numpy scalar)
        return _identity

    def reverse(x: np.ndarray) -> np.ndarray:
        return x[index]

    return reverse


@kernel("iota")
def make_iota(inst: Instruction, ctx: KernelContext) -> Callable[[], np.ndarray]:
    """Counts 0, 1, ... along iota_dimension; computed once at bind time (a read-only constant)."""
    if inst.operands:
        raise inst.error(f"iota takes no operands, got {len(inst.operands)}")
    shape = inst.shape
    if not shape.is_array or shape.rank == 0:
        raise inst.error(f"iota result must be an array of rank >= 1, got {shape}")
    dim = inst.attrs.get("iota_dimension")
    if dim is None:
        raise inst.error("missing attribute iota_dimension")
    dim = int(dim)
    if not 0 <= dim < shape.rank:
        raise inst.error(f"iota_dimension {dim} out of range for rank {shape.rank}")
    n = shape.dimensions[dim]
    dtype = shape.dtype
    if dtype.kind in "iub":
        counts = np.arange(n, dtype=np.int64).astype(dtype)
    else:
        # Exact integer counts rounded once to the result type (bf16, f16, f8 round like XLA's convert).
        counts = np.arange(n, dtype=np.float64).astype(dtype)
    view_shape = [1] * shape.rank
    view_shape[dim] = n
    counts.flags.writeable = False
    value = np.broadcast_to(counts.reshape(view_shape), shape.dimensions)

    def iota() -> np.ndarray:
        return value

    return iota
