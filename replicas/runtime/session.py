"""A persistent job: compiled programs kept on their replicas and called again and again.

`rp.run` starts a job per call: replicas set up, arguments checked and shipped, results
collected, everything released. A training loop calls the same programs thousands of times, so
`Devices` starts the job once and reruns it: the replicas keep their bound interpreters, mailboxes
and fabrics (collective sequence numbers go on from call to call, so no message of one call can be
taken for one of the next). A `Session` is one program on them. Under Ray, the programs jitted for
the same replicas and options share one `Devices` (`shared_devices`), as JAX's functions share
the devices: one set of actors, and an output of one program passed to another moves nothing.

A call that ends cleanly within the backend's poll interval never meets the monitor; any other
call is watched by a `Job` exactly as under `rp.run` (deadlocks, mismatches, timeouts, faults,
Ctrl-C), and a call that fails ends the job (the next call starts a new one); the outputs of its
earlier calls that arrays still name are fetched first (`_evacuate`), so the arrays live on.

What a one-shot job offers, a persistent one offers per call: `progress()` (from any thread, of
the call running or the last one), the live status line (`progress=True`) while the monitor watches
a call, Ctrl-C ending the call (and the job) with KeyboardInterrupt, and `trace=`: the job's flight
recorders (each replica's last `trace_events` events, across its calls) written as a Chrome trace
when the job ends (a failed call, `close()`) and by `write_trace()`.

Outputs: under threads every replica's outputs come back (they are in this process already);
under Ray they stay on the actors, kept by (call, output), and only outputs of at most
`FETCH_MAX` bytes per replica come back with the call's reply. An `rp.Array` names kept outputs by
`(job, call, output)`: `fetch` reads them, `forget` lets the actors drop them with the next call.
A shared job ends when its last program is closed and no array names its outputs.
"""

from __future__ import annotations

import threading
import time
import warnings
import weakref
from typing import Any

from replicas.diagnostics.progress import Progress, progress_of
from replicas.errors import ExecutionTimeout, ProgramError, ReplicasError
from replicas.hlo.source import SourceMap
from replicas.runtime.compile import Executable
from replicas.runtime.job import Backend, Job
from replicas.runtime.options import LaunchOptions

FETCH_MAX = 4096  # bytes of one replica's output that come back with a call's reply (a loss)
EVACUATE_SECONDS = 2.0  # how long a failed job's actors may take to answer for each output it keeps


