"""The interpreter of one replica: runs an Executable's schedules with bound kernels.

It never imports Ray: everything that leaves the replica (collectives, channels, feeds) goes
through the `fabric` given to it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import replicas.channels  # noqa: F401  (registers send/recv, infeed/outfeed)
import replicas.collectives  # noqa: F401  (registers the collective kernels)
import replicas.ops  # noqa: F401  (registers the kernel families)
from replicas.errors import ProgramError, ReplicaFailure
from replicas.hlo.ir import Computation, Instruction, Module
from replicas.ops import python_scalars
from replicas.ops.registry import lookup
from replicas.runtime.compile import Executable, Schedule, compile_module
from replicas.shapes import Shape, Token


class BoundComputation:
    """A schedule whose steps carry their kernels: `bound(*args) -> value`."""

    __slots__ = ("name", "schedule", "_steps", "_num_slots", "_params", "_root", "_interp", "_run", "_code",
                 "_line_to_inst", "donated", "scalars", "_numpy_dtypes", "updated_in_place")

    def __init__(self, schedule: Schedule, interp: Interpreter, donated: Donation = frozenset(),
                 scalars: frozenset[int] = frozenset()) -> None:
        self.name = schedule.computation
        self.schedule = schedule
        self._interp = interp
        # Arguments the caller gives away, which this computation may overwrite: (parameter, None) for
        # an array, (parameter, i) for element i of a tuple. See `_ownership`.
        self.donated = donated
        # A While loop's condition or body whose state elements `scalars` are Python numbers, not 0-d
        # arrays (`ops.python_scalars`): only `loop` runs it, converting them on entry and exit.
        self.scalars = scalars
        self._numpy_dtypes: tuple[tuple[int, np.dtype], ...] = ()  # (element, dtype) of `scalars`, for the exit
        self.updated_in_place: frozenset[tuple[int, int | None]] = frozenset()
        self._num_slots = schedule.num_slots
        self._params = schedule.parameter_slots
        self._root = schedule.root_slot
        self._steps: list[tuple[Callable[..., Any], tuple[int, ...], int, tuple[int, ...], Instruction]] = []

    def bind(self) -> None:
        ctx = self._interp
        steps = []
        comp = ctx.module.computation(self.name)
        for step in self.schedule.steps:
            ctx._binding = comp
            fn = lookup(step.inst)(step.inst, ctx)
            steps.append((fn, step.operand_slots, step.result_slot, step.release, step.inst))
        self._steps = steps
        if self.scalars:
            state = comp.parameters[0].shape.tuple_shapes
            self._numpy_dtypes = tuple((k, state[k].dtype) for k in sorted(self.scalars))
        self._run, self._line_to_inst = _straight_line(self, comp)
        self._code = self._run.__code__

    def __call__(self, *args: Any) -> Any:
        params = self._params
        if len(args) != len(params):
            raise ProgramError(f"computation {self.name} takes {len(params)} arguments, got {len(args)}")
        interp = self._interp
        # Every computation call (each While iteration included) notices a cancel or deadlock abort.
        mailbox = interp.mailbox
        if mailbox is not None and mailbox.aborted is not None:
            raise mailbox.aborted
        if interp.every_instruction_recorder is not None:
            slots: list[Any] = [None] * self._num_slots
            for slot, value in zip(params, args):
                slots[slot] = value
            return self._call_recorded(slots, interp.every_instruction_recorder)
        try:
            return self._run(*args)
        except Exception as e:
            failure = self._kernel_failure(e, (self,))
            if failure is None:
                raise
            raise failure from e

    def loop(self, body: Any, state: Any, own: Callable[[Any, bool], Any] | None = None) -> Any:
        """`while self(state): state = body(state)`, the While loop of a condition and a body of one
        argument each, without their calls' per-call checks: one abort check per iteration, and a
        kernel's error translated as `__call__` does (by the computation whose code raised it). A
        While iteration of a small body is a few dozen microseconds, two computation calls of it.
        `own(state, entry)`: the state made the loop's own, on entry and after every iteration."""
        interp = self._interp
        scalars = self.scalars
        if scalars and interp.every_instruction_recorder is not None:
            # Recording runs the numpy kernels step by step: the computations without Python scalars.
            plain = interp.computation(self.name), interp.computation(body.name, body.donated)
            return plain[0].loop(plain[1], state, own)
        if own is not None:
            state = own(state, True)
        if (type(body) is not BoundComputation or interp.every_instruction_recorder is not None
                or len(self._params) != 1 or len(body._params) != 1):
            while self(state):
                state = body(state) if own is None else own(body(state), False)
            return state
        if scalars:
            values = list(state)
            for k in scalars:
                values[k] = values[k].item()  # a 0-d array's value as a Python int (bool for pred)
            state = tuple(values)
        condition, step = self._run, body._run
        mailbox = interp.mailbox
        try:
            while True:
                if mailbox is not None and mailbox.aborted is not None:
                    raise mailbox.aborted
                if not condition(state):
                    break
                state = step(state)
                if own is not None:
                    state = own(state, False)
        except Exception as e:
            failure = self._kernel_failure(e, (body, self))
            if failure is None:
                raise
            raise failure from e
        if scalars:
            values = list(state)
            for k, dtype in self._numpy_dtypes:
                values[k] = np.array(values[k], dtype)
            state = tuple(values)
        return state

    def _kernel_failure(self, e: Exception, computations: tuple[BoundComputation, ...]) -> BaseException | None:
        """The error a kernel's `e` becomes, named by the instruction of whichever of `computations`
        raised it; None when `e` is to pass as it is (the project's own errors, or not a kernel's)."""
        if isinstance(e, ProgramError) or getattr(e, "_replicas_passthrough", False) or _is_replicas_error(e):
            return None
        for bound in computations:
            inst = bound._failed_instruction(e)
            if inst is not None:
                return kernel_failure(self._interp.replica_id, inst, e)
        return None

    def _failed_instruction(self, e: BaseException) -> Instruction | None:
        """The step whose kernel raised `e`, from the generated code's line in the traceback."""
        inst = None
        tb = e.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code is self._code:
                inst = self._line_to_inst.get(tb.tb_lineno)
            tb = tb.tb_next
        return inst

    def _call_recorded(self, slots: list[Any], recorder: Any) -> Any:
        """The same loop, recording every instruction (`record_every_instruction=True`): kept apart so
        the usual path pays nothing for it."""
        interp = self._interp
        for fn, operand_slots, result_slot, release, inst in self._steps:
            interp.current = inst
            event = recorder.begin("op", inst.name, inst.opcode, computation=self.name)
            try:
                slots[result_slot] = fn(*[slots[s] for s in operand_slots])
            except ProgramError:
                recorder.end(event, error=True)
                raise
            except Exception as e:
                recorder.end(event, error=True)
                if getattr(e, "_replicas_passthrough", False) or _is_replicas_error(e):
                    raise
                raise kernel_failure(interp.replica_id, inst, e) from e
            recorder.end(event)
            for s in release:
                slots[s] = None
        return slots[self._root]


