"""Replicas as Ray actors, the driver's side: `RayBackend` places pooled actors
(`ReplicaHost`, runtime/ray/replica_host.py, which also holds the data paths between them), launches
a job on them, polls their states for the monitor and collects results. The driver is never in a
data path."""

from __future__ import annotations

import atexit
import collections
import contextlib
import hashlib
import ipaddress
import logging
import os
import secrets
import threading
import time
from collections import Counter
from typing import Any

from replicas.cluster.address import prepare_to_join
from replicas.cluster.liveness import host_lost, quiet_ray_messages, silent, silent_failure
from replicas.diagnostics.recorder import DEFAULT_CAPACITY
from replicas.errors import ExecutionTimeout, ReplicaFailure, ReplicasError
from replicas.records import HOST, ReplicaState
from replicas.runtime.compile import Executable
from replicas.runtime.job import Backend
from replicas.runtime.ray.actor_pool import ActorPool
from replicas.runtime.ray.faults import actor_failure, not_started, unplaceable
from replicas.runtime.ray.persistent import PersistentJob
from replicas.runtime.ray.replica_host import STOP_SECONDS, ReplicaHost
from replicas.transport.shm import remove_orphaned_segments, remove_segments_of

_init_lock = threading.Lock()
# The key this driver's actors authenticate direct connections with (see wire.py).
_AUTHKEY = secrets.token_bytes(32)


def ensure_ray(address: str | None = None, timeout: float | None = None) -> None:
    """Join `address` ("auto", "ray://host:port") or start a quiet local Ray once per process. A
    cluster that does not answer within `timeout` s is an error naming it; this driver takes the
    cluster's authentication mode (replicas/cluster/address.py)."""
    import ray

    with _init_lock:
        if ray.is_initialized():
            return
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        os.environ.setdefault("RAY_DEDUP_LOGS", "0")
        # Messages up to 2 MiB travel inline with their task instead of through the object store:
        # measured 127 -> 65 ms for a 1 MiB all-reduce on 4 replicas (bench/README.md).
        os.environ.setdefault("RAY_max_direct_call_object_size", str(2 << 20))
        kwargs: dict[str, Any] = dict(logging_level=logging.ERROR, log_to_driver=False,
                                      configure_logging=True, ignore_reinit_error=True)
        if address is None:
            # "local" always starts a private instance: a cluster left behind by `ray start`
            # on this machine must not capture a laptop run.
            address = "local"
            kwargs["include_dashboard"] = False
        else:
            prepare_to_join(address, timeout)
        try:
            with _loopback_node() if _on_loopback(address) else contextlib.nullcontext():
                ray.init(address=address, **kwargs)
            quiet_ray_messages()
        except Exception as e:  # noqa: BLE001 - Ray raises many kinds; the user needs one
            raise ReplicaFailure(f"cannot start or join Ray (address={address!r}): {type(e).__name__}: {e}") from e


@contextlib.contextmanager
def _loopback_node() -> Any:
    """Ray's addresses kept on loopback while `ray.init` starts a private local instance or joins
    a cluster on 127.0.0.1 (`replicas cluster start --local`): the instance's GCS, raylet, agents and
    workers then listen on loopback only, and this driver finds its node by 127.0.0.1.

    Why: on Linux Ray replaces 127.0.0.1 by the machine's routable address, both for a node it
    starts (even with `_node_ip_address="127.0.0.1"`) and for the address it joins, and a node
    with a routable address listens on every interface. Ray keeps loopback where it takes the
    machine for one that cannot form a cluster (macOS, Windows: `ray_constants.ENABLE_RAY_CLUSTER`).
    That switch is read when an address is chosen, so it is off only during this `ray.init`: a
    later one of this process that joins a real cluster gets the routable address again.
    tests/test_loopback.py checks the listeners, so a Ray that moves the switch shows up there."""
    from ray._private import ray_constants

    if not hasattr(ray_constants, "ENABLE_RAY_CLUSTER"):
        yield
        return
    before = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = before


def _on_loopback(address: str) -> bool:
    """Whether `address` is a private local instance ("local") or ("auto", host:port; not "ray://")
    a cluster on 127.0.0.1."""
    if address == "local":
        return True
    if address.startswith("ray://"):
        return False
    from ray._private import services

    try:
        found = services.get_ray_address_from_environment(address, None) if address == "auto" else address
        host = found.rpartition(":")[0].strip("[]") if found else ""
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except Exception:  # noqa: BLE001 - not an address this can read: Ray chooses, as without this check
        return False


