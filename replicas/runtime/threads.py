"""Replicas as threads of one process: the same interpreter and fabric protocol, no Ray.

Used by `replicas check` and by tests that want many replicas fast. The monitor in the calling
thread turns deadlocks and mismatches into errors.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable
from typing import Any

from replicas.diagnostics.recorder import DEFAULT_CAPACITY, FlightRecorder, RecordedEvents
from replicas.errors import ExecutionTimeout, ReplicasError, ResourceExhausted
from replicas.limits import DEADLINE, check_threads
from replicas.records import HOST, ReplicaState, replicas_text
from replicas.runtime.compile import Executable, light, runs_quickly, uses_blas
from replicas.runtime.interpreter_pool import checkin, checkout
from replicas.runtime.job import Backend, replica_error
from replicas.runtime.memory import check_peak
from replicas.runtime.replica_runner import ReplicaRunner
from replicas.transport.fabric import MailboxFabric
from replicas.transport.mailbox import Mailbox
from replicas.tuning.affinity import Pin, plan
from replicas.tuning.cores import release, share_cores

ABORT_INLINE = 64  # replicas an abort wakes in the caller's thread; beyond, a helper thread does
UNWIND_WAIT = 60.0  # seconds a new job waits at most for the threads of aborted jobs to unwind
STOP_GRACE = 1.0  # seconds a job that could not start waits for the replicas it started to end
CHECKED_THREADS = 256  # replicas from which a job checks the machine's task table before starting them
POLL_CAP = 0.5  # seconds between the monitor's polls at most (reached at ~4,000 replicas)

# Of aborted jobs: (the thread waking them or None, the replica threads still running then), which
# may still be unwinding (`abort` returns before they end).
_unwinding: list[tuple[threading.Thread | None, list[ReplicaRunner]]] = []
_unwinding_lock = threading.Lock()


class ThreadFabric(MailboxFabric):
    def __init__(self, replica_id: int, mailboxes: list[Mailbox], **kwargs: Any) -> None:
        super().__init__(replica_id, len(mailboxes), mailboxes[replica_id], **kwargs)
        self._peers = mailboxes

    def _post(self, dst: int, key: Hashable, value: Any) -> None:
        self._peers[dst].deliver(self.replica_id, key, value)

    def local_mailbox(self, replica: int) -> Mailbox | None:
        return self._peers[replica]


class ThreadBackend(Backend):
    """Runs the replicas as threads of this process."""

    poll_interval = 0.02

    def __init__(self, executable: Executable, args: list[list[Any]], *, strict: bool = True,
                 record_every_instruction: bool = False, placement: list[int] | None = None,
                 nodes: list[int] | None = None, trace_events: int = DEFAULT_CAPACITY, persistent: bool = False,
                 deadline: float | None = None) -> None:
        """`persistent`: a job run again and again (runtime/session.py): its replicas keep their
        interpreters bound after a clean run, for `rerun`. `deadline`: the `time.monotonic()` by
        which the job must end; setting up and starting the replicas count against it."""
        n = len(args)
        self.num_replicas = n
        check_peak(executable, n)  # every replica lives in this process: refused before any is set up
        if n >= CHECKED_THREADS:
            check_threads(n, f"a job of {n} replicas on threads")  # one thread each, refused before any starts
        self._deadline = deadline
        _wait_for_unwinding(deadline)
        # A poll copies every replica's state in this process, holding the GIL the replicas need
        # (microseconds a replica): frequent polls of many replicas would take a core from them. The interval
        # grows with the replicas, to 0.1 s at 250, then so that polls stay near 5% of the CPU, up to a
        # cap that keeps the deadlock detection (two polls) well within its bound (2 s).
        self.poll_interval = min(POLL_CAP, max(ThreadBackend.poll_interval, min(0.1, 4e-4 * n), 1.2e-4 * n))
        self._mailboxes = [Mailbox(r) for r in range(n)]
        self._aborter: threading.Thread | None = None
        self._replicas = []
        self._cores = None
        self._pin: Pin | None = None
        # One process: every collective meets in-process. A placement given here makes the collectives
        # treat replicas as hosted by those "processes" (their cross-process algorithms, without Ray).
        # `nodes` (replica -> node) makes them treat those processes as spread over nodes too.
        placement = list(placement) if placement is not None else [0] * n
        binding = DEADLINE.set(deadline)
        try:
            for r in range(n):
                # Binding a replica's kernels is the costly part of a job of many replicas (4,096
                # replicas of 300 collectives: tens of seconds): the deadline is looked at each time.
                if deadline is not None and time.monotonic() >= deadline:
                    raise ExecutionTimeout(_not_ready("setting up", r, n))
                recorder = FlightRecorder(r, capacity=trace_events, every_instruction=record_every_instruction)
                fabric = ThreadFabric(r, self._mailboxes, strict=strict, recorder=recorder, placement=placement)
                fabric.nodes = nodes
                runner = ReplicaRunner(executable, fabric, recorder)
                runner.persistent = persistent
                self._replicas.append(runner)
        except ExecutionTimeout:
            ready = len(self._replicas)
            self._give_back()
            raise ExecutionTimeout(_not_ready("setting up", ready, n)) from None
        except MemoryError as e:
            ready = len(self._replicas)
            self._give_back()
            raise ResourceExhausted(f"replica {ready} could not be set up (binding its kernels): out of memory ({e})",
                                    "memory", ready, cause=e) from None
        except BaseException:
            self._give_back()
            raise
        finally:
            DEADLINE.reset(binding)
        # n replicas in this process: BLAS pools of (cores - 1) // n threads while the job runs.
        self._cores = share_cores(n) if uses_blas(executable) else None
        # No thread hand-off for a program that cannot wait and ends at once (nothing needs to stop
        # it): its replicas run one after the other in the caller's thread (one replica; or a
        # persistent job's, whose calls would pay the hand-offs again and again, most of a small
        # call's time). Any other runs where the deadline can leave it.
        # Several replicas run so never meet for a batched run (runtime/batched.py: `in_turn` tells
        # their interpreters that the others come after them, not beside them).
        self._here = (n == 1 or persistent) and runs_quickly(executable)
        if self._here:
            for replica, a in zip(self._replicas, args):
                replica.run_here(a, in_turn=n > 1)
            return
        # Two replica threads or more: keep them on one core (they serialize on the GIL anyway;
        # see affinity.py). The driver's thread, the monitor, stays free.
        self._pin = plan(n, light(executable))
        if self._pin is not None:
            for replica in self._replicas:
                replica.pin = self._pin
        started = 0
        try:
            for replica, a in zip(self._replicas, args):
                if deadline is not None and time.monotonic() >= deadline:
                    raise ExecutionTimeout(_not_ready("starting", started, n))
                replica.start(a)
                started += 1
        except BaseException as e:
            error = e
            if isinstance(e, ResourceExhausted):
                error = ResourceExhausted(f"replica {started} of {n} could not start: {e}; replicas 0-{started - 1} "
                                          "that had started were stopped" if started else
                                          f"replica 0 of {n} could not start: {e}", e.resource, started, cause=e)
            self._stop_started(error, started)
            if error is e:
                raise
            raise error from None

    def _give_back(self) -> None:
        """Return the interpreters of the replicas set up so far (a setup that could not finish)."""
        for runner in self._replicas:
            checkin(runner.interpreter)
        self._replicas = []
        release(self._cores)

    def _stop_started(self, error: BaseException, started: int) -> None:
        """Stop the replicas started so far and wait until their threads ended (not kept idle: the
        machine may have refused a thread), so that the job leaves nothing running behind it."""
        for mb in self._mailboxes:
            mb.abort(error)
        if self._pin is not None:
            self._pin.release()
        self._retire(self._replicas[:started], time.monotonic() + STOP_GRACE)
        for replica in self._replicas[started:]:
            checkin(replica.interpreter)
        release(self._cores)

    def rerun(self, args: list[list[Any]]) -> None:
        """Run the program again on the same replicas (every one finished its last run cleanly)."""
        for replica, a in zip(self._replicas, args):
            replica.rerun(a, self._here, in_turn=self._here and len(self._replicas) > 1)

    def finished(self, timeout: float) -> list[Any] | None:
        """The results once every replica finished within `timeout` s; None when one failed or still
        runs (the monitor's turn)."""
        deadline = time.monotonic() + timeout
        for rep in self._replicas:
            if not rep.join(max(0.0, deadline - time.monotonic())) or rep.error is not None:
                return None
        return self.results()

    def completed(self, timeout: float) -> list[Any] | None:
        """The results when every replica has already finished (a program that ran in the caller's
        thread, say); None otherwise: the monitor takes over at once (`timeout` is not waited)."""
        for rep in self._replicas:
            if not rep.join(0) or rep.error is not None:
                return None
        return self.results()

    def states(self) -> list[ReplicaState]:
        return [rep.state() for rep in self._replicas]

    def wait(self, timeout: float) -> None:
        if self._pin is not None:
            self._pin.watch()  # leave a core that another process keeps busy
        for rep in self._replicas:
            if not rep.join(0):
                rep.join(timeout)
                return

    def results(self) -> list[Any]:
        return [rep.result for rep in self._replicas]

    def errors(self) -> dict[int, BaseException]:
        return {rep.replica_id: e for rep in self._replicas if (e := rep.own_error()) is not None}

    def abort(self, exc: BaseException) -> None:
        """Wake every replica with `exc`. Beyond `ABORT_INLINE` replicas a helper thread wakes them, one
        at a time, and the job's error reaches its caller at once: each woken thread unwinds with the
        GIL, and a caller's loop queued behind a thousand of them would make the error late by most
        of the time the deadlock took to find."""
        if self._aborter is not None:
            return  # already waking every replica (with the job's first error, which wins)
        boxes = self._mailboxes
        if self._pin is not None:
            self._pin.release()  # the woken threads unwind on any core (affinity.Pin)
        running = [rep for rep in self._replicas if not rep.join(0)]  # none after a clean end
        if len(boxes) <= ABORT_INLINE:
            for mb in boxes:
                mb.abort(exc)
        else:
            aborter = threading.Thread(target=_abort_all, args=(boxes, exc), name="replicas-abort", daemon=True)
            try:
                aborter.start()
                self._aborter = aborter
            except RuntimeError:  # no thread to spare (the job may have failed for want of one)
                for mb in boxes:
                    mb.abort(exc)
        if isinstance(exc, ResourceExhausted):
            # The machine is short of something: the threads started for this job end with it
            # instead of waiting idle for the next job.
            self._retire(self._replicas, time.monotonic() + STOP_GRACE)
            running = [rep for rep in running if not rep.join(0)]
        if running:
            with _unwinding_lock:
                _unwinding.append((self._aborter, running))

    @staticmethod
    def _retire(replicas: list[ReplicaRunner], until: float) -> None:
        """End the threads started for `replicas` once their runs return; wait for them until `until`."""
        threads = [replica.retire() for replica in replicas]
        for replica, thread in zip(replicas, threads):
            replica.join(max(0.0, until - time.monotonic()))
            if thread is not None:
                thread.join(max(0.0, until - time.monotonic()))

    def shutdown(self) -> None:
        self.abort(ReplicasError("job stopped"))
        release(self._cores)
        for rep in self._replicas:  # a persistent job's threads and interpreters, kept between runs
            if rep.persistent:
                rep.stop()
                if rep.join(0) and rep.error is None:
                    rep.persistent = False
                    checkin(rep.interpreter)

    def deliver_from_host(self, replica: int, key: tuple, value: Any) -> None:
        self._mailboxes[replica].deliver(HOST, key, value)

    def outfeed(self, replica: int, timeout: float | None) -> Any:
        return self._mailboxes[replica].get_outfeed(timeout)

    def from_channel(self, replica: int, channel_id: int, timeout: float | None) -> Any:
        return self._mailboxes[replica].get_from_channel(channel_id, timeout)

    def leftovers(self) -> dict[int, dict[tuple[int, Hashable], Any]]:
        """Each replica's messages nobody took (meaningful once every replica stopped)."""
        return {r: box.leftovers() for r, box in enumerate(self._mailboxes)}

    def events(self) -> RecordedEvents:
        return RecordedEvents((rep.replica_id, rep.recorder) for rep in self._replicas)


def _not_ready(doing: str, r: int, n: int) -> str:
    """The timeout of a job whose replica `r` of `n` was still being set up or started."""
    done = "set up" if doing == "setting up" else "started"
    parts = [f"{replicas_text(range(r))} {done}"] if r else []
    parts.append(f"replica {r} being set up (binding its kernels)" if doing == "setting up"
                 else f"replica {r} next to be started")
    if r + 1 < n:
        parts.append(f"{replicas_text(range(r + 1, n))} not {done}")
    return f"the job's timeout expired while {doing} its replicas, before any ran: " + "; ".join(parts)


def _wait_for_unwinding(deadline: float | None = None) -> None:
    """Let the replica threads of aborted jobs end before a new job's threads start: a thousand
    threads still unwinding (each waking, raising, checking its interpreter in) beside a thousand new
    ones starve the new threads of the GIL (and of the one core when pinned), many times the job's
    own time."""
    with _unwinding_lock:
        ending = list(_unwinding)
        _unwinding.clear()
    wait = time.monotonic() + UNWIND_WAIT
    until = wait if deadline is None else min(deadline, wait)
    for aborter, running in ending:
        if aborter is not None:
            aborter.join(max(0.0, until - time.monotonic()))
        for rep in running:
            if not rep.join(max(0.0, until - time.monotonic())) and deadline is not None and until == deadline:
                # A stopped job's replica still in one long kernel (it stops at its next computation
                # call): this job's timeout ran out waiting for it.
                left = [r for _, rs in ending for r in rs if not r.join(0)]
                with _unwinding_lock:
                    _unwinding.append((None, left))
                doing = rep.state().instruction or "its kernel"
                raise ExecutionTimeout(f"the job's timeout expired before its replicas were set up, waiting for "
                                       f"{len(left)} replica thread(s) of an earlier, stopped job to end (replica "
                                       f"{rep.replica_id} of that job was still running {doing})")


def _abort_all(boxes: list[Mailbox], exc: BaseException) -> None:
    for mb in boxes:
        mb.abort(exc)
        # Hand the GIL to the replica just woken (or the driver): without it, this loop wakes hundreds
        # in one switch interval and the driver's thread waits behind all of their unwinding.
        time.sleep(0)


class _Alone:
    """What a replica running alone in the caller's thread has of a job (`run_alone`): no peer, no
    host, no mailbox (nothing can abort it: nobody holds its job), no recorder (a program that cannot
    wait records nothing unless every instruction is recorded)."""

    __slots__ = ("kernel_state",)
    replica_id = 0
    num_replicas = 1
    placement = (0,)
    nodes = None
    strict = True
    mailbox = None
    recorder = None

    def __init__(self) -> None:
        self.kernel_state: dict[str, Any] = {}


def run_alone(executable: Executable, args: list[Any]) -> list[Any]:
    """`rp.run` of one replica of a program that ends at once (`runs_quickly`), in the caller's
    thread, without a `ThreadBackend` or `Job`: what they would do for it (BLAS pools sized for the
    run, a pooled interpreter, the result list, the job's error for whatever the replica raised)
    and nothing they would only record. `args` passed `job.prepare`. Ctrl-C propagates as
    KeyboardInterrupt, as it does from a job's `result()`."""
    cores = share_cores(1) if uses_blas(executable) else None
    try:
        interpreter = checkout(executable, 0, _Alone(), 1)
        failure: BaseException | None = None
        try:
            result = interpreter.run(args, checked=True)
        except KeyboardInterrupt:
            raise  # the interrupted interpreter is not pooled again
        except BaseException as e:  # noqa: BLE001 - becomes the job's error, as under a Job
            failure = e
        checkin(interpreter)
    finally:
        release(cores)
    if failure is not None:
        raise replica_error(0, failure)
    return [result]