# A result at least this large may be written into a dead operand's buffer (as numpy reuses the
# temporaries of `(a + b) * c`): below it, a fresh allocation is cheaper than the bookkeeping.
DONATE_MIN_ELEMENTS = 1 << 16


def _straight_line(bound: BoundComputation, comp: Computation) -> tuple[Callable[..., Any], dict[int, Instruction]]:
    """Compile the bound steps to straight-line Python: one local per value, `del` at its last use
    (the schedule's liveness), `_interp.current` set per kernel call. This removes the per-step
    loop, list and slot overhead from every computation call (a While body runs it every iteration).
    Tuples and their elements are Python's own tuple display and subscript, which cannot fail.

    A large element-wise result is written into an operand's buffer (`out=`) when that operand is
    a fresh array made by another element-wise ufunc step of this computation, of the same shape
    and type, and this step is its only reader: nothing else can see the buffer change.

    A loop's condition or body with `scalars` (`ops.python_scalars`) computes on those state
    elements as Python expressions; its fast constants are Python literals there."""
    params = bound._params
    steps = bound._steps
    arg_names = [f"a{i}" for i in range(len(params))]
    name_of = {slot: arg_names[i] for i, slot in enumerate(params)}
    operand_vars: list[list[str]] = []
    for k, (_, operand_slots, result_slot, _, _) in enumerate(steps):
        operand_vars.append([name_of[s] for s in operand_slots])
        name_of[result_slot] = f"v{k}"
    root_var = name_of[bound._root]
    readers: dict[str, int] = {}
    for names in operand_vars:
        for n in names:
            readers[n] = readers.get(n, 0) + 1

    def fresh_ufunc(k: int) -> bool:
        fn, inst = steps[k][0], steps[k][4]
        return (isinstance(fn, np.ufunc) and fn.nout == 1 and inst.shape.is_array
                and inst.shape.numel >= DONATE_MIN_ELEMENTS)

    in_place, callee_donations = _ownership(bound, operand_vars, readers, root_var, arg_names)
    plan = python_scalars.plan(bound._interp.module, comp, bound.scalars) if bound.scalars else None
    texts = operand_vars if plan is None else _python_operands(plan, comp, steps, operand_vars)
    used = {n for names in texts for n in names}
    name_of = {slot: arg_names[i] for i, slot in enumerate(params)}
    defined = set(arg_names)
    env: dict[str, Any] = {"_interp": bound._interp}
    lines = [f"def run({', '.join(arg_names)}):"]
    line_to_inst: dict[int, Instruction] = {}
    for k, (fn, _, result_slot, release, inst) in enumerate(steps):
        names = texts[k]
        var = f"v{k}"
        opcode = inst.opcode
        expression = plan.python.get(inst.name) if plan is not None else None
        line = None  # a constant that only Python expressions read (as a literal) is never defined
        if opcode == "get-tuple-element":
            line = f"{var} = {names[0]}[{int(inst.attrs['index'])}]"
        elif opcode == "tuple":
            line = f"{var} = ({''.join(n + ', ' for n in names)})"
        elif expression is not None:
            line = f"{var} = {expression(names)}"
        elif plan is None or inst.name not in plan.literals or var in used or var == root_var:
            if k in in_place:
                fn = fn.in_place
            elif k in callee_donations:
                fn = bound._interp.computation(_callee(inst), callee_donations[k])
            env[f"k{k}"] = fn
            env[f"i{k}"] = inst
            out = ""
            if fresh_ufunc(k):
                for n in names:
                    producer = int(n[1:]) if n[0] == "v" else None
                    if (producer is not None and readers[n] == 1 and n != root_var and fresh_ufunc(producer)
                            and steps[producer][4].shape.compatible(inst.shape)):
                        out = f", out={n}"
                        break
            line = f"_interp.current = i{k}; {var} = k{k}({', '.join(names)}{out})"
            line_to_inst[len(lines) + 1] = inst
        if line is not None:
            lines.append("    " + line)
            defined.add(var)
        dead = [name_of[s] for s in release if s in name_of and s != result_slot]
        name_of[result_slot] = var
        if result_slot in release:
            dead.append(var)
        dead = [d for d in dict.fromkeys(dead) if d in defined]
        if dead:
            lines.append(f"    del {', '.join(dead)}")
    lines.append(f"    return {name_of[bound._root]}")
    exec(compile("\n".join(lines) + "\n", f"<computation {bound.name}>", "exec"), env)  # noqa: S102
    return env["run"], line_to_inst


