"""The fabric: everything a replica's interpreter exchanges with peers and the host.

`Fabric` is the contract kernels, collectives and channels are written against (a
`typing.Protocol`: they never import a transport). `MailboxFabric` implements it over the
replica's `Mailbox`; transports differ only in `_post(dst, key, value)` (how a message reaches
a peer's mailbox): `LocalFabric` (one replica), `ThreadFabric` (replicas as threads of one
process) and `RayFabric` (replicas in actors). Message keys come from `replicas.transport.keys`.

`placement[r]` is the process hosting replica r (0 for every thread of the threads backend,
the actor's index under Ray): collectives meet in-process first and cross processes once.
`nodes[r]` is the node (host) of replica r, or None where every replica is on one node: across
nodes, a node's processes meet first and only one of them talks to each other node.
`shared` is the replica's link to the job's other processes on its node through shared memory
(`SharedMemoryLink`: the board, the arenas, the spinner of its waits), or None where there is
none (threads, one replica, an actor without peers on its node); collectives take the faster
same-node paths through it and fall back to messages without it.

`FabricSlot` is what an interpreter's kernels hold: it forwards to the fabric of the job the
interpreter currently runs in, so a pooled interpreter runs its next job without binding again.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

from replicas.records import HOST, BlockInfo
from replicas.transport import keys
from replicas.transport.mailbox import Mailbox

if TYPE_CHECKING:
    from replicas.diagnostics.recorder import FlightRecorder
    from replicas.transport.board import Board
    from replicas.transport.shm import Inbox, Outbox
    from replicas.transport.spin import Spinner


def _uncounted(writer: int, dst: int) -> None:
    pass


@dataclass(eq=False)
class SharedMemoryLink:
    """One replica's shared memory with the job's other actors on its node (`RayFabric` makes it when
    the job starts; a part that could not be opened is None, and its paths fall back to messages)."""

    board: Board | None = None  # the same-node board its actor shares with the node's other actors
    outbox: Outbox | None = None  # its actor's arena: results leased from it go to peers in place
    inbox: Inbox | None = None  # its actor's mappings of the peers' arenas (leased results read in place)
    same_node: frozenset[int] = frozenset()  # the replicas whose actors run on this node
    spinner: Spinner | None = None  # how its waits on shared memory spin before they sleep
    # Counts a message `writer` (a replica of this actor: a collective's acting leader may write for
    # another member) sent `dst` through shared memory (tests and reports read the counts).
    count: Callable[[int, int], None] = _uncounted


class Fabric(Protocol):
    """What one replica's kernels may use: peers, the host, and a per-replica state slot."""

    replica_id: int
    num_replicas: int
    strict: bool  # collective matching compares instruction identity too
    recorder: FlightRecorder | None
    mailbox: Mailbox | None  # None: a replica that cannot wait (`threads.run_alone`)
    # State kernels keep on this replica between instructions (a Send's posted messages until its
    # SendDone), by the owning module's name: kernels are bound per replica, but their state must
    # outlive one kernel call and belong to the replica, not to a module-level table.
    kernel_state: dict[str, Any]
    placement: Sequence[int]  # replica -> the process hosting it
    nodes: Sequence[int] | None  # replica -> its node; None: one node
    shared: SharedMemoryLink | None  # the same-node shared memory, where the transport has it

    def next_seq(self, counter: Hashable) -> int: ...
    def next_collective(self) -> int: ...
    def next_collectives(self, count: int) -> int: ...
    def collectives_started(self) -> int: ...
    def send(self, dst: int, key: Hashable, value: Any) -> None: ...
    def send_counted(self, dst: int, key: Hashable, value: Any) -> None: ...
    def recv(self, src: int, key: Hashable, block: BlockInfo) -> Any: ...
    def recv_all(self, wanted: list[tuple[int, Hashable]], block: BlockInfo) -> list[Any]: ...
    def poll(self, src: int, key: Hashable) -> bool: ...
    def infeed(self, block: BlockInfo) -> Any: ...
    def outfeed(self, value: Any) -> None: ...
    def to_host(self, channel_id: int, value: Any) -> None: ...
    def from_host(self, channel_id: int, block: BlockInfo) -> Any: ...
    def check_abort(self) -> None: ...
    def local_mailbox(self, replica: int) -> Mailbox | None: ...


