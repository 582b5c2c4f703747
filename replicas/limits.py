"""Ceilings on what one program or job may ask for, checked before anything is allocated.

A 200-byte program can declare `replica_count=2**64` or `f32[999999999999]`; a caller can pass
`num_replicas=2**70`. Each is refused with a ProgramError that states the size and the ceiling,
before a list, an array or a message of that size is built.

    max_replicas  replicas of one job (and a module's replica_count / num_partitions);
                  default 16384 (a TPU v5p pod is 8,960 chips), environment variable
                  REPLICAS_MAX_REPLICAS. Each replica is a thread (of this process, or of a Ray
                  actor): `check_threads` refuses a job whose threads would fill the machine's
                  task table before any starts.
    max_bytes     bytes of one value a program declares, of one value times the number of
                  replicas (every replica materializes its own), and of a replica's peak live bytes
                  times the replicas (runtime/memory.py); default: this machine's physical memory, or
                  the process's address-space or data limit if lower; environment variable
                  REPLICAS_MAX_BYTES.
    max_nesting   depth of tuple shapes and of nested values; fixed at 64 (XLA programs use < 10).
    max_program_bytes
                  bytes of one program's text or .msgpack file, refused before it is read or parsed
                  (parsing holds at most ~10 bytes per input byte); default 512 MiB, environment
                  variable REPLICAS_MAX_PROGRAM_BYTES.
    max_rank      dimensions of one array shape; fixed at 64 (XLA's own limit).

`configure(...)` changes them for this process (Ray actors read the environment variables).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterable
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any

from replicas.errors import ExecutionTimeout, ProgramError, ResourceExhausted

DEFAULT_MAX_REPLICAS = 16384
DEFAULT_MAX_PROGRAM_BYTES = 512 << 20
MAX_NESTING = 64
MAX_RANK = 64
# Error messages list at most this many ranges of replica ids, then say how many were left out.
MAX_LISTED_RANGES = 8


def _physical_memory() -> int:
    """The machine's memory, or less if this process's address space or data segment is capped
    (a program that cannot fit is then refused before it runs, not stopped by a MemoryError)."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = 16 << 30
    try:
        import resource

        for which in (resource.RLIMIT_AS, resource.RLIMIT_DATA):
            soft = resource.getrlimit(which)[0]
            if soft != resource.RLIM_INFINITY and soft > 0:
                memory = min(memory, soft)
    except (ImportError, ValueError, OSError):
        pass
    return memory


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ProgramError(f"environment variable {name}={raw!r} is not an integer") from None
    if value < 1:
        raise ProgramError(f"environment variable {name}={raw!r} must be >= 1")
    return value


@dataclass(frozen=True)
class Limits:
    max_replicas: int
    max_bytes: int
    max_program_bytes: int = DEFAULT_MAX_PROGRAM_BYTES
    max_nesting: int = MAX_NESTING


_current = Limits(_env_int("REPLICAS_MAX_REPLICAS", DEFAULT_MAX_REPLICAS),
                  _env_int("REPLICAS_MAX_BYTES", _physical_memory()),
                  _env_int("REPLICAS_MAX_PROGRAM_BYTES", DEFAULT_MAX_PROGRAM_BYTES))


def current() -> Limits:
    return _current


def configure(*, max_replicas: int | None = None, max_bytes: int | None = None,
              max_program_bytes: int | None = None) -> Limits:
    """Set this process's ceilings; returns the previous ones (pass them back to restore)."""
    global _current
    previous = _current
    changes: dict[str, int] = {}
    for name, value in (("max_replicas", max_replicas), ("max_bytes", max_bytes),
                        ("max_program_bytes", max_program_bytes)):
        if value is not None:
            if not is_integer(value) or value < 1:
                raise ProgramError(f"{name} must be a positive integer, got {value!r}")
            changes[name] = int(value)
    _current = replace(_current, **changes)
    return previous


def restore(limits: Limits) -> None:
    global _current
    _current = limits