def _python_operands(plan: python_scalars.Plan, comp: Computation, steps: list[Any],
                     operand_vars: list[list[str]]) -> list[list[str]]:
    """Each step's operands as generated code names them: a fast constant read by a Python
    expression, or by the body's next state in an element kept as a Python number, is its literal."""
    root = comp.root if comp.root_instruction.shape.is_tuple else None
    texts = []
    for (_, _, _, _, inst), names in zip(steps, operand_vars):
        if inst.name in plan.python or inst.name == root:
            names = [plan.literals[o] if o in plan.literals and (inst.name != root or j in plan.scalars) else n
                     for j, (o, n) in enumerate(zip(inst.operands, names))]
        texts.append(names)
    return texts


def kernel_failure(replica: int, inst: Instruction, error: BaseException) -> ReplicaFailure:
    """A kernel (a custom call, or numpy out of memory) raised: the replica failed, in `inst`."""
    where = f"%{inst.name} ({inst.opcode}" + (f", line {inst.line})" if inst.line is not None else ")")
    target = inst.attrs.get("custom_call_target") if inst.opcode == "custom-call" else None
    what = f"custom call {target!r} raised" if isinstance(target, str) else "its kernel raised"
    return ReplicaFailure(f"replica {replica} failed in {where}: {what} {type(error).__name__}: {error}",
                          replica, f"{type(error).__name__}: {error}", instruction=where)


