"""XlaBuilder top_k."""

from __future__ import annotations

from replicas.hlo.builder.core import BuilderCore, XlaOp


class TopKOps(BuilderCore):
    def top_k(self, operand: XlaOp, k: int, largest: bool = True) -> XlaOp:
        """The (values, s32 indices) tuple of the k largest (or smallest) along the last dimension."""
        return self._emit("topk", [self._op(operand)], {"k": int(k), "largest": bool(largest)})
