"""What a killed driver leaves behind is removed by its reaper: a small process each Ray driver starts,
that holds the read end of a pipe only the driver writes to.

Why a separate process: a driver killed by SIGKILL runs no code, and its actors cannot be relied on
either: when the driver started its own local Ray, its raylet dies with it (Ray's fate sharing) and
takes the actors with it within a second or two, without a chance to run Python; Ray's dashboard and
runtime-env agents then try to tell the dead GCS and linger for a minute or more. The pipe is the
lease: the driver writes what it started (its jobs' tokens, which name their shared-memory
segments, and its local Ray's processes) and the reaper reads it; end of file means the driver is
gone, however it ended. Then the reaper unlinks the segments of every job the driver told it about,
stops what is left of the local Ray the driver started (only that one: its own processes by pid
and start time, and the processes its raylet started by the files of its session directory they
hold open: Ray's agents rename themselves over their environment, so it cannot tell), waits
for those processes to exit, unlinks the segments once more (an actor may have made one while
dying) and exits: within a second or two of the driver's death.

On a clean exit the driver has removed its segments and shut Ray down itself, so the reaper finds
nothing to do. Segments on other nodes of a cluster are not reached from here: there each actor
that makes segments holds a lease of its own (`detached`: its reaper leaves the actor's process
tree, since Ray kills a worker's children with it), and when Ray ends the actors of a dead driver,
their reapers unlink their jobs' segments on their nodes.

This file runs as a script (`python reaper.py <shm dir> <prefix>`) with the standard library only:
importing the package would cost the reaper numpy's start-up.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from typing import IO

GRACE = 2.0  # seconds the reaper waits for the killed processes to exit before its last sweep
ENDED_KEPT = 256  # ended jobs whose segments the reaper still sweeps (as the driver's own `_ended`)


class Lease:
    """The driver's end: the pipe to its reaper (started once per driver process)."""

    def __init__(self, shm_dir: str, prefix: str, *, detached: bool = False) -> None:
        """`detached`: the reaper leaves this process's tree at once (a Ray worker's children are
        killed with it: its reaper must outlive it)."""
        self._lock = threading.Lock()
        argv = [sys.executable, "-I", os.path.abspath(__file__), shm_dir, prefix]
        self._proc = subprocess.Popen(argv + ([str(os.getpid())] if detached else []),
                                      stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      start_new_session=True, close_fds=True)
        if detached:
            self._proc.wait()  # its first process ends once the reaper forked away from it
        self._pipe: IO[bytes] | None = self._proc.stdin
        # A child forked without exec (multiprocessing) must not hold the lease: the reaper would
        # wait for that child's end too.
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        pipe, self._pipe = self._pipe, None
        if pipe is not None:
            try:
                os.close(pipe.fileno())
            except OSError:
                pass

    @property
    def pid(self) -> int:
        return self._proc.pid

    def tell(self, kind: str, value: str) -> None:
        """One line for the reaper: `job <token>` / `ended <token>`, `session <dir>`, or
        `proc <pid> <start time>`."""
        with self._lock:
            pipe = self._pipe
            if pipe is None:
                return
            try:
                pipe.write(f"{kind} {value}\n".encode())
                pipe.flush()
            except (OSError, ValueError):  # the reaper is gone: nothing to tell
                self._pipe = None


_lease: Lease | None = None
_lease_lock = threading.Lock()


def lease(shm_dir: str, prefix: str, *, detached: bool = False) -> Lease | None:
    """This process's lease (its reaper started at the first call); None where it cannot run."""
    global _lease
    with _lease_lock:
        if _lease is None and sys.platform.startswith("linux"):
            try:
                _lease = Lease(shm_dir, prefix, detached=detached)
            except OSError:
                return None
        return _lease


def job_started(token: str) -> None:
    """Before job `token` makes any segment: the reaper removes them if this driver dies."""
    if _lease is not None:
        _lease.tell("job", token)


def job_ended(token: str) -> None:
    """Job `token` ended and its segments were removed (the reaper keeps only the last ENDED_KEPT
    such tokens: a launch on its way when the job ended may still make one)."""
    if _lease is not None:
        _lease.tell("ended", token)


