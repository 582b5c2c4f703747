"""A persistent job: one compiled program kept on its replicas and called again and again.

`rp.run` starts a job per call: replicas set up, arguments checked and shipped, results
collected, everything released. A training loop calls the same program thousands of times, so a
`Session` starts the job once and reruns it: the replicas keep their bound interpreters, mailboxes
and fabrics (collective sequence numbers go on from call to call, so no message of one call can be
taken for one of the next). A call that ends cleanly within the backend's poll interval never
meets the monitor; any other call is watched by a `Job` exactly as under `rp.run` (deadlocks,
mismatches, timeouts, faults, Ctrl-C), and a call that fails ends the job: the next call starts a
new one.

What a one-shot job offers, a persistent one offers per call: `progress()` (from any thread, of
the call running or the last one), the live status line (`progress=True`) while the monitor watches
a call, Ctrl-C ending the call (and the job) with KeyboardInterrupt, and `trace=`: the job's flight
recorders (each replica's last `trace_events` events, across its calls) written as a Chrome trace
when the job ends (a failed call, `close()`) and by `write_trace()`.

Outputs: under threads every replica's outputs come back (they are in this process already);
under Ray they stay on the actors, kept by (call, output), and only outputs of at most
`FETCH_MAX` bytes per replica come back with the call's reply. An `rp.Array` names kept outputs by
`(job, call, output)`: `fetch` reads them, `forget` lets the actors drop them with the next call.
"""

from __future__ import annotations

import threading
import time
import warnings
from typing import Any

from replicas.diagnostics.progress import Progress, progress_of
from replicas.errors import ProgramError, ReplicasError
from replicas.hlo.source import SourceMap
from replicas.runtime.compile import Executable
from replicas.runtime.job import Backend, Job
from replicas.runtime.options import LaunchOptions

FETCH_MAX = 4096  # bytes of one replica's output that come back with a call's reply (a loss)


class _Watched(Backend):
    """The session's backend as one call's `Job` sees it: the job's end releases the backend only
    when the call failed (a clean call leaves the session running); the results of a job whose
    outputs stay on the actors are its `settle`."""

    def __init__(self, backend: Backend, resident: bool) -> None:
        self._backend = backend
        self._resident = resident
        self.failed = False
        self.num_replicas, self.poll_interval = backend.num_replicas, backend.poll_interval
        for name in ("states", "wait", "errors", "deliver_from_host", "outfeed", "from_channel", "events",
                     "drain", "leftovers"):
            setattr(self, name, getattr(backend, name))

    def results(self) -> list[Any]:
        return self._backend.settle() if self._resident else self._backend.results()

    def abort(self, exc: BaseException) -> None:
        self.failed = True
        self._backend.abort(exc)

    def shutdown(self) -> None:
        if self.failed:
            self._backend.shutdown()


