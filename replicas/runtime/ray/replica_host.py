"""The body of a replica actor under Ray: `ReplicaHost` hosts one replica (or several, packed),
their mailboxes and this job's data paths; `RayFabric` (runtime/ray/ray_fabric.py) chooses the path
per peer pair.

Replicas of one actor share its mailboxes; a peer on the same node gets collective rounds through
the board (transport/board.py), Send/Recv messages through the channel rings (transport/channel_ring.py)
and other large arrays through this job's shared memory (transport/shm.py: the bytes go into the
sender's arena, a descriptor over the socket); small messages, and any to
other nodes up to the wire's frame size, go over the direct sockets (transport/wire.py); the rest is
a `deliver` call on the peer's actor through Ray's object store. `RayBackend`
(runtime/ray/backend.py) drives these actors from the driver.
"""

from __future__ import annotations

import gc
import hashlib
import threading
import time
from collections.abc import Hashable
from typing import Any

from replicas.diagnostics import host_output
from replicas.diagnostics.recorder import DEFAULT_CAPACITY, FlightRecorder
from replicas.errors import ReplicaFailure, ReplicasError
from replicas.records import HOST
from replicas.runtime.compile import Executable, runs_bounded_alone
from replicas.runtime.ray import give_back, parking, reaper, state_columns
from replicas.runtime.ray.faults import is_memory_error
from replicas.runtime.ray.persistent_host import PersistentCalls
from replicas.runtime.ray.ray_fabric import RayFabric
from replicas.transport import board as shared_board
from replicas.transport import channel_ring, futex, spin, where
from replicas.transport.fabric import SharedMemoryLink
from replicas.transport.mailbox import Mailbox
from replicas.transport.message_bounds import MessageBounds
from replicas.transport.shm import PREFIX, SHM_DIR, Inbox, Outbox, Shared, remove_job_segments
from replicas.transport.shm import available as shm_available
from replicas.transport.wire import RefusedMessage, Wire, WireError

# How long a reset waits for a job's replicas to stop (as `ActorPool.release`).
STOP_SECONDS = 2.0


