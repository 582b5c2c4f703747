"""XlaBuilder get-dimension-size and set-dimension-size."""

from __future__ import annotations

from typing import Any

from replicas.hlo.builder.core import BuilderCore, XlaOp


class DynamicShapeOps(BuilderCore):
    def get_dimension_size(self, operand: XlaOp, dimension: int) -> XlaOp:
        return self._emit("get-dimension-size", [self._op(operand)], {"dimensions": [int(dimension)]})

    def set_dimension_size(self, operand: XlaOp, val: Any, dimension: int) -> XlaOp:
        size = self._index_op(val, "size")
        return self._emit("set-dimension-size", [self._op(operand), size], {"dimensions": [int(dimension)]})
