"""The stacks of a batched program's values (`runtime/batched.py`): which values differ between
the members (stacked: a leading axis of one row per member) and which are the same for all.

A value's stack is False (the same for every member) or True (stacked), a tuple of stacks for a
tuple. `Analysis` infers every instruction's from its computation's parameters', a While loop's
state to a fixpoint (an element becomes stacked once the body makes it so, never the reverse)."""

from __future__ import annotations

from typing import Any

import numpy as np

from replicas.collectives.groups import plan_groups
from replicas.hlo.ir import Instruction, Module
from replicas.shapes import Shape

Stack = Any  # bool (an array: True when stacked) or a tuple of stacks (a tuple)

COLLECTIVES = frozenset({"all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all"})
MEMBER_DEPENDENT = COLLECTIVES | {"replica-id", "partition-id"}
CHANNEL_OPS = frozenset({"send", "send-done", "recv", "recv-done"})  # between members: batched_channels.py


class Divergent(Exception):
    """The members' control flow differs: the run falls back to one interpreter per member."""


# -- stacks ------------------------------------------------------------------------------------------

def join(a: Stack, b: Stack) -> Stack:
    if isinstance(a, tuple):
        return tuple(join(x, y) for x, y in zip(a, b))
    return bool(a or b)


def any_stacked(s: Stack) -> bool:
    return any(any_stacked(x) for x in s) if isinstance(s, tuple) else bool(s)


def full(shape: Shape, value: bool) -> Stack:
    return tuple(full(s, value) for s in shape.tuple_shapes) if shape.is_tuple else value


def promoter(src: Stack, dst: Stack, members: int) -> Any:
    """None when a value of stack `src` already has stack `dst`; else the function giving it `dst`
    (an unstacked array repeated for every member: a read-only view, nothing writes into it)."""
    if src == dst:
        return None
    if isinstance(src, tuple):
        parts = [promoter(a, b, members) for a, b in zip(src, dst)]
        return lambda v: tuple(x if p is None else p(x) for p, x in zip(parts, v))
    return lambda x: np.broadcast_to(x, (members, *np.shape(x)))


# -- the stacks of every value -------------------------------------------------------------------------

class Analysis:
    """The stack of every instruction of a computation, given its parameters' (memoized)."""

    def __init__(self, module: Module, members: tuple[int, ...], num_replicas: int) -> None:
        self.module = module
        self.members = members
        self.num_replicas = num_replicas
        self._memo: dict[tuple[str, tuple], dict[str, Stack]] = {}

    def of(self, name: str, params: tuple) -> dict[str, Stack]:
        key = (name, params)
        found = self._memo.get(key)
        if found is not None:
            return found
        comp = self.module.computation(name)
        stacks: dict[str, Stack] = {}
        for inst in comp.instructions:
            stacks[inst.name] = self._instruction(inst, [stacks.get(o) for o in inst.operands], params)
        self._memo[key] = stacks
        return stacks

    def root(self, name: str, params: tuple) -> Stack:
        return self.of(name, params)[self.module.computation(name).root]

    def while_state(self, inst: Instruction, initial: Stack) -> Stack:
        state = initial
        while True:
            after = join(state, self.root(inst.attrs["body"], (state,)))
            if after == state:
                return state
            state = after

    def _instruction(self, inst: Instruction, operands: list[Stack], params: tuple) -> Stack:
        op = inst.opcode
        if op == "parameter":
            return params[int(inst.attrs["parameter_number"])]
        if op == "get-tuple-element":
            return operands[0][int(inst.attrs["index"])]
        if op == "tuple":
            return tuple(operands)
        if op in ("replica-id", "partition-id"):
            return True
        if op in COLLECTIVES:
            uniform = op in ("all-reduce", "all-gather") and self.one_group(inst)
            return full(inst.shape, not uniform)
        if op in CHANNEL_OPS:
            # A Send keeps its operand's stack, a RecvDone's data differs between the members;
            # contexts and tokens are the same for all.
            if op == "send":
                return (operands[0], False, False)
            return (True, False) if op == "recv-done" else full(inst.shape, False)
        if op in ("fusion", "call"):
            return self.root(inst.attrs["calls" if op == "fusion" else "to_apply"], tuple(operands))
        if op == "while":
            return self.while_state(inst, operands[0])
        if op == "conditional":
            names = conditional_branches(inst)
            out = full(inst.shape, any_stacked(operands[0]))
            for k, name in enumerate(names):
                out = join(out, self.root(name, (operands[k + 1],)))
            return out
        return full(inst.shape, any(any_stacked(s) for s in operands))

    def one_group(self, inst: Instruction) -> bool:
        """Whether one group holds every member (so every member gets the same result): the members'
        own, or the one group of every replica (which leaves the process: `batched_spanning`)."""
        plan = plan_groups(inst, self.module, self.members[0], self.num_replicas)
        return plan.group == self.members or len(plan.groups) == 1


def conditional_branches(inst: Instruction) -> list[str]:
    if "branch_computations" in inst.attrs:
        return list(inst.attrs["branch_computations"])
    return [inst.attrs["true_computation"], inst.attrs["false_computation"]]
