"""sort: one or more operands sorted together along one dimension by a comparator computation.

Fast path, when `recognize.sort_comparator` finds `key_lhs < key_rhs` (or `>`) on the first
operand: the keys become unsigned integers whose order is XLA's (for floats with TOTALORDER:
-NaN < -inf < ... < -0 < +0 < ... < inf < NaN; with the plain FLOAT compare -0 and +0 are equal
and every NaN sorts last), one stable `np.argsort`, and the permutation applied to every operand.

The comparator jax emits for `lax.sort` on floats (canonicalize NaN and zeros, then TOTALORDER)
is recognized too: its order is that FLOAT order.

A comparator `f(lhs_k) < f(rhs_k)` of one pure function `f` (`recognize.symmetric_key`; jax's
float sort now orders the canonicalized floats' bits this way): `f` on the whole operand k (its
kernels take whole arrays, as a comparator's do), then the same stable sort by that key.

Any other comparator: a bottom-up merge sort along the dimension whose comparisons call the
comparator once per step on whole arrays. Each element finds its place in the merged run by a
binary search in the other run (log2(width) calls per level, log2(n) levels); ties keep the
left run first, so the sort is stable (XLA's `is_stable` is always honoured).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from replicas.errors import ProgramError
from replicas.hlo.ir import Computation, Instruction
from replicas.ops.elementwise_util import WithOperandShapes, quiet
from replicas.ops.recognize import sort_comparator, symmetric_key
from replicas.ops.registry import KernelContext, kernel, lookup
from replicas.shapes import PrimitiveType

_UNSIGNED = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32), 8: np.dtype(np.uint64)}


def _is_float(dtype: np.dtype) -> bool:
    try:
        return PrimitiveType.from_dtype(dtype).is_floating  # numpy floats and ml_dtypes (bf16, f8)
    except ProgramError:
        return False


def order_key(x: np.ndarray, total_order: bool) -> np.ndarray:
    """Unsigned integers that sort (as integers) in XLA's ascending order of `x`."""
    dtype = x.dtype
    if dtype == np.bool_:
        return x.view(np.uint8)
    if dtype.kind == "u":
        return x
    unsigned = _UNSIGNED[dtype.itemsize]
    sign_bit = unsigned.type(1 << (8 * dtype.itemsize - 1))
    if dtype.kind == "i":
        return x.view(unsigned) ^ sign_bit
    if not total_order:
        # A FLOAT compare sees -0 == +0 and orders no NaN: make zeros equal and NaNs the largest.
        x = np.where(x == 0, np.zeros((), dtype), x)
        x = np.where(np.isnan(x), np.asarray(np.nan, dtype), x)
    bits = np.ascontiguousarray(x).view(unsigned)
    negative = (bits & sign_bit) != 0
    return np.where(negative, ~bits, bits | sign_bit)


def stable_permutation(key: np.ndarray, axis: int) -> np.ndarray:
    """`np.argsort(key, axis, kind="stable")` for unsigned keys, faster for keys of up to 32 bits.

    Such a key and its position along the axis fit one u64 whose values are all distinct, so numpy's
    fast (unstable, SIMD) sort gives the stable order.
    """
    length = key.shape[axis]
    if key.dtype.itemsize > 4 or length >= 1 << 32:
        return np.argsort(key, axis=axis, kind="stable")
    position = np.arange(length, dtype=np.uint64).reshape([-1 if d == axis else 1 for d in range(key.ndim)])
    composite = np.sort((key.astype(np.uint64) << np.uint64(32)) | position, axis=axis)
    return (composite & np.uint64(0xFFFFFFFF)).astype(np.intp)


def _constant_is(comp: Computation, name: str, test: Callable[[np.ndarray], bool]) -> bool:
    inst = comp.by_name.get(name)
    if inst is None or inst.opcode != "constant":
        return False
    literal = inst.attrs.get("literal")
    return isinstance(literal, np.ndarray) and literal.ndim == 0 and bool(test(literal.astype(np.float64)))


