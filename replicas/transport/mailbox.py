"""A replica's mailbox: messages keyed by (source, key), host queues, and its published state.

Everything that arrives for a replica (collective pieces, channel data, acks, infeed values,
host transfers) is a message delivered here; the replica takes what it needs, blocking with its
`BlockInfo` published so the monitor can see what it waits for. `abort(exc)` wakes every waiter
with `exc` (deadlock, mismatch, cancel).

Cost: delivering, taking and publishing are O(1) per message whatever the number of peers (a
set of what the blocked replica still misses; the waiter wakes when it empties). A collective's
block lists no peers: the monitor derives them from the group (see `replicas.records`).
"""

from __future__ import annotations

import dataclasses
import random
import threading
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any

from replicas.records import BlockInfo, ReplicaState

_new_state = object.__new__
_POLL = 0.25  # seconds between checks of an abort while blocked outside the mailbox (`wait_external`)
# A replica blocked in its mailbox is woken by every delivery that completes its wait and by every
# abort; it also looks again on its own after a while, so that a wake-up lost to a race costs that
# while, never a hang. The while grows with the process's threads (about RECHECKS_PER_SECOND wake-ups
# a second in all) and is drawn at random: thousands of threads waking together on one timer all
# want the GIL at once, and the one thread that works (a batched run's leader) would get it back
# seldom enough for a job to take minutes instead of seconds.
RECHECKS_PER_SECOND = 256


def _recheck_after() -> float:
    return max(_POLL, threading.active_count() / RECHECKS_PER_SECOND) * (0.5 + random.random())


