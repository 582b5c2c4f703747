"""Shape rules of slice, dynamic-slice, dynamic-update-slice, pad and concatenate."""

from __future__ import annotations

from replicas.hlo.shape_inference.base import Ctx, array_shape, rule
from replicas.shapes import Shape


@rule("slice")
def _slice(c: Ctx) -> Shape:
    s = c.array(0)
    spec = c.attr("slice")
    if len(spec) != s.rank:
        raise c.fail(f"slice has {len(spec)} entries, expected one per operand dimension ({s.rank})")
    out = []
    for i, entry in enumerate(spec):
        start, limit, stride = (list(entry) + [1])[:3]
        if stride < 1:
            raise c.fail(f"stride {stride} in dimension {i} must be positive")
        if not 0 <= start <= limit <= s.dimensions[i]:
            raise c.fail(f"slice [{start}:{limit}] in dimension {i} is out of bounds for size {s.dimensions[i]} "
                         "(need 0 <= start <= limit <= size)")
        out.append(-(-(limit - start) // stride))
    return array_shape(s.element_type, out)


def _check_start_indices(c: Ctx, first: int, rank: int) -> None:
    starts = c.operands[first:]
    if len(starts) == 1 and rank != 1 and starts[0].is_array and starts[0].rank == 1:
        # The old form: one rank-1 index array.
        if starts[0].dimensions[0] != rank or not starts[0].element_type.is_integral:
            raise c.fail(f"start indices {starts[0]} must be an integer vector of length {rank}")
        return
    if len(starts) != rank:
        raise c.fail(f"expects {rank} scalar start indices (one per operand dimension), got {len(starts)}")
    types = set()
    for i, s in enumerate(starts):
        if not (s.is_array and s.is_scalar and s.element_type.is_integral):
            raise c.fail(f"start index {i} must be an integer scalar, got {s}")
        types.add(s.element_type)
    if len(types) > 1:
        raise c.fail(f"start indices must all have the same type, got {sorted(t.value for t in types)}")


@rule("dynamic-slice")
def _dynamic_slice(c: Ctx) -> Shape:
    c.count(at_least=1)
    s = c.array(0)
    _check_start_indices(c, 1, s.rank)
    sizes = c.int_list("dynamic_slice_sizes")
    if len(sizes) != s.rank:
        raise c.fail(f"dynamic_slice_sizes {sizes} must have one entry per operand dimension ({s.rank})")
    for i, (n, d) in enumerate(zip(sizes, s.dimensions)):
        if not 0 <= n <= d:
            raise c.fail(f"slice size {n} in dimension {i} must be between 0 and the operand size {d}")
    return array_shape(s.element_type, sizes)


@rule("dynamic-update-slice")
def _dynamic_update_slice(c: Ctx) -> Shape:
    c.count(at_least=2)
    s, u = c.array(0), c.array(1, "update")
    if u.element_type is not s.element_type:
        raise c.fail(f"update {u} must have the operand's element type {s.element_type.value}")
    if u.rank != s.rank:
        raise c.fail(f"update {u} must have the operand's rank {s.rank}")
    for i, (n, d) in enumerate(zip(u.dimensions, s.dimensions)):
        if n > d:
            raise c.fail(f"update size {n} in dimension {i} exceeds the operand size {d}")
    _check_start_indices(c, 2, s.rank)
    return s


@rule("pad")
def _pad(c: Ctx) -> Shape:
    s, v = c.array(0), c.array(1, "padding value")
    if not v.is_scalar or v.element_type is not s.element_type:
        raise c.fail(f"padding value {v} must be a scalar of the operand's element type {s.element_type.value}")
    cfg = c.attr("padding")
    if len(cfg) != s.rank:
        raise c.fail(f"padding has {len(cfg)} entries, expected one per operand dimension ({s.rank})")
    out = []
    for i, entry in enumerate(cfg):
        lo, hi, interior = (list(entry) + [0])[:3]
        if interior < 0:
            raise c.fail(f"interior padding {interior} in dimension {i} must be non-negative")
        d = s.dimensions[i]
        n = lo + hi + d + max(d - 1, 0) * interior
        if n < 0:
            raise c.fail(f"padding ({lo}, {hi}, {interior}) in dimension {i} of size {d} gives negative size {n}")
        out.append(n)
    return array_shape(s.element_type, out)


@rule("concatenate")
def _concatenate(c: Ctx) -> Shape:
    c.count(at_least=1)
    dims = c.int_list("dimensions")
    if len(dims) != 1:
        raise c.fail(f"dimensions must hold exactly one dimension, got {dims}")
    d = dims[0]
    first = c.array(0)
    if not 0 <= d < first.rank:
        raise c.fail(f"concatenation dimension {d} out of range for rank {first.rank}")
    total = 0
    for i, s in enumerate(c.operands):
        s = c.array(i)
        if s.rank != first.rank:
            raise c.fail(f"operand {i} {s} has rank {s.rank}, operand 0 {first} has rank {first.rank}")
        if s.element_type is not first.element_type:
            raise c.fail(f"operand {i} {s} has element type {s.element_type.value}, operand 0 has "
                         f"{first.element_type.value}")
        for k in range(s.rank):
            if k != d and s.dimensions[k] != first.dimensions[k]:
                raise c.fail(f"operand {i} {s} differs from operand 0 {first} in non-concatenated dimension {k}")
        total += s.dimensions[d]
    out = list(first.dimensions)
    out[d] = total
    return array_shape(first.element_type, out)
