"""XlaBuilder conversions: convert, bitcast-convert, reduce-precision."""

from __future__ import annotations

from replicas.errors import ProgramError
from replicas.hlo.builder.core import BuilderCore, ElementType, XlaOp, as_type
from replicas.shapes import Shape


class ConvertOps(BuilderCore):
    # -- conversions --------------------------------------------------------------------------------
    def convert_element_type(self, operand: XlaOp, new_element_type: ElementType) -> XlaOp:
        operand = self._op(operand)
        t = as_type(new_element_type)
        if not operand.shape.is_array:
            raise ProgramError(f"convert_element_type: operand must be an array, got {operand.shape}")
        return self._emit("convert", [operand], shape=operand.shape.without_layout().with_element_type(t))

    def bitcast_convert_type(self, operand: XlaOp, new_element_type: ElementType) -> XlaOp:
        operand = self._op(operand)
        t = as_type(new_element_type)
        # Only the declared element type matters to inference; it derives the dimensions.
        inferred = self._infer("bitcast-convert", [operand], {}, result=Shape.scalar(t))
        return self._emit("bitcast-convert", [operand], shape=inferred)

    def reduce_precision(self, operand: XlaOp, exponent_bits: int, mantissa_bits: int) -> XlaOp:
        return self._emit("reduce-precision", [self._op(operand)],
                          {"exponent_bits": int(exponent_bits), "mantissa_bits": int(mantissa_bits)})
