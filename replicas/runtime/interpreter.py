"""The interpreter of one replica: runs an Executable's schedules with bound kernels.

It never imports Ray: everything that leaves the replica (collectives, channels, feeds) goes
through the `fabric` given to it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import replicas.channels  # noqa: F401  (registers send/recv, infeed/outfeed)
import replicas.collectives  # noqa: F401  (registers the collective kernels)
import replicas.ops  # noqa: F401  (registers the kernel families)
from replicas.errors import ProgramError
from replicas.hlo.ir import Computation, Instruction, Module
from replicas.ops.registry import lookup
from replicas.runtime.compile import Executable, Schedule, compile_module
from replicas.shapes import Shape, Token


class BoundComputation:
    """A schedule whose steps carry their kernels: `bound(*args) -> value`."""

    __slots__ = ("name", "schedule", "_steps", "_num_slots", "_params", "_root", "_interp")

    def __init__(self, schedule: Schedule, interp: Interpreter) -> None:
        self.name = schedule.computation
        self.schedule = schedule
        self._interp = interp
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

    def __call__(self, *args: Any) -> Any:
        slots: list[Any] = [None] * self._num_slots
        params = self._params
        if len(args) != len(params):
            raise ProgramError(f"computation {self.name} takes {len(params)} arguments, got {len(args)}")
        for slot, value in zip(params, args):
            slots[slot] = value
        interp = self._interp
        # Every computation call (each While iteration included) notices a cancel or deadlock abort.
        mailbox = interp.mailbox
        if mailbox is not None and mailbox.aborted is not None:
            raise mailbox.aborted
        for fn, operand_slots, result_slot, release, inst in self._steps:
            interp.current = inst
            try:
                slots[result_slot] = fn(*[slots[s] for s in operand_slots])
            except ProgramError:
                raise
            except Exception as e:
                if getattr(e, "_replicas_passthrough", False) or _is_replicas_error(e):
                    raise
                raise inst.error(f"kernel failed: {type(e).__name__}: {e}") from e
            for s in release:
                slots[s] = None
        return slots[self._root]


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
            from replicas.runtime.fabric import LocalFabric

            fabric = LocalFabric()
        self.fabric = fabric
        self.mailbox = getattr(fabric, "mailbox", None)
        self.num_replicas = num_replicas if num_replicas is not None else getattr(fabric, "num_replicas", 1)
        self.current: Instruction | None = None
        self._binding: Computation | None = None
        self._bound: dict[str, BoundComputation] = {}
        self._entry = self.computation(self.module.entry)

    # -- KernelContext ---------------------------------------------------------------------------
    def computation(self, name: str) -> BoundComputation:
        bound = self._bound.get(name)
        if bound is None:
            try:
                schedule = self.executable.schedules[name]
            except KeyError:
                raise ProgramError(f"module {self.module.name} has no computation {name!r}") from None
            bound = BoundComputation(schedule, self)
            self._bound[name] = bound  # before bind(): a computation may be referenced twice
            bound.bind()
        return bound

    def computation_ir(self, name: str) -> Computation:
        return self.module.computation(name)

    def operand_shapes(self, inst: Instruction) -> list[Shape]:
        """The static shapes of `inst`'s operands (valid while its kernel is being bound)."""
        comp = self._binding
        return [comp.instruction(name).shape for name in inst.operands]

    # -- running ---------------------------------------------------------------------------------
    def run(self, args: Sequence[Any] = ()) -> Any:
        values = check_arguments(self.module.entry_computation, args)
        return self._entry(*values)


def check_arguments(entry: Computation, args: Sequence[Any]) -> list[Any]:
    """Check (and convert Python scalars/lists to) the entry parameters' shapes and dtypes."""
    params = entry.parameters
    if len(args) != len(params):
        raise ProgramError(f"entry computation {entry.name} takes {len(params)} arguments "
                           f"({', '.join(str(p.shape) for p in params)}), got {len(args)}")
    return [_check_value(p.shape, a, f"argument {p.attrs['parameter_number']} (%{p.name})")
            for p, a in zip(params, args)]


def _check_value(shape: Shape, value: Any, what: str) -> Any:
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
        try:
            arr = np.asarray(value, dtype=shape.dtype)
        except (TypeError, ValueError, OverflowError) as e:
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
