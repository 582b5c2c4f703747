"""What a replica publishes about itself for the monitor: running, blocked (in what), done.

These records sit below collectives, channels, runtime and diagnostics: each of them publishes
or reads them, none of them owns them. A state is constant-size whatever the number of
replicas (counters, never per-peer tables): the monitor polls every replica many times a
second, and under Ray each poll pickles the states.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

HOST = -1  # the driver, as a peer of host transfers and feeds


@dataclass
class BlockInfo:
    """Why a replica is blocked.

    `waits_for` lists the peers (replica ids, or HOST) whose messages it still needs. A collective
    publishes none (`needs="group"`): the monitor derives them from `group` and the members'
    states, so a 1024-member group costs no 1023-id list per blocked replica. `needs` is "group"
    (a collective: every member must join), "all" (every listed peer) or "one" (its one source).
    """

    kind: str  # "collective" | "recv-done" | "send-done" | "infeed" | "host-recv" | ...
    instruction: str
    opcode: str
    waits_for: tuple[int, ...] = ()
    needs: str = "all"
    computation: str | None = None
    seq: int | None = None  # the collective's number on this replica, or the channel's sequence number
    channel_id: int | None = None
    # The replica's group, in group order: one interned tuple shared by every member of a process,
    # so publishing it is a reference (threads) or pickled once per actor batch (Ray).
    group: tuple[int, ...] | None = None
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        # Its fields as they are: `dataclasses.asdict` rebuilt the group tuple value by value, ~1M
        # values for the blocked replicas of a 1024-member group (2.2 s of CPU per report).
        return dict(self.__dict__)


@dataclass
class ReplicaState:
    replica: int
    status: str = "running"  # "running" | "blocked" | "finished" | "failed" | "cancelled"
    block: BlockInfo | None = None
    instruction: str | None = None  # what it is executing (when running)
    progress: int = 0  # bumps on every message taken or delivered: unchanged => no progress
    # Messages this replica sent to replicas (itself included), and messages replicas delivered to
    # it: over a consistent snapshot, sum(sent) == sum(received) <=> nothing is in flight.
    sent: int = 0
    received: int = 0
    error: str | None = None
    collectives_started: int = 0  # how many collectives it numbered (the next one is #collectives_started)
    node: str | None = None  # the Ray node running it (None for threads)

    def to_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        if self.block is not None:
            out["block"] = self.block.to_dict()
        return out
