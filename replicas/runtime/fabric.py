"""The fabric: everything a replica's interpreter exchanges with peers and the host.

Collectives (`replicas.collectives`) and channels/feeds (`replicas.channels`) are written once
against this interface; transports differ only in `_post` (how a message reaches a peer's
mailbox): `LocalFabric` (one replica), `ThreadFabric` (replicas as threads in one process) and
the Ray fabric (replicas as actors).

Messages are keyed: a key is a hashable tuple whose first element names the protocol
("ar", "chan", ...). A (source, key) pair is delivered at most once.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from replicas.diagnostics.state import HOST, BlockInfo
from replicas.runtime.mailbox import Mailbox


class Fabric:
    """Base of every transport. Subclasses implement `_post(dst, key, value)`."""

    def __init__(self, replica_id: int, num_replicas: int, mailbox: Mailbox | None = None, *,
                 strict: bool = True, recorder: Any = None) -> None:
        self.replica_id = replica_id
        self.num_replicas = num_replicas
        self.mailbox = mailbox if mailbox is not None else Mailbox(replica_id)
        self.strict = strict  # collective matching compares instruction identity too
        self.recorder = recorder  # diagnostics.recorder.FlightRecorder or None
        self._counters: dict[Hashable, int] = {}

    # -- sequence numbers (collective #k, channel message #k) ------------------------------------
    def next_seq(self, counter: Hashable) -> int:
        n = self._counters.get(counter, 0)
        self._counters[counter] = n + 1
        return n

    def collectives_started(self) -> int:
        return self._counters.get("coll", 0)

    # -- point to point ---------------------------------------------------------------------------
    def send(self, dst: int, key: Hashable, value: Any) -> None:
        """Post `value` to replica `dst` under `key`. Never blocks."""
        self.mailbox.count_sent(dst)
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

    # -- host -------------------------------------------------------------------------------------
    def infeed(self, block: BlockInfo) -> Any:
        """The next value the host queued for this replica's infeed."""
        seq = self.next_seq(("infeed",))
        block.seq = seq
        return self.mailbox.take(HOST, ("infeed", seq), block)

    def outfeed(self, value: Any) -> None:
        self.mailbox.put_outfeed(value)

    def to_host(self, channel_id: int, value: Any) -> None:
        """A Send with is_host_transfer=true."""
        self.mailbox.put_to_host(channel_id, value)

    def from_host(self, channel_id: int, block: BlockInfo) -> Any:
        """A Recv with is_host_transfer=true: the next value the host sent on `channel_id`."""
        seq = self.next_seq(("from_host", channel_id))
        block.seq = seq
        return self.mailbox.take(HOST, ("host", channel_id, seq), block)

    def check_abort(self) -> None:
        self.mailbox.check_abort()


class LocalFabric(Fabric):
    """One replica alone; host feeds can be preloaded."""

    def __init__(self, replica_id: int = 0, num_replicas: int = 1, infeed: list[Any] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(replica_id, num_replicas, **kwargs)
        for i, value in enumerate(infeed or []):
            self.mailbox.deliver(HOST, ("infeed", i), value)

    def _post(self, dst: int, key: Hashable, value: Any) -> None:
        raise RuntimeError(f"replica {self.replica_id} has no peer {dst} in a one-replica run")


def host_infeed_key(seq: int) -> tuple[str, int]:
    return ("infeed", seq)


def host_channel_key(channel_id: int, seq: int) -> tuple[str, int, int]:
    return ("host", channel_id, seq)
