"""Keep the replica threads of one job in one process on one core (Linux; a no-op elsewhere).

Why: the replica threads of one process serialize on the GIL, so a second core buys them nothing
but costs every hand-off a cross-CPU wake-up (an IPI, and the GIL passed between CPUs) and the
scheduler's migrations: runs whose threads migrated cost several times the CPU of the others, and
the same process pinned to one core (`taskset -c 0`) never had the slow runs.

When: whenever a job has two replica threads or more in this process, and only for a program whose
replicas cannot overlap real work outside the GIL: no op that calls BLAS/LAPACK or a custom call
(`compile.light`), and no array over `LIGHT_BYTES` (numpy's loops over large arrays release the
GIL, and several replicas' loops run in parallel on several cores). Not only when they outnumber
the cores: two replicas' small collectives and Send/Recv round trips are faster pinned than free,
every hand-off staying on one CPU. (The in-process collective itself gains nothing from a second
core at any size, its reduction being one thread's.) Only the
replica threads are pinned: the driver's thread (the monitor, the host side) keeps every core, and
a pooled worker thread gets its own affinity back when its replica's run returns.

Which core: the one the driver's thread runs on when the job starts (the scheduler just found room
there), or where the previous job's threads were at its end. A fixed core must not become a trap
when other processes keep it busy: `Pin.watch`, called by the monitor at each poll, compares each
core's busy time (/proc/stat) with this process's CPU time over a window (`better_cpu`): when the
others took more than `_OTHERS` of the pinned core, the threads move to an idler core (one
`sched_setaffinity` per thread); when no core is idler (a busy machine), they stay.

`REPLICAS_PIN`: "auto" (the rule above, and the default), "off" (never pin), or a CPU number (always
pin to that CPU, whatever the replicas and the program; it must be one this process may run on).
Pinned threads stay pinned while the machine is busy (no core idler than theirs): under the load
of other processes, threads kept on one core spend less CPU and wall time per all-reduce than
threads let go, where every hand-off crosses cores again. (A thousand-replica threads job that
crawls on a busy machine does so pinned or not: a futex storm of GIL waiters, which `gil_slice.py`
damps.)
"""

from __future__ import annotations

import os
import threading
import time

ENV = "REPLICAS_PIN"
DEFAULT = "auto"
LIGHT_BYTES = 1 << 20  # the largest array of a program whose replicas are pinned
_WINDOW = 0.2  # seconds of /proc/stat between two decisions of `watch` (its ticks are 10 ms)
_OTHERS = 0.3  # share of the pinned core other processes may take before the threads move
_MARGIN = 0.1  # how much idler another core must be to move there

_supported = hasattr(os, "sched_setaffinity") and hasattr(os, "sched_getaffinity")


try:
    import ctypes

    _sched_getcpu = ctypes.CDLL(None).sched_getcpu
except (OSError, AttributeError):  # not glibc's Linux: /proc tells
    _sched_getcpu = None
_movable: frozenset[int] | None = None  # the CPUs this process may use, read once


def current_cpu() -> int | None:
    """The CPU the calling thread runs on (Linux; libc's `sched_getcpu`, cheap enough for every
    doorbell call, else /proc), None when unknown."""
    if _sched_getcpu is not None:
        cpu = _sched_getcpu()
        return cpu if cpu >= 0 else None
    try:
        with open("/proc/thread-self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[36])  # field 39 of proc(5), counted after the command's ")"
    except (OSError, ValueError, IndexError):
        return None


def move_off(cpu: int) -> None:
    """Move the calling thread off `cpu` when it runs there. Why: the doorbell's actor thread, woken
    by a driver on `cpu`, is queued by the scheduler beside its waker, where the two then take turns
    on one core (each spinning for the other) while another core idles. Its affinity becomes every
    CPU this process may use but `cpu`, until a later call moves it off another."""
    global _movable
    if not _supported or cpu < 0 or current_cpu() != cpu:
        return
    if _movable is None:
        _movable = frozenset(os.sched_getaffinity(os.getpid()))
    others = _movable - {cpu}
    if others and cpu in _movable:
        try:
            os.sched_setaffinity(0, others)
        except OSError:  # (a container's cpuset changed meanwhile): stay
            pass


