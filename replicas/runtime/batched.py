"""Batched execution: the replicas of one process that run the same program, run as one interpreter
over their values stacked along a leading replica axis.

Which values differ between the members is known before anything runs: each value's *stack* is
False (the same for every member: one array, computed once) or True (one row per member, the
members in replica order), a tuple of stacks for a tuple. Arguments that are the very same object
for every member are not stacked; what is computed from unstacked values only stays unstacked, and
replica-id, partition-id and most collectives' results are stacked (an all-reduce whose one group
holds every member is not). `Analysis` infers the stack of every instruction of every computation
from its parameters' (a While loop's state to a fixpoint); `BatchedComputation` is a computation
bound with `batched_kernels.kernel_for` each instruction's kernel for its operands' stacks, and
compiled by `codegen.straight_line` like any other.

Every member gets what it would have computed alone, bit for bit: the kernels run the same numpy
operations on each member's rows (an element-wise ufunc over a stacked array, `np.matmul` over a
leading batch of the same matrices), a collective among the members reduces their rows in group
order as the in-process unit does, and what has no batched form runs once per member.

A run is speculative. The members meet (the last to arrive leads, as at a collective's meeting);
the leader runs the batched program and hands each member its result. When the members' control
flow would diverge (a While condition or a conditional's branch that differs between members) or
any kernel raises, the leader hands every member `FALLBACK` instead, and each runs the program on
its own, from its own arguments, as without batching: nothing of the batched run is visible
(but in the members' live states while it ran: `batched_live.py`).
Only programs that cannot wait or talk to anyone but the process's own members are batched: no
channel, feed, custom call or stateful rng, and every collective group within the process, but for
an all-reduce of one group of every replica (`batched_spanning.py`): the process's partial, then
the leaders' step, run by the first member (a run that spans processes is led by it and never
falls back once a spanning collective ran).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from replicas.caching import Cache
from replicas.collectives.fingerprint import make_fingerprint
from replicas.collectives.groups import intern, plan_groups, verified_pairs
from replicas.collectives.kernels import computation_of
from replicas.collectives.topology import RESULT, RESULT_LANES
from replicas.errors import ReplicasError
from replicas.hlo.ir import Computation, Instruction, Module
from replicas.ops.elementwise_util import SUB_BYTE_WIDE
from replicas.records import BATCHED_OPCODE, BlockInfo
from replicas.runtime import batched_channels, batched_live, batched_spanning
from replicas.runtime.alone_loops import loops_run_alone
from replicas.runtime.batched_kernels import kernel_for
from replicas.runtime.bound import GENERATED, BoundComputation
from replicas.runtime.codegen import straight_line
from replicas.runtime.compile import Executable, largest_dot, runs_bounded_alone
from replicas.runtime.stacks import (
    CHANNEL_OPS,
    COLLECTIVES,
    MEMBER_DEPENDENT,
    Analysis,
    Divergent,
    Stack,
    any_stacked,
    full,
)
from replicas.shapes import Shape
from replicas.transport import keys
from replicas.tuning import cores

CONTROL = frozenset({"fusion", "call", "while", "conditional"})
# Side effects and hidden state: a program with any of these runs replica by replica.
REFUSED = frozenset({"infeed", "outfeed", "custom-call", "rng",
                     "rng-get-and-update-state", "async-start", "async-update", "async-done", "all-reduce-start",
                     "all-reduce-done", "all-gather-start", "all-gather-done", "collective-permute-start",
                     "collective-permute-done", "collective-broadcast", "ragged-all-to-all", "dynamic-reshape",
                     "get-dimension-size", "set-dimension-size", "copy-start", "copy-done"})
FALLBACK = object()  # the leader's answer when the members are to run on their own
# REPLICAS_BATCHED=0 runs every replica on its own (a comparison, or a suspected bug).
ENABLED = os.environ.get("REPLICAS_BATCHED", "1") not in ("0", "off", "false")
# kernel_state flag of a run whose process runs its replicas one after another in one thread (a
# program that cannot wait, run in the caller's thread): its members can never meet, so none waits.
IN_TURN = "batched: replicas in turn"
RUNS = {"batched": 0, "fallback": 0}  # leaders' runs, for tests and benchmarks
# Arguments that would take more than this stacked run replica by replica: stacking copies them (a
# copy the memory bound of the program does not count), and a replica's numpy work on large arrays
# runs outside the GIL anyway, beside the others'.
STACK_BYTES = 64 << 20
# A batched run's BLAS pools widen (`tuning/cores.widen`) for programs with a dot of at least this
# many multiply-adds per replica: smaller ones gain less than waking the pool's threads costs.
WIDE_BLAS_MULTIPLY_ADDS = 1 << 23
_CALLEES = {"fusion": ("calls",), "call": ("to_apply",), "while": ("condition", "body"),
            "conditional": ("true_computation", "false_computation", "branch_computations")}


# -- eligibility -------------------------------------------------------------------------------------

def program_computations(module: Module) -> set[str]:
    """The computations run as program (the entry and what control flow calls), not applied to
    elements (reducers, comparators)."""
    seen: set[str] = set()
    todo = [module.entry]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for inst in module.computation(name).instructions:
            for attr in _CALLEES.get(inst.opcode, ()):
                value = inst.attrs.get(attr)
                if isinstance(value, str):
                    todo.append(value)
                elif isinstance(value, (list, tuple)):
                    todo.extend(value)
    return seen


def batchable(module: Module) -> bool:
    """Whether the program has only ops the batched interpreter runs (whatever the placement)."""
    program = program_computations(module)
    for name, comp in module.computations.items():
        for inst in comp.instructions:
            op = inst.opcode
            leaves = [s for s in inst.shape.leaves() if s.is_array]
            if op in REFUSED or any(s.is_dynamic or s.element_type in SUB_BYTE_WIDE for s in leaves):
                return False
            if (op in MEMBER_DEPENDENT or op in CHANNEL_OPS) and name not in program:
                return False
            if op == "all-to-all" and not inst.attrs.get("dimensions"):
                return False
            if op == "collective-permute" and len(inst.operands) != 1:
                return False
    return True


def groups_within(module: Module, members: tuple[int, ...], num_replicas: int) -> bool:
    """Whether every collective group (or permute or channel pair) touching a member holds only members."""
    if batched_channels.has_channels(module) and not batched_channels.within(module, members, num_replicas):
        return False
    inside = set(members)
    for comp in module.computations.values():
        for inst in comp.instructions:
            if inst.opcode == "collective-permute":
                pairs = verified_pairs(inst)
                if any((s in inside) != (t in inside) for s, t in pairs):
                    return False
            elif inst.opcode in COLLECTIVES:
                # Each group once (not each member's: O(N) per instruction, not O(N^2)).
                groups = plan_groups(inst, module, members[0], num_replicas).groups
                if not all(inside.issuperset(g) or inside.isdisjoint(g) for g in groups):
                    return False
    return True


# -- binding -------------------------------------------------------------------------------------------

class BatchedComputation(BoundComputation):
    """A computation bound for parameters of the stacks `stacks`: `bound(*args) -> value`."""

    __slots__ = ("stacks",)

    def __init__(self, schedule: Any, ctx: BatchedContext, stacks: tuple) -> None:
        super().__init__(schedule, ctx)
        self.stacks = stacks

    def bind(self) -> None:
        ctx: BatchedContext = self._interp
        comp = ctx.module.computation(self.name)
        values = ctx.analysis.of(self.name, self.stacks)
        steps = []
        stacked: set[str] = set()
        for k, step in enumerate(self.schedule.steps):
            inst = step.inst
            if k % 16 == 0 and ctx.mailbox is not None:
                ctx.mailbox.check_abort()  # a job stopped (its timeout) while its leader binds a long program
            ctx._binding = comp
            operand_stacks = [values[o] for o in inst.operands]
            fn = kernel_for(inst, ctx, operand_stacks, values[inst.name])
            steps.append((fn, step.operand_slots, step.result_slot, step.release, inst))
        for k, step in enumerate(self.schedule.steps):
            if any_stacked(values[step.inst.name]):
                stacked.add(f"v{k}")
        for i in range(len(self._params)):
            if any_stacked(self.stacks[i]):
                stacked.add(f"a{i}")
        self._steps = steps
        self._run, self._line_to_inst = straight_line(self, comp, stacked=stacked)
        self._code = self._run.__code__
        GENERATED[self._code] = self._line_to_inst


class BatchedContext:
    """The `KernelContext` of a batched program: its members, the analysis, its computations."""

    def __init__(self, executable: Executable, members: tuple[int, ...], num_replicas: int) -> None:
        self.executable = executable
        self.module: Module = executable.module
        self.members = members
        self.size = len(members)
        self.replica_id = members[0]
        self.num_replicas = num_replicas
        self.fabric: Any = None  # batched kernels talk to nobody (but a spanning all-reduce's leaders' step)
        self.fabrics: Sequence[Any] = ()  # the members' fabrics, while a run that spans processes runs
        self.spanned = 0  # spanning collectives run by the current run (it can no longer fall back)
        # The current run, on its members' recorders already (`batched_live.go_live`).
        self.live: batched_live.Replayed | None = None
        self.mailbox: Any = None  # the leading member's, while it runs (an abort stops the run)
        self.every_instruction_recorder = None
        self.current: Instruction | None = None
        self.analysis = Analysis(self.module, members, num_replicas)
        self._binding: Computation | None = None
        self._bound: dict[tuple[str, tuple], BatchedComputation] = {}
        # The collectives run, as (index in `collectives`, start ns, end ns): recorded in each member's
        # flight recorder once the run succeeded (`batched_live.replay`), as if each had run them.
        self.log: list[tuple[int, int, int]] = []
        self.collectives: list[tuple[Instruction, list[tuple[tuple[int, ...], Any]]]] = []
        # Send and Recv (batched_channels.py): the current run's by channel, the bound channel ops
        # (instruction, channel, pairs) and the run's log of them.
        self.channels: dict[int, Any] = {}
        self.member_fabrics: Sequence[Any] = ()  # every member's, while a run runs
        self.channel_ops: list[tuple[Instruction, int, tuple[tuple[int, int], ...]]] = []
        self.channel_log: list[tuple[int, int, int, int]] = []
        self._collective_index: dict[int, int] = {}
        self._member_groups: dict[int, list[tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]]] = {}

    def collective(self, inst: Instruction) -> int:
        """The index of `inst` in `collectives`: its instruction and each member's (group, fingerprint)."""
        found = self._collective_index.get(id(inst))
        if found is None:
            computation = computation_of(self, inst)
            shapes = self.operand_shapes(inst)
            if inst.opcode == "collective-permute":
                pairs = verified_pairs(inst)
                group = intern(tuple(sorted({r for p in pairs for r in p})))
                fp = make_fingerprint(inst, computation, shapes, self.module, pairs=pairs)
                per_member = [(group, fp)] * self.size
            else:
                # One fingerprint per list of groups (the same for every member, and O(N) to make: its
                # groups are hashed), not per member.
                fps: dict[int, Any] = {}
                per_member = []
                for group, groups in self.member_groups(inst):
                    fp = fps.get(id(groups))
                    if fp is None:
                        fp = fps[id(groups)] = make_fingerprint(inst, computation, shapes, self.module, groups=groups)
                    per_member.append((group, fp))
            found = self._collective_index[id(inst)] = len(self.collectives)
            self.collectives.append((inst, per_member))
        return found

    def member_groups(self, inst: Instruction) -> list[tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]]:
        """Each member's (group, every group) of collective `inst`, by member; made in O(1) when one
        group holds every replica (thousands of members would each look theirs up)."""
        found = self._member_groups.get(id(inst))
        if found is None:
            first = plan_groups(inst, self.module, self.members[0], self.num_replicas)
            if len(first.groups) == 1:
                found = [(first.group, first.groups)] * self.size
            else:
                plans = [plan_groups(inst, self.module, m, self.num_replicas) for m in self.members]
                found = [(p.group, p.groups) for p in plans]
            self._member_groups[id(inst)] = found
        return found

    def batched(self, name: str, stacks: tuple) -> BatchedComputation:
        key = (name, stacks)
        bound = self._bound.get(key)
        if bound is None:
            bound = self._bound[key] = BatchedComputation(self.executable.schedules[name], self, stacks)
            binding = self._binding
            bound.bind()
            self._binding = binding
        return bound

    # -- KernelContext (for the kernels of unstacked values: the computations they apply) ------------
    def computation(self, name: str, donated: frozenset = frozenset(), *,
                    scalars: frozenset[int] = frozenset()) -> BatchedComputation:
        comp = self.module.computation(name)
        return self.batched(name, tuple(full(p.shape, False) for p in comp.parameters))

    def computation_ir(self, name: str) -> Computation:
        return self.module.computation(name)

    def operand_shapes(self, inst: Instruction) -> list[Shape]:
        comp = self._binding
        return [comp.instruction(name).shape for name in inst.operands]


