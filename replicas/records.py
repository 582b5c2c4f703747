"""What a replica publishes about itself for the monitor: running, blocked (in what), done.

These records sit below collectives, channels, runtime and diagnostics: each of them publishes
or reads them, none of them owns them. A state is constant-size whatever the number of
replicas (counters, never per-peer tables): the monitor polls every replica many times a
second, and under Ray each poll pickles the states.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

HOST = -1  # the driver, as a peer of host transfers and feeds


def replica_ranges(replicas: Iterable[int]) -> str:
    """`[1, 2, 3]` for a few replicas, `0-1022, 1024` once runs make it shorter."""
    ids = sorted(set(replicas))
    runs: list[tuple[int, int]] = []
    for r in ids:
        if runs and r == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], r)
        else:
            runs.append((r, r))
    if len(ids) <= 4 or all(a == b for a, b in runs):
        return "[" + ", ".join(map(str, ids)) + "]"
    return ", ".join(str(a) if a == b else f"{a}-{b}" if b > a + 1 else f"{a}, {b}" for a, b in runs)


def replicas_text(replicas: Iterable[int]) -> str:
    """`replica 3`, `replicas [1, 2, 3]`, `replicas 0-1022` (the host as `the host`)."""
    ids = sorted(set(replicas))
    if ids == [HOST]:
        return "the host"
    host = " and the host" if HOST in ids else ""
    ids = [r for r in ids if r != HOST]
    return (f"replica {ids[0]}" if len(ids) == 1 else f"replicas {replica_ranges(ids)}") + host


BATCHED_OPCODE = "batched"  # the block of a replica whose process's batched run computes it


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
        # Its fields as they are: `dataclasses.asdict` rebuilds the group tuple value by value, once
        # per blocked replica: quadratic in the group's size for one report.
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
