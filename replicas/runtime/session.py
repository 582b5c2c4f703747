"""A persistent job: one compiled program kept on its replicas and called again and again.

`rp.run` starts a job per call: replicas set up, arguments checked and shipped, results
collected, everything released. A training loop calls the same program thousands of times, so a
`Session` starts the job once and reruns it: the replicas keep their bound interpreters, mailboxes
and fabrics (collective sequence numbers go on from call to call, so no message of one call can be
taken for one of the next). A call that ends cleanly within the backend's poll interval never
meets the monitor; any other call is watched by a `Job` exactly as under `rp.run` (deadlocks,
mismatches, timeouts, faults, Ctrl-C), and a call that fails ends the session: the next call
starts a new job.
"""

from __future__ import annotations

import threading
from typing import Any

from replicas.diagnostics.recorder import DEFAULT_CAPACITY
from replicas.errors import ProgramError, ReplicasError
from replicas.runtime.compile import Executable
from replicas.runtime.job import Job


class _Watched:
    """The session's backend as one call's `Job` sees it: the job's end releases the backend only
    when the call failed (a clean call leaves the session running)."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend
        self.failed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def abort(self, exc: BaseException) -> None:
        self.failed = True
        self._backend.abort(exc)

    def shutdown(self) -> None:
        if self.failed:
            self._backend.shutdown()


class Session:
    """Replicas of `executable` kept running between calls (see the module's docstring).

    options: the `rp.run` options of the job (backend, timeout, strict, ...)."""

    def __init__(self, executable: Executable, num_replicas: int, *, backend: str = "ray",
                 timeout: float | None = None, **options: Any) -> None:
        self.executable = executable
        self.num_replicas = num_replicas
        self.backend_name = backend
        self.timeout = timeout
        self._options = options
        self._backend: Any = None
        self._lock = threading.Lock()  # one call at a time
        self.calls = 0

    def call(self, args: list[list[Any]]) -> list[Any]:
        """Run the program once on each replica's checked arguments; one result per replica."""
        if self.backend_name != "threads":
            return self._one_job(args)
        with self._lock:
            backend = self._backend
            if backend is None:
                backend = self._backend = self._start(args)
            else:
                backend.rerun(args)
            self.calls += 1
            try:
                limit = backend.poll_interval if self.timeout is None else min(backend.poll_interval, self.timeout)
                results = backend.finished(limit)
            except BaseException as e:  # Ctrl-C while waiting: the job ends, as under rp.run
                self._backend = None
                backend.abort(ReplicasError("job interrupted") if isinstance(e, KeyboardInterrupt) else e)
                backend.shutdown()
                raise
            if results is not None:
                return results
            watched = _Watched(backend)
            job = Job(watched, self.executable, timeout=self.timeout, host_may_send=False)
            try:
                return job.result()
            finally:
                if watched.failed:
                    self._backend = None

    def _one_job(self, args: list[list[Any]]) -> list[Any]:
        """The call as a job of its own (as `rp.run` runs it)."""
        from replicas.runtime.driver import _start

        o = self._options
        job = _start(self.executable, args, timeout=self.timeout, address=o.get("address"), infeed=None, trace=None,
                     strict=o.get("strict", True), backend=self.backend_name,
                     replicas_per_actor=o.get("replicas_per_actor"), resources=o.get("resources"),
                     record_every_instruction=o.get("record_every_instruction", False),
                     trace_events=o.get("trace_events", DEFAULT_CAPACITY), progress=False, run_to_end=True)
        job.close_host_input()
        with job:
            return job.result()

    def _start(self, args: list[list[Any]]) -> Any:
        if self.backend_name == "threads":
            from replicas.runtime.threads import ThreadBackend

            return ThreadBackend(self.executable, args, persistent=True, **self._options)
        raise NotImplementedError(self.backend_name)

    def fetch(self, key: Any, replicas: list[int]) -> list[Any]:
        raise ProgramError("this job keeps no shards of its own: its arrays hold them")

    def forget(self, key: Any) -> None:
        """An array of this job's was deleted (its shards live where the array is: nothing to free)."""

    def close(self) -> None:
        """End the job: the replicas stop and release what they hold."""
        with self._lock:
            backend, self._backend = self._backend, None
        if backend is not None:
            backend.shutdown()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
