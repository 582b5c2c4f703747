"""JAX's host callbacks on replicas: `jax.debug.print`, `jax.debug.callback`, `jax.pure_callback`
and `jax.experimental.io_callback` compile to `custom-call(...)` to `xla_ffi_python_cpu_callback`
with `backend_config={index = k : ui64}`: the k-th entry of the host callbacks JAX's lowering
collected (`lowered._lowering.compile_args["host_callbacks"]`). Each takes its operands as
read-only numpy arrays (a token as None) and returns a tuple of results (a token as anything).

`bind_callbacks` gives each such instruction a target of its own, registered in the custom-call
registry (which the Ray backend ships to the actors with the program), so the callback runs in
the process that runs the replica: a thread of the driver, or the replica's actor. Ordered
effects keep JAX's order: JAX threads a token through them, and each replica runs its program
in order. What a callback prints is one line per replica, prefixed `[replica r] ` (JAX prints
once per device too), on the driver's stdout (from a Ray actor with the job's or call's outcome:
`diagnostics/host_output.py`).

HLO text naming the target, run without its JAX function, stays a clear error naming rp.jax
(`ops/custom_call.py`).
"""

from __future__ import annotations

import io
import itertools
import re
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from replicas.caching import Cache
from replicas.diagnostics import host_output
from replicas.errors import ProgramError
from replicas.hlo.ir import Module
from replicas.ops.custom_call import JAX_CALLBACK_TARGETS, register_custom_call, unregister_custom_call
from replicas.shapes import TOKEN, Shape

_INDEX = re.compile(r"index\s*=\s*(\d+)")
_programs = itertools.count()
KEPT_PROGRAMS = 16  # programs whose callbacks stay registered (each Ray launch ships the registry)


def _unregister(targets: list[str]) -> None:
    for target in targets:
        unregister_custom_call(target)


# program number -> the targets of its callbacks; a program evicted unregisters them.
_bound: Cache[list[str]] = Cache("jax host-callback programs", KEPT_PROGRAMS, on_evict=_unregister)


class HostCallback:
    """One host callback of one program, as a registered custom-call function. `takes_replica`:
    the custom-call kernel passes the replica id first."""

    takes_replica = True

    def __init__(self, fn: Callable[..., Any], name: str) -> None:
        self.fn = fn
        self.name = name

    def __call__(self, replica: int, *args: Any) -> tuple:
        args = tuple(None if a is TOKEN else _read_only(a) for a in args)
        with _replica_output(replica):
            results = self.fn(*args)
        return tuple(TOKEN if r is None else r for r in results)


def _read_only(a: Any) -> Any:
    a = np.asarray(a)
    if a.flags.writeable:
        a = a.view()
        a.flags.writeable = False
    return a


def bind_callbacks(module: Module, host_callbacks: Sequence[Callable[..., Any]] | None) -> int:
    """Point every JAX host-callback custom call of `module` at its callback (registered under a
    target of its own); the number bound. Raises ProgramError for an index JAX did not give."""
    calls = [inst for _, inst in module.instructions()
             if inst.opcode == "custom-call" and inst.attrs.get("custom_call_target") in JAX_CALLBACK_TARGETS]
    if not calls:
        return 0
    callbacks = list(host_callbacks or ())
    program = next(_programs)
    targets: list[str] = []
    for inst in calls:
        m = _INDEX.search(str(inst.attrs.get("backend_config") or ""))
        index = int(m.group(1)) if m else -1
        if not 0 <= index < len(callbacks):
            raise inst.error(f"host callback #{index} is not among the {len(callbacks)} JAX compiled with the "
                             "program")
        target = f"rp.jax.callback.{program}.{index}"
        register_custom_call(target, HostCallback(callbacks[index], target))
        inst.attrs["custom_call_target"] = target
        targets.append(target)
    _bound.put(program, targets)
    return len(calls)


def bind_jax_callbacks(module: Module, lowered: Any) -> None:
    """`bind_callbacks` with the callbacks of a JAX `Lowered`; its ordered effects' tokens made
    inside the module (`drop_effect_tokens`), so its arguments and results are the function's."""
    lowering = getattr(lowered, "_lowering", None)
    args = getattr(lowering, "compile_args", None) or {}
    bind_callbacks(module, list(args.get("host_callbacks") or ()))
    drop_effect_tokens(module, len(args.get("ordered_effects") or ()))


def drop_effect_tokens(module: Module, count: int) -> None:
    """JAX gives a program with ordered effects (io_callback(ordered=True), ordered debug.print)
    one leading token parameter and result per effect, which its runtime threads from call to
    call. Each replica runs one call in order, so a fresh token (`after-all()`) serves: the
    entry's parameters and results become the function's own."""
    if count <= 0:
        return
    entry = module.entry_computation
    params = entry.parameters
    root = entry.root_instruction
    if (len(params) < count or not all(p.shape.is_token for p in params[:count]) or root.opcode != "tuple"
            or len(root.operands) < count or not all(s.is_token for s in root.shape.tuple_shapes[:count])):
        raise ProgramError(f"JAX compiled {count} ordered effect(s) but the entry computation does not take and "
                           "return their tokens first")
    for p in params[:count]:
        p.opcode, p.attrs = "after-all", {}
    for p in params[count:]:
        p.attrs["parameter_number"] -= count
    root.operands = root.operands[count:]
    root.shape = Shape.tuple(root.shape.tuple_shapes[count:])
    module.attrs.pop("entry_computation_layout", None)  # it names the tokens


# -- one line per replica ------------------------------------------------------------------------

_local = threading.local()
_lock = threading.Lock()
_installed = 0
_original: Any = None


class _PrefixedStdout(io.TextIOBase):
    """sys.stdout while callbacks run: a thread inside a callback writes whole lines prefixed with
    its replica; other threads write through unchanged."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def write(self, text: str) -> int:
        pending = getattr(_local, "pending", None)
        if pending is None:
            return self.target.write(text)
        pending.append(text)
        return len(text)

    def flush(self) -> None:
        if getattr(_local, "pending", None) is None:
            self.target.flush()


class _replica_output:
    def __init__(self, replica: int) -> None:
        self.replica = replica

    def __enter__(self) -> None:
        global _installed, _original
        with _lock:
            if _installed == 0:
                _original = sys.stdout
                sys.stdout = _PrefixedStdout(_original)
            _installed += 1
        self.outer = getattr(_local, "pending", None)
        _local.pending = []

    def __exit__(self, *exc: object) -> None:
        global _installed
        text = "".join(_local.pending)
        _local.pending = self.outer
        with _lock:
            target = sys.stdout.target if isinstance(sys.stdout, _PrefixedStdout) else sys.stdout
            if text:
                lines = text.splitlines()
                # On the driver's stdout: at once here, with the job's outcome from a Ray actor.
                host_output.write(self.replica, "".join(f"[replica {self.replica}] {line}\n" for line in lines),
                                  target)
            _installed -= 1
            if _installed == 0 and isinstance(sys.stdout, _PrefixedStdout):
                sys.stdout = _original