Donation = frozenset  # of (parameter number, tuple index or None): see BoundComputation.donated
_CALLERS = {"fusion": "calls", "call": "to_apply"}


def _callee(inst: Instruction) -> str:
    return inst.attrs[_CALLERS[inst.opcode]]


def _ownership(bound: BoundComputation, operand_vars: list[list[str]], readers: dict[str, int], root_var: str,
               arg_names: list[str]) -> tuple[set[int], dict[int, Donation]]:
    """Which steps may overwrite an operand instead of copying it: (steps running their kernel's
    `in_place` form, {fusion/call step: the arguments it gives its callee}).

    A value is owned when nothing else can see its buffer: a donated argument, the element of a
    donated tuple read by its only get-tuple-element, or a dynamic-update-slice result (a copy, or
    an owned buffer updated). An owned value whose only reader is a step may be given away to it:
    a dynamic-update-slice then writes into it, a fusion or call passes it on as donated."""
    steps = bound._steps
    owned: set[str] = set()
    elements: dict[str, int] = {}  # owned get-tuple-element var -> its tuple index
    for param, index in bound.donated:
        if index is None:
            owned.add(arg_names[param])
    tuple_params = {param for param, index in bound.donated if index is not None}
    for param in tuple_params:
        name = arg_names[param]
        allowed = {index for p, index in bound.donated if p == param}
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
    bound.updated_in_place = frozenset(o for o in updated if o is not None)
    return in_place, callee_donations


def _origin(name: str, arg_names: list[str], elements: dict[str, int]) -> tuple[int, int | None] | None:
    if name in elements:
        return (0, elements[name])
    if name in arg_names:
        return (arg_names.index(name), None)
    return None


def _is_replicas_error(e: BaseException) -> bool:
    from replicas.errors import ReplicasError

    return isinstance(e, ReplicasError)