class _Watched(Backend):
    """The session's backend as one call's `Job` sees it: the job's end leaves the backend to
    `Devices` (a clean call leaves it running; a failed one ends it); the results of a job whose
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
        pass  # (a failed call's: `Devices` ends the job, once it fetched what arrays still name)


class Devices:
    """Replicas kept running between calls (see the module's docstring), with `options` (checked),
    on which the `Session`s given to `call` run."""

    def __init__(self, num_replicas: int, options: LaunchOptions, shared: bool = False) -> None:
        self.num_replicas = num_replicas
        self.options = options
        self.shared = shared  # programs of several jitted functions run here (`shared_devices`)
        self.resident = options.backend != "threads"  # outputs stay where the replicas run
        self._backend: Any = None
        self._lock = threading.Lock()  # one call at a time
        self.job = 0  # the running job's number (a failed call ends it; the next call starts one)
        self._seq = 0  # the next call's number in the job
        self._forget: list[tuple[int, int]] = []  # kept outputs no array names any more
        self._programs = 0  # sessions not closed
        # (job, number) of programs closed since the last call: the actors drop them (appended from
        # finalizers too, which must never wait for the lock: a call of this thread may hold it).
        self._closing: list[tuple[int, int] | None] = []
        # The running job's kept outputs some array still names: (call, output) -> for each replica,
        # the first replica holding an equal shard (what a gather reads).
        self._named: dict[tuple[int, int], tuple[int, ...]] = {}
        # Outputs of jobs that failed, fetched before their job ended (`_evacuate`): (job, call,
        # output) -> replica -> shard; an array reads them there until it is collected.
        self._evacuated: dict[tuple[int, int, int], dict[int, Any]] = {}
        self.calls = 0
        self.watched_calls = 0  # calls that did not end within the poll interval: the monitor watched them
        self._sources: SourceMap | None = None  # the source lines of the running (or last) call's program
        self._started = 0.0  # when the running (or last) call started
        self._watching: Job | None = None  # the Job watching the running call, if the monitor took over
        self._last_progress: Progress | None = None

    def call(self, program: Session, args: list[list[Any]], count: int,
             holders: list[tuple[int, ...]] | None = None) -> tuple[int, list[Any]]:
        """Run `program` once on each replica's arguments (values checked by the caller, or `Kept`
        outputs of this job's earlier calls); the call's number and, per replica, its result
        (resident: the list of its `count` outputs, None for each kept on the replicas).
        `holders`: per output, for each replica the first replica whose shard equals its own (what
        a failed job's outputs are fetched by); default: every replica's."""
        with self._lock:
            backend = self._backend
            if backend is not None and self.resident and backend.stale():  # Ray was shut down meanwhile
                self._end(backend)
                backend = None
            started = backend is None
            if started:
                from replicas.runtime.driver import start

                self.job += 1
                self._seq, self._forget, self._named = 0, [], {}
                backend = self._backend = start(program.executable, args, self.options, persistent=True)
                program.loaded = (self.job, 0)
            if self._closing:
                self._drop_closed(backend)
            loaded = program.loaded
            number = loaded[1] if loaded is not None and loaded[0] == self.job else None
            seq = self._seq
            self._seq += 1
            self.calls += 1
            self._sources = program.sources
            self._started = time.monotonic()
            try:
                if number is None:  # a program new to the running job
                    number = backend.add_program(program.executable)
                    program.loaded = (self.job, number)
                if self.resident:
                    forget, self._forget = self._forget, []
                    named = self._named
                    for key in forget:
                        named.pop(key, None)
                    if holders is None:
                        holders = [tuple(range(self.num_replicas))] * count
                    for i in range(count):
                        named[(seq, i)] = holders[i]
                    backend.rerun(args, seq, count, FETCH_MAX, forget, number)
                elif not started:
                    backend.rerun(args)
                timeout = program.timeout
                limit = backend.poll_interval if timeout is None else min(backend.poll_interval, timeout)
                results = backend.finished(limit)
            except BaseException as e:  # Ctrl-C while waiting, a lost actor: the job ends, as under rp.run
                backend.abort(ReplicasError("job interrupted") if isinstance(e, KeyboardInterrupt) else e)
                self._evacuate(backend, seq)
                self._end(backend)
                raise
            if results is not None:
                return seq, results
            self.watched_calls += 1
            watched = _Watched(backend, self.resident)
            job = Job(watched, program.executable, timeout=program.timeout, host_may_send=False,
                      progress=self.options.progress)
            self._watching = job
            try:
                return seq, job.result()
            finally:
                self._watching = None
                if watched.failed:
                    self._evacuate(backend, seq)
                    self._end(backend, job.events())

    def _evacuate(self, backend: Any, failed: int) -> None:
        """Before a failed job ends: fetch the outputs of its earlier calls that arrays still name
        (one shard per distinct place), so that the arrays of every program the job ran outlive it,
        as JAX's arrays outlive a failed computation. An actor that died took its shards with it."""
        if not self.resident:
            return
        forgotten = set(self._forget)
        for (seq, output), holders in self._named.items():
            if seq == failed or (seq, output) in forgotten:
                continue
            replicas = sorted(set(holders))
            try:
                shards = backend.fetch((seq, output), replicas, time.monotonic() + EVACUATE_SECONDS)
            except ExecutionTimeout:  # an actor that does not answer (stopped): the rest would wait too
                break
            except Exception:  # noqa: BLE001 - lost with its actor: the array says so when read
                continue
            by_replica = dict(zip(replicas, shards))
            self._evacuated[(self.job, seq, output)] = {r: by_replica[h] for r, h in enumerate(holders)}
        self._named = {}

    def _end(self, backend: Any, events: dict[int, list[dict[str, Any]]] | None = None) -> None:
        """The job ends (a failed call, `close`): its trace is written first, if asked for."""
        self._backend = None
        self._closing = []
        try:
            if self.options.trace:
                self.write_trace(self.options.trace, backend, events)
        finally:
            backend.shutdown()

    # -- what a one-shot Job offers -------------------------------------------------------------------
    def progress(self) -> Progress:
        """The running call's progress (from any thread), or the last call's."""
        job, backend, sources = self._watching, self._backend, self._sources
        if job is not None:
            self._last_progress = job.progress()
            return self._last_progress
        if backend is None or sources is None:
            if self._last_progress is None:
                raise ProgramError("no job is running: the function has not been called since its job ended "
                                   "(the error of the call that ended it has the report)")
            return self._last_progress
        self._last_progress = progress_of(backend.states(), time.monotonic() - self._started, sources)
        return self._last_progress

    def write_trace(self, path: str, backend: Any = None,
                    events: dict[int, list[dict[str, Any]]] | None = None) -> None:
        """The running job's flight recorders as a Chrome trace at `path` (a warning, never an error,
        when it cannot be written: as under `rp.run`); source lines from the program called last."""
        from replicas.diagnostics.trace import write_trace

        backend = backend if backend is not None else self._backend
        try:
            if events is None:
                if backend is None or self._sources is None:
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

    # -- outputs kept on the replicas -----------------------------------------------------------------
    def holds(self, key: Any) -> bool:
        """Whether the running job keeps the output `key` = (job, call, output)."""
        return key is not None and key[0] == self.job and self._backend is not None

    def holds_whole(self, key: Any) -> bool:
        """Whether the running job keeps every shard of output `key` in one process (one actor)."""
        backend = self._backend
        return self.resident and self.holds(key) and backend is not None and backend.single_actor

    def fetch(self, key: Any, replicas: list[int]) -> list[Any]:
        backend = self._backend
        evacuated = self._evacuated.get(key) if key is not None else None
        if evacuated is not None:
            return [evacuated[r] for r in replicas]
        if not self.holds(key) or backend is None:
            raise ProgramError("the array's shards were lost with the job that computed them (a call of it failed, "
                               "or it was closed)")
        return backend.fetch((key[1], key[2]), replicas)

    def forget(self, key: Any) -> None:
        """An array naming kept output `key` is gone: the replicas drop it with the next call (a
        shared job without programs ends when the last array is collected, which lets it go)."""
        if key is not None and key[0] == self.job:
            self._forget.append((key[1], key[2]))  # a list append: safe from a finalizer
        elif key is not None:
            self._evacuated.pop(key, None)

    # -- programs -------------------------------------------------------------------------------------
    def opened(self) -> None:
        self._programs += 1

    def closed(self, program: Session) -> None:
        """`program` is closed: it runs here no more (the job ends with the last program, unless an
        array still names an output: then when the last such array is collected)."""
        self._programs -= 1
        self._closing.append(program.loaded)
        if not self._lock.acquire(blocking=False):  # a call runs: the next call drops it
            return
        try:
            backend = self._backend
            unnamed = not self.shared or self._named.keys() <= set(self._forget)
            if backend is not None and self._programs == 0 and unnamed:
                self._end(backend)
            elif backend is not None:
                self._drop_closed(backend)
        finally:
            self._lock.release()

    def _drop_closed(self, backend: Any) -> None:
        closing, self._closing = self._closing, []
        for loaded in closing:
            if loaded is not None and loaded[0] == self.job and self.resident:
                backend.drop_program(loaded[1])

    def close(self) -> None:
        """End the job: the replicas stop and release what they hold."""
        with self._lock:
            backend = self._backend
            if backend is not None:
                self._end(backend)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class Session:
    """One program, `executable`, on `devices` (see the module's docstring); calls time out after
    `timeout` s (None: never)."""

    def __init__(self, executable: Executable, devices: Devices, timeout: float | None) -> None:
        self.executable = executable
        self.devices = devices
        self.timeout = timeout
        self.sources = SourceMap(executable.module)
        self.loaded: tuple[int, int] | None = None  # (job, number) of the job it was last loaded in
        self._closed = False
        devices.opened()

    def call(self, args: list[list[Any]], count: int,
             holders: list[tuple[int, ...]] | None = None) -> tuple[int, list[Any]]:
        """`Devices.call` of this program."""
        if self._closed:
            raise ProgramError("the function's compiled program was closed")
        return self.devices.call(self, args, count, holders)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.devices.closed(self)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


# The running jobs programs share, by replica count and options (`shared_devices`): kept while a
# program or an array uses one.
_SHARED: weakref.WeakValueDictionary[tuple, Devices] = weakref.WeakValueDictionary()
_SHARED_LOCK = threading.Lock()


def shared_devices(num_replicas: int, options: LaunchOptions) -> Devices:
    """The replicas that programs jitted with `options` for `num_replicas` run on: under Ray one job
    for all of them (its actors, shared memory and kept outputs), as JAX's functions share the
    devices. Threads (whose outputs are in this process anyway), a `trace=` file (one per job) and
    per-replica `resources` get a job of their own."""
    if options.backend == "threads" or options.trace or options.resources is not None:
        return Devices(num_replicas, options)
    o = options
    key = (num_replicas, o.backend, o.address, o.strict, o.replicas_per_actor, o.record_every_instruction,
           o.trace_events, o.progress)
    with _SHARED_LOCK:
        devices = _SHARED.get(key)
        if devices is None:
            devices = _SHARED[key] = Devices(num_replicas, options, shared=True)
        return devices


def end_shared_jobs() -> None:
    """End every shared job of this process (tests that must see a job of their own start)."""
    with _SHARED_LOCK:
        every = list(_SHARED.values())
    for devices in every:
        devices.close()