class BatchedProgram:
    """The entry computation of `executable` for the members `members`, one variant per stacks of
    the arguments."""

    def __init__(self, executable: Executable, members: tuple[int, ...], num_replicas: int) -> None:
        self.ctx = BatchedContext(executable, members, num_replicas)
        self.entry = self.ctx.module.entry_computation
        # Whether its BLAS calls gain from the cores the members' own threads would have had.
        self.wide_blas = largest_dot(executable) >= WIDE_BLAS_MULTIPLY_ADDS

    def run(self, per_member: Sequence[Sequence[Any]], mailbox: Any, fabrics: Sequence[Any],
            spanning: bool = False) -> list[Any]:
        """Each member's result, from each member's arguments (in member order); their collectives
        recorded on their `fabrics`. `spanning`: some all-reduce leaves the process (run by the first
        member, whose fabric is `fabrics[0]`)."""
        stacks, values = [], []
        inputs: set[int] = set()
        if _bytes_to_stack(per_member) > STACK_BYTES:
            raise Divergent  # each member runs on its own arguments instead of copies of them all
        for j in range(len(per_member[0])):
            s, v = _stacked([args[j] for args in per_member], inputs)
            stacks.append(s)
            values.append(v)
        ctx = self.ctx
        ctx.spanned = 0
        if spanning and batched_spanning.may_diverge(ctx.analysis, self.entry.name, tuple(stacks)):
            raise Divergent  # a spanning collective cannot be taken back: each member runs on its own
        ctx.mailbox = mailbox
        ctx.fabrics = fabrics if spanning else ()
        ctx.member_fabrics = fabrics
        ctx.log.clear()
        ctx.channels.clear()
        ctx.channel_log.clear()
        batched_live.mark(ctx, fabrics)  # the members' states show the run's count and instruction
        try:
            out = ctx.batched(self.entry.name, tuple(stacks))(*values)
            batched_channels.check_complete(ctx)
        except BaseException:
            batched_live.failed(ctx, fabrics)
            raise
        finally:
            ctx.mailbox = None
            ctx.fabrics = ctx.member_fabrics = ()
        batched_live.replay(ctx, fabrics)
        batched_channels.record(ctx, fabrics)
        root = ctx.analysis.root(self.entry.name, tuple(stacks))
        return [_member(out, root, k, inputs) for k in range(ctx.size)]


