"""reduce-window and select-and-scatter, over the Window dict of docs/ir.md.

A window dimension has a size, a stride, a base (lhs) dilation, a window (rhs) dilation and
low/high padding (negative padding trims). Kernels iterate over the window's elements (a small
static count) and, for each, take one strided view of the padded base: every call they make is
vectorized over all the window positions at once.

reduce-window folds the window elements in XLA's order, `acc = f(acc, x_k)` starting from the
init values, with one ufunc call per window element for add/multiply/max/min/and/or/xor and one
call of the computation per window element otherwise. Padding and base-dilation holes hold the
init value.

select-and-scatter picks, per window, the element XLA's sequential scan would keep (`select(kept,
candidate)` true keeps the earlier one; padding is never selected), then combines the source
values into the selected positions: `np.add.at` for add, otherwise one call of the scatter
computation per "k-th contribution to the same target" round, in window order (deterministic).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from replicas.hlo.ir import Computation, Instruction
from replicas.ops.recognize import binary_reducer
from replicas.ops.reduce import as_tuple, reducer_ufunc
from replicas.ops.registry import KernelContext, kernel
from replicas.shapes import Shape

# Window copies of up to this many elements are folded in one call (see `_accumulate_windows`).
ACCUMULATE_ELEMENTS = 1 << 20


@dataclass(frozen=True)
class WindowGeometry:
    base_dims: tuple[int, ...]  # the operand's dimensions
    size: tuple[int, ...]
    stride: tuple[int, ...]
    pad: tuple[tuple[int, int], ...]
    lhs_dilate: tuple[int, ...]
    rhs_dilate: tuple[int, ...]

    @property
    def rank(self) -> int:
        return len(self.base_dims)

    @functools.cached_property  # a frozen dataclass's cache: computed once, not per call
    def padded_dims(self) -> tuple[int, ...]:
        return tuple(
            max(0, (n - 1) * ld + 1 if n else 0) + lo + hi
            for n, ld, (lo, hi) in zip(self.base_dims, self.lhs_dilate, self.pad)
        )

    @functools.cached_property
    def output_dims(self) -> tuple[int, ...]:
        out = []
        for p, s, st, rd in zip(self.padded_dims, self.size, self.stride, self.rhs_dilate):
            extent = (s - 1) * rd + 1 if s else 0
            out.append(0 if p < extent or s == 0 else (p - extent) // st + 1)
        return tuple(out)

    @functools.cached_property
    def tiles(self) -> bool:
        """The windows cover the padded base side by side, each element in exactly one window."""
        return (self.size == self.stride and all(d == 1 for d in self.rhs_dilate)
                and self.padded_dims == tuple(o * s for o, s in zip(self.output_dims, self.size)))

    @functools.cached_property
    def trivial_padding(self) -> bool:
        return all(p == (0, 0) for p in self.pad) and all(d == 1 for d in self.lhs_dilate)

    def element_offsets(self) -> list[tuple[int, ...]]:
        """Window elements in XLA's (row-major) order, as offsets into the padded base."""
        return [
            tuple(k * rd for k, rd in zip(ks, self.rhs_dilate))
            for ks in itertools.product(*(range(s) for s in self.size))
        ]

    def view_slices(self, offset: tuple[int, ...]) -> tuple[slice, ...]:
        """The padded-base slice holding window element `offset` for every window position."""
        return tuple(
            slice(o, o + (n - 1) * st + 1, st) if n else slice(0, 0)
            for o, n, st in zip(offset, self.output_dims, self.stride)
        )

    def pad_base(self, x: np.ndarray, fill: Any) -> np.ndarray:
        """The operand dilated and padded, holes and padding filled with `fill`."""
        if self.trivial_padding:
            return x
        grow = [(max(lo, 0), max(hi, 0)) for lo, hi in self.pad]
        dilated = [max(0, (n - 1) * ld + 1) if n else 0 for n, ld in zip(self.base_dims, self.lhs_dilate)]
        full_shape = tuple(d + lo + hi for d, (lo, hi) in zip(dilated, grow))
        full = np.full(full_shape, fill, dtype=x.dtype)
        inner = tuple(slice(lo, lo + d, ld) for (lo, _), d, ld in zip(grow, dilated, self.lhs_dilate))
        full[inner] = x
        trim = tuple(slice(-min(lo, 0), full_shape[i] + min(hi, 0)) for i, (lo, hi) in enumerate(self.pad))
        return full[trim]


