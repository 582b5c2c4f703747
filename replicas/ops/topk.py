"""topk (the opcode JAX lowers `lax.top_k` to) and XLA:CPU's `TopK` custom call (its compiled form).

Both return the k largest (or, for `largest=false`, smallest) elements of the last dimension and
their s32 indices, sorted, ties by the lower index. The order is XLA:CPU's total order
(-NaN < -inf < -0 < +0 < inf < NaN, `runtime_topk.cc`): one stable sort of the order key.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from replicas.hlo.ir import Instruction
from replicas.ops.custom_call import builtin_target
from replicas.ops.registry import KernelContext, kernel
from replicas.ops.sort import order_key, stable_permutation


def _make_topk(inst: Instruction, largest: bool) -> Callable[[np.ndarray], tuple[np.ndarray, ...]]:
    values_shape, indices_shape = inst.shape.tuple_shapes
    k = values_shape.dimensions[-1]
    index_dtype = indices_shape.dtype

    def topk(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        key = order_key(x, total_order=True)
        if largest:
            key = ~key  # descending; the stable sort keeps ties in index order
        order = stable_permutation(key, x.ndim - 1)[..., :k]
        return np.take_along_axis(x, order, axis=-1), order.astype(index_dtype)

    return topk


@kernel("topk")
def make_topk_opcode(inst: Instruction, ctx: KernelContext) -> Callable[[np.ndarray], tuple[np.ndarray, ...]]:
    return _make_topk(inst, bool(inst.attrs.get("largest", True)))  # the verifier checked the shapes


@builtin_target("TopK")
def make_topk_custom_call(inst: Instruction, ctx: KernelContext) -> Callable[[np.ndarray], tuple[np.ndarray, ...]]:
    # A custom call's shapes are the program's word alone (no shape rule checks a target): checked here.
    shapes = ctx.operand_shapes(inst)
    if len(shapes) != 1:
        raise inst.error(f"TopK takes one operand, got {len(shapes)}")
    operand = shapes[0]
    results = inst.shape.tuple_shapes if inst.shape.is_tuple else ()
    if len(results) != 2 or not operand.is_array or operand.rank < 1:
        raise inst.error(f"TopK takes an array and returns (values, indices), got {operand} -> {inst.shape}")
    values_shape, indices_shape = results
    k = values_shape.dimensions[-1] if values_shape.rank else -1
    expected = operand.dimensions[:-1] + (k,)
    if values_shape.dimensions != expected or indices_shape.dimensions != expected or not \
            0 <= k <= operand.dimensions[-1]:
        raise inst.error(f"TopK of {operand} cannot give {inst.shape}")
    # XLA:CPU's TopK is always the largest (its comparator is a greater-than).
    return _make_topk(inst, largest=True)
