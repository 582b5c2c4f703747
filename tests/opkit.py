"""Build tiny modules straight from the IR and run them through the interpreter (no builder, no
text): the kernels' tests use this so they depend only on the IR contract (docs/ir.md)."""

from __future__ import annotations

from typing import Any

import numpy as np

from replicas.hlo.ir import Computation, Instruction, Module
from replicas.runtime.compile import compile_module
from replicas.runtime.interpreter import Interpreter
from replicas.shapes import Shape


def shape_of(value: Any) -> Shape:
    return Shape.of(value)


def binary_computation(opcode: str, element_type: str, name: str | None = None, **attrs: Any) -> Computation:
    """`(a: T[], b: T[]) -> opcode(a, b)`, e.g. the `add` reducer of a reduce."""
    s = Shape.scalar(element_type)
    out = Shape.scalar("pred") if opcode == "compare" else s
    comp = Computation(name or f"{opcode}_{element_type}")
    comp.add(Instruction("a", "parameter", s, [], {"parameter_number": 0}))
    comp.add(Instruction("b", "parameter", s, [], {"parameter_number": 1}))
    comp.add(Instruction("r", opcode, out, ["a", "b"], dict(attrs)))
    comp.root = "r"
    return comp


def single_op_module(opcode: str, result_shape: Shape | str, operand_shapes: list[Shape],
                     attrs: dict[str, Any] | None = None,
                     computations: list[Computation] = ()) -> Module:
    if isinstance(result_shape, str):
        result_shape = Shape.parse(result_shape)
    m = Module("test_" + opcode.replace("-", "_"))
    for c in computations:
        m.add(c)
    entry = Computation("main")
    names = []
    for i, s in enumerate(operand_shapes):
        entry.add(Instruction(f"p{i}", "parameter", s, [], {"parameter_number": i}))
        names.append(f"p{i}")
    entry.add(Instruction("op", opcode, result_shape, names, dict(attrs or {})))
    entry.root = "op"
    m.add(entry)
    m.entry = "main"
    return m


def run_module(module: Module, args: list[Any], replica_id: int = 0, fabric: Any = None) -> Any:
    """Verified and run, as every program is: kernels trust verified IR."""
    return Interpreter(compile_module(module), replica_id, fabric).run(args)


def run_op(opcode: str, result_shape: Shape | str, operands: list[Any], attrs: dict[str, Any] | None = None,
           computations: list[Computation] = ()) -> Any:
    """Run one instruction whose operands are the given numpy values (passed as parameters)."""
    operands = [o if isinstance(o, (tuple, np.ndarray)) else np.asarray(o) for o in operands]
    m = single_op_module(opcode, result_shape, [Shape.of(o) for o in operands], attrs, computations)
    return run_module(m, operands)
