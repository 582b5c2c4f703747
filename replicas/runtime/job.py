"""A running N-replica job: host feeds, results, cancel, and the monitor loop.

The job is the same whatever runs the replicas; a *backend* (threads here, Ray actors in
`ray/backend.py`) starts them, reports their states and delivers host messages.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from replicas.caching import Cache
from replicas.collectives.mismatch import with_sides
from replicas.diagnostics.monitor import Monitor
from replicas.diagnostics.progress import LiveStatus, Progress, host_waits, progress_of
from replicas.diagnostics.report import Report
from replicas.diagnostics.sources import with_sources
from replicas.diagnostics.wait_for import deadlock_error
from replicas.errors import (
    ExecutionTimeout,
    ProgramError,
    ReplicaFailure,
    ReplicasError,
    ResourceExhausted,
    exhausted_resource,
)
from replicas.hlo.ir import Instruction, Module
from replicas.hlo.source import SourceMap
from replicas.limits import check_module, check_replicas
from replicas.limits import current as current_limits
from replicas.records import ReplicaState, replicas_text
from replicas.runtime.arguments import check_args_container, check_arguments, check_module_argument
from replicas.runtime.compile import Executable, compile_module, module_fingerprint, verify_for
from replicas.runtime.values import as_value
from replicas.transport import keys

EVENTS_IN_REPORT = 20


class Backend:
    """What runs a job's replicas (threads here, Ray actors in `ray/backend.py`): every method
    `Job` calls. A backend overrides the ones it has more to say in than these defaults."""

    num_replicas: int
    poll_interval: float

    def states(self) -> list[ReplicaState]:
        raise NotImplementedError

    def wait(self, timeout: float) -> None:  # returns early when something may have changed
        raise NotImplementedError

    def results(self) -> list[Any]:
        raise NotImplementedError

    def errors(self) -> dict[int, BaseException]:
        raise NotImplementedError

    def abort(self, exc: BaseException) -> None:
        raise NotImplementedError

    def shutdown(self) -> None:
        raise NotImplementedError

    def deliver_from_host(self, replica: int, key: tuple, value: Any) -> None:
        raise NotImplementedError

    def outfeed(self, replica: int, timeout: float | None) -> Any:
        raise NotImplementedError

    def from_channel(self, replica: int, channel_id: int, timeout: float | None) -> Any:
        raise NotImplementedError

    def events(self) -> Mapping[int, list[dict[str, Any]]]:
        raise NotImplementedError

    def completed(self, timeout: float) -> list[Any] | None:
        """The results when the job ends at once (in about `timeout` s, one reply), else None: the
        monitor's turn."""
        return None

    def drain(self) -> dict[int, tuple[list[Any], dict[int, list[Any]]]] | None:
        """Values the replicas wrote to the host and nobody read, taken when the job ends (for a
        backend whose replicas' memory goes with the job); None when they stay readable."""
        return None

    def leftovers(self) -> dict[int, dict[tuple[int, Hashable], Any]]:
        """Each replica's messages nobody took, where the mailboxes live in this process."""
        raise ProgramError("leftover messages are known only under backend='threads'")


