"""XlaBuilder ops that call computations: map, call, while, conditional."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from replicas.errors import ProgramError
from replicas.hlo.builder.core import BuilderCore, XlaOp


class ControlFlowOps(BuilderCore):
    # -- calls and control flow -------------------------------------------------------------------
    def map(self, operands: Sequence[XlaOp], computation: Any, dimensions: Sequence[int] | None = None) -> XlaOp:
        ops = [self._op(o) for o in operands]
        dims = list(range(ops[0].shape.rank)) if dimensions is None else [int(d) for d in dimensions]
        return self._emit("map", ops, {"dimensions": dims, "to_apply": self._import(computation)})

    def call(self, computation: Any, operands: Sequence[XlaOp]) -> XlaOp:
        return self._emit("call", [self._op(o) for o in operands], {"to_apply": self._import(computation)})

    def while_(self, condition: Any, body: Any, init: XlaOp) -> XlaOp:
        attrs = {"condition": self._import(condition, "condition"), "body": self._import(body, "body")}
        return self._emit("while", [self._op(init, "init")], attrs)

    def conditional(self, selector: XlaOp, *args: Any) -> XlaOp:
        """`conditional(pred, true_operand, true_computation, false_operand, false_computation)` or
        `conditional(branch_index, branch_computations, branch_operands)`."""
        selector = self._op(selector, "selector")
        if len(args) == 4:
            true_op, true_comp, false_op, false_comp = args
            attrs = {"true_computation": self._import(true_comp, "true_computation"),
                     "false_computation": self._import(false_comp, "false_computation")}
            return self._emit("conditional", [selector, self._op(true_op), self._op(false_op)], attrs)
        if len(args) == 2:
            comps, operands = args
            if len(comps) != len(operands):
                raise ProgramError(f"conditional: {len(comps)} branch computations but {len(operands)} operands")
            names = [self._import(c, f"branch {i}") for i, c in enumerate(comps)]
            return self._emit("conditional", [selector, *(self._op(o) for o in operands)],
                              {"branch_computations": names})
        raise ProgramError("conditional: give (pred, true_operand, true_computation, false_operand, "
                           "false_computation) or (branch_index, branch_computations, branch_operands)")
