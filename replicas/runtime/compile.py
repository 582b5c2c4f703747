"""compile(module) -> Executable: a verified module plus one schedule per computation.

A schedule is a list of steps (instruction, operand slots, result slot, slots released after the
step). Slots are reused once their value is dead, so peak memory follows the live set. The order
is program order, which is a valid topological order (operands are defined before use) and keeps
side-effecting ops (collectives, channels, feeds) in the order the program wrote them.
Instructions that are neither needed by the root nor side-effecting are dropped.

Compiling is done once per module content: `compile_module` keeps the last executables by a
fingerprint of the module's content (`module_fingerprint`), so running the same program again
(the same object or an equal one) skips verifying and scheduling. Interpreters bound to an
executable are pooled per process the same way (`replicas.runtime.interpreter_pool.checkout`).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from replicas.caching import Cache
from replicas.errors import ProgramError
from replicas.hlo.ir import Computation, Instruction, Module
from replicas.hlo.opcodes import SIDE_EFFECT_OPCODES
from replicas.hlo.verify import verify
from replicas.runtime.memory import check_peak
from replicas.tuning import affinity


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
    # The module's content fingerprint when it was compiled (the key of every per-module cache).
    fingerprint: bytes = field(default=b"", compare=False)

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

        return compile_module(module_from_bytes(data))

    def bytes(self) -> bytes:
        """`to_bytes()`, serialized once per executable (it travels to every actor on every run)."""
        if not self.fingerprint:
            return self.to_bytes()
        return _SERIALIZED.get_or_make(self.fingerprint, self.to_bytes)


_COMPILED_SIZE = 16
_SERIALIZED: Cache[bytes] = Cache("serialized programs", _COMPILED_SIZE)
# fingerprint -> (executable, the replica counts it was verified for): the last few programs.
_COMPILED: Cache[tuple[Executable, set[int | None]]] = Cache("compiled programs", _COMPILED_SIZE)


def compile_module(module: Module, *, num_replicas: int | None = None) -> Executable:
    """The module verified and scheduled, once per module content: nothing reaches a kernel
    unverified, so kernels trust the IR (they check only what depends on runtime values)."""
    key = module_fingerprint(module)
    entry = _COMPILED.get(key)
    if entry is not None and (entry[0].module is module or module_fingerprint(entry[0].module) == key):
        executable, verified_for = entry
        if num_replicas not in verified_for:
            verify(module, num_replicas=num_replicas)
            verified_for.add(num_replicas)
        return executable
    verify(module, num_replicas=num_replicas)
    verified_for: set[int | None] = {num_replicas}
    schedules = {name: schedule_computation(comp) for name, comp in module.computations.items()}
    executable = Executable(module, schedules, key)
    # Memory known before running (runtime/memory.py): one replica's peak here; the backend checks
    # it times the replicas each of its processes hosts.
    check_peak(executable, 1)
    _COMPILED.put(key, (executable, verified_for))
    return executable


def verify_for(executable: Executable, num_replicas: int) -> Executable:
    """`executable`, its module verified for a job of `num_replicas` (once per program content and
    count): an executable compiled without the job's count (`compile_module(m)`) reaches no kernel
    before its replica groups and pairs were checked against the job's replicas."""
    key = executable.fingerprint
    entry = _COMPILED.get(key) if key else None
    if entry is not None and num_replicas in entry[1]:
        return executable
    verify(executable.module, num_replicas=num_replicas)
    check_peak(executable, 1)  # times the replicas of a process: the backend's check
    if entry is not None:
        entry[1].add(num_replicas)
    elif key:
        _COMPILED.put(key, (executable, {num_replicas}))
    return executable


# (fingerprint, question) -> answer, for questions asked of a program on every run.
_ANSWERS: Cache[bool] = Cache("program answers", 2048)


def _any_opcode(executable: Executable, question: str, test: Any) -> bool:
    key = (executable.fingerprint, question)
    found = _ANSWERS.get(key) if executable.fingerprint else None
    if found is None:
        found = any(test(inst.opcode) for _, inst in executable.module.instructions())
        if executable.fingerprint:
            _ANSWERS.put(key, found)
    return found


def runs_bounded_alone(executable: Executable) -> bool:
    """True when one replica of the program always finishes on its own, in bounded time: no loop,
    no communication, no feed, no custom call (nothing that can wait or run long). Such a program
    may run in the caller's thread instead of a replica thread of its own."""
    return not _any_opcode(executable, "waits", lambda op: op == "while" or op in SIDE_EFFECT_OPCODES)


# Ops whose work can grow faster than the arrays they read and write (a window, a contraction, a
# factorization, a sort): at most the product of the element counts of their two largest arrays.
_SUPERLINEAR = frozenset({"dot", "convolution", "fft", "cholesky", "triangular-solve", "reduce-window",
                          "select-and-scatter", "sort", "topk", "scatter", "map", "reduce", "custom-call"})
