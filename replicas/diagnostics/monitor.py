"""The monitor: from the replicas' published states, decide "deadlock" (or keep waiting).

A job is deadlocked when every unfinished replica is blocked, no message is in flight (every
replica received as many messages from each peer as that peer sent it), nobody waits for a host
that may still feed it, and two consecutive snapshots agree (so no replica moved in between: a
blocked replica can only move by taking a delivered message, which bumps its progress counter).
A slow replica (a long local op) is "running", never part of a deadlock.

Some deadlocks are mismatches in disguise: a replica that executed its k-th collective with a
different group (say alone) never sends to the members waiting in their k-th collective. When a
waited-for replica is already past collective k, `wait_for.deadlock_error` reports a CollectiveMismatchError
built from that replica's flight recorder.
"""

from __future__ import annotations

from replicas.diagnostics.report import Report
from replicas.diagnostics.wait_for import explain
from replicas.hlo.source import NO_SOURCES, SourceMap
from replicas.records import HOST, ReplicaState


class Monitor:
    def __init__(self, num_replicas: int, sources: SourceMap = NO_SOURCES) -> None:
        self.num_replicas = num_replicas
        self.sources = sources
        self._last: tuple | None = None

    @property
    def suspects(self) -> bool:
        """The last snapshot looked stuck: the next one, taken at once, confirms or clears it (the
        time between them proves nothing; equal progress counters do)."""
        return self._last is not None

    def observe(self, states: list[ReplicaState], host_may_send: bool) -> Report | None:
        """Feed one snapshot; returns a deadlock Report once the deadlock is certain."""
        key = stuck_key(states, host_may_send)
        if key is None:
            self._last = None
            return None
        if key != self._last:
            self._last = key
            return None
        return explain(states, self.sources)


def stuck_key(states: list[ReplicaState], host_may_send: bool) -> tuple | None:
    """A fingerprint of the global state if it is stuck right now, else None. O(N).

    Messages in flight are counted, not listed: every message is counted sent before it is posted
    and received when delivered, so sum(sent) == sum(received) means none is on its way. (Two
    consecutive equal fingerprints mean no replica moved between them, so the second snapshot is
    consistent as of a moment when all were blocked.)"""
    sent = received = 0
    blocked = False
    for s in states:
        status = s.status
        if status == "running":
            return None
        if status == "blocked":
            blocked = True
            b = s.block
            if host_may_send and b is not None and HOST in b.waits_for:
                return None
        sent += s.sent
        received += s.received
    if not blocked or sent != received:
        return None  # nothing blocked, or a message in flight whose delivery may unblock its receiver
    return tuple((s.status, s.progress) for s in states)
