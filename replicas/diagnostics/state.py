"""What a replica publishes about itself: running, blocked (in what, waiting for whom), done."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

HOST = -1  # the driver, as a peer of host transfers and feeds


@dataclass
class BlockInfo:
    """Why a replica is blocked.

    `waits_for` lists the peers (replica ids, or HOST) whose messages it still needs; `needs` is
    "all" (a collective needs every listed peer) or "one" (a recv needs its one source).
    """

    kind: str  # "collective" | "recv-done" | "send-done" | "infeed" | "host-recv" | ...
    instruction: str
    opcode: str
    waits_for: tuple[int, ...] = ()
    needs: str = "all"
    computation: str | None = None
    seq: int | None = None  # the collective's number on this replica, or the channel's sequence number
    channel_id: int | None = None
    group: tuple[int, ...] | None = None
    fingerprint: dict[str, Any] | None = None
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ReplicaState:
    replica: int
    status: str = "running"  # "running" | "blocked" | "finished" | "failed" | "cancelled"
    block: BlockInfo | None = None
    instruction: str | None = None  # what it is executing (when running)
    progress: int = 0  # bumps on every message taken or delivered: unchanged => no progress
    sent: dict[int, int] = field(default_factory=dict)  # messages sent, by destination
    received: dict[int, int] = field(default_factory=dict)  # messages delivered to it, by source
    error: str | None = None
    collectives_done: int = 0
    node: str | None = None  # the Ray node running it (None for threads)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["sent"] = {str(k): v for k, v in self.sent.items()}
        d["received"] = {str(k): v for k, v in self.received.items()}
        return d