class Job:
    """Handle of a launched job. Use as a context manager: leaving the block cancels it."""

    def __init__(self, backend: Backend, executable: Executable, *, timeout: float | None,
                 host_may_send: bool, trace: str | None = None, progress: bool = False,
                 deadline: float | None = None) -> None:
        """`deadline`: the `time.monotonic()` by which the job ends (set when the job was launched:
        checking its arguments and starting its replicas counted against `timeout` already); None:
        `timeout` from the first wait for its result."""
        self._backend = backend
        self._deadline = deadline
        self.executable = executable
        self.num_replicas = backend.num_replicas
        self.timeout = timeout
        self._host_may_send = host_may_send
        self._trace = trace
        self._started = time.monotonic()
        self._infeed_seq = [0] * self.num_replicas
        self._host_seq: dict[tuple[int, int], int] = {}
        self._done = False
        self._outcome: tuple[bool, Any] | None = None
        self._final_events: Mapping[int, list[dict[str, Any]]] | None = None
        # replica -> (outfeed values, {channel: values}) not read when the job ended (backends whose
        # replicas' memory goes with the job: Ray actors back in the pool)
        self._host_values: dict[int, tuple[list[Any], dict[int, list[Any]]]] | None = None
        self._status = LiveStatus() if progress else None  # a live status line while result() waits
        self._last_progress: Progress | None = None
        self._sources = SourceMap(getattr(executable, "module", None))  # for reports, errors, progress, traces

    # -- host side --------------------------------------------------------------------------------
    def infeed(self, replica: int, value: Any) -> None:
        """Queue `value` for the next Infeed of `replica`."""
        self._check_replica(replica)
        seq = self._infeed_seq[replica]
        self._infeed_seq[replica] = seq + 1
        self._backend.deliver_from_host(replica, keys.infeed(seq), as_value(value))

    def outfeed(self, replica: int, timeout: float | None = None) -> Any:
        """The next value `replica` wrote to its outfeed; waits up to `timeout` seconds."""
        self._check_replica(replica)
        if self._host_values is not None:
            return self._kept(replica, None, "wrote no more outfeed values")
        try:
            return self._backend.outfeed(replica, timeout)
        except TimeoutError:
            raise ExecutionTimeout(self._with_host_waits(
                f"replica {replica} wrote no outfeed value within {timeout} s")) from None
        except EOFError as e:
            self._raise_if_failed()
            raise ReplicasError(f"replica {replica} wrote no more outfeed values: {e}") from None

    def send(self, replica: int, channel_id: int, value: Any) -> None:
        """Host -> device: the value a Recv with is_host_transfer=true on `channel_id` receives."""
        self._check_replica(replica)
        seq = self._host_seq.get((replica, channel_id), 0)
        self._host_seq[(replica, channel_id)] = seq + 1
        self._backend.deliver_from_host(replica, keys.host_transfer(channel_id, seq), as_value(value))

    def recv(self, replica: int, channel_id: int, timeout: float | None = None) -> Any:
        """Device -> host: the next value a Send with is_host_transfer=true on `channel_id` sent."""
        self._check_replica(replica)
        if self._host_values is not None:
            return self._kept(replica, channel_id, f"sends nothing more on channel {channel_id}")
        try:
            return self._backend.from_channel(replica, channel_id, timeout)
        except TimeoutError:
            raise ExecutionTimeout(self._with_host_waits(
                f"replica {replica} sent nothing to the host on channel {channel_id} within {timeout} s")) from None
        except EOFError as e:
            self._raise_if_failed()
            raise ReplicasError(f"replica {replica} sends nothing more on channel {channel_id}: {e}") from None

    def _kept(self, replica: int, channel_id: int | None, nothing: str) -> Any:
        """After the job ended: the values its replicas wrote to the host before it ended, in order."""
        outfeed, channels = self._host_values.get(replica, ([], {}))
        queue = outfeed if channel_id is None else channels.get(channel_id, [])
        if queue:
            return queue.pop(0)
        ok, value = self._outcome
        if not ok and type(value) is not ReplicasError:  # the job's failure (a cancel is a plain ReplicasError)
            raise value
        raise ReplicasError(f"replica {replica} {nothing}: the job has ended")

    def _with_host_waits(self, message: str) -> str:
        """`message`, and which replicas wait for the host (what the host may have forgotten to feed)."""
        waits = host_waits(self._backend.states(), self._sources)
        return f"{message}; " + "; ".join(waits) if waits else message

    def progress(self) -> Progress:
        """Elapsed time, replicas running/blocked/finished, the slowest replica's instruction and
        collective number, collectives per second, and who waits for the host (see `Progress`)."""
        if self._outcome is not None and self._last_progress is not None:
            return self._last_progress
        self._last_progress = progress_of(self._backend.states(), time.monotonic() - self._started, self._sources)
        return self._last_progress

    def _check_replica(self, replica: int) -> None:
        if not 0 <= replica < self.num_replicas:
            raise ProgramError(f"replica {replica} out of range: the job has {self.num_replicas} replicas")

    # -- outcome ----------------------------------------------------------------------------------
    def result(self, timeout: float | None = None) -> list[Any]:
        """Wait for every replica; one result per replica. Raises the job's error, if any."""
        if self._outcome is None:
            self._outcome = self._wait(timeout)
        ok, value = self._outcome
        if not ok:
            raise value
        return value

    def done(self) -> bool:
        if self._outcome is not None:
            return True
        return all(s.status in ("finished", "failed", "cancelled") for s in self._backend.states())

    def close_host_input(self) -> None:
        """The host sends nothing beyond what is already queued: from now on a replica waiting
        for an infeed or a host transfer can only be deadlocked (as under `rp.run`)."""
        self._host_may_send = False

    def leftovers(self) -> dict[int, dict[tuple[int, Hashable], Any]]:
        """Messages left in each replica's mailbox after the job, by (source, key): evidence of a
        message nobody received. Known only where the mailboxes live in this process (threads)."""
        return self._backend.leftovers()

    def states(self) -> list[ReplicaState]:
        return self._backend.states()

    def events(self) -> Mapping[int, list[dict[str, Any]]]:
        """Each replica's flight recorder (collectives, channel ops, feeds), oldest first: a mapping
        whose replicas' events are made when read."""
        if self._outcome is not None and self._final_events is not None:
            return self._final_events
        return self._backend.events()

    def cancel(self) -> None:
        """Stop every replica and release everything. Safe to call twice."""
        if self._outcome is None:
            self._finish(False, ReplicasError("job cancelled"))

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()

    def __del__(self) -> None:
        try:
            if self._outcome is None:
                self._backend.shutdown()
        except Exception:  # noqa: BLE001 - interpreter shutdown; nothing to report to
            pass

    def _wait(self, timeout: float | None) -> tuple[bool, Any]:
        now = time.monotonic()
        ends = [now + t for t in (timeout, None if self._deadline is not None else self.timeout) if t is not None]
        if self._deadline is not None:
            ends.append(self._deadline)
        deadline = min(ends) if ends else None
        monitor = Monitor(self.num_replicas, self._sources)
        movement = Movement()
        confirming = False
        backend = self._backend
        try:
            results = backend.completed(backend.poll_interval)  # a job that ends at once, in one reply
            if results is not None:
                return self._finish(True, results)
            while True:
                states = backend.states()
                if any(s.status == "failed" for s in states):
                    return self._finish(False, self._failure(states))
                if all(s.status == "finished" for s in states):
                    return self._finish(True, backend.results())
                movement.observe(states, time.monotonic())
                report = monitor.observe(states, self._host_may_send)
                if report is not None:
                    report.events = backend.events()
                    error = deadlock_error(report)  # may read old events (a replica's k-th collective)
                    _trim_events(report)
                    return self._finish(False, error)
                if deadline is not None and time.monotonic() >= deadline:
                    report = Report(f"still running after {timeout if timeout is not None else self.timeout} s "
                                    f"(not a deadlock: some replica is running or a message is in flight)",
                                    states, lines=host_waits(states, self._sources)
                                    + movement.lines(states, time.monotonic()), sources=self._sources)
                    report.events = backend.events()
                    _trim_events(report)
                    return self._finish(False, ExecutionTimeout(report.title, report))
                if self._status is not None:
                    self._last_progress = progress_of(states, time.monotonic() - self._started, self._sources)
                    self._status.show(self._last_progress)
                # A snapshot that looks stuck is confirmed by the next one at once, but only once in a
                # row: a job whose every snapshot looks stuck yet moves is still polled at the interval.
                confirming = monitor.suspects and not confirming
                if not confirming:
                    backend.wait(backend.poll_interval)
        except ReplicasError as e:  # the backend lost a replica (an actor died): name it, clean up
            return self._finish(False, e)
        except KeyboardInterrupt:
            self._finish(False, ReplicasError("job interrupted"))
            raise

    def _failure(self, states: list[ReplicaState]) -> ReplicasError:
        errors = self._backend.errors()
        if errors:  # the first replica that failed on its own (not woken by an abort) names the cause
            first = min(errors)
            return replica_error(first, errors[first])
        failed = [s for s in states if s.status == "failed"]
        s = failed[0]
        return ReplicaFailure(f"replica {s.replica} failed: {s.error}", s.replica, s.error)

    def _finish(self, ok: bool, value: Any) -> tuple[bool, Any]:
        self._outcome = (ok, value)
        backend = self._backend
        if self._status is not None:
            self._status.close()
        try:
            self._final_events = backend.events()
            if not ok:
                # who ran which side of a mismatch; where the instructions it names came from
                self._outcome = (ok, with_sources(with_sides(value, self._final_events), self._sources))
                backend.abort(value)
            self._host_values = backend.drain()
            if self._trace:
                self._write_trace()
        finally:
            backend.shutdown()
        return self._outcome

    def _write_trace(self) -> None:
        """A trace that cannot be written is a warning: it never costs the job's results or error."""
        import warnings

        from replicas.diagnostics.trace import write_trace

        try:
            note = write_trace(self._trace, self._final_events, self._sources)
        except Exception as e:  # noqa: BLE001 - disk full, directory removed meanwhile, ...
            warnings.warn(f"trace {self._trace!r} was not written: {type(e).__name__}: {e}", RuntimeWarning,
                          stacklevel=3)
            return
        if note:  # the ring of some replica overflowed: the file says so too
            warnings.warn(f"{self._trace}: {note}", RuntimeWarning, stacklevel=3)

    def _raise_if_failed(self) -> None:
        states = self._backend.states()
        if any(s.status == "failed" for s in states):
            self.result(0)


