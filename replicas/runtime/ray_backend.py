"""Replicas as Ray actors. Each actor hosts one replica (or several, packed) and its mailbox.

Data moves actor to actor, chosen per peer pair by `RayFabric._post`: replicas of one actor share
its mailboxes; a peer on the same node gets large arrays through this job's shared memory
(runtime/shm.py: the bytes go into the sender's arena, a descriptor over the socket); small
messages, and any to other nodes up to 1 MiB, go over the direct sockets (runtime/wire.py); the
rest is a `deliver` call on the peer's actor through Ray's object store. The driver only starts
actors, polls their states for the monitor and collects results; it is never in a data path.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import logging
import os
import secrets
import threading
import time
from collections import Counter
from collections.abc import Hashable
from typing import Any

from replicas.diagnostics.recorder import DEFAULT_CAPACITY, FlightRecorder
from replicas.errors import ExecutionTimeout, ReplicaFailure, ReplicasError
from replicas.records import HOST, ReplicaState
from replicas.runtime import board as shared_board
from replicas.runtime.actor_pool import ActorPool
from replicas.runtime.compile import Executable
from replicas.runtime.fabric import MailboxFabric
from replicas.runtime.faults import actor_failure, is_memory_error, not_started, unplaceable
from replicas.runtime.mailbox import Mailbox
from replicas.runtime.message_bounds import MessageBounds
from replicas.runtime.shm import Inbox, Outbox, Shared, remove_job_segments, remove_orphaned_segments
from replicas.runtime.shm import available as shm_available
from replicas.runtime.wire import WIRE_MAX_BYTES, RefusedMessage, Wire, WireError, payload_bytes

_init_lock = threading.Lock()
# The key this driver's actors authenticate direct connections with (see wire.py).
_AUTHKEY = secrets.token_bytes(32)


def ensure_ray(address: str | None = None) -> None:
    """Join `address` ("auto", "ray://host:port") or start a quiet local Ray once per process."""
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
        try:
            ray.init(address=address, **kwargs)
        except Exception as e:  # noqa: BLE001 - Ray raises many kinds; the user needs one
            raise ReplicaFailure(f"cannot start or join Ray (address={address!r}): {type(e).__name__}: {e}") from e


class RayFabric(MailboxFabric):
    def __init__(self, replica_id: int, num_replicas: int, mailbox: Mailbox,
                 local: dict[int, Mailbox], **kwargs: Any) -> None:
        super().__init__(replica_id, num_replicas, mailbox, **kwargs)
        self._local = local
        self.routes: dict[int, Any] = {}  # replica -> its actor (large messages, via the object store)
        self.wire: Wire | None = None
        self.wire_routes: dict[int, dict[str, Any]] = {}  # replica -> its actor's wire address
        self.token = ""
        self.outbox: Outbox | None = None  # this actor's shared-memory arena (peers on its node)
        self.same_node: frozenset[int] = frozenset()  # replicas whose actors share this node
        self.shm_sent: dict[int, int] = {}  # dst -> messages sent through shared memory

    def _post(self, dst: int, key: Hashable, value: Any) -> None:
        box = self._local.get(dst)
        if box is not None:
            box.deliver(self.replica_id, key, value)
            return
        if self.outbox is not None and dst in self.same_node:
            shared = self.outbox.encode(value, key)
            if shared is not None:  # a descriptor over the socket; the bytes wait in the arena
                self.shm_sent[dst] = self.shm_sent.get(dst, 0) + 1
                self.wire.send(self.wire_routes[dst], (self.token, dst, self.replica_id, key, shared))
                return
        if self.wire is not None and payload_bytes(value) <= WIRE_MAX_BYTES:
            self.wire.send(self.wire_routes[dst], (self.token, dst, self.replica_id, key, value))
        else:
            self.routes[dst].deliver.remote(self.token, dst, self.replica_id, key, value)


class ReplicaHost:
    """The body of a replica actor. Actors are pooled: `setup` gives one the replicas
    `replica_ids` of a new job, `reset` returns it to the pool once they have all stopped."""

    def __init__(self) -> None:
        self._mailboxes: dict[int, Mailbox] = {}
        self._runners: dict[int, Any] = {}
        self._fabrics: list[RayFabric] = []
        self._executables: dict[bytes, Executable] = {}
        self._wire: Wire | None = None
        self._token = ""  # the current job's: messages of an earlier job are dropped
        self._faults: dict[int, ReplicaFailure] = {}  # replica -> a fault found outside its thread
        self._outbox: Outbox | None = None  # this job's shared-memory arena, when it has peers
        self._inbox: Inbox | None = None
        self._board: shared_board.Board | None = None  # this job's same-node board, when it has peers
        self._shm_report: dict[int, dict[int, int]] = {}
        self._bounds: MessageBounds | None = None  # what peers' messages may hold in the current job
        self._bounds_of: tuple[bytes, int] | None = None  # (program digest, replicas) `_bounds` is for
        # `launch`, `begin` and `finish` of consecutive jobs may run concurrently (a threaded
        # actor): they take turns on this, and `finish` waits on it for its job's launch.
        self._job_turn = threading.Condition(threading.RLock())
        self._launched: Any = None  # the token of the last launch, or ("failed", token)

    def wire_address(self, authkey: bytes, across_nodes: bool = False) -> dict[str, Any]:
        """Open (once per actor) the direct message sockets; their address for the peers. A TCP
        listener is opened only when some job spans nodes (one node: an abstract Unix socket)."""
        import ray

        if self._wire is None:
            self._wire = Wire(self._on_wire, authkey, ray.get_runtime_context().get_node_id(),
                              on_fault=self._on_wire_fault, check=self._check_frame)
        if across_nodes:
            self._wire.open_tcp(ray.util.get_node_ip_address())
        return self._wire.address

    def _check_frame(self, head: tuple, size: int) -> None:
        """Before a peer's message body is read: refuse one for no replica of this actor, or over
        what its key's collective or channel can hold (runtime/message_bounds.py)."""
        if len(head) != 4:
            raise WireError(f"a message head must be (token, dst, src, key), got {len(head)} elements")
        token, dst, src, key = head
        if token != self._token:
            return  # an earlier job's message (bounded by the frame limit): read, then dropped
        if dst not in self._mailboxes or self._bounds is None:
            raise WireError(f"replica {src!r} sent a message for replica {dst!r}, which this actor does not run")
        self._bounds.check_frame(src, key, size)

    def _on_wire(self, message: Any) -> None:
        if not (isinstance(message, tuple) and len(message) == 5):
            raise WireError(f"a message must be (token, dst, src, key, value), got {type(message).__name__}")
        token, dst, src, key, value = message
        box = self._mailboxes.get(dst)
        inbox = self._inbox
        if token != self._token:  # an earlier job's message, late: dropped
            if type(value) is Shared and inbox is not None:
                inbox.release_unread(value)
            return
        if box is None:
            if type(value) is Shared and inbox is not None:
                inbox.release_unread(value)
            raise WireError(f"a message for replica {dst!r}, which this actor does not run")
        if type(value) is Shared and inbox is not None:
            self._bounds.check_shared(src, key, value)  # before any block is mapped
            value = inbox.decode(value)
        box.deliver(src, key, value)

    def _on_wire_fault(self, error: BaseException) -> None:
        """A peer's message was refused: this actor's replicas fail, naming it (never a silent
        dead reader that leaves its sender blocked)."""
        if not self._mailboxes:
            return
        replica = min(self._mailboxes)
        detail = str(error) if isinstance(error, RefusedMessage) else f"{type(error).__name__}: {error}"
        fault = ReplicaFailure(f"replica {replica} failed: {detail}", replica, repr(error))
        self._faults.setdefault(replica, fault)
        for box in self._mailboxes.values():
            box.abort(fault)

    def setup(self, token: str, replica_ids: list[int], num_replicas: int, module_bytes: bytes, strict: bool,
              record_every_instruction: bool, custom_calls: dict[str, Any] | None = None,
              trace_events: int = DEFAULT_CAPACITY, digest: bytes | None = None) -> None:
        import hashlib

        from replicas.ops.custom_call import register_custom_call
        from replicas.runtime.cores import size_replica_process
        from replicas.runtime.replica_runner import ReplicaRunner

        # The driver's registered custom calls (never names from the program) run here too.
        for name, fn in (custom_calls or {}).items():
            register_custom_call(name, fn)

        # Every replica of the job is taken to be on this node (the safe side on one node).
        size_replica_process(num_replicas)
        digest = digest or hashlib.sha256(module_bytes).digest()
        executable = self._executables.get(digest)
        if executable is None:
            if module_bytes is None:
                raise ReplicaFailure("this actor no longer holds the program the driver sent it last", replica_ids[0])
            executable = Executable.from_bytes(module_bytes)
            self._executables = {digest: executable}  # keep the last program only
        if self._bounds_of != (digest, num_replicas):
            self._bounds = MessageBounds(executable.module, num_replicas)
            self._bounds_of = (digest, num_replicas)
        self._close_shared_memory(self._token)
        self._token = token
        self._faults = {}
        self._mailboxes = {r: Mailbox(r) for r in replica_ids}
        self._runners = {}
        self._fabrics = []
        self._shm_report = {}
        self._inbox = Inbox(token)
        if len(replica_ids) < num_replicas and shm_available():
            try:
                self._outbox = Outbox(token, replica_ids[0])
            except OSError:  # no room or no rights under /dev/shm: the sockets and the object store remain
                self._outbox = None
        if len(replica_ids) < num_replicas and shared_board.available():
            try:
                self._board = shared_board.Board(token, replica_ids)
            except OSError:  # leaders then exchange messages (every actor of a node fails alike)
                self._board = None
        for r in replica_ids:
            recorder = FlightRecorder(r, capacity=trace_events, every_instruction=record_every_instruction)
            fabric = RayFabric(r, num_replicas, self._mailboxes[r], self._mailboxes, strict=strict,
                               recorder=recorder)
            fabric.wire, fabric.token, fabric.outbox, fabric.board = self._wire, token, self._outbox, self._board
            self._fabrics.append(fabric)
            self._runners[r] = ReplicaRunner(executable, fabric, recorder)

    def reset(self, timeout: float) -> bool:
        """Stop this job's replicas; True if every one stopped within `timeout` (reusable)."""
        stopped = ReplicasError("job stopped")
        for box in self._mailboxes.values():
            box.abort(stopped)
        clean = all(runner.join(timeout) for runner in self._runners.values())
        # An actor whose replica ran out of memory may hold what it allocated: never reuse it.
        clean = clean and not any(is_memory_error(runner.error) for runner in self._runners.values())
        if self._wire is not None:
            self._wire.drop_peers()
        self._shm_report = self.shm_sent()
        for fabric in self._fabrics:
            fabric.outbox = fabric.board = None  # closed below, whatever still holds a fabric
        token = self._token
        if clean:
            self._mailboxes, self._runners, self._fabrics, self._faults = {}, {}, [], {}
            self._token = ""
        # After the job's objects are let go: the collection there frees what their cycles still map.
        self._close_shared_memory(token)
        return clean

    def _close_shared_memory(self, token: str) -> None:
        """Unlink the job's segments on this node (a dead peer's too) and unmap them."""
        used = False
        if self._outbox is not None:
            used = self._outbox.close()
        if self._inbox is not None:
            used = self._inbox.close() or used
        if self._board is not None:
            # Results never keep views of the board (`Exchange.settle` copies them): a collection
            # is needed only if a failed collective left one in a cycle.
            used = not self._board.close() or used
        remove_job_segments(token)
        self._outbox = self._inbox = self._board = None
        if used:
            # Received arrays left in the finished job's reference cycles (interpreter, kernels,
            # mailboxes) keep their mappings until the cycle collector runs: run it now, so an
            # idle pooled actor does not hold a job's shared memory.
            gc.collect()

    def shm_sent(self) -> dict[int, dict[int, int]]:
        """Per hosted replica: messages it sent through shared memory, by destination (the
        running job's, or the last job's once it was reset)."""
        return {f.replica_id: dict(f.shm_sent) for f in self._fabrics} or self._shm_report

    def ping(self) -> bool:
        return True

    def object_refs(self) -> list[str]:
        """The Ray objects this actor process holds a reference to (for leak checks: an idle pooled
        actor holds none of a finished job's)."""
        import ray

        return list(ray._private.worker.global_worker.core_worker.get_all_reference_counts())  # noqa: SLF001

    def connect(self, routes: dict[int, Any], wire_routes: dict[int, dict[str, Any]],
                placement: list[int] | None = None) -> None:
        node = self._wire.address["node"] if self._wire is not None else None
        same_node = frozenset(r for r, address in wire_routes.items() if address["node"] == node)
        for fabric in self._fabrics:
            fabric.routes = routes
            fabric.wire_routes = wire_routes
            fabric.same_node = same_node
            if placement is not None:
                fabric.placement = placement
        if self._board is not None and placement is not None:
            self._board.locate(placement)

    def start(self, args: dict[int, list[Any]]) -> None:
        for r, a in args.items():
            self._runners[r].start(a)

    def launch(self, call: tuple) -> Any:
        """`setup`, `connect` and (with `args`) `begin` in one call. The program travels only when
        this actor does not hold it (`module_bytes` None: the one of `digest`); a previous job
        still here (a `finish` still deciding) is reset first. A job of several actors begins
        in a second call, once every actor is set up: a peer's message must find its mailbox.

        `call` is (token, replica_ids, num_replicas, digest, module_bytes, setup options, routes,
        wire_routes, placement, args, finish_within), in one argument (Ray serializes each argument
        of a call on its own)."""
        import ray

        (token, replica_ids, num_replicas, digest, module_bytes, options, routes, wire_routes, placement, args,
         finish_within) = call
        if isinstance(module_bytes, ray.ObjectRef):  # inside a tuple Ray does not resolve it
            module_bytes = ray.get(module_bytes)
        with self._job_turn:
            try:
                if self._token:
                    self.reset(_STOP_SECONDS)
                self.setup(token, replica_ids, num_replicas, module_bytes, digest=digest, **options)
                self.connect(routes, wire_routes, placement)
            except BaseException:
                self._launched = ("failed", token)
                self._job_turn.notify_all()
                raise
        return None if args is None else self.begin(token, args, finish_within)

    def begin(self, token: str, args: dict[int, list[Any]], finish_within: float | None = None) -> Any:
        """Start the replicas of job `token` (set up by `launch`); with `finish_within`, then `finish`
        (the whole of a short job in one reply)."""
        with self._job_turn:
            try:
                if self._token != token:
                    raise ReplicaFailure(f"actor of replica {min(args)} is not set up for this job", min(args))
                self.start(args)
                self._launched = token
            except BaseException:
                self._launched = ("failed", token)
                raise
            finally:
                self._job_turn.notify_all()
        return None if finish_within is None else self.finish(token, finish_within)

    def finish(self, token: str, timeout: float) -> tuple[dict[int, Any], bytes, dict[int, Any]] | None:
        """When every hosted replica of job `token` finished within `timeout` s: (results, events,
        host values nobody read) in one reply, and an actor that hosts the whole job is reset (no
        peer can need it any more). None when one failed, was cancelled or is still running: the
        driver's monitor takes over (states, results, reset as for any job)."""
        deadline = time.monotonic() + timeout
        with self._job_turn:
            if not self._job_turn.wait_for(lambda: self._launched in (token, ("failed", token)), timeout):
                return None
            if self._launched != token:
                return None
            runners = list(self._runners.values())
        for runner in runners:
            if not runner.join(max(0.0, deadline - time.monotonic())) or runner.error is not None:
                return None
        with self._job_turn:
            if self._token != token or self._faults:
                return None
            outcome = self.results(), self.events(), self.drain()
            if len(self._runners) == self._fabrics[0].num_replicas:
                self.reset(_STOP_SECONDS)
            return outcome

    def deliver(self, token: str, dst: int, src: int, key: Hashable, value: Any) -> None:
        box = self._mailboxes.get(dst)
        if token == self._token and box is not None:
            if src != HOST:  # a peer's message through the object store: judged like the wire's
                try:
                    self._bounds.check_payload(src, key, value)
                except WireError as e:
                    self._on_wire_fault(RefusedMessage(f"replica {src!r}'s actor (through the object store)", e))
                    return
            box.deliver(src, key, value)

    def states(self) -> list[ReplicaState]:
        import ray

        node = ray.get_runtime_context().get_node_id()
        out = []
        for r, runner in self._runners.items():
            state = runner.state()
            state.node = node
            fault = self._faults.get(r)
            if fault is not None:
                state.status, state.error = "failed", str(fault)
            out.append(state)
        return out

    def results(self) -> dict[int, Any]:
        return {r: runner.result for r, runner in self._runners.items()}

    def errors(self) -> dict[int, BaseException]:
        out: dict[int, BaseException] = dict(self._faults)
        for r, runner in self._runners.items():
            e = runner.own_error()
            if e is not None:
                out[r] = e if _picklable(e) else ReplicaFailure(f"replica {r} failed: {type(e).__name__}: {e}", r,
                                                                repr(e))
        return out

    def abort(self, exc: BaseException) -> None:
        for box in self._mailboxes.values():
            box.abort(exc)

    def outfeed(self, replica: int, timeout: float | None) -> Any:
        return self._mailboxes[replica].get_outfeed(timeout)

    def from_channel(self, replica: int, channel_id: int, timeout: float | None) -> Any:
        return self._mailboxes[replica].get_from_channel(channel_id, timeout)

    def events(self) -> bytes:
        """The hosted replicas' flight recorders, pickled here: Ray would send dicts and lists as
        msgpack, which repeats every shared object (each collective event's group and fingerprint,
        1024 ids at N=1024: 1.4 GB in the driver for 12k events); one pickle keeps one copy."""
        import pickle

        return pickle.dumps({r: runner.recorder.events() for r, runner in self._runners.items()},
                            protocol=pickle.HIGHEST_PROTOCOL)

    def drain(self) -> dict[int, tuple[list[Any], dict[int, list[Any]]]]:
        """Take every value the replicas wrote to the host and nobody read yet."""
        return {r: box.drain_host() for r, box in self._mailboxes.items()}

    def wait(self, timeout: float) -> bool:
        """True once every hosted replica has stopped (finished, failed or cancelled)."""
        for runner in self._runners.values():
            if not runner.join(timeout):
                return False
        return True


