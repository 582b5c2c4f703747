"""The public entry points: launch N replicas of a program, or run it to completion.

A *program* is a Module or Executable, a path to an `.hlo`/`.txt`/`.msgpack` file, HLO text, the
bytes of either, or JAX's lowered / compiled form (`jax.jit(f).lower(*args)` and its `.compile()`:
global arguments and results on every replica, as the lowered text; the compiled *text* takes each
partition's shards, as XLA's SPMD program does).
Arguments may be numpy arrays, JAX arrays (anything with `__array__`), Python scalars and lists.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from replicas.caching import Cache
from replicas.diagnostics.recorder import DEFAULT_CAPACITY
from replicas.errors import ProgramError
from replicas.hlo.ir import Module
from replicas.hlo.jax_compiled import globalize, is_compiled
from replicas.limits import DEADLINE
from replicas.runtime.compile import Executable, module_fingerprint, runs_quickly
from replicas.runtime.job import Job, prepare
from replicas.runtime.options import BACKENDS, DEFAULT_TIMEOUT, LaunchOptions
from replicas.runtime.threads import ThreadBackend, run_alone
from replicas.runtime.values import as_value

Program = Module | Executable | str | bytes | os.PathLike | Any


def as_program(program: Program) -> Module | Executable:
    """The Module (or Executable) that `program` names; ProgramError for anything else."""
    if isinstance(program, Executable):
        return program
    if isinstance(program, Module):
        module = program
    elif isinstance(program, os.PathLike) or (isinstance(program, str) and _looks_like_path(program)):
        from replicas.hlo.files import load

        module = load(program)
    elif isinstance(program, str):
        module = _parse(program)
    elif isinstance(program, (bytes, bytearray, memoryview)):
        module = _from_bytes(bytes(program))
    elif hasattr(program, "lower") and callable(program):
        raise ProgramError("rp.run got a JAX function: JAX needs its arguments to lower it; run it with "
                           "rp.jax.run(f, *args, num_replicas=N), which also splits and joins the shards")
    elif hasattr(program, "as_text") and hasattr(program, "compile"):  # jax.stages.Lowered
        module = _parse(program.as_text(dialect="hlo"))  # as its text: global arguments and results
    elif is_compiled(program):  # jax.stages.Compiled: global arguments and results too
        module = globalize(program)
    else:
        raise ProgramError(f"module must be a program (a Module, a path, HLO text or bytes, JAX's lowered "
                           f"form), got {type(program).__name__}")
    from replicas.hlo.spmd_markers import has_spmd_markers, partition_spmd_markers

    return partition_spmd_markers(module) if has_spmd_markers(module) else module


# Fingerprints of modules found to have no SPMD markers (`as_program` returns them as they are).
_UNMARKED: Cache[bool] = Cache("programs without SPMD markers", 1024)


def _fingerprinted_program(module: Program) -> tuple[Module | Executable, bytes | None]:
    """`as_program(module)` and, when that is `module` itself (a Module), its fingerprint: a warm
    run looks for SPMD markers once per module content, and fingerprints the module once."""
    if type(module) is not Module:
        return as_program(module), None
    fingerprint = module_fingerprint(module)
    if _UNMARKED.get(fingerprint):
        return module, fingerprint
    program = as_program(module)
    if program is not module:
        return program, None
    _UNMARKED.put(fingerprint, True)
    return module, fingerprint


def _looks_like_path(text: str) -> bool:
    return "\n" not in text and not text.lstrip().startswith("HloModule") and len(text) < 4096


def _from_bytes(data: bytes) -> Module:
    from replicas.hlo.serialize import MAGIC, module_from_bytes

    if data.startswith(MAGIC):
        return module_from_bytes(data)
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise ProgramError("bytes that are neither a .msgpack module nor HLO text (UTF-8)") from None
    return _parse(text)


def _parse(text: str) -> Module:
    from replicas.hlo.text import parse_hlo

    return parse_hlo(text)


def declared_replicas(module: Module | Executable) -> int:
    """The replica count a module declares: replica_count x num_partitions (1 when it declares none)."""
    m = module.module if isinstance(module, Executable) else module
    return int(m.attrs.get("replica_count") or 1) * m.num_partitions


def as_arguments(args: Any) -> Any:
    """Array-likes inside `args` as numpy arrays (the container itself is checked by `prepare`)."""
    if isinstance(args, (list, tuple)):
        if all(type(a) is np.ndarray for a in args):  # the usual case: nothing to convert
            return list(args)
        return as_value(list(args))
    if hasattr(args, "__array__") and not isinstance(args, np.ndarray):
        return np.asarray(args)  # one array instead of a list: `prepare` says to wrap it
    return args


def launch(module: Program, args: Sequence[Any] | None = None, num_replicas: int | None = None, *,
           timeout: float | None = DEFAULT_TIMEOUT, address: str | None = None,
           infeed: Sequence[Sequence[Any]] | None = None, trace: str | None = None, strict: bool = True,
           backend: str = "ray", replicas_per_actor: int | None = None,
           resources: Sequence[dict[str, float]] | None = None,
           record_every_instruction: bool = False, trace_events: int = DEFAULT_CAPACITY,
           progress: bool = False) -> Job:
    """Start `num_replicas` replicas of `module` and return the Job without waiting.

    module: a Module, Executable, path, HLO text or bytes, or JAX's lowered/compiled form.
    args: one list of values per replica, or one list given to every replica.
    num_replicas: default the module's declared count (replica_count x num_partitions).
    infeed: values preloaded into each replica's infeed queue (one list per replica).
    backend: "ray" (actors; `address` joins a cluster) or "threads" (one process, no Ray).
    resources: per-replica Ray custom resources, to place replicas on chosen nodes.
    replicas_per_actor: how many replicas share one actor process. By default one each up to the
        cluster's CPUs, two each up to twice that (about one process per CPU: collectives meet
        in-process first, faster than between processes), then packed so that at most twice as many
        processes as CPUs start (each actor process costs seconds of CPU to start).
        `replicas_per_actor=1` gives every replica its own actor.
    record_every_instruction: the flight recorder (and `trace`) also records local ops.
    trace_events: events each replica's flight recorder keeps (the last ones); a trace of a job
        that recorded more says it is truncated, in the file and as a RuntimeWarning.
    progress: while `result()` waits, a live status line on stderr when it is a terminal
        (`job.progress()` gives the same as data at any time).
    """
    options, deadline, executable, per_replica = _checked(
        module, args, num_replicas, infeed, timeout=timeout, address=address, trace=trace, strict=strict,
        backend=backend, replicas_per_actor=replicas_per_actor, resources=resources,
        record_every_instruction=record_every_instruction, trace_events=trace_events, progress=progress)
    return start(executable, per_replica, options, infeed, deadline=deadline)


def _checked(module: Program, args: Sequence[Any] | None, num_replicas: int | None,
             infeed: Sequence[Sequence[Any]] | None,
             **options: Any) -> tuple[LaunchOptions, float | None, Executable, list[list[Any]]]:
    """The options, the job's deadline (every phase, from checking the arguments on, counts against
    `timeout`), the executable and each replica's checked arguments."""
    begun = time.monotonic()
    checked = LaunchOptions.of(**options)
    deadline = checked.deadline(begun)
    return (checked, deadline, *_prepared(module, args, num_replicas, checked, infeed, deadline))