class MailboxFabric:
    """`Fabric` over the replica's mailbox. Subclasses implement `_post(dst, key, value)`."""

    shared: SharedMemoryLink | None = None  # `RayFabric` sets it for a job's actors
    nodes: Sequence[int] | None = None  # `RayFabric` sets it for a job spanning nodes

    def __init__(self, replica_id: int, num_replicas: int, mailbox: Mailbox | None = None, *,
                 strict: bool = True, recorder: FlightRecorder | None = None,
                 placement: Sequence[int] | None = None) -> None:
        self.replica_id = replica_id
        self.num_replicas = num_replicas
        self.mailbox = mailbox if mailbox is not None else Mailbox(replica_id)
        self.strict = strict
        self.recorder = recorder
        self.kernel_state: dict[str, Any] = {}
        self.placement: Sequence[int] = placement if placement is not None else [0] * num_replicas
        self._counters: dict[Hashable, int] = {}
        self._collectives = 0

    # -- sequence numbers (collective #k, channel message #k) ------------------------------------
    def next_seq(self, counter: Hashable) -> int:
        n = self._counters.get(counter, 0)
        self._counters[counter] = n + 1
        return n

    def next_collective(self) -> int:
        n = self._collectives
        self._collectives = n + 1
        return n

    def next_collectives(self, count: int) -> int:
        """Number `count` collectives at once (a batched run's, recorded after it ran): the first's number."""
        n = self._collectives
        self._collectives = n + count
        return n

    def collectives_started(self) -> int:
        return self._collectives

    # -- point to point ---------------------------------------------------------------------------
    def send(self, dst: int, key: Hashable, value: Any) -> None:
        """Post `value` to replica `dst` under `key`. Never blocks."""
        self.mailbox.count_sent()  # before the post: the monitor never sees it received but not sent
        if dst == self.replica_id:
            self.mailbox.deliver(self.replica_id, key, value)
        else:
            self._post(dst, key, value)

    def send_counted(self, dst: int, key: Hashable, value: Any) -> None:
        """`send` from another thread than the replica's (a stream's sender), the message counted
        already (`mailbox.count_sent`, in the replica's thread: only it counts)."""
        if dst == self.replica_id:
            self.mailbox.deliver(self.replica_id, key, value)
        else:
            self._post(dst, key, value)

    def recv(self, src: int, key: Hashable, block: BlockInfo) -> Any:
        """Wait for the message (src, key); `block` is published while waiting."""
        return self.mailbox.take(src, key, block)

    def recv_all(self, wanted: list[tuple[int, Hashable]], block: BlockInfo) -> list[Any]:
        """Wait for every (src, key) in `wanted`; return the values in that order."""
        return self.mailbox.take_all(wanted, block)

    def poll(self, src: int, key: Hashable) -> bool:
        return self.mailbox.poll(src, key)

    def _post(self, dst: int, key: Hashable, value: Any) -> None:
        raise NotImplementedError

    def local_mailbox(self, replica: int) -> Mailbox | None:
        """The mailbox of `replica` if it runs in this process (collectives meet in-process on it:
        collectives/exchange.py), else None. A transport without such access returns None, and its
        collectives keep a fixed leader."""
        return None

    # -- host -------------------------------------------------------------------------------------
    def infeed(self, block: BlockInfo) -> Any:
        """The next value the host queued for this replica's infeed."""
        seq = self.next_seq(keys.INFEED)
        block.seq = seq
        block.waits_for = (HOST,)
        return self.mailbox.take(HOST, keys.infeed(seq), block)

    def outfeed(self, value: Any) -> None:
        self.mailbox.put_outfeed(value)

    def to_host(self, channel_id: int, value: Any) -> None:
        """A Send with is_host_transfer=true."""
        self.mailbox.put_to_host(channel_id, value)

    def from_host(self, channel_id: int, block: BlockInfo) -> Any:
        """A Recv with is_host_transfer=true: the next value the host sent on `channel_id`."""
        seq = self.next_seq((keys.HOST_TRANSFER, channel_id))
        block.seq = seq
        block.waits_for = (HOST,)
        return self.mailbox.take(HOST, keys.host_transfer(channel_id, seq), block)

    def check_abort(self) -> None:
        self.mailbox.check_abort()


class LocalFabric(MailboxFabric):
    """One replica alone; host feeds can be preloaded."""

    def __init__(self, replica_id: int = 0, num_replicas: int = 1, infeed: list[Any] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(replica_id, num_replicas, **kwargs)
        for i, value in enumerate(infeed or []):
            self.mailbox.deliver(HOST, keys.infeed(i), value)

    def _post(self, dst: int, key: Hashable, value: Any) -> None:
        raise RuntimeError(f"replica {self.replica_id} has no peer {dst} in a one-replica run")


class FabricSlot:
    """Forwards every attribute to the fabric of the job an interpreter currently runs in
    (`current`; a kernel that reads many attributes per call reads `current` once). It takes no weak
    references, so nothing can key per-job state on the slot instead of the fabric."""

    __slots__ = ("current",)

    def __init__(self, fabric: Fabric | None) -> None:
        object.__setattr__(self, "current", fabric)

    def attach(self, fabric: Fabric | None) -> None:
        object.__setattr__(self, "current", fabric)

    def as_fabric(self) -> Fabric:
        """This slot, typed as the fabric it forwards to."""
        return cast("Fabric", self)

    def __getattr__(self, name: str) -> Any:
        return getattr(object.__getattribute__(self, "current"), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(object.__getattribute__(self, "current"), name, value)


def current_fabric(fabric: Fabric) -> Fabric:
    """The fabric itself when `fabric` is an interpreter's `FabricSlot` (whose every attribute read
    is a forwarding call), else `fabric`."""
    return fabric.current if type(fabric) is FabricSlot else fabric  # type: ignore[attr-defined]
