"""A longer GIL switch interval while many replica threads run in this process.

Why: a thread waiting for the GIL wakes every switch interval (5 ms by default) to ask for it
again. Replica threads woken together (a job's start, a collective's results, an abort) all wait
for it at once, so with a thousand replicas on the threads backend a busy machine turns those
wake-ups into a storm of futex calls that feeds itself: system time grows several-fold and jobs
slow down by as much. A longer interval makes each waiter ask far less often. The replicas lose
nothing: they give up
the GIL themselves whenever they wait for a message, so the interval only bounds how long a thread
that computes without waiting keeps it (the monitor, the host side, a transport's reader wait up to
that long then, far below a poll).

`REPLICAS_GIL_SLICE_MS` sets the interval (0 leaves Python's alone); it applies while more than
`MANY` replica threads run in the process, and Python's own interval comes back when none does.

Meanwhile the cycle collector's threshold of young objects is raised too (to `YOUNG`, from
Python's 700). Each waiting replica holds a few container objects of its collective (its
exchange, blocked record, message keys): with hundreds of replicas, thousands of them alive at any
time, so a collection every 700 allocations finds young objects that are all still alive, moves
them on and collects the older generations often, a large share of a small all-reduce's time.
With the higher threshold most of what a collection would have seen is freed by then.
"""

from __future__ import annotations

import gc
import os
import sys
import threading

ENV = "REPLICAS_GIL_SLICE_MS"
MANY = 64  # replica threads running in this process beyond which the interval is raised
SLICE = 0.05  # seconds
YOUNG = 20_000  # the cycle collector's threshold of young objects meanwhile (Python's: 700)

_lock = threading.Lock()
_running = 0
_raised: tuple[float, float] | None = None  # (Python's interval before, the one set) while raised
_young: tuple[int, int] | None = None  # (the collector's threshold before, the one set) while raised


def _slice() -> float:
    setting = os.environ.get(ENV, "").strip()
    if not setting:
        return SLICE
    try:
        return max(0.0, float(setting) / 1000)
    except ValueError:
        raise ValueError(f"{ENV}={setting!r}: expected a number of milliseconds") from None


def enter() -> None:
    """A replica thread starts its run (call `leave` when it returns)."""
    global _running, _raised, _young
    with _lock:
        _running += 1
        if _running > MANY and _raised is None:
            before, wanted = sys.getswitchinterval(), _slice()
            if wanted > before:
                sys.setswitchinterval(wanted)
                _raised = (before, sys.getswitchinterval())  # as Python keeps it (in microseconds)
        if _running > MANY and _young is None:
            threshold = gc.get_threshold()
            if 0 < threshold[0] < YOUNG:  # a threshold of 0 keeps automatic collection off: left so
                gc.set_threshold(YOUNG, *threshold[1:])
                _young = (threshold[0], YOUNG)


def leave() -> None:
    global _running, _raised, _young
    with _lock:
        _running -= 1
        if not _running and _raised is not None:
            before, wanted = _raised
            if sys.getswitchinterval() == wanted:  # unless someone else set it meanwhile
                sys.setswitchinterval(before)
            _raised = None
        if not _running and _young is not None:
            threshold = gc.get_threshold()
            if threshold[0] == _young[1]:  # unless someone else set it meanwhile
                gc.set_threshold(_young[0], *threshold[1:])
            _young = None


def raised() -> bool:
    """Whether the interval is raised now (tests read it)."""
    return _raised is not None
