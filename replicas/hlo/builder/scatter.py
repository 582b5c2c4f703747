"""XlaBuilder scatter."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from replicas.hlo.builder.core import BuilderCore, XlaOp
from replicas.hlo.builder.gather import _dimension_numbers, _index_vector_dim

_SCATTER_FIELDS = ("update_window_dims", "inserted_window_dims", "scatter_dims_to_operand_dims",
                   "input_batching_dims", "scatter_indices_batching_dims")


class ScatterOps(BuilderCore):
    def scatter(self, operands: XlaOp | Sequence[XlaOp], scatter_indices: XlaOp,
                updates: XlaOp | Sequence[XlaOp], update_computation: Any, dimension_numbers: Any = None,
                indices_are_sorted: bool = False, unique_indices: bool = False,
                index_vector_dim: int | None = None, **kwargs: Any) -> XlaOp:
        """Scatter (variadic: lists of operands and updates). Dimension numbers as for `gather`
        (update_window_dims=, inserted_window_dims=, scatter_dims_to_operand_dims=, input_batching_dims=,
        scatter_indices_batching_dims=)."""
        ops = [self._op(o) for o in (operands if isinstance(operands, (list, tuple)) else [operands])]
        ups = [self._op(u, "update") for u in (updates if isinstance(updates, (list, tuple)) else [updates])]
        indices = self._op(scatter_indices, "scatter_indices")
        dn = _dimension_numbers(_SCATTER_FIELDS, dimension_numbers, dict(kwargs), "scatter")
        attrs: dict[str, Any] = dict(dn)
        attrs.update(index_vector_dim=_index_vector_dim(index_vector_dim, dimension_numbers, indices),
                     to_apply=self._import(update_computation),
                     indices_are_sorted=bool(indices_are_sorted), unique_indices=bool(unique_indices))
        return self._emit("scatter", [*ops, indices, *ups], attrs)
