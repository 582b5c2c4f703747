"""compile(module) -> Executable: a verified module plus one schedule per computation.

A schedule is a list of steps (instruction, operand slots, result slot, slots released after the
step). Slots are reused once their value is dead, so peak memory follows the live set. The order
is program order, which is a valid topological order (operands are defined before use) and keeps
side-effecting ops (collectives, channels, feeds) in the order the program wrote them.
Instructions that are neither needed by the root nor side-effecting are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

from replicas.errors import ProgramError
from replicas.hlo.ir import Computation, Instruction, Module
from replicas.hlo.opcodes import SIDE_EFFECT_OPCODES


@dataclass(frozen=True)
class Step:
    inst: Instruction
    operand_slots: tuple[int, ...]
    result_slot: int
    release: tuple[int, ...]  # slots whose value is dead after this step


@dataclass(frozen=True)
class Schedule:
    computation: str
    num_slots: int
    parameter_slots: tuple[int, ...]  # indexed by parameter number
    steps: tuple[Step, ...]
    root_slot: int


@dataclass(frozen=True)
class Executable:
    module: Module
    schedules: dict[str, Schedule]

    @property
    def entry(self) -> Schedule:
        return self.schedules[self.module.entry]

    def to_bytes(self) -> bytes:
        """Schedules are cheap to recompute, so only the module travels."""
        from replicas.hlo.serialize import module_to_bytes

        return module_to_bytes(self.module)

    @staticmethod
    def from_bytes(data: bytes) -> Executable:
        from replicas.hlo.serialize import module_from_bytes

        return compile_module(module_from_bytes(data), verified=True)


def compile_module(module: Module, *, verified: bool = False, num_replicas: int | None = None) -> Executable:
    if not verified:
        from replicas.hlo.verify import verify

        verify(module, num_replicas=num_replicas)
    schedules = {name: schedule_computation(comp) for name, comp in module.computations.items()}
    return Executable(module, schedules)


def schedule_computation(comp: Computation) -> Schedule:
    insts = comp.instructions
    index = {inst.name: i for i, inst in enumerate(insts)}
    root = comp.root_instruction
    needed = _needed(comp, index)
    kept = [inst for i, inst in enumerate(insts) if needed[i]]

    last_use: dict[str, int] = {}
    for pos, inst in enumerate(kept):
        for op in inst.operands:
            last_use[op] = pos

    free: list[int] = []
    slot_of: dict[str, int] = {}
    num_slots = 0
    params = sorted((i for i in kept if i.opcode == "parameter"), key=lambda i: i.attrs["parameter_number"])
    parameter_slots = []
    for p in params:
        slot_of[p.name] = num_slots
        parameter_slots.append(num_slots)
        num_slots += 1

    steps: list[Step] = []
    for pos, inst in enumerate(kept):
        if inst.opcode == "parameter":
            continue
        try:
            operand_slots = tuple(slot_of[op] for op in inst.operands)
        except KeyError as e:
            raise inst.error(f"operand %{e.args[0]} is not defined before use") from None
        dead = [slot_of[op] for op in dict.fromkeys(inst.operands)
                if last_use.get(op) == pos and op != root.name]
        if free:
            result_slot = free.pop()
        else:
            result_slot = num_slots
            num_slots += 1
        slot_of[inst.name] = result_slot
        # A value nobody reads (a side effect's token) is dead at once.
        if inst.name not in last_use and inst.name != root.name:
            dead.append(result_slot)
        steps.append(Step(inst, operand_slots, result_slot, tuple(dead)))
        free.extend(s for s in dead if s != result_slot)
        if result_slot in dead:
            free.append(result_slot)
    if root.name not in slot_of:
        raise ProgramError(f"computation {comp.name}: root %{root.name} is not scheduled")
    return Schedule(comp.name, num_slots, tuple(parameter_slots), tuple(steps), slot_of[root.name])


def _needed(comp: Computation, index: dict[str, int]) -> list[bool]:
    insts = comp.instructions
    needed = [False] * len(insts)
    stack = [index[comp.root]]
    stack.extend(i for i, inst in enumerate(insts)
                 if inst.opcode in SIDE_EFFECT_OPCODES or inst.opcode == "parameter"
                 or inst.opcode.endswith("-done"))
    while stack:
        i = stack.pop()
        if needed[i]:
            continue
        needed[i] = True
        for op in insts[i].operands:
            j = index.get(op)
            if j is None:
                raise insts[i].error(f"operand %{op} is not defined in computation {comp.name}")
            if not needed[j]:
                stack.append(j)
    return needed