def _bytes_to_stack(per_member: Sequence[Sequence[Any]]) -> int:
    """The bytes the members' arguments that are not shared would take stacked."""
    total = 0
    for j in range(len(per_member[0])):
        values = [args[j] for args in per_member]
        first = values[0]
        if not all(v is first for v in values):
            total += sum(getattr(leaf, "nbytes", 0) for v in values for leaf in _leaves(v))
    return total


def _leaves(value: Any) -> list[Any]:
    return [x for v in value for x in _leaves(v)] if isinstance(value, tuple) else [value]


def _stacked(values: list[Any], inputs: set[int]) -> tuple[Stack, Any]:
    first = values[0]
    if isinstance(first, tuple):
        parts = [_stacked([v[i] for v in values], inputs) for i in range(len(first))]
        return tuple(p[0] for p in parts), tuple(p[1] for p in parts)
    if all(v is first for v in values):
        inputs.add(id(first))
        return False, first
    return True, np.stack(values)


def _member(value: Any, stack: Stack, k: int, inputs: set[int]) -> Any:
    if isinstance(stack, tuple):
        return tuple(_member(v, s, k, inputs) for v, s in zip(value, stack))
    if stack:
        return value[k, ...]  # a 0-d row stays an array
    if isinstance(value, np.ndarray) and id(value) not in inputs:
        value.flags.writeable = False  # one array every member holds: nobody may change it
    return value


