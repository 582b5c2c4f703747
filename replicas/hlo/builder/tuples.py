"""XlaBuilder tuples and tokens: tuple, get-tuple-element, after-all, add-dependency, opt-barrier."""

from __future__ import annotations

from collections.abc import Sequence

from replicas.hlo.builder.core import BuilderCore, XlaOp


class TupleOps(BuilderCore):
    # -- tokens -----------------------------------------------------------------------------------------
    def after_all(self, tokens: Sequence[XlaOp] = ()) -> XlaOp:
        return self._emit("after-all", [self._op(t, "token") for t in tokens])

    def create_token(self) -> XlaOp:
        return self.after_all([])

    def add_dependency(self, operand: XlaOp, token: XlaOp) -> XlaOp:
        return self._emit("add-dependency", [self._op(operand), self._op(token, "token")])

    def optimization_barrier(self, operand: XlaOp) -> XlaOp:
        return self._emit("opt-barrier", [self._op(operand)])

    def tuple(self, elements: Sequence[XlaOp]) -> XlaOp:
        return self._emit("tuple", [self._op(e) for e in elements])

    def get_tuple_element(self, tuple_data: XlaOp, index: int) -> XlaOp:
        return self._emit("get-tuple-element", [self._op(tuple_data)], {"index": int(index)})
