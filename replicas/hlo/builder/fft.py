"""XlaBuilder fft."""

from __future__ import annotations

from collections.abc import Sequence

from replicas.hlo.builder.core import BuilderCore, XlaOp


class FftOps(BuilderCore):
    # -- fft and linear algebra -------------------------------------------------------------------
    def fft(self, operand: XlaOp, fft_type: str, fft_length: Sequence[int]) -> XlaOp:
        return self._emit("fft", [self._op(operand)], {"fft_type": str(fft_type).upper(),
                                                       "fft_length": [int(n) for n in fft_length]})
