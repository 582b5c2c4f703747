"""Which values of a computation nothing else can see, so a step may overwrite them instead of
copying: the ownership analysis behind in-place dynamic-update-slice and donated callee arguments."""

from __future__ import annotations

from typing import Any

from replicas.hlo.ir import Instruction

Donation = frozenset  # of (parameter number, tuple index or None): see BoundComputation.donated
Origin = tuple[int, int | None]  # an argument: (parameter number, tuple index or None)
_CALLERS = {"fusion": "calls", "call": "to_apply"}


def callee(inst: Instruction) -> str:
    return inst.attrs[_CALLERS[inst.opcode]]


def ownership(steps: list[Any], donated: Donation, operand_vars: list[list[str]], readers: dict[str, int],
              root_var: str, arg_names: list[str]) -> tuple[set[int], dict[int, Donation], frozenset[Origin]]:
    """Which steps may overwrite an operand instead of copying it: (steps running their kernel's
    `in_place` form, {fusion/call step: the arguments it gives its callee}).

    A value is owned when nothing else can see its buffer: a donated argument, the element of a
    donated tuple read by its only get-tuple-element, or a dynamic-update-slice result (a copy, or
    an owned buffer updated). An owned value whose only reader is a step may be given away to it:
    a dynamic-update-slice then writes into it, a fusion or call passes it on as donated. The third
    result: the arguments (parameter, tuple index or None) those steps overwrite."""
    owned: set[str] = set()
    elements: dict[str, int] = {}  # owned get-tuple-element var -> its tuple index
    for param, index in donated:
        if index is None:
            owned.add(arg_names[param])
    tuple_params = {param for param, index in donated if index is not None}
    for param in tuple_params:
        name = arg_names[param]
        allowed = {index for p, index in donated if p == param}
        reads = [k for k, names in enumerate(operand_vars) if name in names]
        if any(steps[k][4].opcode != "get-tuple-element" for k in reads):
            continue  # the tuple itself escapes: none of its elements can be given away
        taken = [steps[k][4].attrs.get("index") for k in reads]
        for k, index in zip(reads, taken):
            if index in allowed and taken.count(index) == 1 and steps[k][4].shape.is_array:
                owned.add(f"v{k}")
                elements[f"v{k}"] = index
    in_place: set[int] = set()
    callee_donations: dict[int, Donation] = {}
    updated: set[tuple[int, int | None]] = set()

    def given(name: str) -> bool:
        return name in owned and readers.get(name) == 1 and name != root_var

    for k, names in enumerate(operand_vars):
        fn, inst = steps[k][0], steps[k][4]
        if inst.opcode == "dynamic-update-slice":
            if names and given(names[0]) and hasattr(fn, "in_place"):
                in_place.add(k)
                updated.add(_origin(names[0], arg_names, elements))
            owned.add(f"v{k}")
        elif inst.opcode in _CALLERS and not inst.shape.is_tuple:
            gifts = frozenset((j, None) for j, n in enumerate(names) if given(n))
            if gifts:
                callee_donations[k] = gifts
                updated.update(_origin(names[j], arg_names, elements) for j, _ in gifts)
    return in_place, callee_donations, frozenset(o for o in updated if o is not None)


def _origin(name: str, arg_names: list[str], elements: dict[str, int]) -> tuple[int, int | None] | None:
    if name in elements:
        return (0, elements[name])
    if name in arg_names:
        return (arg_names.index(name), None)
    return None