class Interpreter:
    """Executes the entry computation of `executable` as replica `replica_id` over `fabric`."""

    def __init__(self, executable: Executable | Module, replica_id: int = 0, fabric: Any = None,
                 num_replicas: int | None = None) -> None:
        if isinstance(executable, Module):
            executable = compile_module(executable)
        self.executable = executable
        self.module: Module = executable.module
        self.replica_id = replica_id
        if fabric is None:
            from replicas.transport.fabric import LocalFabric

            fabric = LocalFabric()
        # Kernels keep this slot, not the fabric: a pooled interpreter runs its next job by
        # pointing the slot at that job's fabric (`attach`), without binding its kernels again.
        self.fabric: Any = FabricSlot(fabric)
        self.num_replicas = num_replicas if num_replicas is not None else fabric.num_replicas
        self.current: Instruction | None = None
        self.attach(fabric)
        self._binding: Computation | None = None
        self._bound: dict[tuple[str, Donation, frozenset[int]], BoundComputation] = {}
        self._entry = self.computation(self.module.entry)

    def attach(self, fabric: Any) -> None:
        """Run the next executions over `fabric` (a new job's: its mailbox, recorder, peers)."""
        self.fabric.attach(fabric)
        self.mailbox = fabric.mailbox
        recorder = fabric.recorder
        every = recorder is not None and recorder.every_instruction
        self.every_instruction_recorder = recorder if every else None
        self.current = None

    # -- KernelContext ---------------------------------------------------------------------------
    def computation(self, name: str, donated: Donation = frozenset(), *,
                    scalars: frozenset[int] = frozenset()) -> BoundComputation:
        """The named computation, bound; with `donated`, the variant that may overwrite those arguments;
        with `scalars`, the variant of a While loop's condition or body taking those state elements
        as Python numbers (`ops.python_scalars`)."""
        key = (name, donated, scalars)
        bound = self._bound.get(key)
        if bound is None:
            try:
                schedule = self.executable.schedules[name]
            except KeyError:
                raise ProgramError(f"module {self.module.name} has no computation {name!r}") from None
            bound = BoundComputation(schedule, self, donated, scalars)
            self._bound[key] = bound  # before bind(): a computation may be referenced twice
            binding = self._binding
            bound.bind()
            self._binding = binding
        return bound

    def computation_ir(self, name: str) -> Computation:
        return self.module.computation(name)

    def operand_shapes(self, inst: Instruction) -> list[Shape]:
        """The static shapes of `inst`'s operands (valid while its kernel is being bound)."""
        comp = self._binding
        return [comp.instruction(name).shape for name in inst.operands]

    # -- running ---------------------------------------------------------------------------------
    def run(self, args: Sequence[Any] = (), *, checked: bool = False) -> Any:
        """The entry computation's result on `args` (`checked`: they already passed `check_arguments`)."""
        values = args if checked else check_arguments(self.module.entry_computation, args)
        # XLA semantics define every result (x/0, NaN casts, overflow): numpy's warnings about
        # them are noise. Silenced once here, for this thread, instead of in every kernel call.
        with np.errstate(all="ignore"):
            return self._entry(*values)


