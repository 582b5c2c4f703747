"""reduce: N inputs, N scalar inits, a reducer computation and the dimensions to reduce.

Fast path: one input whose reducer `recognize.binary_reducer` names (add, multiply, maximum,
minimum, and, or, xor) is one numpy ufunc reduction, with the init value as `initial` (so it is
combined once, as XLA does, and empty reductions give the init). Floats narrower than f32 are
reduced in f32 and rounded once. max/min propagate NaN, like XLA.

Otherwise the computation is evaluated on whole arrays by a pairwise tree: the reduced axes are
moved last and flattened, then each level combines neighbours (element 2i with 2i+1, so the
operands of every call stay in their original order) with one call of the computation, an odd
last element carried to the next level; the init is combined once, on the left, at the end (as
XLA:CPU applies it once). That is
log2(n) calls, never a per-element loop, and it handles variadic reducers such as argmax.

When every output element reduces exactly one input element (no dimensions, or only size-1
dimensions) the result is the input reshaped, init ignored: XLA's algebraic simplifier rewrites
such a reduce to a reshape (the init is assumed to be an identity), so that is what XLA returns.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from replicas.hlo.ir import Instruction
from replicas.ops.recognize import binary_reducer
from replicas.ops.registry import KernelContext, kernel
from replicas.shapes import Shape

_F32 = np.dtype(np.float32)

_FLOAT_UFUNCS: dict[str, np.ufunc] = {
    "add": np.add,
    "multiply": np.multiply,
    "maximum": np.maximum,
    "minimum": np.minimum,
}
_INT_UFUNCS: dict[str, np.ufunc] = {
    **_FLOAT_UFUNCS,
    "and": np.bitwise_and,
    "or": np.bitwise_or,
    "xor": np.bitwise_xor,
}
# XLA's arithmetic on pred: add is or, multiply is and (values are 0/1 and saturate).
_PRED_UFUNCS: dict[str, np.ufunc] = {
    "add": np.logical_or,
    "multiply": np.logical_and,
    "maximum": np.logical_or,
    "minimum": np.logical_and,
    "and": np.logical_and,
    "or": np.logical_or,
    "xor": np.logical_xor,
}


def reducer_ufunc(name: str | None, dtype: np.dtype) -> tuple[np.ufunc, np.dtype] | None:
    """(ufunc, dtype to reduce in) for a recognized reducer on `dtype`, or None."""
    if name is None:
        return None
    if dtype == np.bool_:
        return _PRED_UFUNCS.get(name), dtype
    if dtype.kind in "iu":
        ufunc = _INT_UFUNCS.get(name)
        return (ufunc, dtype) if ufunc is not None else None
    if dtype.kind == "c":
        ufunc = {"add": np.add, "multiply": np.multiply}.get(name)
        return (ufunc, dtype) if ufunc is not None else None
    ufunc = _FLOAT_UFUNCS.get(name)
    if ufunc is None:
        return None
    # f16, bf16 and f8 (ml_dtypes or numpy) accumulate in f32; f32 and f64 in themselves.
    wide = dtype if dtype.itemsize >= 4 else _F32
    return ufunc, wide


def as_tuple(value: Any, n: int) -> tuple[Any, ...]:
    """A computation's result as a tuple of n values (a single array when n == 1)."""
    if n == 1 and not isinstance(value, tuple):
        return (value,)
    return tuple(value)


def _result_shapes(inst: Instruction) -> list[Shape]:
    shape = inst.shape
    return list(shape.tuple_shapes) if shape.is_tuple else [shape]


def tree_reduce_last(
    comp: Callable[..., Any],
    values: Sequence[np.ndarray],
    inits: Sequence[np.ndarray],
    dtypes: Sequence[np.dtype],
) -> list[np.ndarray]:
    """Reduce the last axis of every array in `values` with the N-ary reducer `comp` on whole arrays.

    Returns the reduced arrays (shape without the last axis), with the inits combined on the left.
    """
    n = len(values)
    outer = values[0].shape[:-1]
    length = values[0].shape[-1]
    current = list(values)
    if length == 0:
        return [np.broadcast_to(np.asarray(i, d), outer).copy() for i, d in zip(inits, dtypes)]
    while length > 1:
        # An odd last element waits for the next level (padding with the init would apply it twice).
        pairs = length // 2
        left = [v[..., 0:2 * pairs:2] for v in current]
        right = [v[..., 1:2 * pairs:2] for v in current]
        combined = as_tuple(comp(*left, *right), n)
        combined = [np.broadcast_to(np.asarray(c, d), outer + (pairs,)) for c, d in zip(combined, dtypes)]
        if length % 2:
            combined = [np.concatenate([c, v[..., -1:]], axis=-1) for c, v in zip(combined, current)]
        length = pairs + length % 2
        current = combined
    last = [v[..., 0] for v in current]
    init_arrays = [np.broadcast_to(np.asarray(i, d), outer) for i, d in zip(inits, dtypes)]
    final = as_tuple(comp(*init_arrays, *last), n)
    return [np.array(np.broadcast_to(np.asarray(f, d), outer)) for f, d in zip(final, dtypes)]


@kernel("reduce")
def make_reduce(inst: Instruction, ctx: KernelContext) -> Callable[..., Any]:
    # The verifier checked N array inputs of one shape, N scalar inits, the dimensions, the result
    # shapes and the reducer (hlo/shape_inference/reduce.py).
    shapes = ctx.operand_shapes(inst)
    n = len(shapes) // 2
    input_shapes = shapes[:n]
    dims_in = input_shapes[0].dimensions
    rank = len(dims_in)
    dimensions = sorted(int(d) for d in inst.attrs.get("dimensions", []))
    kept = [d for d in range(rank) if d not in dimensions]
    out_dims = tuple(dims_in[d] for d in kept)
    results = _result_shapes(inst)
    dtypes = [s.dtype for s in results]
    name = inst.attrs["to_apply"]

    if input_shapes[0].numel == math.prod(out_dims):

        def reduce_nothing(*operands: np.ndarray) -> Any:
            out = [np.asarray(v, dtype=d).reshape(out_dims) for v, d in zip(operands[:n], dtypes)]
            return out[0] if n == 1 and not inst.shape.is_tuple else tuple(out)

        return reduce_nothing

    fast = None
    if n == 1 and input_shapes[0].dtype == dtypes[0]:
        fast = reducer_ufunc(binary_reducer(ctx.computation_ir(name)), dtypes[0])
    axes = tuple(dimensions)
    out_dtype = dtypes[0]

    if fast is not None and fast[0] is not None:
        ufunc, wide = fast

        def reduce_fast(x: np.ndarray, init: np.ndarray) -> np.ndarray:
            if x.dtype != wide:
                x = x.astype(wide)
            r = ufunc.reduce(x, axis=axes, initial=np.asarray(init, wide)[()], dtype=wide)
            return np.asarray(r, dtype=out_dtype).reshape(out_dims)

        return reduce_fast

    comp = ctx.computation(name)
    perm = tuple(kept) + axes
    flat_shape = out_dims + (-1,)

    def reduce_tree(*operands: np.ndarray) -> Any:
        values = [
            np.asarray(v).transpose(perm).reshape(flat_shape)
            if v.size
            else np.empty(out_dims + (0,), v.dtype)
            for v in operands[:n]
        ]
        out = tree_reduce_last(comp, values, operands[n:], dtypes)
        return out[0] if n == 1 and not inst.shape.is_tuple else tuple(out)

    return reduce_tree
