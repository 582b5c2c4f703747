"""Replicas as Ray actors, the driver's side: `RayBackend` places pooled actors
(`ReplicaHost`, runtime/ray/replica_host.py, which also holds the data paths between them), launches
a job on them, polls their states for the monitor and collects results. The driver is never in a
data path. Joining or starting Ray is `startup.py`, what the driver keeps across jobs (the actor
pool, its key) `driver_process.py`, where replicas go `placement.py`, a persistent job's calls
`persistent.py`."""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections import Counter
from typing import Any

from replicas.cluster.liveness import LIVENESS_SECONDS, host_lost, silent, silent_failure
from replicas.diagnostics import host_output
from replicas.diagnostics.monitor import stuck_key
from replicas.diagnostics.recorder import DEFAULT_CAPACITY
from replicas.errors import ExecutionTimeout, ReplicaFailure, ReplicasError, ResourceExhausted, exhausted_resource
from replicas.limits import check_threads
from replicas.records import HOST, ReplicaState, replicas_text
from replicas.runtime.compile import Executable, has_custom_calls
from replicas.runtime.job import Backend
from replicas.runtime.memory import check_peak
from replicas.runtime.ray import state_columns
from replicas.runtime.ray.driver_process import AUTHKEY, POOL, job_ended, new_job_token
from replicas.runtime.ray.faults import actor_failure, doing_at, not_started, published, unplaceable, without_report
from replicas.runtime.ray.persistent import PersistentJob
from replicas.runtime.ray.placement import actor_groups, actor_options, cluster_resources, reachable, wanted
from replicas.runtime.ray.replica_host import STOP_SECONDS
from replicas.runtime.ray.startup import connection, ensure_ray
from replicas.runtime.threads import CHECKED_THREADS
from replicas.transport import where

# Names other modules, tests and benchmarks import from here (their homes are the modules above).
_AUTHKEY = AUTHKEY
# Seconds past the job's deadline an actor call may take: the poll that notices the deadline, then the
# report's and the abort's calls.
ANSWER_GRACE = 1.0

__all__ = ["POOL", "RayBackend", "_AUTHKEY", "ensure_ray"]


def _only_this_node(ray: Any, nodes: list[dict[str, Any]]) -> bool:
    """The cluster's one alive node is the driver's (local Ray: the laptop case)."""
    alive = [node for node in nodes if node.get("Alive")]
    try:
        return len(alive) == 1 and alive[0].get("NodeID") == ray.get_runtime_context().get_node_id()
    except Exception:  # noqa: BLE001 - a driver without a node id: no pre-check, the actors' own check stays
        return False