def _canonicalized_parameter(comp: Computation, name: str) -> int | None:
    """The parameter number if `name` is jax's float canonicalization of that parameter:
    `select(p != p, NaN, select(p == 0, 0, p))`, else None."""
    by_name = comp.by_name
    outer = by_name.get(name)
    if outer is None or outer.opcode != "select" or len(outer.operands) != 3:
        return None
    is_nan, nan, inner_name = outer.operands
    inner = by_name.get(inner_name)
    if inner is None or inner.opcode != "select" or len(inner.operands) != 3:
        return None
    is_zero, zero, param_name = inner.operands
    param = by_name.get(param_name)
    if param is None or param.opcode != "parameter":
        return None
    nan_test, zero_test = by_name.get(is_nan), by_name.get(is_zero)
    if (
        nan_test is None
        or nan_test.opcode != "compare"
        or nan_test.operands != [param_name, param_name]
        or nan_test.attrs.get("comparison_direction") != "NE"
    ):
        return None
    if (
        zero_test is None
        or zero_test.opcode != "compare"
        or zero_test.attrs.get("comparison_direction") != "EQ"
        or sorted(zero_test.operands, key=lambda n: n != param_name) != [param_name, zero]
    ):
        return None
    if not (_constant_is(comp, nan, np.isnan) and _constant_is(comp, zero, lambda v: v == 0)):
        return None
    return int(param.attrs["parameter_number"])


def jax_float_comparator(comp: Computation) -> tuple[str, bool] | None:
    """("lt" | "gt", False) for the comparator jax emits for `lax.sort` of floats (NaN and -0.0
    canonicalized, then a TOTALORDER compare of the first operand's pair): that order is exactly
    the FLOAT order of `order_key(x, total_order=False)`."""
    root = comp.root_instruction
    if root.opcode != "compare" or root.attrs.get("type") != "TOTALORDER" or len(root.operands) != 2:
        return None
    direction = root.attrs.get("comparison_direction")
    if direction not in ("LT", "GT"):
        return None
    params = [_canonicalized_parameter(comp, name) for name in root.operands]
    if params == [1, 0]:
        direction = "GT" if direction == "LT" else "LT"
    elif params != [0, 1]:
        return None
    return direction.lower(), False


def _fast_key_supported(dtype: np.dtype) -> bool:
    return dtype == np.bool_ or dtype.kind in "iu" or (_is_float(dtype) and dtype.itemsize in _UNSIGNED)