class ReplicaHost(PersistentCalls):
    """The body of a replica actor. Actors are pooled: `setup` gives one the replicas
    `replica_ids` of a new job, `reset` returns it to the pool once they have all stopped. A
    persistent job's replicas run again for each `call` (persistent_host.py)."""

    def __init__(self) -> None:
        host_output.collect()  # what callbacks print goes to the driver (`printed`), not to this log
        parking.install()  # (this runs in the actor's main thread, which alone takes signals)
        where.publish_here()  # this process's interpreters publish where they are (transport/where.py)
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
        self._rings: channel_ring.ChannelRings | None = None  # this job's channel rings, when it has peers
        self._ring_report: dict[int, dict[int, int]] = {}
        self._shm_report: dict[int, dict[int, int]] = {}
        self._bounds: MessageBounds | None = None  # what peers' messages may hold in the current job
        self._bounds_of: tuple[bytes, int] | None = None  # (program digest, replicas) `_bounds` is for
        # `launch`, `begin` and `finish` of consecutive jobs may run concurrently (a threaded
        # actor): they take turns on this, and `finish` waits on it for its job's launch.
        self._job_turn = threading.Condition(threading.RLock())
        self._launched: Any = None  # the token of the last launch, or ("failed", token)
        self._kept = {}
        self._programs: list[tuple[dict[int, Any], bool]] = []
        self._peer_where: where.Watches | None = None  # the job's other actors on this node, across nodes

    def wire_address(self, authkey: bytes, across_nodes: bool = False) -> dict[str, Any]:
        """Open (once per actor) the direct message sockets; their address for the peers. A TCP
        listener is opened only when some job spans nodes (one node: an abstract Unix socket)."""
        import ray

        if self._wire is None:
            self._wire = Wire(self._on_wire, authkey, ray.get_runtime_context().get_node_id(),
                              on_fault=self._on_wire_fault, check=self._check_frame)
        if across_nodes:
            self._wire.open_tcp(ray.util.get_node_ip_address())
        # Beside the sockets: where the driver of this node maps this process's published whereabouts.
        return dict(self._wire.address, where=where.address())

    def _check_frame(self, head: tuple, size: int) -> None:
        """Before a peer's message body is read: refuse one for no replica of this actor, or over
        what its key's collective or channel can hold (transport/message_bounds.py)."""
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
        self._ring_doorbell(dst, key)

    def _ring_doorbell(self, dst: int, key: Hashable) -> None:
        """A channel message came by a socket or the object store: its replica may be waiting on its
        doorbell (transport/channel_ring.py) rather than on its mailbox."""
        rings = self._rings
        if rings is not None and channel_ring.is_channel_key(key):
            rings.ring_doorbell(dst)

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
              trace_events: int = DEFAULT_CAPACITY, digest: bytes | None = None, persistent: bool = False,
              placement: list[int] | None = None) -> None:

        from replicas.ops.custom_call import register_custom_call
        from replicas.tuning.cores import size_replica_process

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
        self._kept = {}
        self._mailboxes = {r: Mailbox(r) for r in replica_ids}
        self._runners = {}
        self._fabrics = []
        self._shm_report = {}
        self._inbox = Inbox(token)
        if len(replica_ids) < num_replicas:
            # This process's own reaper unlinks the job's segments on this node if the process dies
            # without doing so (killed with its driver, which may be on another node).
            if reaper.lease(SHM_DIR, PREFIX, detached=True) is not None:
                reaper.job_started(token)
        if len(replica_ids) < num_replicas and shm_available():
            try:
                self._outbox = Outbox(token, replica_ids[0])
            except OSError:  # no room or no rights under /dev/shm: the sockets and the object store remain
                self._outbox = None
        if len(replica_ids) < num_replicas and futex.available():
            try:
                self._board = shared_board.Board(token, replica_ids)
            except OSError:  # leaders then exchange messages (every actor of a node fails alike)
                self._board = None
        # One placement list for every fabric (`connect` sets the job's; a list per replica is
        # O(N) each: thousands of replicas of an actor would hold O(N^2) of them).
        placement = placement if placement is not None else [0] * num_replicas
        for r in replica_ids:
            recorder = FlightRecorder(r, capacity=trace_events, every_instruction=record_every_instruction)
            fabric = RayFabric(r, num_replicas, self._mailboxes[r], self._mailboxes, strict=strict,
                               recorder=recorder, placement=placement)
            fabric.wire, fabric.token = self._wire, token
            fabric.shared = SharedMemoryLink(self._board, self._outbox, self._inbox, spinner=spin.NEVER,
                                             count=fabric.count_shm)
            self._fabrics.append(fabric)
        self._runners = self.runners_of(executable, persistent)
        for r, runner in self._runners.items():
            where.claim(runner.interpreter.where, token, r)
        self._inline_all = persistent and runs_bounded_alone(executable)  # persistent_host.py
        self._programs = [(self._runners, self._inline_all)]  # a persistent job's programs (persistent_host.py)
        self._program = 0
        here = {f.replica_id: f for f in self._fabrics}
        for fabric in self._fabrics:
            fabric.here = here

    def runners_of(self, executable: Executable, persistent: bool) -> dict[int, Any]:
        """A runner of `executable` for each hosted replica, on the job's fabrics."""
        from replicas.runtime.replica_runner import ReplicaRunner

        runners = {}
        for fabric in self._fabrics:
            runner = runners[fabric.replica_id] = ReplicaRunner(executable, fabric, fabric.recorder)
            runner.persistent = persistent
        return runners

    def reset(self, timeout: float) -> bool:
        """Stop this job's replicas; True if every one stopped within `timeout` (reusable)."""
        stopped = ReplicasError("job stopped")
        hosted = len(self._runners)
        for box in self._mailboxes.values():
            box.abort(stopped)
        clean = all(runner.join(timeout) for runner in self._runners.values())
        every = [runner for runners, _ in self._programs for runner in runners.values()] or self._runners.values()
        for runner in every:  # a persistent job's parked threads end (the other programs' are idle)
            runner.stop()
        # An actor whose replica ran out of memory may hold what it allocated: never reuse it.
        clean = clean and not any(is_memory_error(runner.error) for runner in every)
        if self._wire is not None:
            self._wire.drop_peers()
        self._shm_report = self.shm_sent()
        self._ring_report = self.ring_declined()
        for fabric in self._fabrics:
            fabric.shared = fabric.rings = None  # closed below, whoever holds them
        token = self._token
        self._kept = {}
        self.close_doorbell()
        self._programs = []
        if clean:
            self._mailboxes, self._runners, self._fabrics, self._faults = {}, {}, [], {}
            self._token = ""
        # After the job's objects are let go: the collection there frees what their cycles still map.
        self._close_shared_memory(token)
        if clean:
            give_back.after_job(hosted)
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
        if self._rings is not None:
            self._rings.close()  # values read from a ring were copied out: nothing keeps a view
        remove_job_segments(token)
        if token:
            reaper.job_ended(token)
        self._outbox = self._inbox = self._board = self._rings = None
        if used:
            # Received arrays left in the finished job's reference cycles (interpreter, kernels,
            # mailboxes) keep their mappings until the cycle collector runs: run it now, so an
            # idle pooled actor does not hold a job's shared memory.
            gc.collect()

    def shm_sent(self) -> dict[int, dict[int, int]]:
        """Per hosted replica: messages it sent through shared memory, by destination (the
        running job's, or the last job's once it was reset)."""
        return {f.replica_id: dict(f.shm_sent) for f in self._fabrics} or self._shm_report

    def ring_declined(self) -> dict[int, dict[int, int]]:
        """Per hosted replica: channel messages to this node's other actors that a ring could not take
        (they went by the socket or the arena), by destination; the last job's once it was reset."""
        return {f.replica_id: dict(f.ring_declined) for f in self._fabrics} or self._ring_report

    def where_of(self, token: str, replicas: list[int]) -> dict[int, int]:
        """What the job's other actors of this node published for `replicas` (transport/where.py):
        the driver asks when one of them died on a node other than its own."""
        watches = self._peer_where
        return {} if watches is None else watches.codes_of(token, replicas)

    def ping(self) -> bool:
        return True

    def heard(self) -> dict[str, float]:
        """Seconds since this actor's wire last read bytes from each other host (cluster/liveness.py)."""
        return {} if self._wire is None else self._wire.heard()

    def printed(self) -> list[tuple[int, str]]:
        """What this actor's replicas printed (host callbacks) since the last call, for the driver's
        stdout: (replica, its lines), in the order printed."""
        return host_output.take()

    def object_refs(self) -> list[str]:
        """The Ray objects this actor process holds a reference to (for leak checks: an idle pooled
        actor holds none of a finished job's)."""
        import ray

        return list(ray._private.worker.global_worker.core_worker.get_all_reference_counts())  # noqa: SLF001

    def connect(self, routes: dict[int, Any], wire_routes: dict[int, dict[str, Any]],
                placement: list[int] | None = None) -> None:
        node = self._wire.address["node"] if self._wire is not None else None
        same_node = frozenset(r for r, address in wire_routes.items() if address["node"] == node)
        # The job's processes on this node: when each can have a core, waits on shared memory spin first.
        processes = len({placement[r] for r in same_node}) if placement is not None else 0
        nodes = _nodes_of(wire_routes, len(placement)) if placement is not None else None
        budget = spin.budget_for(processes) if processes > 1 else 0.0
        for fabric in self._fabrics:
            if fabric.shared is not None:
                fabric.shared.spinner = spin.Spinner(budget) if budget else spin.NEVER
                fabric.shared.same_node = same_node
            fabric.routes = routes
            fabric.wire_routes = wire_routes
            if placement is not None:
                fabric.placement = placement
                fabric.nodes = nodes
        # The driver is not on every node: the survivors here name what a dead peer was executing.
        self._peer_where = None if nodes is None else where.Watches(
            [a.get("where") for r, a in wire_routes.items() if r in same_node and r not in self._mailboxes])
        if self._board is not None and placement is not None:
            self._board.locate(placement)
        if placement is not None and self._fabrics:
            self._open_rings(placement, same_node)

    def _open_rings(self, placement: list[int], same_node: frozenset[int]) -> None:
        """This actor's channel rings, when the program has channels and another actor of the job is
        on this node (transport/channel_ring.py); the sockets and the arena remain without them."""
        me = placement[min(self._mailboxes)]
        if (self._rings is not None or not self._bounds.acknowledged or not channel_ring.available()
                or all(placement[r] == me for r in same_node)):
            return
        try:
            rings = channel_ring.ChannelRings(self._token, sorted(self._mailboxes), placement, same_node,
                                              self._bounds, self._mailboxes, self._on_wire_fault, self._inbox)
        except OSError:  # no room or no rights under /dev/shm
            return
        self._rings = rings
        for fabric in self._fabrics:
            fabric.rings = rings

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
                    self.reset(STOP_SECONDS)
                self.setup(token, replica_ids, num_replicas, module_bytes, digest=digest, placement=placement,
                           **options)
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
                self.reset(STOP_SECONDS)
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
            self._ring_doorbell(dst, key)

    def states(self) -> tuple:
        """The hosted replicas' states, as columns (state_columns.py: `decode` gives the list)."""
        import ray

        if self._rings is not None:
            self._rings.drain()  # what waits in a ring is delivered: in flight until this poll, no longer
        node = ray.get_runtime_context().get_node_id()
        out = []
        for r, runner in self._runners.items():
            state = runner.state()
            state.node = node
            fault = self._faults.get(r)
            if fault is not None:
                state.status, state.error = "failed", str(fault)
            out.append(state)
        return state_columns.encode(out)

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
        msgpack, which repeats every shared object (each collective event's group and fingerprint:
        a copy of a large group per event); one pickle keeps one copy."""
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


def _nodes_of(wire_routes: dict[int, dict[str, Any]], num_replicas: int) -> list[int] | None:
    """Replica -> its node (numbered by first replica), or None when the job is on one node (or a
    replica has no route): collectives/topology.py."""
    numbers: dict[Any, int] = {}
    nodes = []
    for r in range(num_replicas):
        address = wire_routes.get(r)
        if address is None:
            return None
        nodes.append(numbers.setdefault(address["node"], len(numbers)))
    return nodes if len(numbers) > 1 else None