def start_time(pid: int) -> str | None:
    """A process's start time (clock ticks since boot): with its pid, it names that process only."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def tell_local_ray(node: object) -> None:
    """Hand the processes of the local Ray this driver started (`ray._private.node.Node`) to the reaper."""
    current = _lease
    if current is None:
        return
    session = getattr(node, "get_session_dir_path", lambda: None)()
    if session:
        current.tell("session", os.path.realpath(session))
    for infos in getattr(node, "all_processes", {}).values():
        for info in infos:
            pid = getattr(getattr(info, "process", None), "pid", None)
            started = start_time(pid) if pid else None
            if started is not None:
                current.tell("proc", f"{pid} {started}")


# -- the reaper process -------------------------------------------------------------------------------
def _alive(pid: int, started: str) -> bool:
    return start_time(pid) == started and _state(pid) not in ("Z", "X", None)


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _sweep(shm_dir: str, prefix: str, tokens: set[str]) -> None:
    wanted = tuple(f"{prefix}{t}-" for t in tokens)
    if not wanted:
        return
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return
    for name in names:
        if name.startswith(wanted):
            try:
                os.unlink(os.path.join(shm_dir, name))
            except OSError:
                pass


def _in_sessions(sessions: set[str]) -> list[tuple[int, str]]:
    """This user's processes holding a file of one of the Ray session directories `sessions` open
    (the raylet's workers and agents keep their logs there), alive now."""
    prefixes = tuple(d.rstrip("/") + "/" for d in sessions)
    uid, me, found = os.getuid(), os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != uid:
                continue
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{entry}/fd/{fd}")
            except OSError:
                continue
            if target.startswith(prefixes):
                started = start_time(int(entry))
                if started is not None:
                    found.append((int(entry), started))
                break
    return found


def _stop(procs: list[tuple[int, str]]) -> None:
    """SIGKILL each process still the one named, then wait (bounded) until all have exited."""
    waits = []
    for pid, started in procs:
        if not _alive(pid, started):
            continue
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            continue
        if start_time(pid) == started:  # still that process now that the pidfd pins it
            try:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            except OSError:
                pass
        waits.append(fd)
    deadline = time.monotonic() + GRACE
    while waits and time.monotonic() < deadline:
        ready, _, _ = select.select(waits, [], [], max(0.0, deadline - time.monotonic()))
        for fd in ready:
            waits.remove(fd)
            os.close(fd)
    for fd in waits:
        os.close(fd)


def main(shm_dir: str, prefix: str, holder: str | None = None) -> None:
    """Reap for the process `holder` (a pid), or for the parent; with `holder` the reaper first forks
    away from the process that started it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C to the driver's terminal is not the driver's end
    if holder is not None and os.fork() > 0:
        os._exit(0)
    driver = int(holder) if holder is not None else os.getppid()
    try:
        gone = os.pidfd_open(driver)
    except OSError:  # the driver is gone already, or no pidfds: end of file alone says it
        gone = None
    tokens: set[str] = set()  # jobs running, and the last ENDED_KEPT that ended
    ended: deque[str] = deque()
    procs: list[tuple[int, str]] = []
    sessions: set[str] = set()
    for line in sys.stdin.buffer:
        kind, _, value = line.decode(errors="replace").strip().partition(" ")
        if kind == "job" and value:
            tokens.add(value)
        elif kind == "ended" and value in tokens:
            ended.append(value)
            if len(ended) > ENDED_KEPT:
                tokens.discard(ended.popleft())
        elif kind == "session" and value.startswith("/"):
            sessions.add(value)
        elif kind == "proc":
            pid, _, started = value.partition(" ")
            if pid.isdigit() and started.isdigit():
                procs.append((int(pid), started))
    # End of file: the driver is gone, or ending (an exiting interpreter closes its files before it is
    # gone): nothing is stopped before it has exited, and never the driver itself.
    if gone is not None:
        select.select([gone], [], [])
        os.close(gone)
    _sweep(shm_dir, prefix, tokens)
    if procs or sessions:
        _stop([p for p in procs + (_in_sessions(sessions) if sessions else []) if p[0] != driver])
    _sweep(shm_dir, prefix, tokens)


if __name__ == "__main__":
    main(*sys.argv[1:4])