class Session:
    """Replicas of `executable` kept running between calls (see the module's docstring), run
    with `options` (checked)."""

    def __init__(self, executable: Executable, num_replicas: int, options: LaunchOptions) -> None:
        self.executable = executable
        self.num_replicas = num_replicas
        self.options = options
        self.resident = options.backend != "threads"  # outputs stay where the replicas run
        self.timeout = options.timeout
        self._backend: Any = None
        self._lock = threading.Lock()  # one call at a time
        self.job = 0  # the running job's number (a failed call ends it; the next call starts one)
        self._seq = 0  # the next call's number in the job
        self._forget: list[tuple[int, int]] = []  # kept outputs no array names any more
        self.calls = 0
        self.watched_calls = 0  # calls that did not end within the poll interval: the monitor watched them
        self._sources = SourceMap(executable.module)
        self._started = 0.0  # when the running (or last) call started
        self._watching: Job | None = None  # the Job watching the running call, if the monitor took over
        self._last_progress: Progress | None = None

    def call(self, args: list[list[Any]], count: int) -> tuple[int, list[Any]]:
        """Run the program once on each replica's arguments (values checked by the caller, or
        `Kept` outputs of this job's earlier calls); the call's number and, per replica, its result
        (resident: the list of its `count` outputs, None for each kept on the replicas)."""
        with self._lock:
            backend = self._backend
            started = backend is None
            if started:
                self.job += 1
                self._seq, self._forget = 0, []
                backend = self._backend = self._start(args)
            seq = self._seq
            self._seq += 1
            self.calls += 1
            self._started = time.monotonic()
            try:
                if self.resident:
                    forget, self._forget = self._forget, []
                    backend.rerun(args, seq, count, FETCH_MAX, forget)
                elif not started:
                    backend.rerun(args)
                limit = backend.poll_interval if self.timeout is None else min(backend.poll_interval, self.timeout)
                results = backend.finished(limit)
            except BaseException as e:  # Ctrl-C while waiting, a lost actor: the job ends, as under rp.run
                backend.abort(ReplicasError("job interrupted") if isinstance(e, KeyboardInterrupt) else e)
                self._end(backend)
                raise
            if results is not None:
                return seq, results
            self.watched_calls += 1
            watched = _Watched(backend, self.resident)
            job = Job(watched, self.executable, timeout=self.timeout, host_may_send=False,
                      progress=self.options.progress)
            self._watching = job
            try:
                return seq, job.result()
            finally:
                self._watching = None
                if watched.failed:
                    self._end(backend, job.events())

    def _end(self, backend: Any, events: dict[int, list[dict[str, Any]]] | None = None) -> None:
        """The job ends (a failed call, `close`): its trace is written first, if asked for."""
        self._backend = None
        try:
            if self.options.trace:
                self.write_trace(self.options.trace, backend, events)
        finally:
            backend.shutdown()

    # -- what a one-shot Job offers -------------------------------------------------------------------
    def progress(self) -> Progress:
        """The running call's progress (from any thread), or the last call's."""
        job, backend = self._watching, self._backend
        if job is not None:
            self._last_progress = job.progress()
            return self._last_progress
        if backend is None:
            if self._last_progress is None:
                raise ProgramError("no job is running: the function has not been called since its job ended "
                                   "(the error of the call that ended it has the report)")
            return self._last_progress
        self._last_progress = progress_of(backend.states(), time.monotonic() - self._started, self._sources)
        return self._last_progress

    def write_trace(self, path: str, backend: Any = None,
                    events: dict[int, list[dict[str, Any]]] | None = None) -> None:
        """The running job's flight recorders as a Chrome trace at `path` (a warning, never an error,
        when it cannot be written: as under `rp.run`)."""
        from replicas.diagnostics.trace import write_trace

        backend = backend if backend is not None else self._backend
        try:
            if events is None:
                if backend is None:
                    raise ProgramError("no job is running: the function has not been called since its job ended")
                events = backend.events()
            note = write_trace(path, events, self._sources)
        except ProgramError:
            raise
        except Exception as e:  # noqa: BLE001 - disk full, a directory removed meanwhile, ...
            warnings.warn(f"trace {path!r} was not written: {type(e).__name__}: {e}", RuntimeWarning, stacklevel=3)
            return
        if note:  # some replica's ring overflowed: the file says so too
            warnings.warn(f"{path}: {note}", RuntimeWarning, stacklevel=3)

    def _start(self, args: list[list[Any]]) -> Any:
        from replicas.runtime.driver import start

        return start(self.executable, args, self.options, persistent=True)

    # -- outputs kept on the replicas -----------------------------------------------------------------
    def holds(self, key: Any) -> bool:
        """Whether the running job keeps the output `key` = (job, call, output)."""
        return key is not None and key[0] == self.job and self._backend is not None

    def fetch(self, key: Any, replicas: list[int]) -> list[Any]:
        backend = self._backend
        if not self.holds(key) or backend is None:
            raise ProgramError("the array's shards were lost with the job that computed them (a call of it failed, "
                               "or it was closed)")
        return backend.fetch((key[1], key[2]), replicas)

    def forget(self, key: Any) -> None:
        """An array naming kept output `key` is gone: the replicas drop it with the next call."""
        if key is not None and key[0] == self.job:
            self._forget.append((key[1], key[2]))  # a list append: safe from a finalizer

    def close(self) -> None:
        """End the job: the replicas stop and release what they hold."""
        with self._lock:
            backend, self._backend = self._backend, None
        if backend is not None:
            self._end(backend)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
