"""Keep the replica threads of one job in one process on one core (Linux; a no-op elsewhere).

Why (bench/README.md, "percall" and "affinity"): the replica threads of one process serialize on the
GIL, so a second core buys them nothing but costs every hand-off a cross-CPU wake-up (an IPI, and
the GIL passed between CPUs) and the scheduler's migrations. At 256 threads on 2 cores a replica made
2.4-2.6 context switches per all-reduce, and the runs whose threads migrated cost twice the CPU of
the others; the same process pinned to one core (`taskset -c 0`) never had the slow runs.

When: only when the job's replicas in this process outnumber the cores (N=256 or 1024 on threads;
not N=4 on 4 cores), and only for a program whose replicas cannot overlap real work outside the
GIL: no op that calls BLAS/LAPACK or a custom call (`compile.uses_blas`), and no array over
`LIGHT_BYTES` (numpy's loops over large arrays release the GIL, and several replicas' loops run
in parallel on several cores). The small collectives of a While loop at N=256 are the case. (The
in-process collective itself gains nothing from a second core at any size: at N=4, 16 and 64 MiB
all-reduces cost the same wall time pinned and free, its reduction being one thread's.) Only the
replica threads are pinned: the driver's thread (the monitor, the host side) keeps every core, and
a pooled worker thread gets its own affinity back when its replica's run returns.

Which core: the one the driver's thread runs on when the job starts (the scheduler just found room
there). A fixed core must not become a trap when another process keeps it busy: `Pin.watch`, called
by the monitor at each poll, compares the pinned core's busy time (/proc/stat) with this process's
CPU time; when others took more than `_OTHERS` of the core over a window while another allowed core
was idler by more than that, the replica threads move there (one `sched_setaffinity` per thread).

`REPLICAS_PIN`: "auto" (the default: the rule above), "off" (never pin), or a CPU number (always pin
to that CPU, whatever the replicas and the program; it must be one this process may run on).
"""

from __future__ import annotations

import os
import threading
import time

from replicas.runtime.compile import Executable, uses_blas
from replicas.runtime.cores import cores

ENV = "REPLICAS_PIN"
LIGHT_BYTES = 1 << 20  # the largest array of a program whose replicas are pinned
_WINDOW = 0.2  # seconds of /proc/stat between two decisions of `watch` (its ticks are 10 ms)
_OTHERS = 0.3  # share of the pinned core other processes may take before the threads move

_supported = hasattr(os, "sched_setaffinity") and hasattr(os, "sched_getaffinity")


def current_cpu() -> int | None:
    """The CPU the calling thread runs on (Linux), None when unknown."""
    try:
        with open("/proc/thread-self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[36])  # field 39 of proc(5), counted after the command's ")"
    except (OSError, ValueError, IndexError):
        return None


def choose_cpu(replicas_in_process: int, executable: Executable | None = None) -> int | None:
    """The CPU to keep a job's `replicas_in_process` replica threads on, or None (do not pin).
    `executable`: the job's program (`compile.Executable`); None counts as a light one."""
    setting = os.environ.get(ENV, "auto").strip().lower()
    if setting == "off" or not _supported:
        return None
    allowed = sorted(os.sched_getaffinity(0))
    if setting not in ("", "auto"):
        try:
            cpu = int(setting)
        except ValueError:
            raise ValueError(f"{ENV}={setting!r}: expected 'auto', 'off' or a CPU number") from None
        if cpu not in allowed:
            raise ValueError(f"{ENV}={cpu}: this process may run on CPUs {allowed} only")
        return cpu
    if len(allowed) < 2 or replicas_in_process <= cores():
        return None
    if executable is not None and not light(executable):
        return None
    cpu = current_cpu()
    return cpu if cpu in allowed else allowed[0]


_LIGHT: dict[bytes, bool] = {}  # program fingerprint -> light(program)


