"""A replica's mailbox: messages keyed by (source, key), host queues, and its published state.

Everything that arrives for a replica (collective pieces, channel data, acks, infeed values,
host transfers) is a message delivered here; the replica takes what it needs, blocking with its
`BlockInfo` published so the monitor can see what it waits for. `abort(exc)` wakes every waiter
with `exc` (deadlock, mismatch, cancel).
"""

from __future__ import annotations

import dataclasses
import threading
from collections import deque
from collections.abc import Hashable
from typing import Any

from replicas.diagnostics.state import BlockInfo, ReplicaState

_POLL = 0.25  # seconds between checks of an abort while blocked (notify wakes waiters at once)


class Mailbox:
    def __init__(self, replica: int) -> None:
        self.state = ReplicaState(replica)
        self._messages: dict[tuple[int, Hashable], Any] = {}
        self._cond = threading.Condition()
        self._abort: BaseException | None = None
        self._outfeed: deque[Any] = deque()
        self._to_host: dict[int, deque[Any]] = {}  # channel id -> values sent to the host
        # What the replica's thread is waiting for: a delivery wakes it only when this empties.
        self._missing: set[tuple[int, Hashable]] | None = None
        self._block: BlockInfo | None = None
        self._missing: list[tuple[int, Hashable]] = []  # what the blocked replica waits for

    # -- delivery (any thread) -------------------------------------------------------------------
    def deliver(self, src: int, key: Hashable, value: Any) -> None:
        with self._cond:
            if (src, key) in self._messages:
                raise RuntimeError(f"replica {self.state.replica}: duplicate message {key} from {src}")
            self._messages[(src, key)] = value
            self.state.received[src] = self.state.received.get(src, 0) + 1
            self.state.progress += 1
            missing = self._missing
            if missing is not None and (src, key) in missing:
                missing.discard((src, key))
                if missing:
                    self._block.waits_for = tuple(dict.fromkeys(s for s, _ in missing))
                else:
                    self._cond.notify_all()

    def count_sent(self, dst: int) -> None:
        with self._cond:
            self.state.sent[dst] = self.state.sent.get(dst, 0) + 1

    def abort(self, exc: BaseException) -> None:
        with self._cond:
            if self._abort is None:
                self._abort = exc
            self._cond.notify_all()

    @property
    def aborted(self) -> BaseException | None:
        return self._abort

    # -- taking (the replica's thread) -----------------------------------------------------------
    def take(self, src: int, key: Hashable, block: BlockInfo) -> Any:
        return self.take_all([(src, key)], block)[0]

    def take_all(self, wanted: list[tuple[int, Hashable]], block: BlockInfo) -> list[Any]:
        """Block until every (src, key) in `wanted` has arrived; return the values in order."""
        msgs = self._messages
        with self._cond:
            if self._abort is not None:
                raise self._abort
            missing = {w for w in wanted if w not in msgs}
            if missing:
                state = self.state
                block.waits_for = tuple(dict.fromkeys(src for src, _ in missing))
                self._missing = missing
                self._block = block
                state.block = block
                state.status = "blocked"
                try:
                    while missing:
                        if self._abort is not None:
                            raise self._abort
                        self._cond.wait(_POLL)
                finally:
                    self._missing = None
                    self._block = None
                    state.block = None
                    if state.status == "blocked":
                        state.status = "running"
            self.state.progress += 1
            return [msgs.pop(w) for w in wanted]

    def poll(self, src: int, key: Hashable) -> bool:
        with self._cond:
            return (src, key) in self._messages

    def check_abort(self) -> None:
        if self._abort is not None:
            raise self._abort

    # -- host side ---------------------------------------------------------------------------------
    def put_outfeed(self, value: Any) -> None:
        with self._cond:
            self._outfeed.append(value)
            self._cond.notify_all()

    def put_to_host(self, channel_id: int, value: Any) -> None:
        with self._cond:
            self._to_host.setdefault(channel_id, deque()).append(value)
            self._cond.notify_all()

    def get_outfeed(self, timeout: float | None) -> Any:
        return self._host_get(lambda: self._outfeed, timeout)

    def get_from_channel(self, channel_id: int, timeout: float | None) -> Any:
        return self._host_get(lambda: self._to_host.setdefault(channel_id, deque()), timeout)

    def _host_get(self, queue_of: Any, timeout: float | None) -> Any:
        """Pop the oldest value; raise TimeoutError if none arrives within `timeout` seconds."""
        with self._cond:
            ok = self._cond.wait_for(lambda: bool(queue_of()) or self.state.status in ("finished", "failed"),
                                     timeout)
            if queue_of():
                return queue_of().popleft()
            if ok:
                raise EOFError(f"replica {self.state.replica} has {self.state.status}")
            raise TimeoutError

    def snapshot(self) -> ReplicaState:
        with self._cond:
            s = self.state
            status, block = s.status, s.block
            if status == "blocked" and block is not None:
                # The waiting thread may not have woken yet to see a delivered message: publish what is
                # really missing, and "running" when nothing is (it is about to take its messages).
                missing = [w for w in self._missing if w not in self._messages]
                if not missing:
                    status, block = "running", None
                else:
                    block = dataclasses.replace(block, waits_for=tuple(dict.fromkeys(src for src, _ in missing)))
            return ReplicaState(s.replica, status, block, s.instruction, s.progress, dict(s.sent),
                                dict(s.received), s.error, s.collectives_done, s.node)

    def set_status(self, status: str, error: str | None = None) -> None:
        with self._cond:
            self.state.status = status
            self.state.error = error
            self._cond.notify_all()
