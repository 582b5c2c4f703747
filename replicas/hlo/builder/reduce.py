"""XlaBuilder reduce."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from replicas.errors import ProgramError
from replicas.hlo.builder.core import BuilderCore, XlaOp


class ReduceOps(BuilderCore):
    # -- reductions and windows -----------------------------------------------------------------------
    def reduce(self, operands: XlaOp | Sequence[XlaOp], init_values: Any, computation: Any,
               dimensions_to_reduce: Sequence[int]) -> XlaOp:
        ops = [self._op(o) for o in (operands if isinstance(operands, (list, tuple)) else [operands])]
        inits_in = init_values if isinstance(init_values, (list, tuple)) else [init_values]
        if len(inits_in) != len(ops):
            raise ProgramError(f"reduce: {len(ops)} operands need {len(ops)} init values, got {len(inits_in)}")
        inits = [self._op_or_constant(v, o, "init value") for v, o in zip(inits_in, ops)]
        attrs = {"dimensions": [int(d) for d in dimensions_to_reduce], "to_apply": self._import(computation)}
        return self._emit("reduce", [*ops, *inits], attrs)

    def reduce_all(self, operand: XlaOp, init_value: Any, computation: Any) -> XlaOp:
        return self.reduce(operand, init_value, computation, list(range(self._op(operand).shape.rank)))
