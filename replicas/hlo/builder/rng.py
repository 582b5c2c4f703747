"""XlaBuilder random numbers: rng (uniform, normal) and rng-bit-generator."""

from __future__ import annotations

from collections.abc import Sequence

from replicas.hlo.builder.core import BuilderCore, XlaOp
from replicas.shapes import Shape


class RngOps(BuilderCore):
    # -- random numbers -------------------------------------------------------------------------------
    def _rng(self, distribution: str, a: XlaOp, b: XlaOp, shape: Shape | str | Sequence[int]) -> XlaOp:
        a, b = self._op(a), self._op(b)
        if isinstance(shape, str):
            shape = Shape.parse(shape)
        elif not isinstance(shape, Shape):
            shape = Shape.array(a.shape.element_type, [int(d) for d in shape])
        return self._emit("rng", [a, b], {"distribution": distribution}, shape=shape)

    def rng_uniform(self, a: XlaOp, b: XlaOp, shape: Shape | str | Sequence[int]) -> XlaOp:
        return self._rng("rng_uniform", a, b, shape)

    def rng_normal(self, mu: XlaOp, sigma: XlaOp, shape: Shape | str | Sequence[int]) -> XlaOp:
        return self._rng("rng_normal", mu, sigma, shape)

    def rng_bit_generator(self, algorithm: str, initial_state: XlaOp, shape: Shape | str) -> XlaOp:
        """Returns the (new_state, random_bits) tuple, as XlaBuilder::RngBitGenerator."""
        state = self._op(initial_state, "initial_state")
        if isinstance(shape, str):
            shape = Shape.parse(shape)
        algo = str(algorithm).lower()
        if not algo.startswith("rng_"):
            algo = "rng_" + algo
        return self._emit("rng-bit-generator", [state], {"algorithm": algo},
                          shape=Shape.tuple([state.shape.without_layout(), shape]))
