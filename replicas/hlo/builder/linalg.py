"""XlaBuilder cholesky and triangular-solve."""

from __future__ import annotations

from replicas.hlo.builder.core import BuilderCore, XlaOp


class LinalgOps(BuilderCore):
    def cholesky(self, a: XlaOp, lower: bool = True) -> XlaOp:
        return self._emit("cholesky", [self._op(a, "a")], {"lower": bool(lower)})

    def triangular_solve(self, a: XlaOp, b: XlaOp, left_side: bool, lower: bool, unit_diagonal: bool,
                         transpose_a: str = "NO_TRANSPOSE") -> XlaOp:
        attrs = {"left_side": bool(left_side), "lower": bool(lower), "unit_diagonal": bool(unit_diagonal),
                 "transpose_a": str(transpose_a).upper()}
        return self._emit("triangular-solve", [self._op(a, "a"), self._op(b, "b")], attrs)
