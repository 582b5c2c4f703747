"""XlaBuilder select and clamp."""

from __future__ import annotations

from typing import Any

from replicas.hlo.builder.core import BuilderCore, XlaOp


class SelectOps(BuilderCore):
    # -- ternary ----------------------------------------------------------------------------------
    def _expand_scalar(self, x: XlaOp, like: XlaOp) -> XlaOp:
        if x.shape.is_scalar and not like.shape.is_scalar:
            return self.broadcast(x, list(like.shape.dimensions))
        return x

    def select(self, pred: XlaOp, on_true: Any, on_false: Any) -> XlaOp:
        pred = self._op(pred, "pred")
        on_true = self._op_or_constant(on_true, on_false, "on_true")
        on_false = self._op_or_constant(on_false, on_true, "on_false")
        # XlaBuilder broadcasts scalar operands of select to the non-scalar shape.
        widest = max((pred, on_true, on_false), key=lambda o: o.shape.rank if o.shape.is_array else -1)
        pred = self._expand_scalar(pred, widest)
        on_true = self._expand_scalar(on_true, widest)
        on_false = self._expand_scalar(on_false, widest)
        return self._emit("select", [pred, on_true, on_false])

    def clamp(self, min: Any, operand: XlaOp, max: Any) -> XlaOp:  # noqa: A002  (XLA's argument names)
        operand = self._op(operand)
        lo = self._expand_scalar(self._op_or_constant(min, operand, "min"), operand)
        hi = self._expand_scalar(self._op_or_constant(max, operand, "max"), operand)
        return self._emit("clamp", [lo, operand, hi])
