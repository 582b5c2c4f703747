"""The error classes of `replicas`. Every failure a user can cause is one of these."""

from __future__ import annotations

from typing import Any


class ReplicasError(Exception):
    """Base class of every error raised by `replicas`."""

    def __reduce__(self) -> tuple:
        # Errors cross process boundaries (Ray actors -> driver) with their report and fields.
        return (_rebuild, (type(self), str(self), dict(self.__dict__)))


def _rebuild(cls: type, message: str, state: dict[str, Any]) -> ReplicasError:
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    error.__dict__.update(state)
    return error


class ProgramError(ReplicasError):
    """An invalid program, HLO text, file or argument. The message names the instruction or line."""

    def __init__(self, message: str, *, instruction: str | None = None, line: int | None = None,
                 column: int | None = None) -> None:
        where = []
        if line is not None:
            where.append(f"line {line}" + (f", column {column}" if column is not None else ""))
        if instruction is not None:
            where.append(f"instruction {instruction}")
        super().__init__(f"{', '.join(where)}: {message}" if where else message)
        self.instruction = instruction
        self.line = line
        self.column = column


def _with_report(message: str, report: Any) -> str:
    if report is None:
        return message
    text = str(report)
    if text.startswith(message):  # a report titled by the message
        return text
    under = getattr(report, "under", None)  # a report that does not repeat the message's finding
    return f"{message}\n{under(message) if under is not None else text}"


class _ReportError(ReplicasError):
    def __init__(self, message: str, report: Any = None) -> None:
        super().__init__(_with_report(message, report))
        self.report = report


class DeadlockError(_ReportError):
    """Every unfinished replica is blocked and nothing in flight can unblock any of them."""


class CollectiveMismatchError(_ReportError):
    """The members of a replica group disagree about their k-th collective."""


class ReplicaFailure(ReplicasError):
    """A replica died or raised; names the replica and the cause."""

    def __init__(self, message: str, replica: int | None = None, cause: BaseException | str | None = None,
                 instruction: str | None = None):
        super().__init__(message)
        self.replica = replica
        self.cause = cause
        self.instruction = instruction  # what the replica was running, e.g. "%y (custom-call)"


class ResourceExhausted(ReplicaFailure):
    """The machine refused a job a resource it needs (`resource`: "threads", "file descriptors",
    "processes", "shared memory", "memory"); everything the job had started is stopped. A replica
    that ran out names itself (`replica`) and its instruction."""

    def __init__(self, message: str, resource: str, replica: int | None = None,
                 instruction: str | None = None, cause: BaseException | str | None = None) -> None:
        super().__init__(message, replica, cause, instruction)
        self.resource = resource


# Functions whose EAGAIN means the machine refused a process (fork, exec, spawn).
_SPAWNING = frozenset({"fork", "_fork_exec", "fork_exec", "_execute_child", "posix_spawn", "_posix_spawn",
                       "_launch", "spawnv_passfds"})


def exhausted_resource(error: BaseException) -> str | None:
    """The resource whose exhaustion `error` reports ("threads", "file descriptors", "processes",
    "shared memory", "memory"), or None for any other error."""
    import errno

    if isinstance(error, ResourceExhausted):
        return error.resource
    if isinstance(error, MemoryError):
        return "memory"
    if isinstance(error, RuntimeError) and "can't start new thread" in str(error):
        return "threads"
    if not isinstance(error, OSError):
        return None
    code = error.errno
    if code in (errno.EMFILE, errno.ENFILE):
        return "file descriptors"
    names = set()
    tb = error.__traceback__
    while tb is not None:
        names.add(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    if code == errno.EAGAIN and names & _SPAWNING:
        return "processes"
    filename = str(error.filename or "")
    if code in (errno.ENOSPC, errno.ENOMEM) and (filename.startswith("/dev/shm") or "memfd_create" in names
                                                 or "ftruncate" in names):
        return "shared memory"
    if code == errno.ENOMEM:
        return "memory"
    return None


class ExecutionTimeout(ReplicasError):
    """The job was still running (not deadlocked) when its timeout expired."""

    def __init__(self, message: str, report: Any = None) -> None:
        super().__init__(_with_report(message, report))
        self.report = report


class ReplicaDivergenceError(ReplicasError):
    """An output meant to be the same on every replica (replicated) differs across them: a forgotten
    pmean, per-replica randomness, statistics not synchronized. Names the output (`.output`), the
    replicas on each side (`.sides`) and the first instruction whose value diverged although
    everything it depends on agreed (`.instruction`, `.source`); `.report` is a JSON-able dict."""

    def __init__(self, message: str, *, output: str, sides: list[list[int]], instruction: str | None = None,
                 source: str | None = None, report: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.output = output
        self.sides = sides
        self.instruction = instruction
        self.source = source
        self.report = report or {}


__all__ = ["ReplicasError", "ProgramError", "DeadlockError", "CollectiveMismatchError",
           "ReplicaFailure", "ExecutionTimeout", "ReplicaDivergenceError"]