QUICK_BYTES = 1 << 20  # the bytes of every value a quick program computes, together
QUICK_WORK = 1 << 24  # the largest product of element counts a quick program's superlinear op may have
QUICK_STEPS = 20_000  # the instructions a quick program may run, each loop trip's counted
# Instructions that compute no new value (a loop's state, its parts, tuples of them): not counted in
# the program's bytes, which each trip would otherwise count again.
_VIEWS = frozenset({"parameter", "get-tuple-element", "tuple", "bitcast"})
_QUICK: Cache[bool] = Cache("quick programs", 1024)  # program fingerprint -> runs_quickly(program)


def runs_quickly(executable: Executable) -> bool:
    """True when one replica of the program finishes in well under a second, whatever the machine:
    nothing in it can wait (no communication, feed or user custom call: the built-in targets are
    kernels), each of its loops runs a trip count its program fixes (`static_trips`), and counting
    every trip its values together take at most `QUICK_BYTES`, it runs at most `QUICK_STEPS`
    instructions and none of its ops may do more than `QUICK_WORK` steps. Only such a program runs in
    the caller's thread, where no deadline can stop it; any other runs on a thread of its own, which
    a timeout leaves behind."""
    key = executable.fingerprint
    found = _QUICK.get(key) if key else None
    if found is None:
        found = _small_work(executable.module)
        if key:
            _QUICK.put(key, found)
    return found


def _small_work(module: Module) -> bool:
    from replicas.ops.custom_call import is_builtin_target

    weights = _executions(module)
    if weights is None:
        return False
    total = steps = 0
    for name, weight in weights.items():
        comp = module.computation(name)
        by_name = comp.by_name
        steps += weight * len(comp.instructions)
        if steps > QUICK_STEPS:
            return False
        for inst in comp.instructions:
            if inst.opcode in SIDE_EFFECT_OPCODES and not (
                    inst.opcode == "custom-call" and is_builtin_target(inst.attrs.get("custom_call_target"))):
                return False
            sizes = [_elements(inst.shape)]
            if inst.opcode not in _VIEWS:
                total += weight * _bytes(inst.shape)
            if total > QUICK_BYTES:
                return False
            if inst.opcode in _SUPERLINEAR:
                sizes.extend(_elements(by_name[o].shape) for o in inst.operands if o in by_name)
                sizes.sort()
                if len(sizes) > 1 and weight * sizes[-1] * sizes[-2] > QUICK_WORK:
                    return False
    return True


def _executions(module: Module) -> dict[str, int] | None:
    """How many times one run of the entry may run each computation it reaches (a While's condition
    and body once per trip; any other callee once per call of its caller: a reduce's or sort's
    comparator is priced by the superlinear bound instead); None when a loop's trip count is not
    fixed by the program, or the counts pass `QUICK_STEPS`."""
    calls: dict[str, list[tuple[str, int]]] = {}  # computation -> (callee, executions per run of it)
    order: list[str] = []  # callers before callees
    seen: set[str] = set()

    def visit(name: str) -> bool:  # depth-first; the call graph is a verified DAG of bounded depth
        seen.add(name)
        comp = module.computation(name)
        edges = calls[name] = []
        for inst in comp.instructions:
            if inst.opcode == "while":
                trips = static_trips(module, comp, inst)
                if trips is None or trips > QUICK_STEPS:
                    return False
                edges += [(inst.attrs["condition"], trips + 1), (inst.attrs["body"], trips)]
            else:
                edges += [(callee, 1) for callee in inst.called_computations()]
        for callee, _ in edges:
            if callee not in seen and not visit(callee):
                return False
        order.append(name)
        return True

    if not visit(module.entry):
        return None
    weights = dict.fromkeys(order, 0)
    weights[module.entry] = 1
    for name in reversed(order):
        for callee, times in calls[name]:
            weights[callee] += weights[name] * times
            if weights[callee] > QUICK_STEPS:
                return None
    return weights


