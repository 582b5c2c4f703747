"""Reusable threads for replicas: starting a thread costs more than a small program's whole run.

`submit(fn, name)` runs `fn()` on an idle worker thread (a new one when none is idle) and returns
a Task (an Event) set when `fn` returns. Workers wait for their next task for a while, then exit; at most
`MAX_IDLE` wait at any time. A replica that never returns keeps its worker: nothing else waits on it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from replicas.errors import ResourceExhausted

MAX_IDLE = 64
IDLE_SECONDS = 60.0

_lock = threading.Lock()
_idle: list[_Worker] = []


class Task(threading.Event):
    """Set when the submitted function returned. `retire()` ends the thread started for it once it
    has returned instead of keeping it idle (a job that could not start all of its threads gives
    back the ones it started; a worker that was idle before goes back to idle) and returns that
    thread (None: an idle worker ran it)."""

    def __init__(self, worker: _Worker, fresh: bool) -> None:
        super().__init__()
        self._worker = worker
        self._fresh = fresh

    def retire(self) -> threading.Thread | None:
        if not self._fresh:
            return None
        worker = self._worker
        with _lock:
            worker.retiring = True
            if worker in _idle:  # it returned already and waits for a task: let it end now
                _idle.remove(worker)
                worker.ready.set()
        return worker.thread


class _Worker:
    __slots__ = ("ready", "task", "thread", "retiring")

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.task: tuple[Callable[[], None], str, threading.Event] | None = None
        self.thread: threading.Thread | None = None
        self.retiring = False

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
                task = fn = done = None
            with _lock:
                if len(_idle) >= MAX_IDLE or self.retiring:
                    return
                self.ready.clear()
                _idle.append(self)
            if not self.ready.wait(IDLE_SECONDS):
                with _lock:
                    if self.ready.is_set():  # handed a task just as the wait ended
                        continue
                    _idle.remove(self)
                return


def submit(fn: Callable[[], None], name: str) -> Task:
    """Run `fn` on a worker thread named `name`; the returned Task is set when it returns.
    ResourceExhausted when the machine refuses a new thread (nothing of `fn` runs then)."""
    with _lock:
        worker = _idle.pop() if _idle else None
        if worker is not None:
            done = Task(worker, False)
            worker.retiring = False
            worker.task = (fn, name, done)
            worker.ready.set()
            return done
    worker = _Worker()
    done = Task(worker, True)
    worker.task = (fn, name, done)
    worker.thread = threading.Thread(target=worker.loop, name=name, daemon=True)
    try:
        worker.thread.start()
    except RuntimeError as e:  # "can't start new thread": threads, memory for stacks, or processes (EAGAIN)
        raise ResourceExhausted(f"cannot start a thread for {name}: {e} ({threading.active_count()} threads "
                                "running in this process)", "threads") from None
    return done
