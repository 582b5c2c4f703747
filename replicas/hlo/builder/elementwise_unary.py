"""XlaBuilder unary element-wise ops."""

from __future__ import annotations

from typing import Any

from replicas.hlo.builder.core import BuilderCore, XlaOp


class ElementwiseUnaryOps(BuilderCore):
    # -- unary ----------------------------------------------------------------------------------------
    def _unary(self, opcode: str, operand: Any) -> XlaOp:
        return self._emit(opcode, [self._op(operand)])

    def abs(self, x: XlaOp) -> XlaOp:
        return self._unary("abs", x)

    def cbrt(self, x: XlaOp) -> XlaOp:
        return self._unary("cbrt", x)

    def ceil(self, x: XlaOp) -> XlaOp:
        return self._unary("ceil", x)

    def clz(self, x: XlaOp) -> XlaOp:
        return self._unary("count-leading-zeros", x)

    def cos(self, x: XlaOp) -> XlaOp:
        return self._unary("cosine", x)

    def erf(self, x: XlaOp) -> XlaOp:
        return self._unary("erf", x)

    def exp(self, x: XlaOp) -> XlaOp:
        return self._unary("exponential", x)

    def expm1(self, x: XlaOp) -> XlaOp:
        return self._unary("exponential-minus-one", x)

    def floor(self, x: XlaOp) -> XlaOp:
        return self._unary("floor", x)

    def imag(self, x: XlaOp) -> XlaOp:
        return self._unary("imag", x)

    def real(self, x: XlaOp) -> XlaOp:
        return self._unary("real", x)

    def is_finite(self, x: XlaOp) -> XlaOp:
        return self._unary("is-finite", x)

    def log(self, x: XlaOp) -> XlaOp:
        return self._unary("log", x)

    def log1p(self, x: XlaOp) -> XlaOp:
        return self._unary("log-plus-one", x)

    def logistic(self, x: XlaOp) -> XlaOp:
        return self._unary("logistic", x)

    def neg(self, x: XlaOp) -> XlaOp:
        return self._unary("negate", x)

    def not_(self, x: XlaOp) -> XlaOp:
        return self._unary("not", x)

    def population_count(self, x: XlaOp) -> XlaOp:
        return self._unary("popcnt", x)

    def round(self, x: XlaOp) -> XlaOp:
        return self._unary("round-nearest-afz", x)

    def round_nearest_even(self, x: XlaOp) -> XlaOp:
        return self._unary("round-nearest-even", x)

    def rsqrt(self, x: XlaOp) -> XlaOp:
        return self._unary("rsqrt", x)

    def sign(self, x: XlaOp) -> XlaOp:
        return self._unary("sign", x)

    def sin(self, x: XlaOp) -> XlaOp:
        return self._unary("sine", x)

    def sqrt(self, x: XlaOp) -> XlaOp:
        return self._unary("sqrt", x)

    def tan(self, x: XlaOp) -> XlaOp:
        return self._unary("tan", x)

    def tanh(self, x: XlaOp) -> XlaOp:
        return self._unary("tanh", x)
