"""The interpreter of one replica: runs an Executable's schedules with bound kernels.

It never imports Ray: everything that leaves the replica (collectives, channels, feeds) goes
through the `fabric` given to it. The engine's other parts: `compile` (schedules), `bound` (a
computation bound to kernels), `codegen` (its generated code), `ownership` (what a step may
overwrite), `interpreter_pool` (interpreters kept between jobs) and `arguments.check_arguments`.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

import replicas.channels  # noqa: F401  (registers send/recv, infeed/outfeed)
import replicas.collectives  # noqa: F401  (registers the collective kernels)
import replicas.ops  # noqa: F401  (registers the kernel families)
from replicas.errors import ProgramError
from replicas.hlo.ir import Computation, Instruction, Module
from replicas.ops.elementwise_util import ERRORS, IGNORED
from replicas.runtime import batched
from replicas.runtime.arguments import check_arguments
from replicas.runtime.bound import BoundComputation, kernel_failure
from replicas.runtime.compile import Executable, compile_module
from replicas.runtime.ownership import Donation
from replicas.shapes import Shape
from replicas.transport import where
from replicas.transport.fabric import Fabric, FabricSlot, LocalFabric

_DIVERGED = "batched: diverged"  # kernel_state: a batched run of this job fell back

# numpy's floating-point error state during a run: the context variable np.errstate sets, set directly
# with a state made once (np.errstate builds it and its context manager every run, which costs about
# as much as a small program's kernel call); kernels' own `quiet()` then costs nothing. np.errstate
# when this numpy lacks them.
_ERRORS, _IGNORED = ERRORS, IGNORED


class Interpreter:
    """Executes the entry computation of `executable` as replica `replica_id` over `fabric`."""

    def __init__(self, executable: Executable | Module, replica_id: int = 0, fabric: Fabric | None = None,
                 num_replicas: int | None = None) -> None:
        if isinstance(executable, Module):
            executable = compile_module(executable)
        self.executable = executable
        self.module: Module = executable.module
        self.replica_id = replica_id
        if fabric is None:
            fabric = LocalFabric()
        # Kernels keep this slot, not the fabric: a pooled interpreter runs its next job by
        # pointing the slot at that job's fabric (`attach`), without binding its kernels again.
        self.slot = FabricSlot(fabric)
        self.fabric: Fabric = self.slot.as_fabric()
        self.num_replicas = num_replicas if num_replicas is not None else fabric.num_replicas
        self.current: Instruction | None = None
        # In an actor process, where this interpreter is (the code of the instruction it runs) is also
        # published in shared memory the driver can read after the process died (transport/where.py):
        # the generated code stores it before each kernel call.
        self.where = where.take()
        self.where_codes = None if self.where is None else where.codes_of(executable)[0]
        if self.where is not None:
            weakref.finalize(self, where.give_back, self.where)
        self.attach(fabric)
        self._binding: Computation | None = None
        self._entry_params: list[Instruction] | None = None
        self._bound: dict[tuple[str, Donation, frozenset[int]], BoundComputation] = {}
        self._batch: tuple[Any, tuple[int, ...] | None] = (None, None)  # (placement, batched members)
        # A replica that runs batched (`runtime/batched`) binds nothing of its own unless it falls back:
        # binding every replica's kernels would be most of a batched job's cost at thousands of replicas.
        self._entry: BoundComputation | None = None
        if self._batched_members(fabric) is None:
            self._entry = self.computation(self.module.entry)

    def attach(self, fabric: Fabric) -> None:
        """Run the next executions over `fabric` (a new job's: its mailbox, recorder, peers)."""
        self.slot.attach(fabric)
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

    def binding_computation(self) -> Computation | None:
        """The computation whose kernels are being bound (a loop's kernel reads how its state is made)."""
        return self._binding

    def operand_shapes(self, inst: Instruction) -> list[Shape]:
        """The static shapes of `inst`'s operands (valid while its kernel is being bound)."""
        comp = self._binding
        return [comp.instruction(name).shape for name in inst.operands]

    # -- running ---------------------------------------------------------------------------------
    def run(self, args: Sequence[Any] = (), *, checked: bool = False) -> Any:
        """The entry computation's result on `args` (`checked`: they already passed `check_arguments`)."""
        if not checked:
            if self._entry_params is None:  # found once: `parameters` walks and sorts the computation
                self._entry_params = self.module.entry_computation.parameters
            args = check_arguments(self.module.entry_computation, args, self._entry_params)
        # XLA semantics define every result (x/0, NaN casts, overflow): numpy's warnings about
        # them are noise. Silenced once here, for this thread, instead of in every kernel call.
        try:
            return self._run(args)
        finally:
            if self.where is not None:
                self.where[where.CODE] = where.NOWHERE  # between runs

    def _run(self, values: Sequence[Any]) -> Any:
        if _ERRORS is None:
            with np.errstate(all="ignore"):
                return self._execute(values)
        token = _ERRORS.set(_IGNORED)
        try:
            return self._execute(values)
        finally:
            _ERRORS.reset(token)

    def _execute(self, values: Sequence[Any]) -> Any:
        members = None if self.num_replicas < 2 else self._batched_members(self.slot.current)
        if members is not None:
            fabric = self.slot.current
            out = batched.run(self.executable, members, fabric, values)
            if out is not batched.FALLBACK:
                return out
            fabric.kernel_state[_DIVERGED] = True  # this job's members run on their own from now on
        entry = self._entry
        if entry is None:
            entry = self._entry = self.computation(self.module.entry)
        return entry(*values)

    def _batched_members(self, fabric: Fabric) -> tuple[int, ...] | None:
        """The replicas of this process running this program batched with this one (`runtime/batched`),
        or None. Decided once per placement (a pooled interpreter's next job may place them otherwise)."""
        state = fabric.kernel_state
        if (not batched.ENABLED or self.every_instruction_recorder is not None or state.get(_DIVERGED)
                or state.get(batched.IN_TURN)):
            return None
        placement = fabric.placement
        if self._batch[0] is not placement:
            self._batch = (placement, batched.plan(self.executable, self.replica_id, self.num_replicas, placement,
                                                   fabric))
        return self._batch[1]


def evaluate(module: Module, args: Sequence[Any] = (), replica_id: int = 0, fabric: Fabric | None = None) -> Any:
    """Run `module` on one replica in this process (no Ray): the quickest way to test a program."""
    return Interpreter(module, replica_id, fabric).run(args)



__all__ = ["BoundComputation", "Interpreter", "FabricSlot", "evaluate", "kernel_failure", "check_arguments"]