class FabricSlot:
    """Forwards every attribute to the fabric of the job an interpreter currently runs in. It takes
    no weak references, so nothing can key per-job state on the slot instead of the fabric."""

    __slots__ = ("_fabric",)

    def __init__(self, fabric: Any) -> None:
        object.__setattr__(self, "_fabric", fabric)

    def attach(self, fabric: Any) -> None:
        object.__setattr__(self, "_fabric", fabric)

    def __getattr__(self, name: str) -> Any:
        return getattr(object.__getattribute__(self, "_fabric"), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(object.__getattribute__(self, "_fabric"), name, value)


# Interpreters whose job ended, by (program fingerprint, replica id, number of replicas): the next
# job of the same program binds no kernels and generates no code. Bounded (least recent dropped).
_POOL: OrderedDict[tuple[bytes, int, int], list[Interpreter]] = OrderedDict()
_POOL_LIMIT = 512
_POOL_LOCK = threading.Lock()
_pooled = [0]  # interpreters in _POOL


def checkout(executable: Executable, replica_id: int, fabric: Any, num_replicas: int) -> Interpreter:
    """An interpreter of `executable` for `replica_id` over `fabric`: a pooled one when there is one."""
    key = (executable.fingerprint, replica_id, num_replicas)
    if executable.fingerprint:
        with _POOL_LOCK:
            free = _POOL.get(key)
            interp = free.pop() if free else None
            if interp is not None:
                _pooled[0] -= 1
        if interp is not None:
            interp.attach(fabric)
            return interp
    return Interpreter(executable, replica_id, fabric, num_replicas)


def checkin(interp: Interpreter) -> None:
    """Return an interpreter whose execution has ended (finished or failed) to the pool, holding
    nothing of its job (the fabric, and through it the job's mailbox and shared memory, are let go)."""
    fingerprint = interp.executable.fingerprint
    if not fingerprint:
        return
    interp.fabric.attach(None)
    interp.mailbox = interp.every_instruction_recorder = interp.current = None
    key = (fingerprint, interp.replica_id, interp.num_replicas)
    with _POOL_LOCK:
        _POOL.setdefault(key, []).append(interp)
        _POOL.move_to_end(key)
        _pooled[0] += 1
        while _pooled[0] > _POOL_LIMIT:
            _pooled[0] -= len(_POOL.popitem(last=False)[1])


def check_arguments(entry: Computation, args: Sequence[Any], params: list[Instruction] | None = None) -> list[Any]:
    """Check (and convert Python scalars/lists to) the entry parameters' shapes and dtypes
    (`params`: `entry.parameters`, when the caller keeps them)."""
    if params is None:
        params = entry.parameters
    if len(args) != len(params):
        raise ProgramError(f"entry computation {entry.name} takes {len(params)} arguments "
                           f"({', '.join(str(p.shape) for p in params)}), got {len(args)}")
    return [_check_value(p.shape, a, f"argument {p.attrs['parameter_number']} (%{p.name})")
            for p, a in zip(params, args)]


# id(shape) -> (shape, dtype, dimensions) of a static array shape: the check of an argument that
# is already a numpy array of exactly that type and shape (the usual case) is two comparisons.
_STATIC: dict[int, tuple[Shape, np.dtype, tuple[int, ...]]] = {}


def _check_value(shape: Shape, value: Any, what: str) -> Any:
    if type(value) is np.ndarray:
        static = _STATIC.get(id(shape))
        if static is not None and static[0] is shape and value.shape == static[2] and value.dtype == static[1]:
            return value
        if not (shape.is_tuple or shape.is_token or any(shape.dynamic)):
            if len(_STATIC) > 4096:
                _STATIC.clear()
            _STATIC[id(shape)] = (shape, shape.dtype, tuple(shape.dimensions))
    if shape.is_tuple:
        if not isinstance(value, (tuple, list)) or len(value) != len(shape.tuple_shapes):
            raise ProgramError(f"{what}: expected a tuple {shape}, got {_describe(value)}")
        return tuple(_check_value(s, v, f"{what}[{i}]")
                     for i, (s, v) in enumerate(zip(shape.tuple_shapes, value)))
    if shape.is_token:
        if not isinstance(value, Token):
            raise ProgramError(f"{what}: expected a token, got {_describe(value)}")
        return value
    if isinstance(value, np.ndarray):
        if value.dtype != shape.dtype:
            raise ProgramError(f"{what}: expected {shape}, got dtype {value.dtype} "
                               f"(XLA type {shape.element_type.value} is numpy {shape.dtype})")
        arr = value
    elif isinstance(value, (int, float, complex, bool, list, np.generic)):
        if isinstance(value, list) and len(value) != (shape.dimensions[0] if shape.dimensions else -1):
            # Checked before converting: a long list for a small shape never becomes an array.
            raise ProgramError(f"{what}: expected {shape}, got a list of {len(value)}")
        try:
            arr = np.asarray(value, dtype=shape.dtype)
        except (TypeError, ValueError, OverflowError, RecursionError) as e:
            raise ProgramError(f"{what}: cannot convert {_describe(value)} to {shape}: {e}") from None
    else:
        raise ProgramError(f"{what}: expected a numpy array {shape}, got {_describe(value)}")
    dims = shape.dimensions
    ok = arr.ndim == len(dims) and all(
        (n <= d if dyn else n == d) for n, d, dyn in zip(arr.shape, dims, shape.dynamic))
    if not ok:
        raise ProgramError(f"{what}: expected shape {shape}, got {arr.dtype}{list(arr.shape)}")
    return arr


def _describe(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"array {value.dtype}{list(value.shape)}"
    if isinstance(value, (tuple, list)):
        return f"{type(value).__name__} of {len(value)}"
    return type(value).__name__


def evaluate(module: Module, args: Sequence[Any] = (), replica_id: int = 0, fabric: Any = None) -> Any:
    """Run `module` on one replica in this process (no Ray): the quickest way to test a program."""
    return Interpreter(module, replica_id, fabric).run(args)