def is_integer(value: Any) -> bool:
    """A Python or numpy integer, not a bool."""
    import numpy as np

    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def check_replicas(value: Any, what: str = "num_replicas") -> int:
    """`value` as a replica count in [1, max_replicas], or ProgramError naming `what`."""
    if not is_integer(value):
        raise ProgramError(f"{what} must be an integer, got {type(value).__name__} {_short(value)}")
    n = int(value)
    if n < 1:
        raise ProgramError(f"{what} must be >= 1, got {n}")
    ceiling = _current.max_replicas
    if n > ceiling:
        raise ProgramError(f"{what}={_short(n)} exceeds the ceiling of {ceiling} replicas per job "
                           "(replicas.limits.configure(max_replicas=...) or REPLICAS_MAX_REPLICAS)")
    return n


# The share of the machine's task table (kernel.pid_max, kernel.threads-max, the cgroup's pids.max)
# a job's replica threads may fill, counting every task already there: the rest stays for the
# machine's other processes (and this job's own Ray, BLAS and transport threads).
TASK_SHARE = 0.75


def task_room() -> tuple[int, str] | None:
    """How many more threads may start before the fullest task table this process is under (the
    kernel's and its cgroup's) reaches `TASK_SHARE`, and a description of that table; None where
    unknown (not Linux). A user's RLIMIT_NPROC is not counted (it needs a scan of every process):
    a thread it refuses ends the job with ResourceExhausted as it starts."""
    try:
        with open("/proc/loadavg") as f:
            total = int(f.read().split()[3].split("/")[1])  # "running/total" tasks of the machine
    except (OSError, ValueError, IndexError):
        return None
    tables = [(_read_int("/proc/sys/kernel/pid_max"), total, "kernel.pid_max"),
              (_read_int("/proc/sys/kernel/threads-max"), total, "kernel.threads-max")]
    for path in _pids_cgroups():
        tables.append((_read_int(f"{path}/pids.max"), _read_int(f"{path}/pids.current") or 0,
                       f"the cgroup's pids.max ({path})"))
    best: tuple[int, str] | None = None
    for size, used, name in tables:
        if size:
            room = int(size * TASK_SHARE) - used
            if best is None or room < best[0]:
                best = (room, f"{name} = {size}, {used} tasks in use")
    return best


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):  # missing, or "max" (no limit)
        return None


def _pids_cgroups() -> list[str]:
    """This process's pids cgroup directories (v2: the unified hierarchy; v1: the pids controller's)."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            out.append(f"/sys/fs/cgroup{path.rstrip('/')}")
        elif "pids" in controllers.split(","):
            out.append(f"/sys/fs/cgroup/pids{path.rstrip('/')}")
    return out


def check_threads(count: int, what: str) -> None:
    """ResourceExhausted ("threads") if `count` more threads (`what` needs them) would fill the
    machine's task table past `TASK_SHARE`: refused before any of them starts."""
    found = task_room()
    if found is not None and count > found[0]:
        raise ResourceExhausted(f"{what} needs {count} threads, but this machine has room for {max(0, found[0])} more "
                                f"within {TASK_SHARE:.0%} of its task table ({found[1]}): fewer replicas, or a "
                                "Ray cluster of more nodes", "threads")


def check_program_size(size: int, what: str = "the program") -> None:
    """ProgramError if a program of `size` bytes (text or .msgpack) is over max_program_bytes:
    called before the program is read or parsed."""
    ceiling = _current.max_program_bytes
    if size > ceiling:
        raise ProgramError(f"{what} takes {format_bytes(size)}, more than the ceiling of {format_bytes(ceiling)} "
                           "per program (replicas.limits.configure(max_program_bytes=...) or "
                           "REPLICAS_MAX_PROGRAM_BYTES)")


def shape_bytes(shape: Any) -> int:
    """Bytes a value of `shape` takes (sub-byte types one byte per element), without recursion;
    ProgramError if tuples nest deeper than max_nesting."""
    total = 0
    stack = [(shape, 0)]
    while stack:
        s, depth = stack.pop()
        if depth > _current.max_nesting:
            raise ProgramError(f"tuple shape nests deeper than {_current.max_nesting} levels")
        if s.is_tuple:
            stack.extend((t, depth + 1) for t in s.tuple_shapes)
        elif not s.is_token:
            if len(s.dimensions) > MAX_RANK:
                raise ProgramError(f"an array shape of rank {len(s.dimensions)}: more than the {MAX_RANK} "
                                   "dimensions XLA allows")
            total += math.prod(s.dimensions) * max(1, s.dtype.itemsize)
    return total


