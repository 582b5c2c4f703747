"""XlaBuilder reduce-window and select-and-scatter."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from replicas.errors import ProgramError
from replicas.hlo.builder.convolution import Padding, padding_pairs
from replicas.hlo.builder.core import BuilderCore, XlaOp
from replicas.hlo.ir import make_window


class ReduceWindowOps(BuilderCore):
    def reduce_window(self, operands: XlaOp | Sequence[XlaOp], init_values: Any, computation: Any,
                      window_dimensions: Sequence[int], window_strides: Sequence[int] | None = None,
                      padding: Padding = "VALID", base_dilations: Sequence[int] | None = None,
                      window_dilations: Sequence[int] | None = None) -> XlaOp:
        ops = [self._op(o) for o in (operands if isinstance(operands, (list, tuple)) else [operands])]
        inits_in = init_values if isinstance(init_values, (list, tuple)) else [init_values]
        if len(inits_in) != len(ops):
            raise ProgramError(f"reduce_window: {len(ops)} operands need {len(ops)} init values")
        inits = [self._op_or_constant(v, o, "init value") for v, o in zip(inits_in, ops)]
        rank = ops[0].shape.rank
        size = [int(w) for w in window_dimensions]
        strides = [int(s) for s in window_strides] if window_strides is not None else [1] * rank
        pads = padding_pairs(padding, ops[0].shape.dimensions, size, strides, "reduce_window")
        window = make_window(len(size), size=size, stride=strides, pad=pads, lhs_dilate=base_dilations,
                             rhs_dilate=window_dilations)
        attrs = {"window": window, "to_apply": self._import(computation)}
        return self._emit("reduce-window", [*ops, *inits], attrs)

    def select_and_scatter(self, operand: XlaOp, select: Any, window_dimensions: Sequence[int],
                           window_strides: Sequence[int], padding: Padding, source: XlaOp, init_value: Any,
                           scatter: Any) -> XlaOp:
        operand = self._op(operand)
        size = [int(w) for w in window_dimensions]
        strides = [int(s) for s in window_strides]
        pads = padding_pairs(padding, operand.shape.dimensions, size, strides, "select_and_scatter")
        init = self._op_or_constant(init_value, operand, "init_value")
        attrs = {"window": make_window(len(size), size=size, stride=strides, pad=pads),
                 "select": self._import(select, "select"), "scatter": self._import(scatter, "scatter")}
        return self._emit("select-and-scatter", [operand, self._op(source, "source"), init], attrs)

    def select_and_scatter_with_general_padding(self, operand: XlaOp, select: Any, window_dimensions: Sequence[int],
                                                window_strides: Sequence[int], padding: Sequence[Sequence[int]],
                                                source: XlaOp, init_value: Any, scatter: Any) -> XlaOp:
        return self.select_and_scatter(operand, select, window_dimensions, window_strides, padding, source,
                                       init_value, scatter)