class Movement:
    """How the replicas' messages moved in the last seconds before a timeout, so its report tells a
    long job (replicas still taking and receiving messages: they advance) from a stuck one (nothing
    moved for a while, though some replica runs or a message is in flight). A replica's `progress`
    counts the messages it took or was delivered."""

    WINDOW = 5.0  # seconds over which a report counts the messages moved
    RECENT = 1.0  # a replica whose messages moved this close to the timeout was advancing

    def __init__(self) -> None:
        # (time, progress by replica), one every WINDOW / 10 s: O(N) memory per sample at any poll rate.
        self._samples: deque[tuple[float, dict[int, int]]] = deque()
        # replica -> (its progress, when a poll saw it change; None: not since the first poll looked)
        self._changed: dict[int, tuple[int, float | None]] = {}
        self._first_look: float | None = None

    def observe(self, states: list[ReplicaState], now: float) -> None:
        changed = self._changed
        if self._first_look is None:
            self._first_look = now
        for s in states:
            seen = changed.get(s.replica)
            if seen is None:
                changed[s.replica] = (s.progress, None)
            elif seen[0] != s.progress:
                changed[s.replica] = (s.progress, now)
        samples = self._samples
        if not samples or now - samples[-1][0] >= self.WINDOW / 10:
            samples.append((now, {s.replica: s.progress for s in states}))
            while len(samples) > 1 and now - samples[1][0] >= self.WINDOW:
                samples.popleft()

    def lines(self, states: list[ReplicaState], now: float) -> list[str]:
        changed = self._changed
        active = sorted(s.replica for s in states if s.status in ("running", "blocked") and s.replica in changed)
        if not active or self._first_look is None:
            return []
        moves = [changed[r][1] for r in active if changed[r][1] is not None]
        recent = [r for r in active if changed[r][1] is not None and now - changed[r][1] <= self.RECENT]
        if not recent:
            still = now - max(moves, default=self._first_look)
            return [f"no message moved in the last {still:.1f} s before the timeout ({replicas_text(active)} "
                    "running or blocked)"]
        since, first = self._samples[0]
        moved = {s.replica: s.progress - first.get(s.replica, 0) for s in states if s.replica in recent}
        most = max(recent, key=lambda r: moved[r])
        return [f"{replicas_text(recent)} took or received messages in the last {self.RECENT:.0f} s before the "
                f"timeout ({moved[most]:,} by replica {most} in the last {now - since:.1f} s): the job was "
                "advancing, only slower than its timeout"]