# -- the members' meeting ----------------------------------------------------------------------------

_WIRE = ("batched program",)  # the meeting's fingerprint: the same tuple for every member
_LEAD = RESULT - 1  # the meeting's round handing a spanning run's deposits to its first member
# (program, id(members), replicas) -> (members, kept alive for its id; members, or () when not batched;
# whether a collective leaves the process)
_plans: Cache[Any] = Cache("batched plans", 1024)
_plans_lock = threading.Lock()  # a program's list of free BatchedPrograms changes under it
_programs: Cache[list[BatchedProgram]] = Cache("batched programs", 64)


def plan(executable: Executable, replica_id: int, num_replicas: int, placement: Sequence[int],
         fabric: Any) -> tuple[int, ...] | None:
    """The members this replica runs batched with (itself included), or None: the program runs
    replica by replica (one member here, a program `batchable` refuses, a group leaving the process)."""
    if num_replicas < 2 or not 0 <= replica_id < len(placement) or len(placement) < num_replicas:
        return None
    members = _members_by_process(placement, num_replicas)[placement[replica_id]]
    if len(members) < 2 or fabric.local_mailbox(members[0]) is None:
        return None
    # Keyed by the interned members' identity: every replica of the process asks, and hashing the
    # tuple would be O(N) each.
    key = (executable.fingerprint, id(members), num_replicas)
    found = _plans.get(key)
    if found is None:
        with _plans_lock:  # one replica decides; the others (thousands of threads) wait for it
            found = _plans.get(key)
            if found is None:
                module = executable.module
                # A program that cannot wait may run its replicas one after the other in one thread
                # (threads: `runs_quickly`; a Ray actor's persistent calls): its members would never meet.
                ok = batchable(module) and not runs_bounded_alone(executable) and not loops_run_alone(module)
                within = ok and groups_within(module, members, num_replicas)
                spanning = (ok and not within and not batched_channels.has_channels(module)
                            and batched_spanning.spans(module, members, num_replicas))
                found = _plans.put(key, (members, members if within or spanning else (), spanning))
    return found[1] or None


