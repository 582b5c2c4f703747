"""XlaBuilder comparisons."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from replicas.hlo.builder.core import BuilderCore, XlaOp


class CompareOps(BuilderCore):
    # -- comparisons ------------------------------------------------------------------------------
    def compare(self, lhs: Any, rhs: Any, direction: str, comparison_type: str | None = None,
                broadcast_dimensions: Sequence[int] | None = None) -> XlaOp:
        direction = direction.upper()
        attrs: dict[str, Any] = {"comparison_direction": direction}
        if comparison_type is not None:
            attrs["type"] = comparison_type.upper()
        return self._binary("compare", f"compare {direction}", lhs, rhs, broadcast_dimensions, attrs)

    def eq(self, lhs: Any, rhs: Any, broadcast_dimensions: Sequence[int] | None = None) -> XlaOp:
        return self.compare(lhs, rhs, "EQ", None, broadcast_dimensions)

    def ne(self, lhs: Any, rhs: Any, broadcast_dimensions: Sequence[int] | None = None) -> XlaOp:
        return self.compare(lhs, rhs, "NE", None, broadcast_dimensions)

    def ge(self, lhs: Any, rhs: Any, broadcast_dimensions: Sequence[int] | None = None) -> XlaOp:
        return self.compare(lhs, rhs, "GE", None, broadcast_dimensions)

    def gt(self, lhs: Any, rhs: Any, broadcast_dimensions: Sequence[int] | None = None) -> XlaOp:
        return self.compare(lhs, rhs, "GT", None, broadcast_dimensions)

    def le(self, lhs: Any, rhs: Any, broadcast_dimensions: Sequence[int] | None = None) -> XlaOp:
        return self.compare(lhs, rhs, "LE", None, broadcast_dimensions)

    def lt(self, lhs: Any, rhs: Any, broadcast_dimensions: Sequence[int] | None = None) -> XlaOp:
        return self.compare(lhs, rhs, "LT", None, broadcast_dimensions)

    def _total(self, lhs: Any, rhs: Any, direction: str, broadcast_dimensions: Sequence[int] | None) -> XlaOp:
        # XLA's *TotalOrder compares use TOTALORDER for floats and the plain order otherwise.
        probe = lhs if isinstance(lhs, XlaOp) else rhs
        t = probe.shape.element_type if isinstance(probe, XlaOp) else None
        ctype = "TOTALORDER" if t is not None and (t.is_floating or t.is_complex) else None
        return self.compare(lhs, rhs, direction, ctype, broadcast_dimensions)

    def eq_total_order(self, lhs: Any, rhs: Any, broadcast_dimensions: Sequence[int] | None = None) -> XlaOp:
        return self._total(lhs, rhs, "EQ", broadcast_dimensions)

    def ne_total_order(self, lhs: Any, rhs: Any, broadcast_dimensions: Sequence[int] | None = None) -> XlaOp:
        return self._total(lhs, rhs, "NE", broadcast_dimensions)

    def ge_total_order(self, lhs: Any, rhs: Any, broadcast_dimensions: Sequence[int] | None = None) -> XlaOp:
        return self._total(lhs, rhs, "GE", broadcast_dimensions)

    def gt_total_order(self, lhs: Any, rhs: Any, broadcast_dimensions: Sequence[int] | None = None) -> XlaOp:
        return self._total(lhs, rhs, "GT", broadcast_dimensions)

    def le_total_order(self, lhs: Any, rhs: Any, broadcast_dimensions: Sequence[int] | None = None) -> XlaOp:
        return self._total(lhs, rhs, "LE", broadcast_dimensions)

    def lt_total_order(self, lhs: Any, rhs: Any, broadcast_dimensions: Sequence[int] | None = None) -> XlaOp:
        return self._total(lhs, rhs, "LT", broadcast_dimensions)