def choose_cpu(replicas_in_process: int, light: bool = True) -> int | None:
    """The CPU to keep a job's `replicas_in_process` replica threads on, or None (do not pin).
    `light`: the job's program cannot run work outside the GIL worth a second core
    (`compile.light`)."""
    setting = os.environ.get(ENV, "").strip().lower() or DEFAULT
    if setting == "off" or not _supported:
        return None
    allowed = sorted(os.sched_getaffinity(0))
    if setting != "auto":
        try:
            cpu = int(setting)
        except ValueError:
            raise ValueError(f"{ENV}={setting!r}: expected 'auto', 'off' or a CPU number") from None
        if cpu not in allowed:
            raise ValueError(f"{ENV}={cpu}: this process may run on CPUs {allowed} only")
        return cpu
    if len(allowed) < 2 or replicas_in_process < 2:
        return None
    if not light:
        return None
    cpu = current_cpu()
    return cpu if cpu in allowed else allowed[0]


def plan(replicas_in_process: int, light: bool = True) -> Pin | None:
    """The `Pin` of a job's replica threads in this process, or None (see `choose_cpu`). A CPU the
    user named (`REPLICAS_PIN=<cpu>`) is kept; one chosen here follows `watch`, and a job starts
    where the last one's watch left its threads when that was within `_MEMORY` seconds."""
    cpu = choose_cpu(replicas_in_process, light)
    if cpu is None:
        return None
    if (os.environ.get(ENV, "").strip().lower() or DEFAULT) != "auto":  # a CPU number
        return Pin(cpu, movable=False)
    when, where = _last
    if time.monotonic() - when < _MEMORY and (where is None or where in os.sched_getaffinity(0)):
        cpu = where
    return Pin(cpu, expected=replicas_in_process)


_MEMORY = 2.0  # seconds a watch's verdict (a core, or none while the machine is busy) serves the next job
_last: list = [float("-inf"), None]  # [when, where]: the latest watch's verdict