_actor_class = None
# Tokens of this driver's jobs that ended (the last ENDED_KEPT). A job's launch may still reach an
# actor after the job ended (it failed or timed out while the call was on its way): the actor then
# creates the job's segments after the driver removed them. Each job's end removes what such jobs
# left, and so does the driver's exit.
ENDED_KEPT = 256
_ended: collections.deque[str] = collections.deque(maxlen=ENDED_KEPT)
_ended_lock = threading.Lock()


def _job_ended(*tokens: str) -> None:
    """Remove the segments of `tokens` and of the earlier ended jobs on this node."""
    with _ended_lock:
        _ended.extend(tokens)
        ended = list(_ended)
    remove_segments_of(ended)


atexit.register(_job_ended)


def _remote_host_class() -> Any:
    global _actor_class
    if _actor_class is None:
        import ray

        remove_orphaned_segments()  # once per driver: what a killed driver's jobs left on this node
        _actor_class = ray.remote(ReplicaHost)
    return _actor_class


POOL = ActorPool(_remote_host_class)


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
        deadline = None if timeout is None else time.monotonic() + timeout
        n = len(args)
        self.num_replicas = n
        per = int(replicas_per_actor) if replicas_per_actor else _default_packing(n, resources)
        groups = [list(range(i, min(i + per, n))) for i in range(0, n, per)]
        self._groups = groups
        self._actors = []
        self._options: list[dict[str, Any]] = []
        self._actor_of: dict[int, Any] = {}
        self._stopped = False
        self._dead: set[int] = set()  # indexes of actors that died or never started: never pooled
        self._last: dict[int, ReplicaState] = {}  # each replica's last reported state
        for ids in groups:
            options: dict[str, Any] = {"num_cpus": num_cpus, "max_concurrency": 64}
            if resources is not None:
                merged: dict[str, float] = {}
                for r in ids:
                    for k, v in (resources[r] or {}).items():
                        merged[k] = merged.get(k, 0) + v
                # Ray takes CPUs and GPUs as options of their own, other resources by name.
                for name, option in (("CPU", "num_cpus"), ("GPU", "num_gpus")):
                    if name in merged:
                        options[option] = merged.pop(name)
                if merged:
                    options["resources"] = merged
            self._options.append(options)
        # Every actor from the pool: they were placed already, so the cluster is not asked (a GCS round trip).
        warm = POOL.can_serve(self._options)
        nodes = None
        if not warm:
            nodes = ray.nodes()
            why = unplaceable([(ids, _wanted(o)) for ids, o in zip(groups, self._options)], nodes)
            if why is not None:
                raise ReplicaFailure(why, groups[0][0])
        pooled = []
        for ids, options in zip(groups, self._options):
            actor, from_pool = POOL.acquire(options)
            self._actors.append(actor)
            pooled.append(from_pool)
            for r in ids:
                self._actor_of[r] = actor
        from replicas.ops.custom_call import registered_custom_calls

        self._executable = executable
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
        self.calls: Counter[str] = Counter()  # actor calls this job made, by method (see tests)
        self._token = secrets.token_hex(8)
        try:
            addresses = [POOL.note(a).get("address") for a in self._actors]
            if all(pooled) and _reachable(addresses):
                self._launch(addresses, run_to_end)  # not waited for: `completed` (or the first other call) checks it
            else:
                self._start_cold(pooled, nodes)
        except BaseException as e:
            self.shutdown()
            if isinstance(e, ReplicasError):
                raise
            raise _unwrap(e) from None

    def _start_cold(self, pooled: list[bool], nodes: list[dict[str, Any]] | None) -> None:
        """Ask each actor for its wire address (a pooled one that died while idle is replaced), then
        launch and wait for the launch (start-up errors and timeouts are raised here)."""
        if nodes is None:
            nodes = self._ray.nodes()
        across_nodes = sum(1 for node in nodes if node.get("Alive")) > 1
        self.calls["wire_address"] += len(self._actors)
        addresses = self._started(self._first_contact(pooled, across_nodes, self._deadline), self._deadline,
                                  self._timeout)
        for actor, address in zip(self._actors, addresses):
            note = POOL.note(actor)
            note.clear()
            note["address"] = address
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
        _job_ended(self._token)  # the launch that found an actor dead is abandoned
        self._token = secrets.token_hex(8)
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
        deadline = time.monotonic() + timeout + 1.0  # the actors answer after `timeout` at the latest
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
        merged: dict[int, Any] = {}
        for results, _, _ in self._finished.values():
            merged.update(results)
        return [merged[r] for r in range(self.num_replicas)]

    def _first_contact(self, pooled: list[bool], across_nodes: bool, deadline: float | None) -> list[Any]:
        """Each actor's wire address (refs). A pooled actor that died while idle (killed, out of
        memory) is replaced by a fresh one; a fresh actor that dies is the job's failure (`_started`)."""
        from ray.exceptions import RayActorError

        refs = [a.wire_address.remote(_AUTHKEY, across_nodes) for a in self._actors]
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
                refs[i] = self._actors[i].wire_address.remote(_AUTHKEY, across_nodes)
        return refs

    def _started(self, refs: list[Any], deadline: float | None, timeout: float | None) -> list[Any]:
        """One start-up step (a call per actor), within what is left of the job's timeout."""
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, pending = self._ray.wait(refs, num_returns=len(refs), timeout=left)
        if pending:
            waiting = [i for i, ref in enumerate(refs) if ref in set(pending)]
            self._dead.update(waiting)  # still unplaced or stuck: killed, never pooled
            ids = [r for i in waiting for r in self._groups[i]]
            raise ExecutionTimeout(not_started(ids, _wanted(self._options[waiting[0]]), *_resources(self._ray),
                                               timeout))
        return self._get(refs)

    def _get(self, refs: list[Any], indexes: list[int] | None = None) -> list[Any]:
        try:
            return self._ray.get(refs)
        except Exception as e:  # noqa: BLE001 - named below: which actor, which replicas
            raise self._named(refs, indexes if indexes is not None else list(range(len(refs))), e) from None

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
                return actor_failure(self._groups[index], self._last, e)
            except Exception as e:  # noqa: BLE001
                return _unwrap(e)
        return _unwrap(error)

    def _touch(self, method: str, quiet: bool = False) -> None:
        """Before an actor call of `method` (counted): the job's launch must have been seen."""
        self.calls[method] += len(self._actors)
        try:
            self._ensure_launched()
        except Exception:
            if not quiet:
                raise

    def states(self) -> list[ReplicaState]:
        self._touch("states")
        out: list[ReplicaState] = []
        refs = [a.states.remote() for a in self._actors]
        nodes = [(POOL.note(a).get("address") or {}).get("node") for a in self._actors]
        here = self._ray.get_runtime_context().get_node_id()
        quiet = silent(self._ray, refs, nodes, here)
        if quiet:  # a host cut off or frozen: Ray would take a minute to say so (cluster/liveness.py)
            self._dead.update(quiet)
            raise silent_failure(self._ray, self._groups, quiet, nodes)
        dead_before = set(self._dead)
        try:
            parts = self._get(refs)
        except ReplicaFailure as e:  # an actor died: on another host, its host's others with it
            raise host_lost(self._ray, e, refs, nodes, here, self._dead, self._dead - dead_before,
                            self._groups) from None
        for states in parts:
            out.extend(states)
        self._last = {s.replica: s for s in out}
        return out

    def wait(self, timeout: float) -> None:
        self._touch("wait")
        self._ray.wait([a.wait.remote(timeout) for a in self._actors], num_returns=len(self._actors),
                       timeout=timeout + 1)

    def results(self) -> list[Any]:
        self._touch("results")
        merged: dict[int, Any] = {}
        for part in self._get([a.results.remote() for a in self._actors]):
            merged.update(part)
        return [merged[r] for r in range(self.num_replicas)]

    def errors(self) -> dict[int, BaseException]:
        self._touch("errors")
        merged: dict[int, BaseException] = {}
        for part in self._get([a.errors.remote() for a in self._actors]):
            merged.update(part)
        return merged

    def abort(self, exc: BaseException) -> None:
        self._touch("abort", quiet=True)
        for a in self._actors:
            a.abort.remote(exc)

    def shutdown(self) -> None:
        if self._stopped:
            return
        self._close_doorbell()
        with contextlib.suppress(Exception):
            self._ensure_launched()  # a reset must never overtake the launch
        self._stopped = True
        live = [i for i in range(len(self._actors)) if i not in self._dead]
        if self._clean and len(self._actors) == 1:  # it reset itself in `finish`
            POOL.hand_back([(self._actors[i], self._options[i]) for i in live])
        else:  # (several actors: each holds shared memory its peers may still read until all finished)
            self.calls["reset"] += len(live)
            POOL.release([(self._actors[i], self._options[i]) for i in live])
        POOL.discard([self._actors[i] for i in self._dead])
        _job_ended(self._token)  # what killed actors of this node left behind, and late launches

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
        return next(i for i, ids in enumerate(self._groups) if ids[0] <= replica <= ids[-1])

    def drain(self) -> dict[int, tuple[list[Any], dict[int, list[Any]]]]:
        """What each live actor's replicas wrote to the host and nobody read yet (kept on the Job)."""
        merged: dict[int, tuple[list[Any], dict[int, list[Any]]]] = {}
        for _, _, drained in self._finished.values():  # taken by `finish` already
            merged.update(drained)
        if self._clean:
            return merged
        self._touch("drain", quiet=True)
        live = [i for i in range(len(self._actors)) if i not in self._dead]
        refs = [self._actors[i].drain.remote() for i in live]
        ready, _ = self._ray.wait(refs, num_returns=len(refs), timeout=5)
        for ref in ready:
            try:
                for r, values in self._ray.get(ref).items():
                    if values[0] or values[1] or r not in merged:
                        merged[r] = values
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
        self._touch("events", quiet=True)
        try:
            live = [a for i, a in enumerate(self._actors) if i not in self._dead]  # the dead never answer
            for part in self._ray.get([a.events.remote() for a in live], timeout=10):
                merged.update(pickle.loads(part))  # noqa: S301 - our own actors' bytes
        except Exception:  # noqa: BLE001 - events are a best-effort addition to a report
            pass
        return merged