def replica_error(replica: int, error: BaseException) -> ReplicasError:
    """The job's error when `replica` failed on its own with `error`: a ReplicasError as it is
    (the interpreter already named the instruction), anything else a ReplicaFailure wrapping it."""
    if isinstance(error, ReplicasError):
        return error
    resource = exhausted_resource(error)
    if resource is not None:
        return ResourceExhausted(f"replica {replica} failed: out of {resource}: {type(error).__name__}: {error}",
                                 resource, replica, cause=error)
    return ReplicaFailure(f"replica {replica} failed: {type(error).__name__}: {error}", replica, error)


def _trim_events(report: Report) -> None:
    report.events = {r: evs[-EVENTS_IN_REPORT:] for r, evs in report.events.items()}


def per_replica_args(args: Sequence[Any] | None, num_replicas: int, num_params: int) -> list[list[Any]]:
    """`args` is one list per replica, or one list given to every replica.

    It is per replica when it holds `num_replicas` lists of `num_params` values each; tuples stand
    for tuple-shaped parameters, never for a replica's argument list.
    """
    if type(args) is not list:  # a list is already what the check makes of the rest
        args = check_args_container(args)
    if args is None:
        return [[] for _ in range(num_replicas)]
    if (len(args) == num_replicas and all(isinstance(a, list) for a in args)
            and all(len(a) == num_params for a in args)):
        return [list(a) for a in args]
    return [list(args) for _ in range(num_replicas)]