def light(executable: Executable) -> bool:
    """True when the program cannot run work outside the GIL worth a second core: no BLAS/LAPACK or
    custom call, no array over `LIGHT_BYTES` (see the module's docstring)."""
    key = executable.fingerprint
    found = _LIGHT.get(key) if key else None
    if found is None:
        largest = 0
        for _, inst in executable.module.instructions():
            for leaf in inst.shape.leaves():
                if leaf.is_array:
                    largest = max(largest, leaf.numel * leaf.element_type.bit_width // 8)
        found = largest <= LIGHT_BYTES and not uses_blas(executable)
        if key:
            if len(_LIGHT) > 1024:
                _LIGHT.clear()
            _LIGHT[key] = found
    return found


class Pin:
    """The pinning of one job's replica threads: each replica thread calls `enter` when its run
    starts and `leave` when it returns (in that thread); the monitor calls `watch` at its polls."""

    def __init__(self, cpu: int) -> None:
        self.cpu = cpu
        self._lock = threading.Lock()
        self._threads: dict[int, set[int]] = {}  # native id -> its affinity before the job
        self.moves = 0  # times the threads moved to another core (tests and benchmarks read it)
        self._allowed = sorted(os.sched_getaffinity(0))
        self._sample: tuple[float, float, dict[int, tuple[int, int]]] | None = None

    def enter(self) -> None:
        tid = threading.get_native_id()
        with self._lock:
            try:
                before = os.sched_getaffinity(0)
                os.sched_setaffinity(0, (self.cpu,))
            except OSError:  # the CPU left this process's cpuset meanwhile: run unpinned
                return
            self._threads[tid] = before

    def leave(self) -> None:
        tid = threading.get_native_id()
        with self._lock:
            before = self._threads.pop(tid, None)
            if before is not None:
                try:
                    os.sched_setaffinity(0, before)
                except OSError:  # a CPU of `before` left the cpuset: take what the process may use
                    os.sched_setaffinity(0, os.sched_getaffinity(os.getpid()))

    def pinned(self) -> dict[int, set[int]]:
        """{native thread id: its affinity before the job} of the replica threads pinned now."""
        with self._lock:
            return dict(self._threads)

    def move(self, cpu: int) -> None:
        """Move every pinned replica thread (and those that start later) to `cpu`."""
        with self._lock:
            self.cpu = cpu
            self.moves += 1
            for tid in self._threads:
                try:
                    os.sched_setaffinity(tid, (cpu,))
                except OSError:  # the thread just ended, or the CPU left the cpuset
                    pass

    def watch(self) -> None:
        """Move the threads to an idler core when other processes keep theirs busy (see the module's
        docstring); cheap enough for every poll (one read of /proc/stat per `_WINDOW`)."""
        now = time.monotonic()
        sample = self._sample
        if sample is not None and now - sample[0] < _WINDOW:
            return
        ticks = _cpu_ticks()
        ours = time.process_time()
        self._sample = (now, ours, ticks)
        if sample is None or not ticks:
            return
        then, ours_then, ticks_then = sample
        hz = os.sysconf("SC_CLK_TCK")
        window = now - then

        def busy(cpu: int) -> float:
            b1, t1 = ticks.get(cpu, (0, 0))
            b0, t0 = ticks_then.get(cpu, (0, 0))
            return (b1 - b0) / hz / window

        # This process's CPU is nearly all the replica threads' on the pinned core (the monitor's
        # own share is small and only makes `others` smaller: it never causes a move).
        others = busy(self.cpu) - (ours - ours_then) / window
        if others <= _OTHERS:
            return
        best = min((c for c in self._allowed if c != self.cpu), key=busy, default=None)
        if best is not None and busy(best) + _OTHERS < others:
            self.move(best)
            self._sample = None  # a fresh window on the new core


def _cpu_ticks() -> dict[int, tuple[int, int]]:
    """{cpu: (busy ticks, total ticks)} from /proc/stat; empty where it cannot be read."""
    try:
        with open("/proc/stat", "rb") as f:
            lines = f.read().split(b"\n")
    except OSError:
        return {}
    out = {}
    for line in lines[1:]:
        if not line.startswith(b"cpu"):
            break
        name, *values = line.split()
        v = [int(x) for x in values[:8]]
        total = sum(v)
        out[int(name[3:])] = (total - v[3] - v[4], total)  # idle and iowait are not busy
    return out
