"""slice, dynamic-slice, dynamic-update-slice, pad, concatenate.

Static slices are basic numpy slicing (views). Dynamic start indices are clamped as the
Operation Semantics document says: start = clamp(start, 0, dim - size), so a slice never leaves
the operand. Pad builds the interior-padded array with one strided assignment into a filled
array and then cuts negative edges off by slicing.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from replicas.hlo.ir import Instruction
from replicas.ops.registry import KernelContext, kernel
from replicas.shapes import Shape


def _check_array(inst: Instruction, shape: Shape, what: str) -> None:
    if not shape.is_array:
        raise inst.error(f"{what} must be an array, got {shape}")


@kernel("slice")
def make_slice(inst: Instruction, ctx: KernelContext) -> Callable[[np.ndarray], np.ndarray]:
    if len(inst.operands) != 1:
        raise inst.error(f"slice takes 1 operand, got {len(inst.operands)}")
    (operand,) = ctx.operand_shapes(inst)
    _check_array(inst, operand, "operand")
    spec = inst.attrs.get("slice")
    if spec is None:
        raise inst.error("missing attribute slice")
    if len(spec) != operand.rank:
        raise inst.error(f"slice has {len(spec)} entries for a rank {operand.rank} operand")
    index = []
    out_dims = []
    for d, entry in enumerate(spec):
        start, limit, stride = (int(v) for v in entry) if len(entry) == 3 else (*map(int, entry), 1)
        size = operand.dimensions[d]
        if not (0 <= start <= limit <= size) or stride < 1:
            raise inst.error(f"slice [{start}:{limit}:{stride}] is out of range for dimension {d} of size {size}")
        index.append(slice(start, limit, stride))
        out_dims.append(-(-(limit - start) // stride))
    if tuple(out_dims) != inst.shape.dimensions:
        raise inst.error(f"result shape {inst.shape} does not match the slice's dimensions {out_dims}")
    key = tuple(index)
    if operand.rank == 0:  # x[()] would turn a 0-d array into a numpy scalar
        return _identity

    def slice_(x: np.ndarray) -> np.ndarray:
        return x[key]

    return slice_


def _identity(x: np.ndarray, *ignored: np.ndarray) -> np.ndarray:
    return x


def _start_index_reader(inst: Instruction, index_shapes: list[Shape], rank: int) -> Callable[[tuple], list[int]]:
    """Start indices come as `rank` scalars (current HLO) or one rank-1 array (the old form)."""
    for s in index_shapes:
        if not s.is_array or not s.element_type.is_integral:
            raise inst.error(f"start indices must be integer arrays, got {s}")
    if len(index_shapes) == rank and all(s.rank == 0 for s in index_shapes):
        def scalars(values: tuple) -> list[int]:
            return [int(v) for v in values]

        return scalars
    if len(index_shapes) == 1 and index_shapes[0].dimensions == (rank,):
        def vector(values: tuple) -> list[int]:
            return [int(v) for v in values[0]]

        return vector
    raise inst.error(f"expected {rank} scalar start indices, got {', '.join(map(str, index_shapes)) or 'none'}")


def _clamped_slices(starts: list[int], sizes: tuple[int, ...], dims: tuple[int, ...]) -> tuple[slice, ...]:
    key = []
    for start, size, dim in zip(starts, sizes, dims):
        start = max(min(start, dim - size), 0)
        key.append(slice(start, start + size))
    return tuple(key)


@kernel("dynamic-slice")
def make_dynamic_slice(inst: Instruction, ctx: KernelContext) -> Callable[..., np.ndarray]:
    shapes = ctx.operand_shapes(inst)
    if not shapes:
        raise inst.error("dynamic-slice needs an operand")
    operand = shapes[0]
    _check_array(inst, operand, "operand")
    sizes = tuple(int(s) for s in inst.attrs.get("dynamic_slice_sizes", ()))
    if len(sizes) != operand.rank:
        raise inst.error(f"dynamic_slice_sizes has {len(sizes)} entries for a rank {operand.rank} operand")
    for d, (size, dim) in enumerate(zip(sizes, operand.dimensions)):
        if not 0 <= size <= dim:
            raise inst.error(f"slice size {size} out of range for dimension {d} of size {dim}")
    if sizes != inst.shape.dimensions:
        raise inst.error(f"result shape {inst.shape} does not match dynamic_slice_sizes {list(sizes)}")
    read_starts = _start_index_reader(inst, shapes[1:], operand.rank)
    if operand.rank == 0:
        return _identity

    def dynamic_slice(x: np.ndarray, *indices: np.ndarray) -> np.ndarray:
        return x[_clamped_slices(read_starts(indices), sizes, x.shape)]

    return dynamic_slice


@kernel("dynamic-update-slice")
def make_dynamic_update_slice(inst: Instruction, ctx: KernelContext) -> Callable[..., np.ndarray]:
    shapes = ctx.operand_shapes(inst)
    if len(shapes) < 2:
        raise inst.error("dynamic-update-slice needs an operand and an update")
    operand, update = shapes[0], shapes[1]
    _check_array(inst, operand, "operand")
    _check_array(inst, update, "update")
    if update.rank != operand.rank:
        raise inst.error(f"update {update} must have the operand's rank {operand.rank}")
    if operand.element_type is not update.element_type:
        raise inst.error(f"update type {update.element_type.value} differs from operand type "
                         f"{operand.element_type.value}")
    for d, (u, o) in enumerate(zip(update.dimensions, operand.dimensions)):
        if u > o:
            raise inst.error(f"update dimension {d} (size {u}) is larger than the operand's ({o})")
    read_starts = _start_index_reader(inst, shapes[2:], operand.rank)

    def dynamic_update_slice(x: np.ndarray, u: np.ndarray, *indices: np.ndarray) -> np.ndarray:
        result = x.copy()
        result[_clamped_slices(read_starts(indices), u.shape, x.shape)] = u
        return result

    def in_place(x: np.ndarray, u: np.ndarray, *indices: np.ndarray) -> np.ndarray:
        """The same, writing into `x`: the interpreter calls it when nothing else can see `x`."""
        x[_clamped_slices(read_starts(indices), u.shape, x.shape)] = u
        return x

    dynamic_update_slice.in_place = in_place  # type: ignore[attr-defined]
    return dynamic_update_slice


@kernel("pad")
def make_pad(inst: Instruction, ctx: KernelContext) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """Edge padding (negative = cut) and interior padding between elements, per dimension."""
    if len(inst.operands) != 2:
        raise inst.error(f"pad takes 2 operands (operand, padding value), got {len(inst.operands)}")
    operand, pad_value = ctx.operand_shapes(inst)
    _check_array(inst, operand, "operand")
    if not pad_value.is_scalar or pad_value.element_type is not operand.element_type:
        raise inst.error(f"padding value must be a {operand.element_type.value} scalar, got {pad_value}")
    config = inst.attrs.get("padding")
    if config is None or len(config) != operand.rank:
        raise inst.error(f"padding needs one (low, high, interior) entry per dimension ({operand.rank})")
    full_dims: list[int] = []  # the array before negative edges are cut off
    place: list[slice] = []  # where the operand's elements land in it
    cut: list[slice] = []
    out_dims: list[int] = []
    for d, entry in enumerate(config):
        lo, hi, interior = (int(v) for v in entry) if len(entry) == 3 else (*map(int, entry), 0)
        if interior < 0:
            raise inst.error(f"interior padding {interior} of dimension {d} is negative")
        n = operand.dimensions[d]
        spread = n + (n - 1) * interior if n else 0
        size = lo + spread + hi
        if size < 0:
            raise inst.error(f"padding ({lo}, {hi}, {interior}) makes dimension {d} negative ({size})")
        start = max(lo, 0)
        full = start + spread + max(hi, 0)
        full_dims.append(full)
        place.append(slice(start, start + spread, interior + 1))
        cut.append(slice(max(-lo, 0), full - max(-hi, 0)))
        out_dims.append(size)
    if tuple(out_dims) != inst.shape.dimensions:
        raise inst.error(f"result shape {inst.shape} does not match the padded dimensions {out_dims}")
    full_shape, place_key, cut_key = tuple(full_dims), tuple(place), tuple(cut)
    dtype = inst.shape.dtype
    nothing_to_do = all(tuple(int(v) for v in e)[:2] == (0, 0) and (len(e) < 3 or int(e[2]) == 0) for e in config)
    needs_cut = any(s.start or s.stop != n for s, n in zip(cut, full_dims))

    def pad(x: np.ndarray, value: np.ndarray) -> np.ndarray:
        if nothing_to_do:
            return x
        result = np.full(full_shape, value, dtype)
        result[place_key] = x
        return result[cut_key] if needs_cut else result

    return pad


@kernel("concatenate")
def make_concatenate(inst: Instruction, ctx: KernelContext) -> Callable[..., np.ndarray]:
    shapes = ctx.operand_shapes(inst)
    if not shapes:
        raise inst.error("concatenate needs at least one operand")
    for s in shapes:
        _check_array(inst, s, "every operand")
        if s.element_type is not inst.shape.element_type or s.rank != inst.shape.rank:
            raise inst.error(f"operand {s} does not match the result {inst.shape} in type or rank")
    dims = inst.attrs.get("dimensions")
    if dims is None or len(dims) != 1:
        raise inst.error("concatenate needs dimensions=[d]")
    axis = int(dims[0])
    if not 0 <= axis < inst.shape.rank:
        raise inst.error(f"concatenate dimension {axis} out of range for rank {inst.shape.rank}")
    for s in shapes:
        for d in range(s.rank):
            if d != axis and s.dimensions[d] != inst.shape.dimensions[d]:
                raise inst.error(f"operand {s} differs from the result {inst.shape} in dimension {d}")
    if sum(s.dimensions[axis] for s in shapes) != inst.shape.dimensions[axis]:
        raise inst.error(f"operand sizes along dimension {axis} do not add up to the result's")

    def concatenate(*xs: np.ndarray) -> np.ndarray:
        return np.concatenate(xs, axis=axis)

    return concatenate