def merge_sort_last(comparator: Callable[..., Any], operands: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Stable sort of 2-D arrays (rows, n) along the last axis with an element-wise comparator.

    `comparator(lhs_0, rhs_0, lhs_1, rhs_1, ...)` is true where lhs sorts strictly before rhs.
    """
    rows, n = operands[0].shape
    current = list(operands)
    position = np.arange(n, dtype=np.int64)
    width = 1
    while width < n:
        block_start = position // (2 * width) * (2 * width)
        offset = position - block_start
        is_left = offset < width
        index_in_run = np.where(is_left, offset, offset - width)
        other_start = np.where(is_left, block_start + width, block_start)
        other_length = np.where(is_left, np.clip(n - (block_start + width), 0, width), width)
        # Each element counts the elements of the other run that go before it: for a left element
        # those strictly less, for a right element those not greater (ties: left first).
        low = np.zeros((rows, n), dtype=np.int64)
        high = np.broadcast_to(other_length, (rows, n)).copy()
        while True:
            active = low < high
            if not active.any():
                break
            middle = (low + high) // 2
            gather = np.minimum(other_start + middle, n - 1)
            others = [np.take_along_axis(v, gather, axis=1) for v in current]
            args: list[np.ndarray] = []
            for mine, other in zip(current, others):
                args.append(np.where(is_left, other, mine))
                args.append(np.where(is_left, mine, other))
            before = np.broadcast_to(np.asarray(comparator(*args), dtype=np.bool_), (rows, n))
            advance = np.where(is_left, before, ~before)
            low = np.where(active & advance, middle + 1, low)
            high = np.where(active & ~advance, middle, high)
        destination = block_start + index_in_run + low
        merged = []
        for v in current:
            out = np.empty_like(v)
            np.put_along_axis(out, destination, v, axis=1)
            merged.append(out)
        current = merged
        width *= 2
    return current


@kernel("sort")
def make_sort(inst: Instruction, ctx: KernelContext) -> Callable[..., Any]:
    shapes = ctx.operand_shapes(inst)
    dims = shapes[0].dimensions
    n = len(shapes)
    as_tuple = inst.shape.is_tuple
    rank = len(dims)
    axis = int(inst.attrs["dimensions"][0])
    name = inst.attrs["to_apply"]
    comparator_ir = ctx.computation_ir(name)

    def pack(values: Sequence[np.ndarray]) -> Any:
        return tuple(values) if as_tuple else values[0]

    if rank == 0 or dims[axis] <= 1:
        return lambda *values: pack([np.array(v) for v in values])

    recognized = sort_comparator(comparator_ir) or jax_float_comparator(comparator_ir)
    if recognized is not None and _fast_key_supported(shapes[0].dtype):
        direction, total_order = recognized

        def sort_fast(*values: np.ndarray) -> Any:
            with quiet():
                key = order_key(values[0], total_order)
                if direction == "gt":
                    key = ~key
                permutation = stable_permutation(key, axis)
            return pack([np.take_along_axis(v, permutation, axis=axis) for v in values])

        if n == 1 and (shapes[0].dtype.kind in "iub"):
            # Equal integers are identical, so an unstable sort of the values is the stable result.
            def sort_integers(x: np.ndarray) -> Any:
                ordered = np.sort(x, axis=axis)
                return pack([np.flip(ordered, axis=axis).copy() if direction == "gt" else ordered])

            return sort_integers
        return sort_fast

    keyed = _keyed_sort(comparator_ir, ctx, axis, pack)
    if keyed is not None:
        return keyed

    comparator = ctx.computation(name)
    length = dims[axis]

    def sort_generic(*values: np.ndarray) -> Any:
        moved = [np.moveaxis(v, axis, -1) for v in values]
        outer = moved[0].shape[:-1]
        flat = [m.reshape(-1, length) for m in moved]
        with quiet():
            ordered = merge_sort_last(comparator, flat)
        return pack(
            [np.ascontiguousarray(np.moveaxis(o.reshape(outer + (length,)), -1, axis)) for o in ordered]
        )

    return sort_generic


def _keyed_sort(comparator: Computation, ctx: KernelContext, axis: int,
                pack: Callable[[Sequence[np.ndarray]], Any]) -> Callable[..., Any] | None:
    """The sort by a symmetric comparator's key function, or None."""
    found = symmetric_key(comparator)
    if found is None or not _fast_key_supported(comparator.by_name[found.key].shape.dtype):
        return None
    by_name = comparator.by_name
    kernels = [(inst.name, lookup(inst)(inst, WithOperandShapes(ctx, [by_name[o].shape for o in inst.operands])),
                inst.operands) for inst in found.steps]
    parameter, key_name, operand, direction, total = (found.parameter, found.key, found.operand, found.direction,
                                                      found.total_order)

    def sort_by_key(*values: np.ndarray) -> Any:
        x = values[operand]
        with quiet():
            computed = {parameter: x}
            for step_name, fn, operands in kernels:
                computed[step_name] = fn(*[computed[o] for o in operands])
            key = order_key(np.broadcast_to(computed[key_name], x.shape), total)
            if direction == "gt":
                key = ~key
            permutation = stable_permutation(key, axis)
        return pack([np.take_along_axis(v, permutation, axis=axis) for v in values])

    return sort_by_key