class Mailbox:
    def __init__(self, replica: int) -> None:
        self.state = ReplicaState(replica)
        self._messages: dict[tuple[int, Hashable], Any] = {}
        # Reentrant: `snapshot` asks an outside wait's `ready()` under it, which may poll this mailbox.
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)  # the host's waits (outfeed, channels to the host)
        self._host_waits = 0  # threads waiting on `_cond` now
        # The replica's own thread sleeps on `_wake` (a lock used as a binary semaphore) while
        # `_sleeping`; a delivery that completes what it waits for releases it once. Cheaper than a
        # Condition (whose wait allocates a lock and runs a dozen lines of Python per hand-off: a
        # profile of a packed actor had `Condition.notify` as its largest line).
        self._wake = threading.Lock()
        self._wake.acquire()
        self._sleeping = False
        # The error that ended the job, set once by `abort` (every wait, and the interpreter at each
        # computation call, raises it).
        self.aborted: BaseException | None = None
        self._outfeed: deque[Any] = deque()
        self._to_host: dict[int, deque[Any]] = {}  # channel id -> values sent to the host
        # What the blocked replica still waits for: a delivery wakes it only when this empties.
        self._missing: set[tuple[int, Hashable]] = set()
        # While the replica waits outside the mailbox (the same-node board): is what it waits for
        # there, and how to interrupt its wait.
        self._external: tuple[Callable[[], bool], Callable[[], None]] | None = None
        # In-process meetings of collectives this replica is the first local member of (`meet`).
        self._meetings: dict[int, list[Any]] = {}

    # -- delivery (any thread) -------------------------------------------------------------------
    def deliver(self, src: int, key: Hashable, value: Any) -> None:
        message = (src, key)
        with self._lock:
            messages = self._messages
            if message in messages:
                raise RuntimeError(f"replica {self.state.replica}: duplicate message {key} from {src}")
            messages[message] = value
            state = self.state
            if src >= 0:  # from a replica (the host's feeds are not in the sent/received balance)
                state.received += 1
            state.progress += 1
            missing = self._missing
            if missing:
                missing.discard(message)
                if not missing and self._sleeping:
                    self._sleeping = False
                    self._wake.release()

    def count_taken(self, src: int) -> None:
        """A message from `src` delivered and taken at once (a channel ring's record read by the waiting
        replica itself): received, and progress."""
        with self._lock:
            state = self.state
            state.received += 1
            state.progress += 1

    def count_sent(self) -> None:
        # Only the replica's own thread sends, so no lock: a snapshot sees the count before or after
        # (the GIL makes the store atomic), and either is consistent with the post that follows.
        self.state.sent += 1

    def _wake_replica(self) -> None:
        """Wake the replica's thread if it sleeps in `take_all` (the caller holds `_lock`)."""
        if self._sleeping:
            self._sleeping = False
            self._wake.release()

    def abort(self, exc: BaseException) -> None:
        if self.aborted is not None:
            # Already aborted: every waiter was woken then, and any later wait raises at once. (A job's
            # end aborts twice, with its error and then on shutdown: with a thousand threads the second
            # pass would take each mailbox's lock again while the woken threads unwind.)
            return
        with self._lock:
            if self.aborted is None:
                self.aborted = exc
            self._cond.notify_all()
            self._wake_replica()
            external = self._external
        if external is not None:
            external[1]()

    def wait_external(self, block: BlockInfo | None, ready: Callable[[], bool], sleep: Callable[[float], None],
                      wake: Callable[[], None], slice_: float = _POLL) -> None:
        """Wait until `ready()` outside the mailbox (on shared memory): `sleep(t)` waits at most t s
        for a change, `wake()` interrupts it (on abort). With a `block`, the replica is published as
        blocked meanwhile, and as running as soon as `ready()` holds (nothing in flight is missed:
        what it waits for is there, it has not woken yet)."""
        if ready():
            return
        state = self.state
        with self._lock:
            if self.aborted is not None:
                raise self.aborted
            self._external = (ready, wake)
            if block is not None:
                state.block = block
                state.status = "blocked"
        try:
            while not ready():
                if self.aborted is not None:
                    raise self.aborted
                sleep(slice_)
        finally:
            with self._lock:
                self._external = None
                if block is not None:
                    state.block = None
                    if state.status == "blocked":
                        state.status = "running"
                state.progress += 1

    def meet(self, seq: int, rank: int, expected: int, fingerprint: tuple, replica: int, value: Any, box: Mailbox,
             check: Callable[[int, tuple], None]) -> tuple[list[Any], list[Mailbox]] | None:
        """One local member (`rank` of `expected`, replica `replica`, its mailbox `box`) arrives at its
        process's meeting of collective #`seq`, held on the mailbox of the group's first local member.
        The last to arrive gets every member's value and mailbox, by rank, and leads the collective
        (collectives/topology.py); the others get None and wait for their results. Nothing is in
        flight (no message is counted): a member that arrived and waits is blocked only once it waits
        for its result, which the last one delivers.

        Every fingerprint is compared with the first member's (rank 0), as a fixed leader compared
        the deposits, before the value is left here: `check(replica, its fingerprint)` runs in the
        arriving member for rank 0's (or, when rank 0 arrives, for each earlier arrival's, in rank
        order) when it is not the very same tuple, and raises on a mismatch. So the members that
        lead never use a value of another collective, and a mismatch names the same two replicas
        whatever the order of arrival."""
        with self._lock:
            if self.aborted is not None:
                raise self.aborted
            meetings = self._meetings
            entry = meetings.get(seq)
            if entry is None:
                entry = meetings[seq] = [[None] * expected, [None] * expected, [None] * expected,
                                         [None] * expected, expected]
            fingerprints, replicas, values, boxes = entry[0], entry[1], entry[2], entry[3]
            if rank:
                first = fingerprints[0]
                if first is not None and first is not fingerprint:
                    check(replicas[0], first)
            else:
                for k, theirs in enumerate(fingerprints):
                    if theirs is not None and theirs is not fingerprint:
                        check(replicas[k], theirs)
            if boxes[rank] is not None:  # equal fingerprints name the same group: never
                raise RuntimeError(f"replica {replica}: rank {rank} arrived twice at collective #{seq}")
            fingerprints[rank], replicas[rank], values[rank], boxes[rank] = fingerprint, replica, value, box
            entry[4] -= 1
            if entry[4]:
                return None
            del meetings[seq]
            return values, boxes

    # -- taking (the replica's thread) -----------------------------------------------------------
    def take(self, src: int, key: Hashable, block: BlockInfo) -> Any:
        """Block until (src, key) has arrived; return its value (`take_all` of one, without its lists:
        the usual wait of a collective's member)."""
        message = (src, key)
        msgs = self._messages
        with self._lock:
            if self.aborted is not None:
                raise self.aborted
            if message not in msgs:
                self._missing.add(message)
                if block.needs != "group" and not block.waits_for:
                    block.waits_for = (src,)
                self._sleep_until_complete(block)
            self.state.progress += 1
            return msgs.pop(message)

    def take_all(self, wanted: list[tuple[int, Hashable]], block: BlockInfo) -> list[Any]:
        """Block until every (src, key) in `wanted` has arrived; return the values in order."""
        msgs = self._messages
        with self._lock:
            if self.aborted is not None:
                raise self.aborted
            missing = self._missing
            for w in wanted:
                if w not in msgs:
                    missing.add(w)
            if missing:
                if block.needs != "group" and not block.waits_for:
                    block.waits_for = tuple(dict.fromkeys(src for src, _ in missing))
                self._sleep_until_complete(block)
            self.state.progress += 1
            if len(wanted) == 1:
                return [msgs.pop(wanted[0])]
            return [msgs.pop(w) for w in wanted]

    def _sleep_until_complete(self, block: BlockInfo) -> None:
        """Sleep (published as blocked in `block`) until `_missing` empties (the caller holds `_lock`)."""
        state = self.state
        state.block = block
        state.status = "blocked"
        missing = self._missing
        lock = self._lock
        wake = self._wake
        try:
            while missing:
                if self.aborted is not None:
                    raise self.aborted
                wake.acquire(False)  # a release left by a wait that timed out as it came
                self._sleeping = True
                lock.release()
                try:
                    wake.acquire(True, _recheck_after())
                finally:
                    lock.acquire()
                    self._sleeping = False
        finally:
            missing.clear()
            state.block = None
            if state.status == "blocked":
                state.status = "running"

    def poll(self, src: int, key: Hashable) -> bool:
        with self._lock:
            return (src, key) in self._messages

    def check_abort(self) -> None:
        if self.aborted is not None:
            raise self.aborted

    def leftovers(self) -> dict[tuple[int, Hashable], Any]:
        """The messages nobody took (a finished job's evidence for `replicas check`)."""
        with self._lock:
            return dict(self._messages)

    # -- host side ---------------------------------------------------------------------------------
    def put_outfeed(self, value: Any) -> None:
        with self._lock:
            self._outfeed.append(value)
            self._cond.notify_all()

    def put_to_host(self, channel_id: int, value: Any) -> None:
        with self._lock:
            self._to_host.setdefault(channel_id, deque()).append(value)
            self._cond.notify_all()

    def get_outfeed(self, timeout: float | None) -> Any:
        return self._host_get(lambda: self._outfeed, timeout)

    def get_from_channel(self, channel_id: int, timeout: float | None) -> Any:
        return self._host_get(lambda: self._to_host.setdefault(channel_id, deque()), timeout)

    def drain_host(self) -> tuple[list[Any], dict[int, list[Any]]]:
        """Take every outfeed value and host-channel message not read yet (kept when a job ends)."""
        with self._lock:
            outfeed, self._outfeed = list(self._outfeed), deque()
            channels = {ch: list(q) for ch, q in self._to_host.items() if q}
            self._to_host = {}
            return outfeed, channels

    def _host_get(self, queue_of: Any, timeout: float | None) -> Any:
        """Pop the oldest value; raise TimeoutError if none arrives within `timeout` seconds."""
        with self._lock:
            ended = ("finished", "failed", "cancelled")  # a cancelled replica writes nothing more either
            self._host_waits += 1
            try:
                ok = self._cond.wait_for(lambda: bool(queue_of()) or self.state.status in ended, timeout)
            finally:
                self._host_waits -= 1
            if queue_of():
                return queue_of().popleft()
            if ok:
                raise EOFError(f"replica {self.state.replica} has {self.state.status}")
            raise TimeoutError

    def snapshot(self) -> ReplicaState:
        """A copy of the state, O(1): the block is shared (it never changes once published)."""
        with self._lock:
            s = self.state
            status, block = s.status, s.block
            external = self._external
            if status == "blocked" and (not self._missing if external is None else external[0]()):
                # Everything arrived; the waiting thread has not woken yet to take it: it is running.
                status, block = "running", None
            elif external is None and block is not None and len(block.waits_for) > 1 and block.needs != "group":
                # A Send-done acked by some of its targets: name only those still missing.
                block = dataclasses.replace(block, waits_for=tuple(dict.fromkeys(src for src, _ in self._missing)))
            # A bare copy of the fields: far cheaper than copy.copy, and the monitor copies N states
            # per poll, holding the GIL the replicas need.
            out = _new_state(ReplicaState)
            out.__dict__ = s.__dict__.copy()
            out.status, out.block = status, block
            return out

    def set_status(self, status: str, error: str | None = None) -> None:
        with self._lock:
            self.state.status = status
            self.state.error = error
            if self._host_waits:  # (twice a persistent job's call: no notification without a waiter)
                self._cond.notify_all()