def window_geometry(inst: Instruction, base_dims: tuple[int, ...]) -> WindowGeometry:
    """The window's geometry (the shape rule checked its arity and values)."""
    window = inst.attrs["window"]
    rank = len(base_dims)
    size = tuple(int(v) for v in window.get("size", [1] * rank))
    stride = tuple(int(v) for v in window.get("stride", [1] * rank))
    pad = tuple((int(lo), int(hi)) for lo, hi in window.get("pad", [(0, 0)] * rank))
    lhs = tuple(int(v) for v in window.get("lhs_dilate", [1] * rank))
    rhs = tuple(int(v) for v in window.get("rhs_dilate", [1] * rank))
    geometry = WindowGeometry(tuple(base_dims), size, stride, pad, lhs, rhs)
    if any(p < 0 for p in geometry.padded_dims):
        raise inst.error(f"negative padding {list(pad)} removes more than the whole operand")
    return geometry


def _result_shapes(inst: Instruction) -> list[Shape]:
    return list(inst.shape.tuple_shapes) if inst.shape.is_tuple else [inst.shape]


@kernel("reduce-window")
def make_reduce_window(inst: Instruction, ctx: KernelContext) -> Callable[..., Any]:
    shapes = ctx.operand_shapes(inst)
    n = len(shapes) // 2
    inputs = shapes[:n]
    base_dims = inputs[0].dimensions
    geometry = window_geometry(inst, base_dims)
    out_dims = geometry.output_dims
    dtypes = [s.dtype for s in _result_shapes(inst)]
    name = inst.attrs["to_apply"]
    offsets = geometry.element_offsets() if math.prod(out_dims) else []
    slices = [geometry.view_slices(o) for o in offsets]

    # XLA folds only the operand's elements of a window into the init: padding and the holes of a
    # base dilation are skipped. Filling them with the init is the same when the reducer absorbs
    # it (`_absorbs_itself`: adding +0, a max); otherwise each element's step is masked to the
    # positions where it lies inside the operand.
    inside = None if geometry.trivial_padding else geometry.pad_base(np.ones(base_dims, bool), False)

    def _skipping_outside(ufunc: np.ufunc, x: np.ndarray, init: np.ndarray, dtype: np.dtype) -> np.ndarray:
        base = geometry.pad_base(x, np.zeros((), dtype))
        acc = np.full(out_dims, init, dtype=dtype)
        for sl in slices:
            ufunc(acc, base[sl], out=acc, where=inside[sl])
        return acc

    fast = None
    if n == 1 and inputs[0].dtype == dtypes[0]:
        fast = reducer_ufunc(binary_reducer(ctx.computation_ir(name)), dtypes[0])
    if fast is not None and fast[0] is not None:
        ufunc = fast[0]
        dtype = dtypes[0]
        window_numel = len(offsets)
        out_numel = math.prod(out_dims)
        # Many window elements: one `accumulate` over all of them (a strictly left-to-right fold, the
        # same operations in the same order as the loop below) instead of one call per element,
        # while the windows' copy stays small beside the operand.
        accumulate = (window_numel > 4 and dtype.kind in "biuf" and dtype.type.__module__ == "numpy"
                      and (window_numel + 1) * out_numel <= max(4 * math.prod(base_dims), ACCUMULATE_ELEMENTS))

        numpy_type = dtype.kind in "biuf" and dtype.type.__module__ == "numpy"
        scan = _prefix_scan(ufunc, geometry, dtype) if numpy_type and window_numel > 1 else None
        tiles = _tiles_fold(ufunc, geometry, dtype) if accumulate and scan is None else None

        def reduce_window_fast(x: np.ndarray, init: np.ndarray) -> np.ndarray:
            if scan is not None:
                out = scan(x, init)
                if out is not None:
                    return out
            if tiles is not None:
                return tiles(x, init)
            if not slices:
                return np.full(out_dims, init, dtype=dtype)
            if inside is not None and not _absorbs_itself(ufunc, init, dtype):
                return _skipping_outside(ufunc, x, init, dtype)
            base = geometry.pad_base(x, init)
            if accumulate:
                return _accumulate_windows(ufunc, geometry, base, init, dtype)
            acc = np.empty(out_dims, dtype=dtype)
            ufunc(np.asarray(init, dtype), base[slices[0]], out=acc)
            for sl in slices[1:]:
                ufunc(acc, base[sl], out=acc)
            return acc

        return reduce_window_fast

    comp = ctx.computation(name)

    def reduce_window(*operands: np.ndarray) -> Any:
        bases = [geometry.pad_base(x, init) for x, init in zip(operands[:n], operands[n:])]
        acc = [np.full(out_dims, init, dtype=d) for init, d in zip(operands[n:], dtypes)]
        for sl in slices:
            combined = as_tuple(comp(*acc, *[b[sl] for b in bases]), n)
            step = [np.broadcast_to(np.asarray(c, d), out_dims) for c, d in zip(combined, dtypes)]
            acc = step if inside is None else [np.where(inside[sl], c, a) for c, a in zip(step, acc)]
        acc = [np.array(a) for a in acc]
        return acc[0] if n == 1 and not inst.shape.is_tuple else tuple(acc)

    return reduce_window


