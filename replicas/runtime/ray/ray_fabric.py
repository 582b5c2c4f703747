"""`RayFabric`: a replica actor's fabric, which chooses the path per peer pair: the board for a
same-node peer's collective rounds, the channel rings for its Send/Recv messages, this job's shared
memory for its other large arrays, the direct sockets for small messages and other nodes, Ray's
object store for the rest (the paths are described in `replica_host.py`, whose `ReplicaHost` makes
one per hosted replica)."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from replicas.transport import channel_ring, spin
from replicas.transport.fabric import MailboxFabric, SharedMemoryLink
from replicas.transport.mailbox import Mailbox
from replicas.transport.wire import WIRE_MAX_BYTES, Wire, payload_bytes


class RayFabric(MailboxFabric):
    def __init__(self, replica_id: int, num_replicas: int, mailbox: Mailbox,
                 local: dict[int, Mailbox], **kwargs: Any) -> None:
        super().__init__(replica_id, num_replicas, mailbox, **kwargs)
        self._local = local
        self.routes: dict[int, Any] = {}  # replica -> its actor (large messages, via the object store)
        self.wire: Wire | None = None
        self.wire_routes: dict[int, dict[str, Any]] = {}  # replica -> its actor's wire address
        self.token = ""
        self.shm_sent: dict[int, int] = {}  # dst -> messages sent through shared memory
        self.rings: channel_ring.ChannelRings | None = None  # channel messages to this node's other actors
        self.ring_declined: dict[int, int] = {}  # dst -> channel messages a ring could not take
        # The board, arenas, same-node replicas and spinner: set per job by `setup` and `connect`.
        self.shared: SharedMemoryLink | None = None
        self.here: dict[int, RayFabric] = {}  # the fabrics of this actor's replicas (set by `setup`)

    def local_mailbox(self, replica: int) -> Mailbox | None:
        return self._local.get(replica)

    def count_shm(self, writer: int, dst: int) -> None:
        """Count a message `writer` (a replica of this actor; its collective's acting leader may be
        another one: collectives/hierarchy.py) sent `dst` through shared memory."""
        sent = self.shm_sent if writer == self.replica_id else self.here[writer].shm_sent
        sent[dst] = sent.get(dst, 0) + 1

    def send(self, dst: int, key: Hashable, value: Any) -> None:
        """`MailboxFabric.send`, a channel message to another actor of this node written into its ring
        without the calls between (a ping-pong's every message), an acknowledgement as a word there."""
        rings = self.rings
        if rings is not None and dst in rings.peers and type(key) is tuple and key[0] in channel_ring.CHANNEL_KINDS:
            if value is True and rings.post_ack(dst, self.replica_id, key, value):  # never in flight: not counted
                self.shm_sent[dst] = self.shm_sent.get(dst, 0) + 1
                return
            self.mailbox.count_sent()  # before the post: the monitor never sees it received but not sent
            shared = self.shared
            if not rings.send(dst, self.replica_id, key, value, shared.outbox if shared is not None else None):
                self.ring_declined[dst] = self.ring_declined.get(dst, 0) + 1
                self._post_otherwise(dst, key, value, True)
                return
            self.shm_sent[dst] = self.shm_sent.get(dst, 0) + 1
            return
        self.mailbox.count_sent()
        if dst == self.replica_id:
            self.mailbox.deliver(dst, key, value)
        else:
            self._post(dst, key, value)

    def recv(self, src: int, key: Hashable, block: Any) -> Any:
        rings = self.rings
        if rings is not None and src in rings.peers and type(key) is tuple and key[0] in channel_ring.CHANNEL_KINDS:
            return rings.take(self.replica_id, src, key, self.mailbox, block, self._spinner())
        return self.mailbox.take(src, key, block)

    def recv_all(self, wanted: list[tuple[int, Hashable]], block: Any) -> list[Any]:
        rings = self.rings
        if rings is not None and any(src in rings.peers and channel_ring.is_channel_key(key) for src, key in wanted):
            return rings.take_all(self.replica_id, wanted, self.mailbox, block, self._spinner())
        return self.mailbox.take_all(wanted, block)

    def _spinner(self) -> spin.Spinner:
        shared = self.shared
        return shared.spinner if shared is not None and shared.spinner is not None else spin.NEVER

    def _post_to_ring(self, rings: channel_ring.ChannelRings, dst: int, key: Hashable, value: Any) -> None:
        shared = self.shared
        if rings.send(dst, self.replica_id, key, value, shared.outbox if shared is not None else None):
            self.shm_sent[dst] = self.shm_sent.get(dst, 0) + 1
        else:
            self.ring_declined[dst] = self.ring_declined.get(dst, 0) + 1
            self._post_otherwise(dst, key, value, True)

    def _post(self, dst: int, key: Hashable, value: Any) -> None:
        rings = self.rings
        channel = rings is not None and channel_ring.is_channel_key(key)
        if channel and dst in rings.peers:
            self._post_to_ring(rings, dst, key, value)
        else:
            self._post_otherwise(dst, key, value, channel)

    def _post_otherwise(self, dst: int, key: Hashable, value: Any, channel: bool) -> None:
        """Post by the paths other than a channel ring (`channel`: the key is a channel's)."""
        rings = self.rings
        box = self._local.get(dst)
        shared = self.shared
        outbox = shared.outbox if shared is not None else None
        if box is not None:
            box.deliver(self.replica_id, key, value)
            if channel:
                rings.ring_doorbell(dst)  # it may wait on its doorbell for a peer's ring too
            return
        if outbox is not None and dst in shared.same_node:
            descriptor = outbox.encode(value, key)
            if descriptor is not None:  # a descriptor over the socket; the bytes wait in the arena
                self.shm_sent[dst] = self.shm_sent.get(dst, 0) + 1
                self.wire.send(self.wire_routes[dst], (self.token, dst, self.replica_id, key, descriptor))
                return
        route = self.wire_routes.get(dst) if self.wire is not None else None
        if route is not None and (route["node"] != self.wire.address["node"] or payload_bytes(value) <= WIRE_MAX_BYTES):
            self.wire.send(route, (self.token, dst, self.replica_id, key, value))
        else:
            self.routes[dst].deliver.remote(self.token, dst, self.replica_id, key, value)
