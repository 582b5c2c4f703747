"""XlaBuilder gather, and the dimension-number arguments it shares with scatter."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from replicas.errors import ProgramError
from replicas.hlo.builder.core import BuilderCore, XlaOp

_GATHER_FIELDS = ("offset_dims", "collapsed_slice_dims", "start_index_map", "operand_batching_dims",
                  "start_indices_batching_dims")


def _dimension_numbers(fields: Sequence[str], dimension_numbers: Any, kwargs: dict[str, Any],
                       what: str) -> dict[str, list[int]]:
    """Read gather/scatter dimension numbers from an object (jax-style), a dict, or keywords."""
    out: dict[str, list[int]] = {}
    for f in fields:
        value = kwargs.pop(f, None)
        if value is None and dimension_numbers is not None:
            value = (dimension_numbers.get(f) if isinstance(dimension_numbers, dict)
                     else getattr(dimension_numbers, f, None))
        out[f] = [int(v) for v in (value or ())]
    if kwargs:
        raise ProgramError(f"{what}: unexpected arguments {sorted(kwargs)}")
    return out


class GatherOps(BuilderCore):
    def gather(self, operand: XlaOp, start_indices: XlaOp, dimension_numbers: Any = None,
               slice_sizes: Sequence[int] = (), indices_are_sorted: bool = False,
               index_vector_dim: int | None = None, **kwargs: Any) -> XlaOp:
        """Gather. Dimension numbers come from `dimension_numbers` (an object with jax's field names, or
        a dict) or keywords (offset_dims=, collapsed_slice_dims=, start_index_map=,
        operand_batching_dims=, start_indices_batching_dims=). `index_vector_dim` defaults to the last
        dimension of the indices (jax's convention)."""
        operand, indices = self._op(operand), self._op(start_indices, "start_indices")
        dn = _dimension_numbers(_GATHER_FIELDS, dimension_numbers, dict(kwargs), "gather")
        if index_vector_dim is None:
            index_vector_dim = getattr(dimension_numbers, "index_vector_dim", None)
            if index_vector_dim is None and isinstance(dimension_numbers, dict):
                index_vector_dim = dimension_numbers.get("index_vector_dim")
        if index_vector_dim is None:
            index_vector_dim = indices.shape.rank - 1
        attrs: dict[str, Any] = dict(dn)
        attrs.update(index_vector_dim=int(index_vector_dim), slice_sizes=[int(s) for s in slice_sizes],
                     indices_are_sorted=bool(indices_are_sorted))
        return self._emit("gather", [operand, indices], attrs)
