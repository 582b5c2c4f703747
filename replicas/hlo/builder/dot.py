"""XlaBuilder dot and dot_general."""

from __future__ import annotations

from typing import Any

from replicas.errors import ProgramError
from replicas.hlo.builder.core import BuilderCore, ElementType, XlaOp, as_type


class DotOps(BuilderCore):
    # -- dot ----------------------------------------------------------------------------------------
    def dot(self, lhs: XlaOp, rhs: XlaOp, precision_config: Any = None,
            preferred_element_type: ElementType | None = None) -> XlaOp:
        """XlaBuilder::Dot: contracts the last dimension of lhs with the first of rhs (ranks 1 or 2)."""
        lhs, rhs = self._op(lhs, "lhs"), self._op(rhs, "rhs")
        if lhs.shape.rank not in (1, 2) or rhs.shape.rank not in (1, 2):
            raise ProgramError(f"dot: operands must have rank 1 or 2, got {lhs.shape} and {rhs.shape} "
                               "(use dot_general)")
        return self.dot_general(lhs, rhs, (([lhs.shape.rank - 1], [0]), ([], [])),
                                preferred_element_type=preferred_element_type)

    def dot_general(self, lhs: XlaOp, rhs: XlaOp, dimension_numbers: Any, precision_config: Any = None,
                    preferred_element_type: ElementType | None = None) -> XlaOp:
        """`dimension_numbers` as jax: ((lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch)), or a
        dict with lhs_contracting_dims, rhs_contracting_dims, lhs_batch_dims, rhs_batch_dims."""
        lhs, rhs = self._op(lhs, "lhs"), self._op(rhs, "rhs")
        if isinstance(dimension_numbers, dict):
            attrs = {k: [int(d) for d in dimension_numbers.get(k, ())] for k in
                     ("lhs_batch_dims", "rhs_batch_dims", "lhs_contracting_dims", "rhs_contracting_dims")}
        else:
            try:
                (lc, rc), (lb, rb) = dimension_numbers
            except (TypeError, ValueError):
                raise ProgramError(f"dot_general: bad dimension_numbers {dimension_numbers!r}") from None
            attrs = {"lhs_batch_dims": [int(d) for d in lb], "rhs_batch_dims": [int(d) for d in rb],
                     "lhs_contracting_dims": [int(d) for d in lc], "rhs_contracting_dims": [int(d) for d in rc]}
        shape = None
        if preferred_element_type is not None:
            inferred = self._infer("dot", [lhs, rhs], attrs)
            assert inferred is not None
            shape = inferred.with_element_type(as_type(preferred_element_type))
        return self._emit("dot", [lhs, rhs], attrs, shape=shape)
