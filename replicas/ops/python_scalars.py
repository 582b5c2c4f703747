"""A While loop's integer and pred scalars as Python numbers: its counter and condition without numpy.

A loop's counter and condition (`i + 1`, `i < k`) are 0-d s32/pred values. As numpy 0-d arrays
every step is a ufunc call, dearer still with many replicas on threads, where a replica's numpy
objects have left the core's cache by its next turn. As Python ints they are a few bytecodes of
the computation's generated code.

`loop_scalars` picks the elements of a loop's state that can stay Python numbers (int for the
integer types, bool for pred) through the condition and the body: every value computed from them
is the operand only of ops that `expression` writes as Python, or goes back into a state element
picked too. The interpreter then generates those ops as Python expressions (`plan` says which),
converting the elements to Python on the loop's entry and back to 0-d arrays of their own dtype on
its exit, so nothing outside the loop sees a Python number. The expressions give numpy's bits:
integers wrap at their width (two's complement for signed types), compares and select as numpy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from replicas.hlo.ir import Computation, Instruction, Module
from replicas.ops.element_ops import writer
from replicas.shapes import PrimitiveType, Shape

P = PrimitiveType
# The types kept as Python numbers: pred and the byte-wide integers (sub-byte ones stay numpy).
FAST_TYPES = frozenset({P.PRED, P.S8, P.S16, P.S32, P.S64, P.U8, P.U16, P.U32, P.U64})

Expression = Callable[[list[str]], str]  # operand texts -> the Python expression of the result


def is_fast(shape: Shape) -> bool:
    """A 0-d array of a type kept as a Python number."""
    return shape.is_array and not shape.dimensions and shape.element_type in FAST_TYPES


def expression(inst: Instruction, operand_types: list[PrimitiveType], module: Module | None = None,
               depth: int = 0) -> Expression | None:
    """The Python expression of `inst` on Python-number operands, or None when it has none. Only
    ops whose result is exactly numpy's for every operand value are here (`element_ops.writer`'s:
    no divide, remainder or power, whose edge cases stay with the numpy kernels). A fusion or call
    (of `module`) whose computation is such ops on scalars is their expressions composed (XLA's
    compiled loops wrap their counter's add and compare in fusions)."""
    t = inst.shape.element_type
    if not is_fast(inst.shape) or any(o not in FAST_TYPES for o in operand_types):
        return None
    op = inst.opcode
    if op in ("copy", "bitcast", "reshape") and operand_types == [t]:
        return lambda a: a[0]
    if op in ("fusion", "call"):
        return None if module is None else _composed(module, module.computation(inst.called_computations()[0]), depth)
    if op in _LEFT_TO_NUMPY:
        return None
    return writer(inst, operand_types)


# Ops element_ops writes that a loop's scalars leave to their numpy kernels: shifts and abs, and
# bitcast-convert (written with struct helpers the interpreter's generated code does not have).
_LEFT_TO_NUMPY = frozenset({"shift-left", "shift-right-arithmetic", "shift-right-logical", "abs", "bitcast-convert"})


# A composed expression longer than this (a deep fusion repeating its shared values) stays numpy;
# so does a fusion nested deeper than MAX_DEPTH.
MAX_COMPOSED = 2000
MAX_DEPTH = 8
# Placeholders as long as any operand text of the generated code (a variable, or a 64-bit literal),
# so a composed expression measured with them is never shorter than the one generated.
_PLACEHOLDER = "x" * 24


def _composed(module: Module, comp: Computation, depth: int) -> Expression | None:
    """`comp`'s root as one Python expression of its parameters: every instruction a parameter, a
    fast constant or an op with an expression. A value read twice is written out twice (pure, and
    a conditional expression may evaluate either branch only, so no shared temporaries)."""
    if depth > MAX_DEPTH:
        return None
    steps: list[tuple[Instruction, Expression | None]] = []
    by_name = comp.by_name
    for inst in comp.instructions:
        if inst.opcode == "parameter" or inst.opcode == "constant":
            if not is_fast(inst.shape) or (inst.opcode == "constant" and literal(inst) is None):
                return None
            steps.append((inst, None))
            continue
        found = expression(inst, [by_name[o].shape.element_type for o in inst.operands], module, depth + 1)
        if found is None:
            return None
        steps.append((inst, found))

    def compose(operands: list[str]) -> str:
        texts: dict[str, str] = {}
        for inst, found in steps:
            if found is not None:
                text = found([texts[o] for o in inst.operands])
                if len(text) > MAX_COMPOSED:
                    raise _TooLong
                texts[inst.name] = text
            elif inst.opcode == "parameter":
                texts[inst.name] = operands[inst.attrs["parameter_number"]]
            else:
                texts[inst.name] = literal(inst)  # type: ignore[assignment]
        return texts[comp.root]

    try:
        compose([_PLACEHOLDER] * len(comp.parameters))
    except _TooLong:
        return None
    return compose


class _TooLong(Exception):
    pass


def literal(inst: Instruction) -> str | None:
    """A fast 0-d constant's value as a Python literal (numpy's conversion to its dtype first), or
    None for a literal that is not one value (the constant's kernel reports it)."""
    try:
        value: Any = np.asarray(inst.attrs["literal"]).astype(inst.shape.dtype)
    except (KeyError, TypeError, ValueError, OverflowError):
        return None
    return repr(value.item()) if value.size == 1 else None


@dataclass
class Plan:
    """How a condition or body carries the state elements `scalars` as Python numbers."""

    scalars: frozenset[int]
    python: dict[str, Expression | None] = field(default_factory=dict)  # Python values (None: a state element)
    literals: dict[str, str] = field(default_factory=dict)  # fast constants, as Python literals
    drop: set[int] = field(default_factory=set)  # elements whose values reach a numpy consumer
    ops: int = 0  # Python expressions (not counting reads of the state)


def plan(module: Module, comp: Computation, scalars: frozenset[int]) -> Plan:
    """Which values of `comp` (a loop's condition or body, whose parameter is the state tuple) are
    Python numbers when the state elements `scalars` are. A body's root is the next state: a
    Python value may go back into an element of `scalars` only."""
    result = Plan(scalars)
    param = comp.parameters[0].name
    by_name = comp.by_name
    origin: dict[str, frozenset[int]] = {}
    body_root = comp.root if comp.root_instruction.shape.is_tuple else None
    for inst in comp.instructions:
        name = inst.name
        if inst.opcode == "get-tuple-element" and inst.operands == [param]:
            index = inst.attrs["index"]
            if index in scalars:
                result.python[name] = None
                origin[name] = frozenset((index,))
            continue
        if inst.opcode == "constant" and is_fast(inst.shape):
            text = literal(inst)
            if text is not None:
                result.literals[name] = text
            continue
        sources = [origin[o] for o in inst.operands if o in origin]
        if name == body_root:
            for j, o in enumerate(inst.operands):
                if o in origin and j not in scalars:
                    result.drop |= origin[o]
                elif j in scalars and o not in origin and o not in result.literals:
                    result.drop.add(j)  # a numpy value would have to become a Python one
            continue
        if not sources:
            continue
        found = None
        if all(o in origin or o in result.literals for o in inst.operands):
            found = expression(inst, [by_name[o].shape.element_type for o in inst.operands], module)
        if found is None:
            for s in sources:
                result.drop |= s
            continue
        result.python[name] = found
        result.ops += 1
        origin[name] = frozenset().union(*sources)
    return result


def loop_scalars(module: Module, state: Shape, condition: Computation, body: Computation) -> frozenset[int]:
    """The elements of a While loop's state kept as Python numbers through `condition` and `body`
    (empty when none, or when no op of the loop would compute on them)."""
    if not state.is_tuple or body.root_instruction.opcode != "tuple":
        return frozenset()
    if any(body.root in i.operands for i in body.instructions):
        return frozenset()  # the next state is read inside the body too: its elements must be arrays
    for comp in (condition, body):
        if len(comp.parameters) != 1:
            return frozenset()
        param = comp.parameters[0].name
        if any(param in i.operands and i.opcode != "get-tuple-element" for i in comp.instructions):
            return frozenset()  # the state tuple itself escapes: its elements must stay arrays
    scalars = frozenset(k for k, s in enumerate(state.tuple_shapes) if is_fast(s))
    while scalars:
        plans = plan(module, condition, scalars), plan(module, body, scalars)
        drop = plans[0].drop | plans[1].drop
        if not drop:
            return scalars if plans[0].ops + plans[1].ops else frozenset()
        scalars -= drop
    return scalars
