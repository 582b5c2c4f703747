"""An actor's main thread parked while its persistent job needs no Ray call.

Why: Ray runs an actor's task loop in its main thread, and that loop wakes every 10 ms to check for
signals (taking the GIL), whatever the actor does. A persistent job served by the doorbell
(transport/doorbell.py) needs none of it between calls, yet each of its actors pays ~100 wake-ups a
second; a few dozen `rp.jax.jit` functions alive are a few dozen such actors, and their wake-ups take
a large share of a small machine's cores from the calls that run.

How: the actor's main thread, which alone runs Python's signal handlers, gets one (installed when
the actor starts: `install`). The doorbell's thread sends it that signal (`park`) when the driver
does not hold the actors awake; at its next check the main thread runs the handler, which waits on
the doorbell's release word instead of returning to Ray's loop. Actor calls then queue in the
actor, so the driver holds its actors awake (`Doorbell.hold`: the release word moves, and nothing
parks until the hold expires) before it makes any: the monitor's polls, settling a watched call,
fetching a large output, the job's end. Whatever else reaches a parked actor waits at most
`PARK_MAX` seconds (the handler always returns by then), never forever.
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

from replicas.transport import futex

PARK_MAX = 2.0  # seconds the main thread stays parked at most (then Ray's loop runs its queue)
_SLICE = 0.25  # seconds of one futex wait: a stopped doorbell is noticed within it
_SIGNAL = signal.SIGRTMIN + 6 if hasattr(signal, "SIGRTMIN") else None


class _State:
    def __init__(self) -> None:
        self.enabled = False
        self.lock = threading.Lock()
        self.bell: Any = None  # the doorbell the main thread parks on (None: do not park)
        self.seen = 0  # its release word when `park` decided
        self.parked = False  # a park was asked for and has not ended
        self.outside = threading.Event()  # set while the handler does not read the doorbell
        self.outside.set()
        self.parks = 0  # parks that took effect (tests read it)


_state = _State()


def install() -> bool:
    """In the actor's main thread, once: the handler that parks it. False (parking off) outside a
    Ray actor, from any other thread, without real-time signals, or when something else holds the
    signal."""
    if _state.enabled:
        return True
    if _SIGNAL is None or threading.current_thread() is not threading.main_thread() or not futex.available():
        return False
    try:
        import ray

        if ray.get_runtime_context().get_actor_id() is None:
            return False
    except Exception:  # noqa: BLE001 - no Ray here: no actor to park
        return False
    try:
        if signal.getsignal(_SIGNAL) is not signal.SIG_DFL:  # (None: a handler set outside Python)
            return False
        signal.signal(_SIGNAL, _parked)
    except (ValueError, OSError):
        return False
    _state.enabled = True
    return True


def park(bell: Any) -> None:
    """From the doorbell's thread: park the main thread on `bell` unless it is parked already or the
    driver holds the actors awake."""
    s = _state
    if not s.enabled or s.parked or bell.held():
        return
    with s.lock:
        s.bell, s.seen, s.parked = bell, bell.release_word(), True
    try:
        signal.pthread_kill(threading.main_thread().ident, _SIGNAL)
    except (OSError, ValueError):
        with s.lock:
            s.bell, s.parked = None, False


def release(bell: Any) -> None:
    """From the doorbell's thread before it closes `bell`: the main thread leaves it (and reads it
    no more once this returns)."""
    s = _state
    with s.lock:
        if s.bell is bell:
            s.bell = None
    bell.wake_main()
    s.outside.wait(2 * _SLICE)


def parked() -> bool:
    return _state.parked


def _parked(signum: int, frame: Any) -> None:
    """The handler, in the main thread: wait until the release word moves, the doorbell stops or is
    released, or `PARK_MAX` passes."""
    s = _state
    with s.lock:
        bell, seen = s.bell, s.seen
        if bell is None:
            s.parked = False
            return
        s.outside.clear()
    try:
        s.parks += 1
        deadline = time.monotonic() + PARK_MAX
        while s.bell is bell and bell.release_word() == seen and not bell.stopped():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            bell.wait_release(seen, min(left, _SLICE))
    except Exception:  # noqa: BLE001 - never an error of Ray's signal check: the loop just runs on
        pass
    finally:
        with s.lock:
            s.outside.set()
            if s.bell is bell:
                s.bell = None
            s.parked = False
