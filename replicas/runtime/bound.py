"""A computation bound to one interpreter's kernels: its generated code, While loops of it, and
which instruction a kernel's error came from."""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from replicas.errors import (
    ExecutionTimeout,
    ProgramError,
    ReplicaFailure,
    ReplicasError,
    ResourceExhausted,
    exhausted_resource,
)
from replicas.hlo.ir import Instruction
from replicas.limits import DEADLINE
from replicas.ops.registry import lookup
from replicas.runtime.codegen import straight_line
from replicas.runtime.compile import Schedule
from replicas.runtime.ownership import Donation

# Generated code -> {line: the instruction whose kernel that line calls}, of every bound computation.
GENERATED: weakref.WeakKeyDictionary[Any, dict[int, Instruction]] = weakref.WeakKeyDictionary()


class BoundComputation:
    """A schedule whose steps carry their kernels: `bound(*args) -> value`."""

    __slots__ = ("name", "schedule", "_steps", "_num_slots", "_params", "_root", "_interp", "_run", "_code",
                 "_line_to_inst", "donated", "scalars", "_numpy_dtypes", "updated_in_place")

    def __init__(self, schedule: Schedule, interp: Any, donated: Donation = frozenset(),
                 scalars: frozenset[int] = frozenset()) -> None:
        self.name = schedule.computation
        self.schedule = schedule
        self._interp = interp
        # Arguments the caller gives away, which this computation may overwrite: (parameter, None) for
        # an array, (parameter, i) for element i of a tuple. See `ownership`.
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
        deadline = DEADLINE.get()  # a job's setup of its replicas counts against its timeout
        for i, step in enumerate(self.schedule.steps):
            if deadline is not None and not i & 15 and time.monotonic() >= deadline:
                raise ExecutionTimeout(f"the job's timeout expired while binding the kernels of computation "
                                       f"{self.name} (at %{step.inst.name})")
            ctx._binding = comp
            try:
                fn = lookup(step.inst)(step.inst, ctx)
            except MemoryError as e:  # a kernel's tables or constants: named as a kernel's own failure is
                raise kernel_failure(ctx.replica_id, step.inst, e) from None
            steps.append((fn, step.operand_slots, step.result_slot, step.release, step.inst))
        self._steps = steps
        if self.scalars:
            state = comp.parameters[0].shape.tuple_shapes
            self._numpy_dtypes = tuple((k, state[k].dtype) for k in sorted(self.scalars))
        self._run, self._line_to_inst = straight_line(self, comp)
        self._code = self._run.__code__
        GENERATED[self._code] = self._line_to_inst

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
        if isinstance(e, ProgramError) or _is_replicas_error(e):
            return None
        for bound in computations:
            inst = bound._failed_instruction(e)
            if inst is not None:
                return kernel_failure(self._interp.replica_id, inst, e)
        return None

    def _failed_instruction(self, e: BaseException) -> Instruction | None:
        """The step whose kernel raised `e`: the innermost generated code's line in the traceback
        (of this computation or of a callee its code ran directly)."""
        inst = None
        tb = e.__traceback__
        mine = False
        while tb is not None:
            code = tb.tb_frame.f_code
            lines = GENERATED.get(code)
            if lines is not None:
                mine = mine or code is self._code
                found = lines.get(tb.tb_lineno)
                if found is not None and mine:
                    inst = found
            tb = tb.tb_next
        return inst

    def _call_recorded(self, slots: list[Any], recorder: Any) -> Any:
        """The same loop, recording every instruction (`record_every_instruction=True`): kept apart so
        the usual path pays nothing for it."""
        interp = self._interp
        observe = recorder.observe  # each value too (a divergence hunt), or None
        for fn, operand_slots, result_slot, release, inst in self._steps:
            fn = getattr(fn, "plain", fn)  # a fusion or loop compiled per element: its instructions, as bound
            interp.current = inst
            event = recorder.begin("op", inst.name, inst.opcode, computation=self.name)
            try:
                slots[result_slot] = fn(*[slots[s] for s in operand_slots])
            except ProgramError:
                recorder.end(event, error=True)
                raise
            except Exception as e:
                recorder.end(event, error=True)
                if _is_replicas_error(e):
                    raise
                raise kernel_failure(interp.replica_id, inst, e) from e
            recorder.end(event)
            if observe is not None:
                observe(event, slots[result_slot])
            for s in release:
                slots[s] = None
        return slots[self._root]


def kernel_failure(replica: int, inst: Instruction, error: BaseException) -> ReplicaFailure:
    """A kernel (a custom call, or numpy out of memory) raised: the replica failed, in `inst`."""
    where = f"%{inst.name} ({inst.opcode}" + (f", line {inst.line})" if inst.line is not None else ")")
    target = inst.attrs.get("custom_call_target") if inst.opcode == "custom-call" else None
    what = f"custom call {target!r} raised" if isinstance(target, str) else "its kernel raised"
    message = f"replica {replica} failed in {where}: {what} {type(error).__name__}: {error}"
    resource = exhausted_resource(error)
    if resource is not None:  # the machine refused it something: say which
        return ResourceExhausted(f"{message} (out of {resource})", resource, replica, where,
                                 f"{type(error).__name__}: {error}")
    return ReplicaFailure(message, replica, f"{type(error).__name__}: {error}", instruction=where)



def _is_replicas_error(e: BaseException) -> bool:
    return isinstance(e, ReplicasError)