class RayBackend(PersistentJob, Backend):
    """Runs the replicas in Ray actors."""

    # Each poll is two actor tasks per actor; deadlocks need two equal snapshots, so this still
    # reports them well within 2 s, and completion is noticed at once (wait returns early).
    poll_interval = 0.2

    def __init__(self, executable: Executable, args: list[list[Any]], *, address: str | None = None,
                 strict: bool = True, record_every_instruction: bool = False, replicas_per_actor: int = 0,
                 resources: list[dict[str, float]] | None = None, num_cpus: float = 0,
                 timeout: float | None = None, trace_events: int = DEFAULT_CAPACITY, run_to_end: bool = False,
                 persistent: bool = False) -> None:
        """`run_to_end`: nothing but `completed` is called first (no host feeds): a warm job
        launches and reports its end in one call per actor. `persistent`: the job is set up but not
        begun; each `rerun` runs it (runtime/session.py), its outputs kept on the actors."""
        import ray

        ensure_ray(address, timeout)
        self._ray = ray
        self._connection = connection()
        deadline = None if timeout is None else time.monotonic() + timeout
        n = len(args)
        self.num_replicas = n
        nodes = ray.nodes() if resources is not None and not replicas_per_actor else None
        groups = actor_groups(n, resources, int(replicas_per_actor or 0), persistent, nodes)
        check_peak(executable, max(map(len, groups)))  # an actor's replicas share its memory (runtime/memory.py)
        self._groups = groups
        self._actors = []
        self._actor_of: dict[int, Any] = {}
        self._stopped = False
        self._dead: set[int] = set()  # indexes of actors that died or never started: never pooled
        self._last: dict[int, ReplicaState] = {}  # each replica's last reported state
        self._options = [actor_options(ids, resources, num_cpus) for ids in groups]
        # Every actor from the pool: they were placed already, so the cluster is not asked (a GCS round trip).
        warm = POOL.can_serve(self._options)
        if nodes is None and (not warm or n >= CHECKED_THREADS):
            nodes = ray.nodes()
        if not warm:
            why = unplaceable([(ids, wanted(o)) for ids, o in zip(groups, self._options)], nodes)
            if why is not None:
                raise ReplicaFailure(why, groups[0][0])
        if nodes is not None and _only_this_node(ray, nodes):  # every replica thread is in this machine's task table
            check_threads(n, f"a job of {n} replicas on this machine's Ray node")
        pooled = []
        for ids, options in zip(groups, self._options):
            actor, from_pool = POOL.acquire(options)
            self._actors.append(actor)
            pooled.append(from_pool)
            for r in ids:
                self._actor_of[r] = actor
        from replicas.ops.custom_call import registered_custom_calls

        self._executable = executable  # the program running (a persistent job may run several)
        self._programs = [executable]
        self._prints = has_custom_calls(executable)  # a host callback's lines come back (`_show_printed`)
        self._digest = executable.fingerprint or hashlib.sha256(executable.bytes()).digest()
        self._launch_options = dict(strict=strict, record_every_instruction=record_every_instruction,
                                    custom_calls=registered_custom_calls() or None, trace_events=trace_events,
                                    persistent=persistent)
        self._persistent = persistent
        self._note = POOL.note
        self._call_refs: list[Any] | None = None  # a persistent job's running call, one per actor
        self._args = args
        self._deadline, self._timeout = deadline, timeout
        self._launch_refs: list[Any] | None = None  # launch calls not yet seen to succeed
        self._launch_error: BaseException | None = None
        self._relaunched = False
        self._finish_refs: list[Any] | None = None
        self._finished: dict[int, tuple[dict[int, Any], bytes, dict[int, Any]]] = {}  # actor -> its `finish`
        self._clean = False  # every replica finished, seen by `completed`: the actors need no waited reset
        self._stuck_events: tuple[dict[int, ReplicaState], dict[int, Any]] | None = None  # (snapshot, events)
        self._aborted = False  # `abort` was called: the actors' resets are not waited for (`shutdown`)
        self._drained: dict[int, tuple[list[Any], dict[int, list[Any]]]] | None = None  # `_take_drained`
        self.calls: Counter[str] = Counter()  # actor calls this job made, by method (see tests)
        self._token = new_job_token()
        try:
            addresses = [POOL.note(a).get("address") for a in self._actors]
            if all(pooled) and reachable(addresses):
                self._launch(addresses, run_to_end)  # not waited for: `completed` (or the first other call) checks it
            else:
                self._start_cold(pooled, nodes)
        except BaseException as e:
            self.shutdown()
            if isinstance(e, ReplicasError):
                raise
            raise _unwrap(e) from None

    def stale(self) -> bool:
        """Whether the Ray session this job started in has ended (`ray.shutdown`, perhaps another
        `ray.init` since): its actors are gone with it."""
        return connection() is not self._connection  # (None once Ray is shut down)

    def _start_cold(self, pooled: list[bool], nodes: list[dict[str, Any]] | None) -> None:
        """Ask each actor for its wire address (a pooled one that died while idle is replaced), then
        launch and wait for the launch (start-up errors and timeouts are raised here)."""
        if nodes is None:
            nodes = self._ray.nodes()
        across_nodes = sum(1 for node in nodes if node.get("Alive")) > 1
        self.calls["wire_address"] += len(self._actors)
        addresses = self._started(self._first_contact(pooled, across_nodes, self._deadline), self._deadline,
                                  self._timeout)
        here = self._ray.get_runtime_context().get_node_id()
        for actor, address in zip(self._actors, addresses):
            note = POOL.note(actor)
            note.clear()
            note["address"] = address
            # Mapped while the actor lives, read if it dies (transport/where.py): this node's actors only.
            note["where"] = where.watch(address.get("where")) if address.get("node") == here else None
        self._launch(addresses, False)
        self._ensure_launched()

    def _launch(self, addresses: list[dict[str, Any]], to_end: bool) -> None:
        """Start the job: one actor alone gets one `launch` (setup, connect, begin); several get
        `launch` (waited for) and then `begin`. Then `finish` (`to_end`: in the same call as the
        begin). Only the launch of several actors is waited for here."""
        n = self.num_replicas
        wire_routes = {r: address for address, ids in zip(addresses, self._groups) for r in ids}
        placement = [0] * n  # replica -> the index of its actor: collectives meet in-actor first
        for index, ids in enumerate(self._groups):
            for r in ids:
                placement[r] = index
        known = [POOL.note(a) for a in self._actors]
        module: Any = None
        if any(k.get("program") != self._digest for k in known):
            module = self._ray.put(self._executable.bytes())  # one object for every actor that needs it
        finish_within = self.poll_interval if to_end else None
        alone = len(self._actors) == 1  # no peer: set up and begin in one call
        refs = []
        for actor, ids, k in zip(self._actors, self._groups, known):
            program = None if k.get("program") == self._digest else module
            k["program"] = self._digest  # forgotten again if this launch fails (`_ensure_launched`)
            # Peers' actor handles only (each costs Ray a reference registration).
            routes = {r: a for r, a in self._actor_of.items() if a is not actor}
            # One argument: Ray serializes each argument of a call on its own.
            refs.append(actor.launch.remote((self._token, ids, n, self._digest, program, self._launch_options,
                                             routes, wire_routes, placement,
                                             {r: self._args[r] for r in ids} if alone and not self._persistent
                                             else None, finish_within)))
        self._launch_refs = refs
        self.calls["launch"] += len(refs)
        if self._persistent:
            return
        if not alone:
            self._ensure_launched()
            if self._launch_refs is not None or self._finish_refs is not None:
                return  # relaunched from scratch (a pooled actor had died)
            refs = [a.begin.remote(self._token, {r: self._args[r] for r in ids}, finish_within)
                    for a, ids in zip(self._actors, self._groups)]
            self._launch_refs = refs
            self.calls["begin"] += len(refs)
        if to_end:
            self._finish_refs = refs
        else:
            self._finish_refs = [a.finish.remote(self._token, self.poll_interval) for a in self._actors]
            self.calls["finish"] += len(refs)

    def _ensure_launched(self) -> None:
        """Wait for the launch calls not seen yet; raise what failed. A pooled actor found dead (it
        may have died while idle: Ray cannot tell that from a death in the call) is replaced and the
        job launched again, once, on a cold start whose launch does not run the program."""
        refs, self._launch_refs = self._launch_refs, None
        if refs is None:
            if self._launch_error is not None:
                raise self._launch_error
            return
        try:
            # A launch may include the job's first `poll_interval` (`completed`): never a start-up timeout.
            deadline = self._deadline and max(self._deadline, time.monotonic() + self.poll_interval + 1.0)
            left = None if deadline is None else deadline - time.monotonic()
            self._ray.wait(refs, num_returns=len(refs), timeout=left)
            died = [i for i, ref in enumerate(refs) if _died(self._ray, ref)]
            if died and not self._relaunched:
                self._relaunched = True
                self._relaunch(died)
                return
            self._started(refs, deadline, self._timeout)
        except BaseException as e:
            for actor in self._actors:
                POOL.note(actor).pop("program", None)
            self._launch_error = e if isinstance(e, ReplicasError) else _unwrap(e)
            raise self._launch_error from None

    def _relaunch(self, died: list[int]) -> None:
        live = [i for i in range(len(self._actors)) if i not in died]
        resets = [self._actors[i].reset.remote(STOP_SECONDS) for i in live]
        self.calls["reset"] += len(resets)
        self._ray.wait(resets, num_returns=len(resets), timeout=STOP_SECONDS + 5)
        POOL.discard([self._actors[i] for i in died])
        for i in died:
            self._actors[i] = POOL.fresh(self._options[i])
            for r in self._groups[i]:
                self._actor_of[r] = self._actors[i]
        job_ended(self._token)  # the launch that found an actor dead is abandoned
        self._token = new_job_token()
        self._finish_refs, self._finished = None, {}
        self._start_cold([i not in died for i in range(len(self._actors))], None)

    def completed(self, timeout: float) -> list[Any] | None:
        """Each replica's result when every actor's `finish` reports its replicas finished within
        about `timeout` s; None otherwise (a failure, a wait, a long job: the monitor's turn)."""
        refs, self._finish_refs = self._finish_refs, None
        if refs is None:
            return None
        index = {ref: i for i, ref in enumerate(refs)}
        pending = refs
        left = self._left()  # the actors answer after `timeout` at the latest, unless stopped
        deadline = time.monotonic() + (timeout + 1.0 if left is None else min(timeout + 1.0, left))
        while pending:
            ready, pending = self._ray.wait(pending, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            try:
                outcome = self._ray.get(ready[0])
            except Exception:  # noqa: BLE001 - a dead actor: the monitor's poll names it
                outcome = None
            if outcome is None:
                break
            self._finished[index[ready[0]]] = outcome
        if len(self._finished) < len(self._actors):
            self._ensure_launched()
            return None
        if refs is self._launch_refs:  # the launches returned these outcomes: they succeeded
            self._launch_refs = None
        self._ensure_launched()
        self._clean = True
        self._show_printed()
        merged: dict[int, Any] = {}
        for results, _, _ in self._finished.values():
            merged.update(results)
        return [merged[r] for r in range(self.num_replicas)]

    def _show_printed(self) -> None:
        """What the replicas printed (a program with custom calls: JAX's host callbacks), on this
        process's stdout (diagnostics/host_output.py)."""
        if self._prints:
            self.calls["printed"] += len(self._actors)
            with contextlib.suppress(Exception):  # a dead actor's lines die with it; its fault is reported
                host_output.show(self._ray.get([a.printed.remote() for a in self._actors], timeout=STOP_SECONDS))

    def _first_contact(self, pooled: list[bool], across_nodes: bool, deadline: float | None) -> list[Any]:
        """Each actor's wire address (refs). A pooled actor that died while idle (killed, out of
        memory) is replaced by a fresh one; a fresh actor that dies is the job's failure (`_started`)."""
        from ray.exceptions import RayActorError

        refs = [a.wire_address.remote(AUTHKEY, across_nodes) for a in self._actors]
        if not any(pooled):
            return refs
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, _ = self._ray.wait(refs, num_returns=len(refs), timeout=left)
        ready_set = set(ready)
        for i, ref in enumerate(refs):
            if not pooled[i] or ref not in ready_set:
                continue  # still busy or unplaced: `_started` reports it within the timeout
            try:
                self._ray.get(ref, timeout=0)
            except RayActorError:
                POOL.discard([self._actors[i]])
                self._actors[i] = POOL.fresh(self._options[i])
                for r in self._groups[i]:
                    self._actor_of[r] = self._actors[i]
                refs[i] = self._actors[i].wire_address.remote(AUTHKEY, across_nodes)
        return refs

    def _started(self, refs: list[Any], deadline: float | None, timeout: float | None) -> list[Any]:
        """One start-up step (a call per actor), within what is left of the job's timeout."""
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, pending = self._ray.wait(refs, num_returns=len(refs), timeout=left)
        if pending:
            waiting = [i for i, ref in enumerate(refs) if ref in set(pending)]
            self._dead.update(waiting)  # still unplaced or stuck: killed, never pooled
            ids = [r for i in waiting for r in self._groups[i]]
            raise ExecutionTimeout(not_started(ids, wanted(self._options[waiting[0]]), *cluster_resources(self._ray),
                                               timeout))
        return self._get(refs)

    def _left(self) -> float | None:
        """How long an actor call may still take: until the job's deadline plus ANSWER_GRACE (None
        without a timeout)."""
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic()) + ANSWER_GRACE

    def _get(self, refs: list[Any], indexes: list[int] | None = None, until: float | None = None) -> list[Any]:
        """The answers of `refs` (one call per actor of `indexes`), never waited for past the job's
        deadline (or `until`, a time.monotonic() the caller's step ends by): an actor that does not
        answer by then (its process stopped, or a call in it holding the GIL) ends the job with
        ExecutionTimeout naming its replicas."""
        indexes = indexes if indexes is not None else list(range(len(refs)))
        left = self._left() if until is None else max(0.0, until - time.monotonic())
        if left is not None:
            _, pending = self._ray.wait(refs, num_returns=len(refs), timeout=left)
            if pending:
                waiting = set(pending)
                raise self._unanswered([i for ref, i in zip(refs, indexes) if ref in waiting])
        try:
            return self._ray.get(refs)
        except Exception as e:  # noqa: BLE001 - named below: which actor, which replicas
            raise self._named(refs, indexes, e) from None

    def _unanswered(self, indexes: list[int]) -> ExecutionTimeout:
        """The actors of `indexes` answered nothing by the deadline: never asked again (killed at the
        job's end, never pooled)."""
        self._dead.update(indexes)
        ids = sorted(r for i in indexes for r in self._groups[i])
        at: dict[int, str] = {}
        for i in indexes:
            at.update(published(POOL.note(self._actors[i]).get("where"), self._token, self._groups[i],
                                self._executable.module))
        doing = "; ".join(f"replica {r} {doing_at(r, at, self._last)}" for r in ids[:4])
        return ExecutionTimeout(
            f"still running after {self._timeout:g} s: {replicas_text(ids)} did not answer the driver "
            f"{ANSWER_GRACE:g} s after it (their actor process is stopped, or a call in it holds the GIL): {doing}")

    def _named(self, refs: list[Any], indexes: list[int], error: BaseException) -> BaseException:
        """The error of the first actor whose call failed, naming its replicas if it died."""
        from ray.exceptions import GetTimeoutError, RayActorError

        for ref, index in zip(refs, indexes):
            try:
                self._ray.get(ref, timeout=0)
            except GetTimeoutError:
                continue
            except RayActorError as e:
                self._dead.add(index)
                ids = self._groups[index]
                note = POOL.note(self._actors[index])
                watch = note.get("where") or self._asked_on_its_node(index, ids)
                at = published(watch, self._token, ids, self._executable.module)
                return actor_failure(ids, self._last, e, at)
            except Exception as e:  # noqa: BLE001
                return _unwrap(e)
        return _unwrap(error)

    def _asked_on_its_node(self, index: int, ids: list[int]) -> where.Answered | None:
        """What the dead actor `index` (of another node than the driver's) published for its replicas
        `ids`, as the job's live actors on its node read it (replica_host.where_of), or None."""
        nodes = self._nodes()
        node = nodes[index]
        there = [a for j, a in enumerate(self._actors) if j != index and j not in self._dead and nodes[j] == node]
        if node is None or not there:
            return None
        refs = [a.where_of.remote(self._token, ids) for a in there]
        ready, _ = self._ray.wait(refs, num_returns=len(refs), timeout=1.0)
        codes: dict[int, int] = {}
        for ref in ready:
            with contextlib.suppress(Exception):  # another death: what the others read is enough
                codes.update(self._ray.get(ref))
        return where.Answered(codes) if codes else None

    def _nodes(self) -> list[str | None]:
        """Each actor's node (from its wire address), None where unknown."""
        return [(POOL.note(a).get("address") or {}).get("node") for a in self._actors]

    def _touch(self, method: str, quiet: bool = False) -> None:
        """Before an actor call of `method` (counted): the job's launch must have been seen, and
        parked actors are woken."""
        self.calls[method] += len(self._actors)
        self._wake_actors()
        try:
            self._ensure_launched()
        except Exception:
            if not quiet:
                raise

    def states(self) -> list[ReplicaState]:
        self._touch("states")
        out: list[ReplicaState] = []
        refs = [a.states.remote() for a in self._actors]
        nodes = self._nodes()
        here = self._ray.get_runtime_context().get_node_id()
        left = self._left()  # one allowance for the liveness wait and the answers together
        until = None if left is None else time.monotonic() + left
        quiet = silent(self._ray, refs, nodes, here, left, self._heard_from)
        if quiet:  # a host cut off or frozen: Ray would take a minute to say so (cluster/liveness.py)
            self._dead.update(quiet)
            raise silent_failure(self._ray, self._groups, quiet, nodes)
        dead_before = set(self._dead)
        try:
            parts = self._get(refs, until=until)
        except ReplicaFailure as e:  # an actor died: on another host, its host's others with it
            raise host_lost(self._ray, e, refs, nodes, here, self._dead, self._dead - dead_before,
                            self._groups) from None
        for columns in parts:
            out.extend(state_columns.decode(columns))
        self._last = {s.replica: s for s in out}
        return out

    def _heard_from(self, quiet: list[int], answered: list[int]) -> set[int]:
        """Which of the `quiet` actors' hosts the `answered` actors read bytes from lately (their
        wires: cluster/liveness.py)."""
        hosts = {i: ((POOL.note(self._actors[i]).get("address") or {}).get("tcp") or (None,))[0] for i in quiet}
        refs = [self._actors[j].heard.remote() for j in answered]
        self.calls["heard"] += len(refs)
        ready, _ = self._ray.wait(refs, num_returns=len(refs), timeout=1.0)
        latest: dict[str, float] = {}
        for ref in ready:
            with contextlib.suppress(Exception):  # an actor that died now: the next poll names it
                for host, age in self._ray.get(ref).items():
                    latest[host] = min(age, latest.get(host, age))
        return {i for i in quiet if hosts[i] is not None and latest.get(hosts[i], LIVENESS_SECONDS) < LIVENESS_SECONDS}

    def wait(self, timeout: float) -> None:
        self._touch("wait")
        self._ray.wait([a.wait.remote(timeout) for a in self._actors], num_returns=len(self._actors),
                       timeout=timeout + 1)

    def results(self) -> list[Any]:
        self._touch("results")
        self._show_printed()
        merged: dict[int, Any] = {}
        for part in self._get([a.results.remote() for a in self._actors]):
            merged.update(part)
        return [merged[r] for r in range(self.num_replicas)]

    def errors(self) -> dict[int, BaseException]:
        self._touch("errors")
        self._show_printed()
        merged: dict[int, BaseException] = {}
        for part in self._get([a.errors.remote() for a in self._actors]):
            merged.update(part)
        return merged

    def abort(self, exc: BaseException) -> None:
        self._touch("abort", quiet=True)
        self._aborted = True
        if self._drained is None and self._last and stuck_key(list(self._last.values()), True) is not None:
            # Stuck (the monitor's verdict: nobody runs, nothing in flight, nobody waits for the host):
            # no replica can write to the host before the abort wakes it, so what it wrote is taken
            # now, while the actors' threads still sleep (once woken, thousands of them unwinding
            # hold each actor's GIL for seconds).
            self._drained = self._take_drained()
        light = without_report(exc)  # the replicas only wake with it; the report stays the driver's
        for a in self._actors:
            a.abort.remote(light)

    def shutdown(self) -> None:
        if self._stopped:
            return
        self._close_doorbell()
        if self.stale():  # its actors ended with their Ray session; a Ray call would start another one
            self._stopped = True
            job_ended(self._token)
            return
        with contextlib.suppress(Exception):
            self._ensure_launched()  # a reset must never overtake the launch
        self._stopped = True
        live = [i for i in range(len(self._actors)) if i not in self._dead]
        if self._clean and len(self._actors) == 1:  # it reset itself in `finish`
            POOL.hand_back([(self._actors[i], self._options[i]) for i in live])
        else:  # (several actors: each holds shared memory its peers may still read until all finished)
            self.calls["reset"] += len(live)
            # An aborted job's error does not wait for its replica threads to unwind (the pool does).
            POOL.release([(self._actors[i], self._options[i]) for i in live], within=self._left(),
                         later=self._aborted)
        POOL.discard([self._actors[i] for i in self._dead])
        job_ended(self._token)  # what killed actors of this node left behind, and late launches

    def deliver_from_host(self, replica: int, key: tuple, value: Any) -> None:
        self._touch("deliver")
        self._actor_of[replica].deliver.remote(self._token, replica, HOST, key, value)

    def outfeed(self, replica: int, timeout: float | None) -> Any:
        self._touch("outfeed")
        return self._get([self._actor_of[replica].outfeed.remote(replica, timeout)], [self._index_of(replica)])[0]

    def from_channel(self, replica: int, channel_id: int, timeout: float | None) -> Any:
        self._touch("from_channel")
        return self._get([self._actor_of[replica].from_channel.remote(replica, channel_id, timeout)],
                         [self._index_of(replica)])[0]

    def _index_of(self, replica: int) -> int:
        return next(i for i, ids in enumerate(self._groups) if replica in ids)

    def drain(self) -> dict[int, tuple[list[Any], dict[int, list[Any]]]]:
        """What each live actor's replicas wrote to the host and nobody read yet (kept on the Job)."""
        merged: dict[int, tuple[list[Any], dict[int, list[Any]]]] = {}
        for _, _, drained in self._finished.values():  # taken by `finish` already
            merged.update(drained)
        if self._clean:
            return merged
        if self._drained is None:
            self._drained = self._take_drained()
        for r, values in self._drained.items():
            if values[0] or values[1] or r not in merged:
                merged[r] = values
        return merged

    def _take_drained(self) -> dict[int, tuple[list[Any], dict[int, list[Any]]]]:
        """What the live actors' replicas wrote to the host and nobody read yet (taken from them)."""
        merged: dict[int, tuple[list[Any], dict[int, list[Any]]]] = {}
        self._touch("drain", quiet=True)
        live = [i for i in range(len(self._actors)) if i not in self._dead]
        for ref in self._answered([self._actors[i].drain.remote() for i in live], live, 5.0):
            try:
                merged.update(self._ray.get(ref))
            except Exception:  # noqa: BLE001 - a dead actor's values are lost with it
                pass
        return merged

    def events(self) -> dict[int, list[dict[str, Any]]]:
        import pickle

        merged: dict[int, list[dict[str, Any]]] = {}
        if self._clean:
            for _, events, _ in self._finished.values():
                merged.update(pickle.loads(events))  # noqa: S301 - our own actors' bytes
            return merged
        kept = self._stuck_events
        if kept is not None and kept[0] is self._last and not self._aborted:
            # Asked again (the job's end, after its deadlock report): nobody moved since the snapshot
            # that was stuck, so nobody recorded anything.
            return dict(kept[1])
        self._touch("events", quiet=True)
        live = [i for i in range(len(self._actors)) if i not in self._dead]  # the dead never answer
        for ref in self._answered([self._actors[i].events.remote() for i in live], live, 10.0):
            try:
                merged.update(pickle.loads(self._ray.get(ref)))  # noqa: S301 - our own actors' bytes
            except Exception:  # noqa: BLE001 - events are a best-effort addition to a report
                pass
        if self._last and stuck_key(list(self._last.values()), True) is not None:
            self._stuck_events = (self._last, dict(merged))
        return merged

    def _answered(self, refs: list[Any], indexes: list[int], most: float) -> list[Any]:
        """The calls of `refs` (to the actors of `indexes`) answered within `most` s and the job's
        deadline (`_left`); the actors that did not answer are never asked again (killed at the end)."""
        left = self._left()
        _, pending = self._ray.wait(refs, num_returns=len(refs), timeout=most if left is None else min(most, left))
        waiting = set(pending)
        self._dead.update(i for ref, i in zip(refs, indexes) if ref in waiting)
        return [ref for ref in refs if ref not in waiting]


def _died(ray: Any, ref: Any) -> bool:
    from ray.exceptions import GetTimeoutError, RayActorError

    try:
        ray.get(ref, timeout=0)
    except RayActorError:
        return True
    except (GetTimeoutError, Exception):  # noqa: BLE001 - not a death: `_started` names it
        return False
    return False


def _unwrap(e: BaseException) -> BaseException:
    """Turn Ray's wrappers into the error the replica raised, or a ReplicaFailure naming the actor."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, (ReplicasError, TimeoutError, EOFError)):
        return cause
    if isinstance(e, (ReplicasError, TimeoutError, EOFError)):
        return e
    resource = exhausted_resource(cause) if isinstance(cause, BaseException) else None
    if resource is not None:  # an actor refused a descriptor, a segment, memory, a thread: say which
        return ResourceExhausted(f"a replica actor failed: out of {resource}: {type(cause).__name__}: {cause}",
                                 resource, cause=repr(cause))
    return ReplicaFailure(f"a replica actor failed: {type(e).__name__}: {e}", None, repr(e))