def _prepared(module: Program, args: Sequence[Any] | None, num_replicas: int | None, options: LaunchOptions,
              infeed: Sequence[Sequence[Any]] | None,
              deadline: float | None = None) -> tuple[Executable, list[list[Any]]]:
    """Every check of a launch, in order (the program, the options, the arguments): the executable
    and each replica's checked arguments. Nothing has started yet. Past `deadline` (a
    `time.monotonic()`), ExecutionTimeout naming the phase."""
    scope = DEADLINE.set(deadline)  # reading and verifying the program count against the timeout too
    try:
        program, fingerprint = _fingerprinted_program(module)
        if num_replicas is None:
            num_replicas = declared_replicas(program)
        num_replicas = options.checked(num_replicas, infeed)
        return prepare(program, as_arguments(args), num_replicas, fingerprint=fingerprint, deadline=deadline)
    finally:
        DEADLINE.reset(scope)


def start(executable: Executable, per_replica: list[list[Any]], options: LaunchOptions,
          infeed: Sequence[Sequence[Any]] | None = None, *, run_to_end: bool = False,
          persistent: bool = False, deadline: float | None = None) -> Any:
    """The job of `executable` on `per_replica`'s checked arguments (`options` checked): a `Job`;
    with `persistent`, the backend alone, for a `Session` to run again and again. `run_to_end`:
    the caller only waits for the result (see `RayBackend`). `deadline`: the `time.monotonic()` by
    which the job ends (default: `options.timeout` from now); start-up counts against it."""
    o = options
    if deadline is None:
        deadline = o.deadline()
    if o.backend == "threads":
        engine: Any = ThreadBackend(executable, per_replica, strict=o.strict,
                                    record_every_instruction=o.record_every_instruction,
                                    trace_events=o.trace_events, persistent=persistent,
                                    deadline=None if persistent else deadline)
    else:
        from replicas.runtime.ray.backend import RayBackend

        # What is left of the timeout: the backend's start-up steps wait for no longer.
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        engine = RayBackend(executable, per_replica, address=o.address, strict=o.strict,
                            record_every_instruction=o.record_every_instruction,
                            replicas_per_actor=o.replicas_per_actor or 0,
                            resources=list(o.resources) if o.resources is not None else None,
                            timeout=o.timeout if persistent else left,
                            trace_events=o.trace_events, run_to_end=run_to_end and not infeed,
                            persistent=persistent)
    if persistent:
        return engine
    job = Job(engine, executable, timeout=o.timeout, host_may_send=True, trace=o.trace, progress=o.progress,
              deadline=deadline)
    for r, values in enumerate(infeed or []):
        for v in values:
            job.infeed(r, v)
    return job