def check_shape(shape: Any, what: str = "a shape") -> int:
    """The bytes of `shape`, or ProgramError if one value of it exceeds max_bytes."""
    size = shape_bytes(shape)
    ceiling = _current.max_bytes
    if size > ceiling:
        raise ProgramError(f"{what} {_short(shape)} takes {format_bytes(size)}, more than the ceiling of "
                           f"{format_bytes(ceiling)} per value (replicas.limits.configure(max_bytes=...) "
                           "or REPLICAS_MAX_BYTES)")
    return size


def check_module(module: Any, num_replicas: int | None = None) -> None:
    """Every shape of `module` within max_bytes (times `num_replicas` when given), and its
    replica_count / num_partitions within max_replicas; before the verifier or a kernel sizes
    anything by them."""
    for key in ("replica_count", "num_partitions"):
        value = module.attrs.get(key)
        if value is not None:
            check_replicas(value, f"module {module.name}: {key}")
    largest, where = 0, ""
    for comp in module.computations.values():
        for inst in comp.instructions:
            size = check_shape(inst.shape, f"instruction %{inst.name} of shape")
            if size > largest:
                largest, where = size, f"%{inst.name} ({_short(inst.shape)})"
    if num_replicas is not None and largest * num_replicas > _current.max_bytes:
        raise ProgramError(f"{num_replicas} replicas each holding {where} need "
                           f"{format_bytes(largest * num_replicas)}, more than the ceiling of "
                           f"{format_bytes(_current.max_bytes)} per job (replicas.limits.configure(max_bytes=...) "
                           "or REPLICAS_MAX_BYTES)")


def format_bytes(n: int) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.3g} {unit} ({n} bytes)"
    return f"{n} bytes"


def id_ranges(ids: Iterable[int], limit: int = MAX_LISTED_RANGES) -> str:
    """Sorted ids as ranges, at most `limit` of them: "0-3, 7, 9-999999 (and 12 more ranges)"."""
    ranges: list[tuple[int, int]] = []
    for i in sorted(ids):
        if ranges and i == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], i)
        elif not ranges or i != ranges[-1][1]:
            ranges.append((i, i))
    return _ranges_text(ranges, limit)


def missing_ids(present: Iterable[int], n: int) -> str:
    """The ids in range(n) missing from `present`, as ranges, in time proportional to `present`."""
    gaps: list[tuple[int, int]] = []
    previous = -1
    for i in sorted(set(present)):
        if i > previous + 1:
            gaps.append((previous + 1, i - 1))
        previous = i
    if previous < n - 1:
        gaps.append((previous + 1, n - 1))
    return _ranges_text(gaps, MAX_LISTED_RANGES)


def _ranges_text(ranges: list[tuple[int, int]], limit: int) -> str:
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges[:limit])
    if len(ranges) > limit:
        text += f" (and {len(ranges) - limit} more ranges)"
    return text


def short_text(value: Any, limit: int = 120) -> str:
    """`str(value)` cut to `limit` characters, for error messages about hostile input."""
    return _short(value, limit)


def _short(value: Any, limit: int = 80) -> str:
    if isinstance(value, int) and value.bit_length() > 256:
        return f"an integer of {value.bit_length()} bits"
    text = str(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


__all__ = ["Limits", "current", "configure", "restore", "check_replicas", "check_shape", "check_module",
           "check_program_size", "check_threads", "task_room",
           "shape_bytes", "format_bytes", "id_ranges", "missing_ids", "short_text", "is_integer"]


# The `time.monotonic()` by which the job being prepared in this thread must have ended (set by
# `rp.run`/`rp.launch` while they read the program, check the arguments and set the replicas up):
# long loops of those phases look at it. None: no job's deadline applies.
DEADLINE: ContextVar[float | None] = ContextVar("DEADLINE", default=None)


def check_deadline(doing: str) -> None:
    """ExecutionTimeout if this thread's job deadline (`DEADLINE`) has passed, saying what it was
    `doing` then."""
    deadline = DEADLINE.get()
    if deadline is not None and time.monotonic() >= deadline:
        raise ExecutionTimeout(f"the job's timeout expired while {doing}")
