"""Shape rule of scatter (XLA's ShapeInference::InferScatterShape)."""

from __future__ import annotations

from replicas.hlo.shape_inference.base import (
    Ctx,
    check_dims_unique_in_range,
    check_scalar_computation,
    rule,
    same_dims,
    tuple_or_single,
)
from replicas.hlo.shape_inference.gather import check_batching, expanded_indices
from replicas.shapes import Shape


@rule("scatter")
def _scatter(c: Ctx) -> Shape:
    n = len(c.operands)
    if n < 3 or n % 2 == 0:
        raise c.fail(f"expects N operands, the indices and N updates (an odd count >= 3), got {n} operands")
    k = (n - 1) // 2
    operands, indices, updates = c.operands[:k], c.operands[k], c.operands[k + 1:]
    for i in range(n):
        c.array(i)
    for i, s in enumerate(operands):
        if not same_dims(s, operands[0]):
            raise c.fail(f"operand {i} {s} must have the dimensions of operand 0 {operands[0]}")
    for i, (u, s) in enumerate(zip(updates, operands)):
        if not same_dims(u, updates[0]):
            raise c.fail(f"update {i} {u} must have the dimensions of update 0 {updates[0]}")
        if u.element_type is not s.element_type:
            raise c.fail(f"update {i} {u} must have the element type of operand {i} {s}")
    operand, update = operands[0], updates[0]
    ivd = int(c.attr("index_vector_dim"))
    expanded = expanded_indices(c, indices, ivd)
    window_dims = c.int_list("update_window_dims", [])
    inserted = c.int_list("inserted_window_dims", [])
    to_operand = c.int_list("scatter_dims_to_operand_dims", [])
    input_batching = c.int_list("input_batching_dims", [])
    indices_batching = c.int_list("scatter_indices_batching_dims", [])

    check_dims_unique_in_range(c, window_dims, update.rank, "update_window_dims", sorted_required=True)
    check_dims_unique_in_range(c, inserted, operand.rank, "inserted_window_dims", sorted_required=True)
    check_dims_unique_in_range(c, input_batching, operand.rank, "input_batching_dims", sorted_required=True)
    if set(inserted) & set(input_batching):
        raise c.fail(f"inserted_window_dims {inserted} and input_batching_dims {input_batching} overlap")
    check_batching(c, operand, indices, input_batching, indices_batching, ivd,
                    ("input_batching_dims", "scatter_indices_batching_dims"))
    if expanded[ivd] != len(to_operand):
        raise c.fail(f"the index vector size {expanded[ivd]} (indices dimension {ivd}) must equal the length of "
                     f"scatter_dims_to_operand_dims {to_operand}")
    check_dims_unique_in_range(c, to_operand, operand.rank, "scatter_dims_to_operand_dims")
    if set(to_operand) & set(input_batching):
        raise c.fail(f"scatter_dims_to_operand_dims {to_operand} and input_batching_dims {input_batching} overlap")
    if len(window_dims) + len(inserted) + len(input_batching) != operand.rank:
        raise c.fail(f"update_window_dims {window_dims}, inserted_window_dims {inserted} and input_batching_dims "
                     f"{input_batching} must add up to the operand rank {operand.rank}")
    if update.rank != len(window_dims) + len(expanded) - 1:
        raise c.fail(f"updates {update} must have rank {len(window_dims) + len(expanded) - 1} "
                     f"(update_window_dims plus the scatter dimensions of the indices)")
    scatter_sizes = [d for i, d in enumerate(expanded) if i != ivd]
    update_scatter = [d for i, d in enumerate(update.dimensions) if i not in window_dims]
    if update_scatter != scatter_sizes:
        raise c.fail(f"the scatter dimensions of updates {update_scatter} must equal the indices' batch "
                     f"dimensions {scatter_sizes}")
    window_operand_dims = [i for i in range(operand.rank) if i not in inserted and i not in input_batching]
    for ud, od in zip(window_dims, window_operand_dims):
        if update.dimensions[ud] > operand.dimensions[od]:
            raise c.fail(f"update window dimension {ud} (size {update.dimensions[ud]}) is larger than operand "
                         f"dimension {od} (size {operand.dimensions[od]})")
    types = [s.element_type for s in operands]
    check_scalar_computation(c, c.computation("to_apply"), types + types, types, "update computation")
    return tuple_or_single(list(operands))
