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


def _index_vector_dim(given: int | None, dimension_numbers: Any, indices: XlaOp) -> int:
    """`given`, else the dimension numbers' (object or dict), else the indices' last dimension
    (jax's convention)."""
    if given is None:
        given = (dimension_numbers.get("index_vector_dim") if isinstance(dimension_numbers, dict)
                 else getattr(dimension_numbers, "index_vector_dim", None))
    return int(indices.shape.rank - 1 if given is None else given)


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
        attrs: dict[str, Any] = dict(dn)
        attrs.update(index_vector_dim=_index_vector_dim(index_vector_dim, dimension_numbers, indices),
                     slice_sizes=[int(s) for s in slice_sizes],
                     indices_are_sorted=bool(indices_are_sorted))
        return self._emit("gather", [operand, indices], attrs)
