"""Reusable threads for replicas: starting a thread costs more than a small program's whole run.

`submit(fn, name)` runs `fn()` on an idle worker thread (a new one when none is idle) and returns
an Event set when `fn` returns. Workers wait for their next task for a while, then exit; at most
`MAX_IDLE` wait at any time. A replica that never returns keeps its worker: nothing else waits on it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

MAX_IDLE = 64
IDLE_SECONDS = 60.0

_lock = threading.Lock()
_idle: list[_Worker] = []


class _Worker:
    __slots__ = ("ready", "task")

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.task: tuple[Callable[[], None], str, threading.Event] | None = None

    def loop(self) -> None:
        thread = threading.current_thread()
        while True:
            task = self.task
            self.task = None
            if task is not None:
                fn, name, done = task
                thread.name = name
                try:
                    fn()
                finally:
                    done.set()
                    thread.name = "replica-worker (idle)"
                # An idle worker holds nothing of its last task (the job's runner, its results and
                # the shared memory they may pin).
                task = fn = None
            with _lock:
                if len(_idle) >= MAX_IDLE:
                    return
                self.ready.clear()
                _idle.append(self)
            if not self.ready.wait(IDLE_SECONDS):
                with _lock:
                    if self.ready.is_set():  # handed a task just as the wait ended
                        continue
                    _idle.remove(self)
                return


def submit(fn: Callable[[], None], name: str) -> threading.Event:
    """Run `fn` on a worker thread named `name`; the returned Event is set when it returns."""
    done = threading.Event()
    with _lock:
        worker = _idle.pop() if _idle else None
        if worker is not None:
            worker.task = (fn, name, done)
            worker.ready.set()
            return done
    worker = _Worker()
    worker.task = (fn, name, done)
    threading.Thread(target=worker.loop, name=name, daemon=True).start()
    return done