def _reachable(addresses: list[dict[str, Any] | None]) -> bool:
    """Every address known, and the actors can reach each other with what they opened (one
    node: Unix sockets; several: TCP listeners)."""
    if not all(addresses):
        return False
    return len({a["node"] for a in addresses}) == 1 or all(a.get("tcp") for a in addresses)


def _died(ray: Any, ref: Any) -> bool:
    from ray.exceptions import GetTimeoutError, RayActorError

    try:
        ray.get(ref, timeout=0)
    except RayActorError:
        return True
    except (GetTimeoutError, Exception):  # noqa: BLE001 - not a death: `_started` names it
        return False
    return False


def _default_packing(num_replicas: int, resources: list[dict[str, float]] | None) -> int:
    """One replica per actor up to the cluster's CPUs, then two (about one process per CPU: on 2
    cores, 4 replicas in 2 actors were faster than in 4 in all 20 rows of bench/collectives.py,
    1.3-5.5x, bench/README.md "Copies per collective"); beyond twice the CPUs, enough per actor for
    at most twice as many actors as CPUs."""
    import math

    import ray

    if resources is not None or num_replicas <= 2:
        return 1  # placement was chosen replica by replica; or one actor each on any cluster
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    if num_replicas <= cpus:
        return 1
    return max(2, math.ceil(num_replicas / (2 * cpus)))


