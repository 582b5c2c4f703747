"""Recognize common called computations so kernels can take numpy fast paths.

`binary_reducer(comp)` names the reduction of a `(a, b) -> op(a, b)` computation (add, multiply,
maximum, minimum, and, or, xor), for reduce, reduce-window, scatter and all-reduce;
`sort_comparator(comp)` recognizes `a < b` / `a > b` on the first operand's pair of parameters.
Anything else returns None and the kernel evaluates the computation on whole arrays.
"""

from __future__ import annotations

from replicas.hlo.ir import Computation

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