def _absorbs_itself(ufunc: np.ufunc, init: Any, dtype: np.dtype) -> bool:
    """Whether folding `init` into a value made from `init` leaves it as it is, for the reducers
    `reducer_ufunc` gives: `f(init, init)` is `init` bit for bit (adding a zero of the init's sign,
    multiplying by one or zero, a max, a min, and, or; not adding one)."""
    init = np.asarray(init, dtype)
    return ufunc(init, init).tobytes() == init.tobytes()


def _prefix_scan(ufunc: np.ufunc, geometry: WindowGeometry, dtype: np.dtype) -> Callable[..., Any] | None:
    """Windows along one axis that all start in the low padding (or at its first element) and end
    inside the operand: XLA's cumulative sums and maxima. Window j's fold is then the fold of the
    init over the padding it covers, which is the init itself when `f(init, init)` is the init (bit
    for bit, checked each call: the kernel returns None otherwise), followed by the operand's first
    elements: one `accumulate` over the init and the operand gives every window (the same operations
    in the same order as the fold). None when the geometry is not such a scan."""
    axes = [a for a, (s, lo_hi) in enumerate(zip(geometry.size, geometry.pad)) if s != 1 or lo_hi != (0, 0)]
    if len(axes) != 1 or any(d != 1 for d in geometry.lhs_dilate + geometry.rhs_dilate):
        return None
    a = axes[0]
    if any(st != 1 for i, st in enumerate(geometry.stride) if i != a):
        return None
    n, w, st, lo = geometry.base_dims[a], geometry.size[a], geometry.stride[a], geometry.pad[a][0]
    out = geometry.output_dims[a]
    if not out or lo < 0 or (out - 1) * st > lo or (out - 1) * st + w - 1 - lo > n - 1:
        return None
    picks = np.maximum(np.arange(out) * st + w - lo, 0)  # window j: the accumulation after its last element
    rank = geometry.rank
    shape = tuple(geometry.base_dims[i] for i in range(rank) if i != a) + (n + 1,)
    back = tuple(range(a)) + (rank - 1,) + tuple(range(a, rank - 1))  # the scanned axis to its place again

    def scan(x: np.ndarray, init: np.ndarray) -> np.ndarray | None:
        init = np.asarray(init, dtype)
        if ufunc(init, init).tobytes() != init.tobytes():
            return None
        acc = np.empty(shape, dtype)
        acc[..., 0] = init
        acc[..., 1:] = np.moveaxis(x, a, -1)
        ufunc.accumulate(acc, axis=-1, dtype=dtype, out=acc)
        return np.ascontiguousarray(acc[..., picks].transpose(back))

    return scan