def _unwrap(e: BaseException) -> BaseException:
    """Turn Ray's wrappers into the error the replica raised, or a ReplicaFailure naming the actor."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, (ReplicasError, TimeoutError, EOFError)):
        return cause
    if isinstance(e, (ReplicasError, TimeoutError, EOFError)):
        return e
    return ReplicaFailure(f"a replica actor failed: {type(e).__name__}: {e}", None, repr(e))


def _resources(ray: Any) -> tuple[dict[str, float], dict[str, float], int]:
    """Free and total resources of the cluster's alive nodes, and how many nodes died (for a message)."""
    try:
        nodes = ray.nodes()
        free = dict(ray.available_resources())
    except Exception:  # noqa: BLE001 - only for the message
        return {}, {}, 0
    total: dict[str, float] = {}
    for node in nodes:
        if node.get("Alive"):
            for k, v in node.get("Resources", {}).items():
                total[k] = total.get(k, 0) + v
    return free, total, sum(1 for node in nodes if not node.get("Alive"))


def _wanted(options: dict[str, Any]) -> dict[str, float]:
    """The resources an actor's options ask for, by Ray's names."""
    wanted = dict(options.get("resources", {}))
    for name, option in (("CPU", "num_cpus"), ("GPU", "num_gpus")):
        if options.get(option):
            wanted[name] = options[option]
    return wanted