class Pin:
    """The pinning of one job's replica threads: each replica thread calls `enter` when its run
    starts and `leave` when it returns (in that thread); the monitor calls `watch` at its polls.
    `cpu` None: the threads run where the scheduler puts them (the machine was busy), until a
    watch finds a core with room.

    `expected`: the number of replica threads; given, they run unpinned until the last of them
    enters, which pins them all. 1024 new threads each moving itself onto one
    core while the driver's thread, on the other, waits for each to start took seconds (and a job
    started beside 1023 unwinding threads of an aborted one, tens of seconds); unpinned they start
    on whichever core is free. `release` lets them all go before an abort wakes them, for the same
    reason."""

    def __init__(self, cpu: int | None, movable: bool = True, expected: int = 0) -> None:
        self.cpu = cpu
        self.movable = movable
        self.activated = threading.Event()  # set once the threads are pinned
        self._waiting_for = expected  # threads still to enter before they are pinned
        if not expected:
            self.activated.set()
        self._lock = threading.Lock()
        self._threads: dict[int, set[int]] = {}  # native id -> its affinity before the job
        self.moves = 0  # times the threads changed cores or were let go (tests and benchmarks read it)
        self._allowed = sorted(os.sched_getaffinity(0))
        self._sample: tuple[float, float, dict[int, int]] | None = None

    def enter(self) -> None:
        tid = threading.get_native_id()
        with self._lock:
            before = os.sched_getaffinity(0)
            if self.cpu is not None and self.activated.is_set():
                try:
                    os.sched_setaffinity(0, (self.cpu,))
                except OSError:  # the CPU left this process's cpuset meanwhile: run unpinned
                    return
            self._threads[tid] = before
            if not self.activated.is_set():
                self._waiting_for -= 1
                if not self._waiting_for:
                    self.activated.set()
                    if self.cpu is not None:
                        self._apply()

    def leave(self) -> None:
        tid = threading.get_native_id()
        with self._lock:
            before = self._threads.pop(tid, None)
            if before is not None and self.cpu is not None and self.activated.is_set():
                try:
                    os.sched_setaffinity(0, before)
                except OSError:  # a CPU of `before` left the cpuset: take what the process may use
                    os.sched_setaffinity(0, os.sched_getaffinity(os.getpid()))

    def pinned(self) -> dict[int, set[int]]:
        """{native thread id: its affinity before the job} of the replica threads pinned now."""
        with self._lock:
            return dict(self._threads) if self.cpu is not None and self.activated.is_set() else {}

    def move(self, cpu: int | None) -> None:
        """Move every replica thread of the job (and those that start later) to `cpu`; None lets them
        run anywhere they could before the job."""
        with self._lock:
            self.cpu = cpu
            self.moves += 1
            self._apply()

    def release(self) -> None:
        """Let every replica thread run anywhere it could before the job, for good (an abort: the
        woken threads unwind on whichever core is free)."""
        with self._lock:
            self.cpu = None
            self._apply()

    def _apply(self) -> None:
        """Set every entered thread's affinity to `cpu` (None: its own from before the job); the
        caller holds the lock."""
        cpu = self.cpu
        for tid, before in self._threads.items():
            try:
                os.sched_setaffinity(tid, before if cpu is None else (cpu,))
            except OSError:  # the thread just ended, or the CPU left the cpuset
                pass

    def watch(self) -> None:
        """Keep the threads on a core with room, or let them go while the machine has none (see the
        module's docstring); cheap enough for every poll (one read of /proc/stat per `_WINDOW`)."""
        if not self.movable:
            return
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
        window_ticks = (now - then) * os.sysconf("SC_CLK_TCK")
        busy = {c: (ticks[c] - ticks_then.get(c, ticks[c])) / window_ticks for c in self._allowed if c in ticks}
        target = better_cpu(self.cpu, busy, (ours - ours_then) / (now - then))
        _last[:] = [now, target]
        if target != self.cpu:
            self.move(target)
            self._sample = None  # a fresh window where they are now


def better_cpu(cpu: int | None, busy: dict[int, float], ours: float) -> int | None:
    """Where the replica threads should run next: a CPU, or None (anywhere). `cpu`: where they run
    now (None: anywhere); `busy`: each allowed CPU's busy share of the last window; `ours`: this
    process's CPU over it, in CPUs (nearly all the replica threads'; the monitor's small share only
    makes `others` smaller).

    Pinned, they stay while other processes take at most `_OTHERS` of their core, move to an idler
    core when there is one, and stay when there is none (a busy machine: let go, they would hand the
    GIL between cores again, at twice the CPU per hand-off). Unpinned (after an abort's `release`),
    they are pinned again to the idlest core once the others leave more than a core and a half free."""
    if cpu is not None:
        others = busy.get(cpu, 0.0) - ours
        if others <= _OTHERS:
            return cpu
        best = min((c for c in busy if c != cpu), key=busy.__getitem__, default=None)
        if best is not None and busy[best] + _MARGIN < others:
            return best
        return cpu
    if not busy:
        return None
    others = sum(busy.values()) - ours
    if others <= len(busy) - 1.5:
        return min(busy, key=busy.__getitem__)
    return None


def _cpu_ticks() -> dict[int, int]:
    """{cpu: busy ticks} from /proc/stat; empty where it cannot be read."""
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
        out[int(name[3:])] = sum(v) - v[3] - v[4]  # idle and iowait are not busy
    return out