def spanning(executable: Executable, members: tuple[int, ...], num_replicas: int) -> bool:
    """Whether the batched run of `members` (a `plan`) has collectives that leave the process."""
    found = _plans.get((executable.fingerprint, id(members), num_replicas))
    return bool(found is not None and found[0] is members and found[2])


_by_process: Cache[tuple[int, dict[Any, tuple[int, ...]]]] = Cache("members by process", 64, by_identity=True)


def _members_by_process(placement: Sequence[int], num_replicas: int) -> dict[Any, tuple[int, ...]]:
    """Process -> the replicas it hosts (interned, in replica order), once per placement (every
    fabric of a job shares its placement list)."""
    found = _by_process.get(placement)
    if found is None or found[0] != num_replicas:
        hosted: dict[Any, list[int]] = {}
        for r in range(num_replicas):
            hosted.setdefault(placement[r], []).append(r)
        found = _by_process.put(placement, (num_replicas, {p: intern(tuple(rs)) for p, rs in hosted.items()}))
    return found[1]


def run(executable: Executable, members: tuple[int, ...], fabric: Any, args: Sequence[Any]) -> Any:
    """This member's result of a batched run, or `FALLBACK` (run on your own)."""
    me = fabric.replica_id
    rank = members.index(me)
    # Meetings of their own numbers (negative: never a collective's), so a run that falls back
    # numbers its collectives as it would have without the meeting.
    seq = -1 - fabric.next_seq(_WIRE)
    mailbox = fabric.mailbox
    first = members[0]
    got = fabric.local_mailbox(first).meet(seq, rank, len(members), _WIRE, me, (list(args), fabric), mailbox,
                                           _never)
    key = keys.collective(seq, RESULT)
    block = BlockInfo("collective", "batched program", BATCHED_OPCODE, needs="group", group=members, seq=seq)
    across = spanning(executable, members, fabric.num_replicas)
    if across and rank != 0 and got is not None:
        # A run whose collectives leave the process is led by the first member: the peers' messages
        # and the board's waits are its mailbox's. The last to arrive hands it the deposits.
        mailbox.count_sent()
        fabric.local_mailbox(first).deliver(first, keys.collective(seq, _LEAD), got)
        got = None
    elif across and rank == 0 and got is None:
        got = fabric.recv(first, keys.collective(seq, _LEAD), block)
    if got is None:
        results, leader, boxes = fabric.recv(first, key, block)
        _hand_on(mailbox, first, seq, (results, leader, boxes), rank)
    else:
        deposits, boxes = got
        results = _lead(executable, members, deposits, mailbox, fabric.num_replicas, across, fabric.placement)
        lanes = _hand_on(mailbox, first, seq, (results, rank, boxes), -1)
        if results is FALLBACK:
            # Every other member goes first (the end of each lane says it was handed on), so the
            # replicas start their own runs in about the order they started this one: the leader
            # arrived last, and a report of where each replica is reads as without batching.
            fabric.recv_all([(first, keys.collective(seq, RESULT + 1 + j)) for j in range(lanes)], block)
    return FALLBACK if results is FALLBACK else results[rank]


