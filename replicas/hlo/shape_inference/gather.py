"""Shape rule of gather, and the index checks shared with scatter."""

from __future__ import annotations

from replicas.hlo.shape_inference.base import (
    Ctx,
    array_shape,
    check_dims_unique_in_range,
    rule,
)
from replicas.shapes import Shape


def expanded_indices(c: Ctx, indices: Shape, index_vector_dim: int) -> list[int]:
    if not indices.element_type.is_integral:
        raise c.fail(f"start indices {indices} must be integers")
    if not 0 <= index_vector_dim <= indices.rank:
        raise c.fail(f"index_vector_dim {index_vector_dim} out of range [0, {indices.rank}]")
    dims = list(indices.dimensions)
    if index_vector_dim == indices.rank:
        dims.append(1)
    return dims


def check_batching(c: Ctx, operand: Shape, indices: Shape, operand_batching: list[int],
                    indices_batching: list[int], index_vector_dim: int, names: tuple[str, str]) -> None:
    check_dims_unique_in_range(c, indices_batching, indices.rank, names[1])
    if index_vector_dim in indices_batching:
        raise c.fail(f"{names[1]} {indices_batching} must not contain index_vector_dim {index_vector_dim}")
    if len(operand_batching) != len(indices_batching):
        raise c.fail(f"{names[0]} {operand_batching} and {names[1]} {indices_batching} must have the same length")
    for a, b in zip(operand_batching, indices_batching):
        if operand.dimensions[a] != indices.dimensions[b]:
            raise c.fail(f"batching dimension sizes differ: operand dimension {a} is {operand.dimensions[a]}, "
                         f"indices dimension {b} is {indices.dimensions[b]}")


@rule("gather")
def _gather(c: Ctx) -> Shape:
    operand, indices = c.array(0, "operand"), c.array(1, "start indices")
    ivd = int(c.attr("index_vector_dim"))
    expanded = expanded_indices(c, indices, ivd)
    offset_dims = c.int_list("offset_dims", [])
    collapsed = c.int_list("collapsed_slice_dims", [])
    start_index_map = c.int_list("start_index_map", [])
    operand_batching = c.int_list("operand_batching_dims", [])
    indices_batching = c.int_list("start_indices_batching_dims", [])
    slice_sizes = c.int_list("slice_sizes")

    batch_rank = len(expanded) - 1
    output_rank = len(offset_dims) + batch_rank
    check_dims_unique_in_range(c, offset_dims, output_rank, "offset_dims", sorted_required=True)
    check_dims_unique_in_range(c, collapsed, operand.rank, "collapsed_slice_dims", sorted_required=True)
    check_dims_unique_in_range(c, operand_batching, operand.rank, "operand_batching_dims", sorted_required=True)
    if set(collapsed) & set(operand_batching):
        raise c.fail(f"collapsed_slice_dims {collapsed} and operand_batching_dims {operand_batching} overlap")
    check_dims_unique_in_range(c, start_index_map, operand.rank, "start_index_map")
    if set(start_index_map) & set(operand_batching):
        raise c.fail(f"start_index_map {start_index_map} and operand_batching_dims {operand_batching} overlap")
    check_batching(c, operand, indices, operand_batching, indices_batching, ivd,
                    ("operand_batching_dims", "start_indices_batching_dims"))
    if expanded[ivd] != len(start_index_map):
        raise c.fail(f"the index vector size {expanded[ivd]} (indices dimension {ivd}) must equal the length "
                     f"of start_index_map {start_index_map}")
    if len(slice_sizes) != operand.rank:
        raise c.fail(f"slice_sizes {slice_sizes} must have one entry per operand dimension ({operand.rank})")
    for i, (n, d) in enumerate(zip(slice_sizes, operand.dimensions)):
        if not 0 <= n <= d:
            raise c.fail(f"slice size {n} in dimension {i} must be between 0 and the operand size {d}")
    for d in collapsed + operand_batching:
        if slice_sizes[d] > 1:
            raise c.fail(f"slice size of collapsed or batching dimension {d} must be at most 1, "
                         f"got {slice_sizes[d]}")
    if len(offset_dims) + len(collapsed) + len(operand_batching) != operand.rank:
        raise c.fail(f"offset_dims {offset_dims}, collapsed_slice_dims {collapsed} and operand_batching_dims "
                     f"{operand_batching} must add up to the operand rank {operand.rank}")
    offset_sizes = [n for i, n in enumerate(slice_sizes) if i not in collapsed and i not in operand_batching]
    batch_sizes = [n for i, n in enumerate(expanded) if i != ivd]
    out = []
    o = b = 0
    for i in range(output_rank):
        if i in offset_dims:
            out.append(offset_sizes[o])
            o += 1
        else:
            out.append(batch_sizes[b])
            b += 1
    return array_shape(operand.element_type, out)
