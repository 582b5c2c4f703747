"""Bounded, adaptive spinning before a futex sleep on shared memory (the board, the channel rings).

Why: a replica that sleeps on a futex costs its peer a `FUTEX_WAKE` system call and itself a
wake-up (the call, then the scheduler's delay before the woken thread runs again), twice per round
trip of a ping-pong and once per leader and all-reduce. MPI's ranks never sleep: they poll. When
every process of the job on this node can have a core of its own, the peer is running and
publishes within microseconds, so watching the shared word for a short while finds it without
either system call (a writer wakes only a reader that said it sleeps).

When it must not spin: with more of the job's processes on the node than cores (packed N=1024,
one actor per replica at N=4 on 2 cores: a spinning process takes the core its peer needs), and
on a machine whose other work keeps the peers from running. The first is decided per job
(`budget_for(processes)`); the second by the outcome: a spin that ends without the word changing
counts as a failure and a hit takes one back, so once failures outnumber hits by `_FAILURES`
(fewer than half the spins pay) the spinner stops spinning for `_REST` waits, then tries again
(`_FAILURES` failed spins per `_REST` waits at most when it never pays).
A spin holds the GIL: it is bounded (`budget`), so a thread of the same process that needs the
GIL (a transport's reader, the host's poll) waits at most that long, far below Python's switch
interval. Each poll yields the core (`sched_yield`): the scheduler often queues the peer a spinner
waits for on the spinner's own core (a process it woke, placed beside its waker), where an
unyielding spin holds the peer off for the whole budget. Nothing depends on a spin: the futex
wait that follows is the same as without it.

A waiter that can see how long each wait would have taken, spinning or not, decides from that
instead (`Spinner.observed`, the doorbell's two waits: the call's reply, the next call): it spins
while its recent waits (the median of the last three) took at most the budget. Failures alone cannot
tell when to spin again: a side that rests sleeps, its peer's wake-up of it outlasts the peer's
spin, and both keep sleeping though each would have found the other within microseconds.

`REPLICAS_SPIN_US` sets the budget in microseconds (0: never spin), whatever the processes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from os import sched_yield as _sched_yield
from time import perf_counter
from typing import Any

from replicas.tuning.cores import cores

ENV = "REPLICAS_SPIN_US"
BUDGET = 100e-6  # seconds a wait may spin before it sleeps
# The doorbell's waits (transport/doorbell.py) spin only while the other side's turns are short, so
# a spin there nearly always pays; its budget outlasts a slice of another process on this core
# (each poll yields to it), which a shorter one does not.
DOORBELL_BUDGET = 1e-3
_FAILURES = 8  # failed spins in a row before the spinner rests
_REST = 256  # waits without spinning after that


def budget_for(processes: int, budget: float = BUDGET) -> float:
    """Seconds to spin before sleeping (`budget`), for a job with `processes` processes on this node."""
    setting = os.environ.get(ENV, "").strip()
    if setting:
        try:
            return max(0.0, float(setting) * 1e-6)
        except ValueError:
            raise ValueError(f"{ENV}={setting!r}: expected a number of microseconds") from None
    return budget if processes <= cores() else 0.0


class Spinner:
    """Per replica (one thread uses it): `spin(changed)` polls `changed()` for at most the budget."""

    __slots__ = ("budget", "_failures", "_rest", "spins", "hits", "_recent", "_last")

    def __init__(self, budget: float) -> None:
        self.budget = budget
        self._recent: float | None = None  # an `observed` spinner's typical wait, of its `_last`
        self._last: list[float] = []
        self._failures = 0
        self._rest = 0
        self.spins = 0  # spins tried, and how many saw the change (tests and benchmarks read them)
        self.hits = 0

    def spin(self, changed: Callable[[], bool]) -> bool:
        """True as soon as `changed()` holds; False after the budget (or at once while resting)."""
        if self.budget <= 0.0:
            return False
        if self._rest:
            self._rest -= 1
            return False
        recent = self._recent
        if recent is not None and recent > self.budget:
            return False
        self.spins += 1
        deadline = perf_counter() + self.budget
        while True:
            if changed():
                self.hits += 1
                if self._failures:
                    self._failures -= 1  # a hit pays for one failure: it rests below half hits
                return True
            if perf_counter() > deadline:
                break
            _sched_yield()
        if recent is not None:
            return False  # (its waits' lengths decide, not the failures)
        self._failures += 1
        if self._failures >= _FAILURES:
            self._failures = 0
            self._rest = _REST
        return False

    def observed(self, seconds: float) -> None:
        """A wait took `seconds` (or would have, had it spun): from now on waits spin only while
        the median of the last three took at most the budget (one long wait, a pause between
        bursts of calls, does not stop the spinning; one short one under load does not start it)."""
        last = self._last
        last.append(seconds)
        if len(last) > 3:
            del last[0]
        self._recent = sorted(last)[len(last) // 2]

    def _will_spin(self) -> bool:
        """Whether a watch spins now, decided as `spin` decides (a resting spinner counts this wait),
        before the watch's closure is built."""
        if self.budget <= 0.0:
            return False
        if self._rest:
            self._rest -= 1
            return False
        return self._recent is None or self._recent <= self.budget

    def watch(self, mapping: Any, index: int, then: Callable[[], bool]) -> bool:
        """Spin until the shared word `mapping.words[index]` (a board counter, a doorbell) changes
        and `then()` holds, or the mapping is closed (its `words` emptied: the caller's wait ends it)."""
        if not self._will_spin():
            return False
        seen = int(mapping.words[index])

        def changed() -> bool:
            nonlocal seen
            words = mapping.words
            if not words.size:
                return True
            value = int(words[index])
            if value == seen:
                return False
            seen = value
            return then()

        return self.spin(changed)

    def watch_words(self, words: memoryview, index: int, then: Callable[[], bool]) -> bool:
        """`watch` of a u32 memoryview's word `index` (the channel rings' doorbells: a memoryview's read
        is a fraction of a numpy scalar's); a released view (its segment closed) ends the spin as a change
        would, and the caller's wait ends it."""
        if not self._will_spin():
            return False
        try:
            seen = words[index]
        except ValueError:
            return True

        def changed() -> bool:
            nonlocal seen
            try:
                value = words[index]
            except ValueError:
                return True
            if value == seen:
                return False
            seen = value
            return then()

        return self.spin(changed)


NEVER = Spinner(0.0)  # for waits outside a job with peers on this node
