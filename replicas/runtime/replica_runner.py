"""One replica's interpreter running in its own thread (under threads or inside a Ray actor)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from replicas.diagnostics.recorder import FlightRecorder
from replicas.records import ReplicaState
from replicas.runtime import batched, batched_live
from replicas.runtime.compile import Executable
from replicas.runtime.interpreter_pool import checkin, checkout
from replicas.transport.fabric import MailboxFabric
from replicas.tuning import gil_slice, workers
from replicas.tuning.affinity import Pin


class _Flag:
    """Set once, when one run of a parked replica returned: an Event with a lock's cost (a
    persistent job's call hands every replica over and back; an Event's Condition costs a dozen
    lines of Python each way)."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()

    def set(self) -> None:
        self._lock.release()

    def clear(self) -> bool:
        """Unset it again, when it is set and nobody holds it at this instant (else False)."""
        return self._lock.acquire(blocking=False)

    def wait(self, timeout: float | None = None) -> bool:
        if self._lock.acquire(timeout=-1 if timeout is None else timeout):
            self._lock.release()
            return True
        return False


class ReplicaRunner:
    def __init__(self, executable: Executable, fabric: MailboxFabric, recorder: FlightRecorder) -> None:
        self.replica_id = fabric.replica_id
        self.fabric = fabric
        self.mailbox = fabric.mailbox
        self.recorder = recorder
        self.interpreter = checkout(executable, fabric.replica_id, fabric, fabric.num_replicas)
        self.result: Any = None
        self.error: BaseException | None = None
        self._done: threading.Event | None = None  # set when the replica's run returned
        self._task: workers.Task | None = None  # the worker thread's task (None: not on a thread of its own)
        # The job's `affinity.Pin` when its replica threads are kept on one core (set before `start`).
        self.pin: Pin | None = None
        # A persistent job's runner (runtime/session.py) runs again: it keeps its interpreter bound to
        # its fabric after a clean run instead of pooling it.
        self.persistent = False
        # A persistent replica's thread parks between runs, waiting on `_go` for `_next` (None: end).
        self._go: threading.Lock | None = None
        self._next: list[Any] | None = None
        self._named: tuple[Any, str | None] = (None, None)  # (the last instruction `state` named, its name)

    def start(self, args: Sequence[Any]) -> None:
        values = list(args)
        if self.persistent:
            self._go = threading.Lock()
            self._go.acquire()
            self._done = _Flag()
            self._task = workers.submit(lambda: self._parked(values), f"replica-{self.replica_id}")
            return
        self._done = self._task = workers.submit(lambda: self._run(values), f"replica-{self.replica_id}")

    def _parked(self, args: list[Any] | None) -> None:
        """Run, then wait for the next run's arguments in the same thread (a persistent job)."""
        go = self._go
        while args is not None:
            done = self._done
            self._run(args)
            done.set()
            go.acquire()
            args, self._next = self._next, None

    def stop(self) -> None:
        """End a parked replica's thread once its current run returns (its job ended)."""
        go, self._go = self._go, None
        if go is not None:
            self._next = None
            go.release()

    def run_here(self, args: Sequence[Any], in_turn: bool = False) -> None:
        """Run in the calling thread: a program that cannot wait (see `runs_bounded_alone`), or the
        replica a Ray actor's call thread runs itself instead of handing it over. `join` from other
        threads (the monitor's polls) waits for it. Ctrl-C in the caller's thread propagates, after
        the replica is recorded as failed (the job ends as any interrupted job). `in_turn`: this
        thread runs every replica of the process, one after the other (so they never run batched)."""
        done = self._done
        if type(done) is not _Flag or not done.clear():  # (the last run's flag again, when it can be)
            done = self._done = _Flag()
        if in_turn:
            self.fabric.kernel_state[batched.IN_TURN] = True
        self._run(args if type(args) is list else list(args), counted=False)
        done.set()
        if type(self.error) is KeyboardInterrupt:
            raise self.error

    def _run(self, args: list[Any], counted: bool = True) -> None:
        """`counted`: the run is one of the process's replica threads that may run at once (one
        that runs in its caller's thread is not: the GIL's switch interval is for many of them)."""
        pin = self.pin
        if pin is not None:
            pin.enter()
        if counted:
            gil_slice.enter()
        try:
            self.result = self.interpreter.run(args, checked=True)  # job.prepare checked them
            if not self.persistent:
                checkin(self.interpreter)  # before "finished": its kernels and code serve the next job
            status, error = "finished", None
        except BaseException as e:  # noqa: BLE001 - reported to the driver, never swallowed
            self.error = e
            checkin(self.interpreter)
            status = "cancelled" if self.mailbox.aborted is e else "failed"
            error = f"{type(e).__name__}: {e}"
        # The kernels' state of this job (a collective keeps its `Exchange` there, which refers to the
        # fabric: a cycle that would keep the job's mailbox and recorder until a collection).
        self.fabric.kernel_state.clear()
        if counted:
            gil_slice.leave()
        if pin is not None:
            # Before the status: once every replica is finished, no thread of the job is pinned (a
            # pooled worker thread has its own affinity back).
            pin.leave()
        self.mailbox.set_status(status, error)

    def rerun(self, args: Sequence[Any], here: bool = False, in_turn: bool = False) -> None:
        """Run again with `args` (a persistent job whose every replica finished its last run)."""
        self.result = self.error = None
        self.mailbox.set_status("running")
        if here:
            self.run_here(args, in_turn)
        elif self._go is not None:  # its thread is parked: hand it the arguments
            self._done = _Flag()
            self._next = list(args)
            self._go.release()
        else:
            self.start(args)

    def retire(self) -> threading.Thread | None:
        """End the thread started for this replica once its run returns (not kept idle for the next
        job); that thread, to join (None: it ran in the caller's thread, on a worker that was idle
        before, or never started)."""
        task = self._task
        return None if task is None else task.retire()

    def join(self, timeout: float | None = None) -> bool:
        if self._done is None:
            return True
        return self._done.wait(timeout)

    def state(self) -> ReplicaState:
        s = self.mailbox.snapshot()
        # While its process's batched run computes it, the run's count and instruction (its own
        # interpreter runs nothing meanwhile, and the run numbers its collectives once it ended).
        live = batched_live.during(self.fabric.kernel_state)
        if live is None:
            s.collectives_started = self.fabric.collectives_started()
            inst = self.interpreter.current
        else:
            s.collectives_started, inst = live
        if s.status == "running":
            if inst is not self._named[0]:  # the monitor polls every replica many times per instruction
                self._named = (inst, None if inst is None else f"%{inst.name} ({inst.opcode})")
            s.instruction = self._named[1]
        return s

    def own_error(self) -> BaseException | None:
        """The replica's error unless it was only woken by an abort."""
        e = self.error
        return None if e is None or self.mailbox.aborted is e else e