def static_trips(module: Module, comp: Computation, loop: Instruction) -> int | None:
    """The trip count of While `loop` (in `comp`) when its program fixes it, else None: a counter
    starting from a constant, stepped by a constant in the body and compared with a constant in the
    condition (`i < n`, `i <= n`, `i > n`, `i >= n`; the form JAX's fori_loop and scan take, also
    through XLA's single-op wrapper fusions and a call passing the initial state). None also when
    the counter could wrap around its type before the condition fails."""
    condition = module.computation(loop.attrs["condition"])
    body = module.computation(loop.attrs["body"])
    test = _through(module, condition, condition.root_instruction)
    if test is None or test[0] != "compare" or len(test[2]) != 2:
        return None
    direction = test[1].get("comparison_direction")
    a, b = (_plain(condition, o) for o in test[2])
    if a.opcode == "constant":  # `n > i` is `i < n`
        a, b = b, a
        direction = {"LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE"}.get(direction)
    index = _state_index(condition, a)
    bound = _integer(b)
    if direction is None or index is False or bound is None:
        return None
    dtype = a.shape.dtype if a.shape.is_array else None
    if dtype is None or dtype.kind not in "iu":
        return None
    root = body.root_instruction
    if index is None:
        next_value = root
    elif root.opcode == "tuple" and index < len(root.operands):
        next_value = body.instruction(root.operands[index])
    else:
        return None
    step_op = _through(module, body, next_value)
    if step_op is None or step_op[0] != "add" or len(step_op[2]) != 2:
        return None
    x, c = (_plain(body, o) for o in step_op[2])
    if x.opcode == "constant":
        x, c = c, x
    step = _integer(c)
    if step is None or _state_index(body, x) != index or index is False:
        return None
    start = _integer(_initial(module, comp, loop, index))
    if start is None:
        return None
    info = np.iinfo(dtype)
    if direction in ("LT", "LE") and step > 0:
        last = bound if direction == "LE" else bound - 1  # the counter's last value that runs a trip
        trips = 0 if start > last else (last - start) // step + 1
        return trips if last + step <= info.max else None
    if direction in ("GT", "GE") and step < 0:
        last = bound if direction == "GE" else bound + 1
        trips = 0 if start < last else (start - last) // -step + 1
        return trips if last + step >= info.min else None
    return None


def _through(module: Module, comp: Computation, inst: Instruction) -> tuple[str, dict, list[Instruction]] | None:
    """(opcode, attributes, operands in `comp`) of `inst`, or of the one op a fusion or call of it
    wraps whose operands are the callee's parameters (XLA's `wrapped_add`, `wrapped_compare`)."""
    if inst.opcode not in ("fusion", "call"):
        return inst.opcode, inst.attrs, [comp.instruction(o) for o in inst.operands]
    callee = module.computation(inst.attrs.get("calls") or inst.attrs.get("to_apply"))
    root = callee.root_instruction
    operands = []
    for o in root.operands:
        param = callee.instruction(o)
        if param.opcode != "parameter":
            return None
        operands.append(comp.instruction(inst.operands[param.attrs["parameter_number"]]))
    return root.opcode, root.attrs, operands


def _plain(comp: Computation, inst: Instruction) -> Instruction:
    """`inst` through copies, and bitcasts or reshapes of one scalar to another of its type."""
    while inst.opcode in ("copy", "bitcast", "reshape") and len(inst.operands) == 1:
        source = comp.instruction(inst.operands[0])
        if inst.opcode != "copy" and not (source.shape.is_array and inst.shape.is_array
                                          and source.shape.numel == inst.shape.numel == 1
                                          and source.shape.dtype == inst.shape.dtype):
            break
        inst = source
    return inst


def _state_index(comp: Computation, inst: Instruction) -> int | None | bool:
    """Which element of a loop computation's state `inst` is: the tuple index, None for the whole
    (a state that is not a tuple), False when it is neither."""
    if inst.opcode == "parameter":
        return None if inst.shape.is_array else False
    if inst.opcode == "get-tuple-element":
        source = comp.instruction(inst.operands[0])
        if source.opcode == "parameter":
            return int(inst.attrs["index"])
    return False


def _initial(module: Module, comp: Computation, loop: Instruction, index: int | None) -> Instruction:
    """The instruction giving the loop counter's initial value (through a call's parameter)."""
    value = _plain(comp, comp.instruction(loop.operands[0]))
    if index is None:
        return value
    if value.opcode == "parameter":  # XLA's `while.N_computation`, called with the state from one call site
        sites = [(c, i) for c, i in module.instructions()
                 if i.opcode == "call" and i.attrs.get("to_apply") == comp.name]
        if len(sites) != 1:
            return value
        caller, call = sites[0]
        value = _plain(caller, caller.instruction(call.operands[value.attrs["parameter_number"]]))
        comp = caller
    if value.opcode == "tuple" and index < len(value.operands):
        return _plain(comp, comp.instruction(value.operands[index]))
    return value


def _integer(inst: Instruction) -> int | None:
    """The value of an integer scalar constant, else None."""
    if inst.opcode != "constant" or not inst.shape.is_array or inst.shape.numel != 1:
        return None
    literal = inst.attrs.get("literal")
    if not isinstance(literal, np.ndarray) or literal.dtype.kind not in "iu":
        return None
    return int(literal.reshape(-1)[0])


def _elements(shape: Any) -> int:
    return sum(leaf.numel for leaf in shape.leaves() if leaf.is_array)


