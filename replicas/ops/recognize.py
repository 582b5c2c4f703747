"""Recognize common called computations so kernels can take numpy fast paths.

`binary_reducer(comp)` names the reduction of a `(a, b) -> op(a, b)` computation (add, multiply,
maximum, minimum, and, or, xor), for reduce, reduce-window, scatter and all-reduce;
`sort_comparator(comp)` recognizes `a < b` / `a > b` on the first operand's pair of parameters;
`symmetric_key(comp)` a comparator `f(lhs_k) < f(rhs_k)` for one pure function `f` of one operand.
Anything else returns None and the kernel evaluates the computation on whole arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

from replicas.hlo.ir import Computation, Instruction
from replicas.hlo.opcodes import opcode as opcode_record

REDUCERS = ("add", "multiply", "maximum", "minimum", "and", "or", "xor")
_COMMUTATIVE = frozenset(REDUCERS)


def binary_reducer(comp: Computation) -> str | None:
    params = comp.parameters
    if len(params) != 2 or any(not p.shape.is_scalar for p in params):
        return None
    root = comp.root_instruction
    # Allow convert wrappers XLA sometimes keeps (bf16 sums accumulated in f32) only when the
    # result type equals the parameter type; otherwise the computation is not a plain reducer.
    if root.opcode not in _COMMUTATIVE or len(root.operands) != 2:
        return None
    names = {p.name for p in params}
    if set(root.operands) != names or root.operands[0] == root.operands[1]:
        return None
    if root.shape.element_type is not params[0].shape.element_type:
        return None
    if len(comp.instructions) != 3:
        return None
    return root.opcode


def sort_comparator(comp: Computation) -> tuple[str, bool] | None:
    """("lt" | "gt", total_order) if `comp` orders by the first operand alone, else None.

    A sort comparator has 2*N scalar parameters (lhs_i = 2i, rhs_i = 2i+1). Only the key pair
    (parameters 0 and 1) may be used; the root is one compare of them.
    """
    params = comp.parameters
    if len(params) < 2 or len(params) % 2:
        return None
    root = comp.root_instruction
    if root.opcode != "compare" or len(root.operands) != 2:
        return None
    by_name = comp.by_name
    p0, p1 = params[0].name, params[1].name
    a, b = root.operands
    direction = root.attrs.get("comparison_direction")
    if direction not in ("LT", "GT"):
        return None
    if (a, b) == (p1, p0):
        direction = "GT" if direction == "LT" else "LT"
    elif (a, b) != (p0, p1):
        return None
    if any(by_name[n].opcode != "parameter" for n in (a, b)):
        return None
    total = root.attrs.get("type") == "TOTALORDER"
    return direction.lower(), total


# The ops a key function of a comparator may use: pure, element by element.
_KEY_FAMILIES = frozenset({"elementwise_unary", "elementwise_binary", "compare", "select", "convert", "constants"})
_KEY_OPCODES = frozenset({"bitcast", "copy", "reshape"})


@dataclass(frozen=True)
class SymmetricKey:
    """A comparator `f(lhs_k) <direction> f(rhs_k)`: `steps` compute f (in program order) from the
    parameter named `parameter`, whose value is `key`; `total_order` for a TOTALORDER compare."""

    operand: int
    direction: str  # "lt" | "gt"
    total_order: bool
    parameter: str
    key: str
    steps: tuple[Instruction, ...]


def symmetric_key(comp: Computation) -> SymmetricKey | None:
    """The key function of a comparator whose root compares the same pure function of one operand's
    lhs and rhs parameters (jax's float sort canonicalizes NaN and zeros, then orders their bits)."""
    params = comp.parameters
    root = comp.root_instruction
    if len(params) < 2 or len(params) % 2 or root.opcode != "compare" or len(root.operands) != 2:
        return None
    direction = root.attrs.get("comparison_direction")
    if direction not in ("LT", "GT"):
        return None
    by_name = comp.by_name
    memo: dict[str, tuple[str, frozenset[int]] | None] = {}

    def signature(name: str) -> tuple[str, frozenset[int]] | None:
        """The expression of `name` with its parameter written X, and the parameters it reads."""
        if name in memo:
            return memo[name]
        inst = by_name[name]
        found: tuple[str, frozenset[int]] | None = None
        if inst.opcode == "parameter":
            found = ("X", frozenset((int(inst.attrs["parameter_number"]),)))
        else:
            record = opcode_record(inst.opcode)
            if record is not None and (record.family in _KEY_FAMILIES or inst.opcode in _KEY_OPCODES):
                parts = [signature(o) for o in inst.operands]
                if all(p is not None for p in parts):
                    attrs = repr(sorted((k, repr(v)) for k, v in inst.attrs.items()))
                    text = f"{inst.opcode}:{inst.shape}:{attrs}({','.join(p[0] for p in parts)})"  # type: ignore[index]
                    found = (text, frozenset().union(*[p[1] for p in parts]))  # type: ignore[index]
        memo[name] = found
        return found

    a, b = root.operands
    lhs, rhs = signature(a), signature(b)
    if lhs is None or rhs is None or lhs[0] != rhs[0] or len(lhs[1]) != 1 or len(rhs[1]) != 1:
        return None
    (pa,), (pb,) = lhs[1], rhs[1]
    if pa % 2 or pb != pa + 1:
        if pb % 2 or pa != pb + 1:
            return None
        a, pa = b, pb
        direction = "GT" if direction == "LT" else "LT"
    parameter = next(p.name for p in params if int(p.attrs["parameter_number"]) == pa)
    cone: set[str] = set()
    stack = [a]
    while stack:
        name = stack.pop()
        if name not in cone:
            cone.add(name)
            stack.extend(by_name[name].operands)
    steps = tuple(i for i in comp.instructions if i.name in cone and i.opcode != "parameter")
    return SymmetricKey(pa // 2, direction.lower(), root.attrs.get("type") == "TOTALORDER", parameter, a, steps)
