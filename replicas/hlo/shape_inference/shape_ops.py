"""Shape rules of the ops that rearrange one array: iota, broadcast, reshape, bitcast, copy, transpose, reverse."""

from __future__ import annotations

from replicas.hlo.shape_inference.base import Ctx, array_shape, check_dims_unique_in_range, rule
from replicas.shapes import Shape


@rule("iota")
def _iota(c: Ctx) -> None:
    d = c.attr("iota_dimension")
    r = c.result
    if r is not None:
        if not r.is_array:
            raise c.fail(f"result must be an array, got {r}")
        if r.rank == 0:
            raise c.fail("result must have at least one dimension")
        if not 0 <= d < r.rank:
            raise c.fail(f"iota_dimension {d} out of range for rank {r.rank} result {r}")
    return None


@rule("broadcast")
def _broadcast(c: Ctx) -> None:
    s = c.array(0)
    dims = c.int_list("dimensions", [])
    if len(dims) != s.rank:
        raise c.fail(f"dimensions {dims} must have one entry per operand dimension (rank {s.rank})")
    r = c.result
    if r is None:
        return None
    if not r.is_array or r.element_type is not s.element_type:
        raise c.fail(f"result {r} must be an array of the operand's element type {s.element_type.value}")
    check_dims_unique_in_range(c, dims, r.rank, "dimensions")
    for i, d in enumerate(dims):
        if s.dimensions[i] not in (1, r.dimensions[d]):
            raise c.fail(f"operand dimension {i} (size {s.dimensions[i]}) does not match result dimension "
                         f"{d} (size {r.dimensions[d]})")
    return None


@rule("reshape")
def _reshape(c: Ctx) -> None:
    s = same_type_result(c)
    r = c.result
    if r is not None and r.numel != s.numel:
        raise c.fail(f"element count changes from {s.numel} ({s}) to {r.numel} ({r})")
    return None


def same_type_result(c: Ctx) -> Shape:
    """Operand 0, once the declared result is known to be an array of its element type."""
    s = c.array(0)
    r = c.result
    if r is not None and (not r.is_array or r.element_type is not s.element_type):
        raise c.fail(f"result {r} must be an array of the operand's element type {s.element_type.value}")
    return s


@rule("bitcast")
def _bitcast(c: Ctx) -> None:
    s = c.array(0)
    r = c.result
    if r is not None:
        if not r.is_array:
            raise c.fail(f"result must be an array, got {r}")
        if r.numel * r.element_type.bit_width != s.numel * s.element_type.bit_width:
            raise c.fail(f"size in bits changes from {s} to {r}")
    return None


@rule("copy")
def _copy(c: Ctx) -> Shape:
    return c.operands[0]


@rule("transpose")
def _transpose(c: Ctx) -> Shape:
    s = c.array(0)
    perm = c.int_list("dimensions")
    if sorted(perm) != list(range(s.rank)):
        raise c.fail(f"dimensions {perm} is not a permutation of the operand's {s.rank} dimensions")
    return array_shape(s.element_type, [s.dimensions[p] for p in perm])


@rule("reverse")
def _reverse(c: Ctx) -> Shape:
    s = c.array(0)
    check_dims_unique_in_range(c, c.int_list("dimensions"), s.rank, "dimensions")
    return s
