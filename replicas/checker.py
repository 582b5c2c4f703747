"""`rp.check` and `replicas check`: run every replica as a thread of this process and report what goes wrong.

Besides what `rp.run` reports (deadlocks, mismatches, failures), a check looks at the messages
left in the replicas' mailboxes once every replica finished: a message nobody took is a silent
bug that no wait revealed, such as a collective-permute whose target skipped it (sources never
wait), or a Send whose peer posted its Recv but never ran the RecvDone.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from replicas.collectives.fingerprint import Fingerprint
from replicas.collectives.kernels import zeros_of
from replicas.diagnostics.recorder import DEFAULT_CAPACITY
from replicas.errors import ProgramError, ReplicasError
from replicas.hlo.ir import Module
from replicas.limits import check_replicas
from replicas.records import HOST
from replicas.runtime.arguments import check_timeout
from replicas.runtime.compile import Executable
from replicas.runtime.driver import DEFAULT_TIMEOUT, Program, as_arguments, as_program, declared_replicas, launch
from replicas.transport import keys


def check(module: Program, args: Sequence[Any] | None = None, num_replicas: int | None = None, *,
          timeout: float = DEFAULT_TIMEOUT, infeed: Sequence[Sequence[Any]] | None = None, strict: bool = True,
          trace: str | None = None, record_every_instruction: bool = False,
          trace_events: int = DEFAULT_CAPACITY, replicated: Sequence[int] = (), tolerance: float = 0.0) -> None:
    """`rp.check`: run `module` on threads and raise what goes wrong, as `rp.verify` raises for a bad
    module: DeadlockError, CollectiveMismatchError, ReplicaFailure, ExecutionTimeout, or a
    ProgramError for messages nobody received. Without `args` every parameter is zeros. Returns
    None when clean. The trace options are `rp.launch`'s. `replicated`: the outputs (indices into
    the entry's result tuple; 0 for a result that is not a tuple) meant to be the same on every
    replica: one that differs (bitwise, or beyond `tolerance`) is a ReplicaDivergenceError naming
    the first instruction whose value diverged though everything it depends on agreed."""
    program = as_program(module)
    if num_replicas is None:
        num_replicas = declared_replicas(program)
    num_replicas = check_replicas(num_replicas)
    check_timeout(timeout)
    problem = find_problem(program.module if isinstance(program, Executable) else program, as_arguments(args),
                           num_replicas, timeout=timeout, infeed=infeed, strict=strict, trace=trace,
                           record_every_instruction=record_every_instruction, trace_events=trace_events,
                           replicated=replicated, tolerance=tolerance)
    if problem is not None:
        raise problem


def find_problem(module: Module, args: Sequence[Any] | None = None, num_replicas: int = 2, *,
          timeout: float = DEFAULT_TIMEOUT, infeed: Sequence[Sequence[Any]] | None = None,
          strict: bool = True, replicated: Sequence[int] = (), tolerance: float = 0.0,
          **options: Any) -> ReplicasError | None:
    """Run `module` on `num_replicas` threads; None if it completes cleanly, else the error it raised
    (DeadlockError, CollectiveMismatchError, ProgramError, ReplicaFailure, ExecutionTimeout),
    with the same report `rp.run` gives, or a ProgramError naming the messages nobody received.
    Without `args`, every parameter is zeros."""
    if args is None:
        args = zero_arguments(module)
    try:
        job = launch(module, args, num_replicas, timeout=timeout, infeed=infeed, strict=strict, backend="threads",
                     **options)  # trace, record_every_instruction, progress: as rp.run takes them
        job.close_host_input()  # as in rp.run: nothing is fed beyond `infeed`
        with job:
            results = job.result()
    except ReplicasError as e:
        return e
    left = job.leftovers()  # the finished job's leftovers are the evidence
    findings = [line for r, messages in left.items() for line in leftovers(r, messages)]
    if findings:
        return ProgramError("messages nobody received after every replica finished:\n  " + "\n  ".join(findings))
    if replicated:
        return _divergence(module, args, num_replicas, results, replicated, tolerance)
    return None


def _divergence(module: Module, args: Sequence[Any], num_replicas: int, results: list[Any],
                replicated: Sequence[int], tolerance: float) -> ReplicasError | None:
    from replicas.jax.divergence import check_outputs, checked_tolerance
    from replicas.runtime.job import per_replica_args

    tolerance = checked_tolerance(tolerance) or 0.0
    is_tuple = module.entry_computation.result_shape.is_tuple
    count = len(module.entry_computation.result_shape.tuple_shapes) if is_tuple else 1
    bad = [i for i in replicated if not isinstance(i, int) or not 0 <= i < count]
    if bad:
        return ProgramError(f"replicated= names output(s) {bad}; the program has {count} output(s)")
    flat = [list(r) if is_tuple else [r] for r in results]
    per_replica = per_replica_args(args, num_replicas, len(module.entry_computation.parameters))
    try:
        check_outputs(module, per_replica, flat, list(replicated), tolerance=tolerance)
    except ReplicasError as e:
        return e
    return None


def leftovers(replica: int, messages: dict[tuple[int, Hashable], Any]) -> list[str]:
    """One line per message left in replica `replica`'s mailbox (host values excepted)."""
    out = []
    for (src, key), value in sorted(messages.items(), key=lambda item: repr(item[0])):
        if src == HOST or not isinstance(key, tuple) or not key:
            continue
        protocol = key[0]
        if protocol == keys.COLLECTIVE:
            seq, round_ = key[1], key[2]
            what = f"collective #{seq}"
            if round_ == 0 and isinstance(value, tuple) and len(value) == 2:
                what += f" ({_collective_name(value[0])})"
            out.append(f"replica {src} sent its {what} to replica {replica}, which never took part in it")
        elif protocol == keys.CHANNEL:
            out.append(f"replica {src} sent message #{key[2]} on channel {key[1]} to replica {replica}, "
                       f"which never received it (its recv-done did not run)")
        elif protocol == keys.CHANNEL_ACK:
            out.append(f"replica {src} posted recv #{key[2]} on channel {key[1]} from replica {replica}, "
                       f"whose send-done never ran")
        else:
            out.append(f"replica {src} sent {key!r} to replica {replica}, which never took it")
    return out


def _collective_name(wire: Any) -> str:
    try:
        fp = Fingerprint(tuple(wire))
        return f"%{fp.name}, {fp.opcode}"
    except (IndexError, TypeError, ValueError):
        return "unknown instruction"


def zero_arguments(module: Module) -> list[Any]:
    """Zeros of each entry parameter's shape: enough to exercise a program's communication."""
    return [zeros_of(p.shape) for p in module.entry_computation.parameters]


def describe(problem: ReplicasError) -> str:
    """The text `replicas check` prints: the error with its report, as `replicas run` prints it."""
    return f"{type(problem).__name__}: {problem}"