def _bytes(shape: Any) -> int:
    return sum(leaf.numel * max(8, leaf.element_type.bit_width) // 8 for leaf in shape.leaves() if leaf.is_array)


_BLAS_OPCODES = frozenset({"dot", "convolution", "cholesky", "triangular-solve", "custom-call", "fft"})


def largest_dot(executable: Executable) -> int:
    """The multiply-adds of the program's largest dot: what one BLAS call of it may spread over
    threads (a small one gains less than the pool's wake-ups cost)."""
    largest = 0
    for comp, inst in executable.module.instructions():
        if inst.opcode == "dot":
            lhs = comp.instruction(inst.operands[0]).shape
            contracted = math.prod(lhs.dimensions[int(d)] for d in inst.attrs.get("lhs_contracting_dims") or [])
            largest = max(largest, math.prod(inst.shape.dimensions) * contracted)
    return largest


def has_custom_calls(executable: Executable) -> bool:
    """True when the program calls custom-call targets (Python functions that may print: a JAX host
    callback's lines travel back from a Ray actor, diagnostics/host_output.py)."""
    return _any_opcode(executable, "custom-call", "custom-call".__eq__)


def uses_blas(executable: Executable) -> bool:
    """True when the program has ops that call BLAS/LAPACK (whose thread pools are worth sizing)."""
    return _any_opcode(executable, "blas", _BLAS_OPCODES.__contains__)


_LIGHT: Cache[bool] = Cache("light programs", 1024)  # program fingerprint -> light(program)


def light(executable: Executable) -> bool:
    """True when the program cannot run work outside the GIL worth a second core: no BLAS/LAPACK or
    custom call, no array over `affinity.LIGHT_BYTES` (see `tuning/affinity.py`)."""
    key = executable.fingerprint
    found = _LIGHT.get(key) if key else None
    if found is None:
        largest = 0
        for _, inst in executable.module.instructions():
            for leaf in inst.shape.leaves():
                if leaf.is_array:
                    largest = max(largest, leaf.numel * leaf.element_type.bit_width // 8)
        found = largest <= affinity.LIGHT_BYTES and not uses_blas(executable)
        if key:
            _LIGHT.put(key, found)
    return found


# Attributes holding array literals: their bytes are digested apart (numpy's repr elides big arrays).
_LITERAL_ATTRS = ("literal", "custom_call_literal")


def module_fingerprint(module: Module) -> bytes:
    """A digest of everything in `module` that decides what it computes (names, opcodes, shapes,
    operands, attributes, literals' bytes), fast enough to take on every run."""
    attrs = module.attrs
    parts = [repr((module.name, module.entry, sorted(attrs.items(), key=str) if attrs else []))]
    append = parts.append
    literals = []
    for comp in module.computations.values():
        append(f"{comp.name}|{comp.root}|{comp.is_fusion}|{len(comp.instructions)}")
        for inst in comp.instructions:
            shape_text = _shape_text(inst.shape)
            attrs = inst.attrs
            if not attrs:
                append(f"{inst.name}|{inst.opcode}|{shape_text}|{inst.operands}|")
                continue
            held: list[str] = []
            if "literal" in attrs or "custom_call_literal" in attrs:  # bytes after the text, in order
                held = [k for k in _LITERAL_ATTRS if k in attrs]
                literals.extend(attrs[k] for k in held)
                attrs = {k: v for k, v in attrs.items() if k not in _LITERAL_ATTRS}
            append(f"{inst.name}|{inst.opcode}|{shape_text}|{inst.operands}|{attrs}|{held}")
    digest = hashlib.blake2b("\n".join(parts).encode(), digest_size=20)
    for literal in literals:
        _update_literal(digest.update, literal)
    return digest.digest()


_SHAPE_TEXT: Cache[str] = Cache("shape texts", 100_000, by_identity=True)


def _shape_text(shape: Any) -> str:
    """`repr(shape)`, remembered per shape object (parsed modules share their shape objects; shapes
    are frozen)."""
    text = _SHAPE_TEXT.get(shape)
    if text is None:
        text = _SHAPE_TEXT.put(shape, repr(shape))
    return text


def _update_literal(update: Any, value: Any) -> None:
    if isinstance(value, tuple):
        for v in value:
            _update_literal(update, v)
        return
    if not isinstance(value, (np.ndarray, np.generic, bool, int, float, complex)) or np.asarray(value).dtype.hasobject:
        update(repr((type(value).__name__, value)).encode())  # not a literal (a hostile file): the verifier says so
        return
    arr = np.asarray(value)
    update(repr((arr.dtype.str, arr.shape)).encode())
    update(np.ascontiguousarray(arr).view(np.uint8).reshape(-1).data if arr.size else b"")


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