def run(module: Program, args: Sequence[Any] | None = None, num_replicas: int | None = None, *,
        timeout: float | None = DEFAULT_TIMEOUT, address: str | None = None,
        infeed: Sequence[Sequence[Any]] | None = None, trace: str | None = None, strict: bool = True,
        backend: str = "ray", replicas_per_actor: int | None = None,
        resources: Sequence[dict[str, float]] | None = None,
        record_every_instruction: bool = False, trace_events: int = DEFAULT_CAPACITY,
        progress: bool = False) -> list[Any]:
    """Run `module` on `num_replicas` replicas to completion; one result per replica.

    Takes every option `launch` takes. Nothing hangs: a deadlock raises DeadlockError within
    seconds, a disagreement between the members of a collective raises CollectiveMismatchError,
    and `timeout` seconds of work raise ExecutionTimeout naming what each replica was doing.
    """
    options, deadline, executable, per_replica = _checked(
        module, args, num_replicas, infeed, timeout=timeout, address=address, trace=trace, strict=strict,
        backend=backend, replicas_per_actor=replicas_per_actor, resources=resources,
        record_every_instruction=record_every_instruction, trace_events=trace_events, progress=progress)
    if (backend == "threads" and len(per_replica) == 1 and infeed is None and trace is None and not progress
            and not record_every_instruction and runs_quickly(executable)):
        # Nothing of a job is needed by a replica that cannot wait and ends at once, and nobody can
        # see one: no mailbox, recorder, monitor or Job, with the same results and errors (`run_alone`).
        # Any other program runs on a replica thread, which the deadline can leave behind.
        return run_alone(executable, per_replica[0])
    job = start(executable, per_replica, options, infeed, run_to_end=True, deadline=deadline)
    job.close_host_input()  # run() feeds nothing beyond the preloaded infeed
    with job:
        return job.result()


__all__ = ["BACKENDS", "DEFAULT_TIMEOUT", "LaunchOptions", "as_program", "as_value", "declared_replicas", "launch",
           "run", "start"]
