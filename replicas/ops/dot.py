"""dot (DotGeneral): batch, contracting and free dimensions in any position.

Both operands are transposed to (batch, free, contract) / (batch, contract, free), flattened to
three dimensions and multiplied with one `np.matmul` (BLAS for floats). The result dimensions are
batch, lhs free, rhs free, as XLA orders them.

Accumulation follows XLA on CPU: floats narrower than f32 (f16, bf16, f8) are multiplied and
summed in f32 and rounded once to the result type; integers are exact modulo 2**64 (int64 matmul
wraps) and then wrap to the result type; pred is "any (a and b)".
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from replicas.hlo.ir import Instruction
from replicas.ops.registry import KernelContext, dimension_list, kernel
from replicas.shapes import PrimitiveType

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)


def _compute_dtype(types: list[PrimitiveType]) -> np.dtype:
    """The dtype both operands are converted to before the matmul."""
    if any(t.is_complex for t in types):
        wide = any(t in (PrimitiveType.C128, PrimitiveType.F64) for t in types)
        return np.dtype(np.complex128 if wide else np.complex64)
    if any(t.is_floating for t in types):
        return _F64 if PrimitiveType.F64 in types else _F32
    if all(t is PrimitiveType.PRED for t in types):
        return np.dtype(np.int64)
    if any(t is PrimitiveType.U64 for t in types):
        return np.dtype(np.uint64)
    return np.dtype(np.int64)


@kernel("dot")
def make_dot(inst: Instruction, ctx: KernelContext) -> Callable[..., np.ndarray]:
    lhs_shape, rhs_shape = ctx.operand_shapes(inst)
    lhs_batch = dimension_list(inst, "lhs_batch_dims")
    rhs_batch = dimension_list(inst, "rhs_batch_dims")
    lhs_contract = dimension_list(inst, "lhs_contracting_dims")
    rhs_contract = dimension_list(inst, "rhs_contracting_dims")
    ldims, rdims = lhs_shape.dimensions, rhs_shape.dimensions
    lhs_free = [d for d in range(lhs_shape.rank) if d not in lhs_batch and d not in lhs_contract]
    rhs_free = [d for d in range(rhs_shape.rank) if d not in rhs_batch and d not in rhs_contract]
    batch_sizes = [ldims[d] for d in lhs_batch]
    out_dims = inst.shape.dimensions

    b = math.prod(batch_sizes)
    m = math.prod(ldims[d] for d in lhs_free)
    k = math.prod(ldims[d] for d in lhs_contract)
    n = math.prod(rdims[d] for d in rhs_free)
    lhs_perm = tuple(lhs_batch + lhs_free + lhs_contract)
    rhs_perm = tuple(rhs_batch + rhs_contract + rhs_free)
    lhs_identity = lhs_perm == tuple(range(lhs_shape.rank))
    rhs_identity = rhs_perm == tuple(range(rhs_shape.rank))

    out_type = inst.shape.element_type
    out_dtype = inst.shape.dtype
    types = [lhs_shape.element_type, rhs_shape.element_type]
    if out_type.is_floating or out_type.is_complex:
        # Integer operands of a float dot are converted to the result type first, as XLA does.
        types.append(out_type)
    compute = _compute_dtype(types)
    is_pred = out_type is PrimitiveType.PRED

    def prepare(
        x: np.ndarray, perm: tuple[int, ...], identity: bool, shape3: tuple[int, int, int]
    ) -> np.ndarray:
        if not identity:
            x = x.transpose(perm)
        if x.dtype != compute:
            x = x.astype(compute)
        return x.reshape(shape3)

    def dot(lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        a = prepare(lhs, lhs_perm, lhs_identity, (b, m, k))
        c = prepare(rhs, rhs_perm, rhs_identity, (b, k, n))
        product = np.matmul(a, c)
        if is_pred:
            product = product != 0
        elif compute.kind == "c" and out_dtype.kind != "c":
            product = product.real
        result = product.reshape(out_dims)
        if result.dtype != out_dtype:
            result = result.astype(out_dtype)
        return result

    return dot