def _tiles_fold(ufunc: np.ufunc, geometry: WindowGeometry, dtype: np.dtype) -> Callable[..., Any] | None:
    """`_accumulate_windows` of windows side by side over an unpadded operand (XLA's blocks of a row
    reduction), its shapes worked out once: one copy of the operand behind a column of inits, one
    `accumulate`."""
    if not geometry.tiles or not geometry.trivial_padding:
        return None
    out_dims, size = geometry.output_dims, geometry.size
    rank = geometry.rank
    count = math.prod(size)
    tiled = tuple(d for pair in zip(out_dims, size) for d in pair)
    order = tuple(range(0, 2 * rank, 2)) + tuple(range(1, 2 * rank, 2))  # positions first, then the window
    rows_shape = tuple(out_dims) + (count + 1,)
    windows_shape = tuple(out_dims) + tuple(size)

    def fold(x: np.ndarray, init: np.ndarray) -> np.ndarray:
        rows = np.empty(rows_shape, dtype)
        rows[..., 0] = init
        # Splitting the contiguous last axis of the slice is always a view: the copy lands in `rows`.
        np.reshape(rows[..., 1:], windows_shape, copy=False)[...] = x.reshape(tiled).transpose(order)
        ufunc.accumulate(rows, axis=-1, dtype=dtype, out=rows)
        return rows[..., count].copy()

    return fold


def _accumulate_windows(ufunc: np.ufunc, geometry: WindowGeometry, base: np.ndarray, init: Any,
                        dtype: np.dtype) -> np.ndarray:
    """`acc = ufunc(acc, x_k)` over the window elements in XLA's order, from `init`: the windows as one
    (positions, elements + 1) array, the init its first column, folded by `ufunc.accumulate` along
    the elements (accumulate never reorders, unlike a reduction's pairwise sums)."""
    out_dims = geometry.output_dims
    size = tuple(geometry.size)
    rank = len(size)
    if geometry.tiles:  # windows side by side: a reshape and a transpose, no strided view to build
        tiled = base.reshape(tuple(d for pair in zip(out_dims, size) for d in pair))
        windows = tiled.transpose(tuple(range(1, 2 * rank, 2)) + tuple(range(0, 2 * rank, 2)))
    else:
        strides = base.strides
        windows = np.lib.stride_tricks.as_strided(
            base, shape=size + tuple(out_dims),
            strides=tuple(s * d for s, d in zip(strides, geometry.rhs_dilate))
            + tuple(s * st for s, st in zip(strides, geometry.stride)), writeable=False)
    count = math.prod(geometry.size)
    # The window's elements along the last axis: accumulate runs along contiguous rows (along the
    # first axis it is many times slower), in the same order per window.
    rows = np.empty(tuple(out_dims) + (count + 1,), dtype=dtype)
    rows[..., 0] = init
    rows[..., 1:] = windows.transpose(tuple(range(rank, 2 * rank)) + tuple(range(rank))).reshape(
        tuple(out_dims) + (count,))
    ufunc.accumulate(rows, axis=-1, dtype=dtype, out=rows)
    return rows[..., count].copy()