# (module fingerprint, replicas, limits) -> the executable whose checks passed and its entry's
# parameters in order: a warm run of a program repeats none of them (the fingerprint is taken on
# every run: a module edited in place is new content). An executable serves another module of its
# content only while its own module still has that content (interpreters bound from it are pooled
# under the fingerprint).
_PREPARED: Cache[tuple[Executable, list[Instruction]]] = Cache("prepared programs", 64)


def checked_executable(module: Module | Executable, num_replicas: int, *,
                       fingerprint: bytes | None = None) -> Executable:
    """The executable of `module`, checked for `num_replicas` (cached by the module's content)."""
    return _executable_and_parameters(module, num_replicas, fingerprint)[0]


def prepare(module: Module | Executable, args: Sequence[Any] | None, num_replicas: int, *,
            fingerprint: bytes | None = None, deadline: float | None = None) -> tuple[Executable, list[list[Any]]]:
    """The executable of `module` checked for `num_replicas`, and each replica's checked arguments.
    `fingerprint`: `module_fingerprint(module)` when the caller has just taken it. Past `deadline`
    (a `time.monotonic()`), ExecutionTimeout naming the phase and the replica it had reached."""
    executable, params = _executable_and_parameters(module, num_replicas, fingerprint)
    if deadline is not None and time.monotonic() >= deadline:
        raise ExecutionTimeout("the job's timeout expired while its program was read, verified and compiled, "
                               f"before any of its {num_replicas} replicas' arguments were checked")
    entry = executable.module.entry_computation
    per_replica = per_replica_args(args, num_replicas, len(params))
    checked = []
    for r, a in enumerate(per_replica):
        if deadline is not None and time.monotonic() >= deadline:
            raise ExecutionTimeout(_checking_timeout(r, num_replicas))
        try:
            checked.append(check_arguments(entry, a, params))
        except ProgramError as e:
            raise ProgramError(f"replica {r}: {e}") from None
        except MemoryError as e:
            raise ResourceExhausted(f"replica {r}: out of memory while checking its arguments ({e})", "memory",
                                    r, cause=e) from None
    return executable, checked


def _checking_timeout(r: int, n: int) -> str:
    parts = [f"{replicas_text(range(r))} checked"] if r else []
    parts.append(f"replica {r}'s arguments next to be checked")
    if r + 1 < n:
        parts.append(f"{replicas_text(range(r + 1, n))} not checked")
    return "the job's timeout expired while checking its arguments, before any replica was set up: " + "; ".join(parts)


def _executable_and_parameters(module: Module | Executable, num_replicas: int,
                               fingerprint: bytes | None) -> tuple[Executable, list[Instruction]]:
    if type(num_replicas) is not int or not 1 <= num_replicas <= current_limits().max_replicas:
        num_replicas = check_replicas(num_replicas)  # before any per-replica list is built
    if type(module) is Module:
        key = (fingerprint or module_fingerprint(module), num_replicas, current_limits())
        prepared = _PREPARED.get(key)
        if prepared is not None and prepared[0].module is not module and module_fingerprint(
                prepared[0].module) != key[0]:
            prepared = None  # the module it was compiled from has been edited in place since
        if prepared is None:
            executable = _checked(module, num_replicas)
            prepared = _PREPARED.put(key, (executable, executable.module.entry_computation.parameters))
        executable, params = prepared
    else:
        executable = _checked(module, num_replicas)
        params = executable.module.entry_computation.parameters
    return executable, params


def _checked(module: Module | Executable, num_replicas: int) -> Executable:
    check_module_argument(module)
    ir = module.module if isinstance(module, Executable) else module
    _check_replica_count(ir, num_replicas)
    check_module(ir, num_replicas)
    if isinstance(module, Executable):
        return verify_for(module, num_replicas)
    return compile_module(module, num_replicas=num_replicas)


def _check_replica_count(module: Module, num_replicas: int) -> None:
    declared = module.attrs.get("replica_count")
    partitions = module.num_partitions
    if partitions > 1:
        if num_replicas != partitions:
            raise ProgramError(f"module {module.name} has num_partitions={partitions}: run it with "
                               f"num_replicas={partitions} (each partition runs as one replica)")
    elif declared not in (None, 1) and declared != num_replicas:
        raise ProgramError(f"module {module.name} declares replica_count={declared} but "
                           f"num_replicas={num_replicas}")