def _picklable(e: BaseException) -> bool:
    import pickle

    try:
        pickle.dumps(e)
        return True
    except Exception:  # noqa: BLE001
        return False


_STOP_SECONDS = 2.0  # how long a reset waits for a job's replicas to stop (as `ActorPool.release`)
_actor_class = None


def _remote_host_class() -> Any:
    global _actor_class
    if _actor_class is None:
        import ray

        remove_orphaned_segments()  # once per driver: what a killed driver's jobs left on this node
        _actor_class = ray.remote(ReplicaHost)
    return _actor_class


POOL = ActorPool(_remote_host_class)


class RayBackend:
    """Runs the replicas in Ray actors (see `Backend` in job.py)."""

    # Each poll is two actor tasks per actor; deadlocks need two equal snapshots, so this still
    # reports them well within 2 s, and completion is noticed at once (wait returns early).
    poll_interval = 0.2

    def __init__(self, executable: Executable, args: list[list[Any]], *, address: str | None = None,
                 strict: bool = True, record_every_instruction: bool = False, replicas_per_actor: int = 0,
                 resources: list[dict[str, float]] | None = None, num_cpus: float = 0,
                 timeout: float | None = None, trace_events: int = DEFAULT_CAPACITY, run_to_end: bool = False
                 ) -> None:
        """`run_to_end`: nothing but `completed` is called first (no host feeds): a warm job
        launches and reports its end in one call per actor."""
        import ray

        ensure_ray(address)
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
                                    custom_calls=registered_custom_calls() or None, trace_events=trace_events)
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
            addresses = [_KNOWN.get(a._actor_id, {}).get("address") for a in self._actors]
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
            _KNOWN[actor._actor_id] = {"address": address}
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
        known = [_KNOWN.setdefault(a._actor_id, {}) for a in self._actors]
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
                                             {r: self._args[r] for r in ids} if alone else None, finish_within)))
        self._launch_refs = refs
        self.calls["launch"] += len(refs)
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
                _KNOWN.get(actor._actor_id, {}).pop("program", None)
            self._launch_error = e if isinstance(e, ReplicasError) else _unwrap(e)
            raise self._launch_error from None

    def _relaunch(self, died: list[int]) -> None:
        live = [i for i in range(len(self._actors)) if i not in died]
        resets = [self._actors[i].reset.remote(_STOP_SECONDS) for i in live]
        self.calls["reset"] += len(resets)
        self._ray.wait(resets, num_returns=len(resets), timeout=_STOP_SECONDS + 5)
        POOL.discard([self._actors[i] for i in died])
        for i in died:
            _KNOWN.pop(self._actors[i]._actor_id, None)
            self._actors[i] = POOL.fresh(self._options[i])
            for r in self._groups[i]:
                self._actor_of[r] = self._actors[i]
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
        for states in self._get([a.states.remote() for a in self._actors]):
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
        remove_job_segments(self._token)  # what killed actors of this node left behind

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
            for part in self._ray.get([a.events.remote() for a in self._actors], timeout=10):
                merged.update(pickle.loads(part))  # noqa: S301 - our own actors' bytes
        except Exception:  # noqa: BLE001 - events are a best-effort addition to a report
            pass
        return merged


# Per actor (by Ray's actor id): its wire address, and the digest of the program it holds. A warm
# job sends neither the address request nor the program again.
_KNOWN: dict[Any, dict[str, Any]] = {}


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
    """One replica per actor until there are more than twice the cluster's CPUs; then pack."""
    import math

    import ray

    if resources is not None or num_replicas <= 2:
        return 1  # placement was chosen replica by replica; or one actor each on any cluster
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    limit = 2 * cpus
    return 1 if num_replicas <= limit else math.ceil(num_replicas / limit)


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