def _hand_on(mailbox: Any, first: int, seq: int, message: tuple, rank: int) -> int:
    """The results go down `RESULT_LANES` chains of the members other than the leader, as a collective's
    (`Exchange.scatter_local`): the leader (`rank` -1) starts each, member k of the others forwards to
    member k + RESULT_LANES, so only a few threads become runnable at a time. A fallback's last member of
    each lane tells the leader. The number of lanes."""
    results, leader, boxes = message
    others = len(boxes) - 1
    lanes = min(RESULT_LANES, others)
    key = keys.collective(seq, RESULT)
    if rank < 0:
        targets: Sequence[int] = range(lanes)
    else:
        position = rank if rank < leader else rank - 1
        targets = [position + RESULT_LANES] if position + RESULT_LANES < others else []
        if not targets and results is FALLBACK:
            mailbox.count_sent()
            boxes[leader].deliver(first, keys.collective(seq, RESULT + 1 + position % RESULT_LANES), None)
    for j in targets:
        mailbox.count_sent()
        boxes[j if j < leader else j + 1].deliver(first, key, message)
    return lanes


def _lead(executable: Executable, members: tuple[int, ...], deposits: list[Any], mailbox: Any,
          num_replicas: int, across: bool, placement: Sequence[int]) -> Any:
    key = (executable.fingerprint, members, num_replicas)
    with _plans_lock:
        free = _programs.get(key)
        if free is None:
            free = _programs.put(key, [])
        program = free.pop() if free else None
    try:
        if program is None:
            program = BatchedProgram(executable, members, num_replicas)
        # This thread calls BLAS for every member, with the cores their own threads would have had.
        wide = (cores.widen(len(members), len(_members_by_process(placement, num_replicas)))
                if program.wide_blas else None)
        try:
            results: Any = program.run([d[0] for d in deposits], mailbox, [d[1] for d in deposits], across)
        finally:
            cores.narrow(wide)
    except BaseException as e:  # noqa: BLE001 - an abort propagates; anything else is each member's to meet
        if mailbox.aborted is not None and e is mailbox.aborted:
            raise
        if not isinstance(e, Exception) or (program is not None and program.ctx.spanned):
            raise  # (after a collective that left the process, nobody can run it again on their own)
        results = FALLBACK
    if program is not None:
        with _plans_lock:
            free.append(program)
    RUNS["fallback" if results is FALLBACK else "batched"] += 1
    return results


def _never(replica: int, theirs: tuple) -> None:
    raise ReplicasError(f"replica {replica} reached a batched program's meeting with another program")
