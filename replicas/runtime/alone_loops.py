"""Programs whose replicas run one by one for a loop's sake: a long While loop of a few numbers a member.

Batched (runtime/batched.py), the members' loop state is stacked and every trip is numpy calls on
rows of a few elements. Replica by replica, each member's loop is per-element code, soon machine
code (ops/python_elements, ops/machine): hundreds of times cheaper a trip, and the members' machine
code runs side by side without the GIL. A long loop (a sampler's chain: a `fori_loop` of hundreds
of trips) outweighs what batching saves on the rest of the program; a short one (threefry's five
rounds inside a training step) does not, and a loop that talks to other replicas is where batching
pays most.
"""

from __future__ import annotations

from replicas.hlo.ir import Instruction, Module
from replicas.ops.python_elements import small_state

# A loop whose condition bounds its counter by at least this many trips is long.
LONG_TRIPS = 64
# Ops in a loop that make its members wait for, or depend on, anyone: such a loop stays batched.
_SHARED = frozenset({"all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all",
                     "collective-broadcast", "ragged-all-to-all", "replica-id", "partition-id", "send", "recv",
                     "send-done", "recv-done", "infeed", "outfeed", "custom-call", "rng",
                     "rng-get-and-update-state"})


def loops_run_alone(module: Module) -> bool:
    """Whether a While of the program is long (`LONG_TRIPS`), keeps its whole state as a few numbers
    a member (`small_state`) and talks to nobody."""
    for comp in module.computations.values():
        for inst in comp.instructions:
            if (inst.opcode == "while" and small_state(inst) and (_bound(module, inst) or 0) >= LONG_TRIPS
                    and not _talks(module, inst)):
                return True
    return False


def _bound(module: Module, inst: Instruction) -> int | None:
    """The integer constant the While's condition compares its state with (a counted loop's bound,
    as JAX's `fori_loop` writes it), or None."""
    cond = module.computation(inst.attrs["condition"])
    root = cond.root_instruction
    compare = root
    if root.opcode == "fusion":
        compare = module.computation(root.attrs["calls"]).root_instruction
    if compare.opcode != "compare":
        return None
    for name in root.operands:
        operand = cond.by_name[name]
        literal = operand.attrs.get("literal") if operand.opcode == "constant" else None
        if literal is not None and getattr(literal, "ndim", None) == 0 and literal.dtype.kind in "iu":
            return int(literal)
    return None


def _talks(module: Module, inst: Instruction) -> bool:
    """Whether the While's condition or body (or what they call) has an op of `_SHARED`."""
    seen: set[str] = set()
    todo = [inst.attrs["condition"], inst.attrs["body"]]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for i in module.computation(name).instructions:
            if i.opcode in _SHARED:
                return True
            todo.extend(i.called_computations())
    return False