_COMPARE_UFUNCS = {
    "GE": np.greater_equal,
    "GT": np.greater,
    "LE": np.less_equal,
    "LT": np.less,
    "EQ": np.equal,
    "NE": np.not_equal,
}


def _select_compare(comp: Computation) -> np.ufunc | None:
    """The numpy comparison equal to a `compare(param0, param1)` select computation, if it is one."""
    params = comp.parameters
    root = comp.root_instruction
    if (
        len(params) != 2
        or root.opcode != "compare"
        or len(comp.instructions) != 3
        or root.operands != [params[0].name, params[1].name]
    ):
        return None
    if root.attrs.get("type") == "TOTALORDER":
        return None
    return _COMPARE_UFUNCS.get(root.attrs.get("comparison_direction"))


@kernel("select-and-scatter")
def make_select_and_scatter(inst: Instruction, ctx: KernelContext) -> Callable[..., np.ndarray]:
    operand_shape = ctx.operand_shapes(inst)[0]
    geometry = window_geometry(inst, operand_shape.dimensions)
    out_dims = geometry.output_dims
    dtype = inst.shape.dtype
    dims = operand_shape.dimensions
    numel = operand_shape.numel
    offsets = geometry.element_offsets() if math.prod(out_dims) else []
    slices = [geometry.view_slices(o) for o in offsets]
    # Static per-window-element data: which operand element each window position reads.
    positions = geometry.pad_base(np.arange(numel, dtype=np.int64).reshape(dims), -1)
    element_index = [np.ascontiguousarray(positions[sl]) for sl in slices]
    element_valid = [idx >= 0 for idx in element_index]

    compare = _select_compare(ctx.computation_ir(inst.attrs["select"]))
    select = compare or ctx.computation(inst.attrs["select"])
    scatter_name = binary_reducer(ctx.computation_ir(inst.attrs["scatter"]))
    fast_scatter = reducer_ufunc(scatter_name, dtype)
    scatter_comp = (
        None
        if fast_scatter is not None and fast_scatter[0] is not None
        else ctx.computation(inst.attrs["scatter"])
    )

    def select_positions(operand: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        base = geometry.pad_base(operand, np.zeros((), dtype))
        kept_value = kept_index = has = None
        for sl, idx, valid in zip(slices, element_index, element_valid):
            value = base[sl]
            if kept_value is None:
                kept_value, kept_index, has = value, idx, valid
                continue
            keep = np.asarray(select(kept_value, value), dtype=np.bool_)
            take = valid & ~(has & keep)
            kept_value = np.where(take, value, kept_value)
            kept_index = np.where(take, idx, kept_index)
            has = has | valid
        return kept_index.reshape(-1), has.reshape(-1)

    def scatter(out: np.ndarray, targets: np.ndarray, values: np.ndarray) -> np.ndarray:
        if scatter_comp is None:
            ufunc, wide = fast_scatter
            acc = out.astype(wide)
            ufunc.at(acc, targets, values.astype(wide))
            return acc.astype(dtype)
        order = np.argsort(targets, kind="stable")
        targets, values = targets[order], values[order]
        positions = np.arange(len(targets))
        starts = np.ones(len(targets), dtype=np.bool_)
        starts[1:] = targets[1:] != targets[:-1]
        rank = positions - np.maximum.accumulate(np.where(starts, positions, 0))
        for r in range(int(rank.max()) + 1 if len(rank) else 0):
            chosen = rank == r
            t = targets[chosen]
            out[t] = np.asarray(scatter_comp(out[t], values[chosen]), dtype=dtype)
        return out

    def select_and_scatter(operand: np.ndarray, source: np.ndarray, init: np.ndarray) -> np.ndarray:
        out = np.full(numel, init, dtype=dtype)
        if not slices:
            return out.reshape(dims)
        index, has = select_positions(operand)
        out = scatter(out, index[has], source.reshape(-1)[has])
        return out.reshape(dims)

    return select_and_scatter
