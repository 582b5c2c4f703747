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


@kernel("slice")
def make_slice(inst: Instruction, ctx: KernelContext) -> Callable[[np.ndarray], np.ndarray]:
    key = tuple(slice(*(int(v) for v in entry)) for entry in inst.attrs["slice"])
    if not key:  # x[()] would turn a 0-d array into a numpy scalar
        return _identity

    def slice_(x: np.ndarray) -> np.ndarray:
        return x[key]

    return slice_


def _identity(x: np.ndarray, *ignored: np.ndarray) -> np.ndarray:
    return x


def _start_index_reader(inst: Instruction, index_shapes: list[Shape], rank: int) -> Callable[[tuple], list[int]]:
    """Start indices come as `rank` scalars (current HLO) or one rank-1 array (the old form)."""
    if len(index_shapes) == rank and all(s.rank == 0 for s in index_shapes):
        def scalars(values: tuple) -> list[int]:
            return [int(v) for v in values]

        return scalars

    def vector(values: tuple) -> list[int]:
        return [int(v) for v in values[0]]

    return vector


def _clamped_slices(starts: list[int], sizes: tuple[int, ...], dims: tuple[int, ...]) -> tuple[slice, ...]:
    key = []
    for start, size, dim in zip(starts, sizes, dims):
        start = max(min(start, dim - size), 0)
        key.append(slice(start, start + size))
    return tuple(key)


@kernel("dynamic-slice")
def make_dynamic_slice(inst: Instruction, ctx: KernelContext) -> Callable[..., np.ndarray]:
    shapes = ctx.operand_shapes(inst)
    operand = shapes[0]
    sizes = inst.shape.dimensions
    read_starts = _start_index_reader(inst, shapes[1:], operand.rank)
    if operand.rank == 0:
        return _identity
    if len(shapes) - 1 == operand.rank and all(s.rank == 0 for s in shapes[1:]):
        # Scalar starts (current HLO), clamped against the static shapes: the per-trip read of a scan.
        slices_of = _scalar_slicer(_bounds(sizes, operand.dimensions))

        def dynamic_slice_scalars(x: np.ndarray, *indices: np.ndarray) -> np.ndarray:
            return x[slices_of(indices)]

        return dynamic_slice_scalars

    def dynamic_slice(x: np.ndarray, *indices: np.ndarray) -> np.ndarray:
        return x[_clamped_slices(read_starts(indices), sizes, x.shape)]

    return dynamic_slice


def _bounds(sizes: tuple[int, ...], dims: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """(size, largest start) per dimension."""
    return tuple((size, max(dim - size, 0)) for size, dim in zip(sizes, dims))


def _scalar_slicer(bounds: tuple[tuple[int, int], ...]) -> Callable[[tuple], tuple[slice, ...]]:
    """`_scalar_slices` for these bounds, with the dimensions every start clamps to 0 (the slice
    takes the whole dimension) fixed once: a scan's per-trip read or write of one row reads one start."""
    moving = [d for d, (_, last) in enumerate(bounds) if last > 0]
    if len(moving) != 1:
        return lambda indices: _scalar_slices(indices, bounds)
    d = moving[0]
    size, last = bounds[d]
    before = tuple(slice(0, s) for s, _ in bounds[:d])
    after = tuple(slice(0, s) for s, _ in bounds[d + 1:])

    def slices(indices: tuple) -> tuple[slice, ...]:
        start = int(indices[d])
        start = 0 if start < 0 else last if start > last else start
        return (*before, slice(start, start + size), *after)

    return slices


def _scalar_slices(indices: tuple, bounds: tuple[tuple[int, int], ...]) -> tuple[slice, ...]:
    key = []
    for v, (size, last) in zip(indices, bounds):
        start = int(v)
        start = 0 if start < 0 else last if start > last else start
        key.append(slice(start, start + size))
    return tuple(key)


@kernel("dynamic-update-slice")
def make_dynamic_update_slice(inst: Instruction, ctx: KernelContext) -> Callable[..., np.ndarray]:
    shapes = ctx.operand_shapes(inst)
    read_starts = _start_index_reader(inst, shapes[2:], shapes[0].rank)
    if len(shapes) - 2 == shapes[0].rank and all(s.rank == 0 for s in shapes[2:]):
        where = _scalar_slicer(_bounds(shapes[1].dimensions, shapes[0].dimensions))
    else:
        def where(indices: tuple) -> tuple[slice, ...]:
            return _clamped_slices(read_starts(indices), shapes[1].dimensions, shapes[0].dimensions)

    def dynamic_update_slice(x: np.ndarray, u: np.ndarray, *indices: np.ndarray) -> np.ndarray:
        result = x.copy()
        result[where(indices)] = u
        return result

    def in_place(x: np.ndarray, u: np.ndarray, *indices: np.ndarray) -> np.ndarray:
        """The same, writing into `x`: the interpreter calls it when nothing else can see `x`."""
        x[where(indices)] = u
        return x

    dynamic_update_slice.in_place = in_place  # type: ignore[attr-defined]
    return dynamic_update_slice


@kernel("pad")
def make_pad(inst: Instruction, ctx: KernelContext) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """Edge padding (negative = cut) and interior padding between elements, per dimension."""
    operand = ctx.operand_shapes(inst)[0]
    config = inst.attrs["padding"]
    full_dims: list[int] = []  # the array before negative edges are cut off
    place: list[slice] = []  # where the operand's elements land in it
    cut: list[slice] = []
    for d, entry in enumerate(config):
        lo, hi, interior = (int(v) for v in entry) if len(entry) == 3 else (*map(int, entry), 0)
        n = operand.dimensions[d]
        spread = n + (n - 1) * interior if n else 0
        start = max(lo, 0)
        full = start + spread + max(hi, 0)
        full_dims.append(full)
        place.append(slice(start, start + spread, interior + 1))
        cut.append(slice(max(-lo, 0), full - max(-hi, 0)))
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
    axis = int(inst.attrs["dimensions"][0])

    def concatenate(*xs: np.ndarray) -> np.ndarray:
        return np.concatenate(xs, axis=axis)

    return concatenate
