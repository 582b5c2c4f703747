"""XlaBuilder sort."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from replicas.errors import ProgramError
from replicas.hlo.builder.core import BuilderCore, XlaOp
from replicas.hlo.ir import Computation, Instruction
from replicas.shapes import PrimitiveType, Shape


class SortOps(BuilderCore):
    def sort(self, operands: XlaOp | Sequence[XlaOp], comparator: Any = None, dimension: int = -1,
             is_stable: bool = False) -> XlaOp:
        """Sort along `dimension`; without a comparator, ascending by the first operand (total order)."""
        ops = [self._op(o) for o in (operands if isinstance(operands, (list, tuple)) else [operands])]
        if not ops:
            raise ProgramError("sort: needs at least one operand")
        rank = ops[0].shape.rank
        d = dimension + rank if dimension < 0 else dimension
        name = self._import(comparator, "comparator") if comparator is not None else self._default_comparator(ops)
        return self._emit("sort", ops, {"dimensions": [int(d)], "is_stable": bool(is_stable), "to_apply": name})

    def _default_comparator(self, ops: list[XlaOp]) -> str:
        types = [o.shape.element_type for o in ops]
        key = "compare_lt_" + "_".join(t.value for t in types)
        if key in self._generated:
            return self._generated[key]
        name = self._computation_name(key)
        self._generated[key] = name
        comp = Computation(name)
        params = []
        for i, t in enumerate(types):
            for side in ("lhs", "rhs"):
                p = self._claim(f"{side}.{i}")
                comp.add(Instruction(p, "parameter", Shape.scalar(t), [], {"parameter_number": len(params)}))
                params.append(p)
        attrs: dict[str, Any] = {"comparison_direction": "LT"}
        if types[0].is_floating:
            attrs["type"] = "TOTALORDER"
        root = self._claim("compare")
        comp.add(Instruction(root, "compare", Shape.scalar(PrimitiveType.PRED), params[:2], attrs))
        comp.root = root
        self._imported[name] = comp
        return name
