"""The monitor: from the replicas' published states, decide "deadlock" (or keep waiting).

A job is deadlocked when every unfinished replica is blocked, no message is in flight (every
replica received as many messages from each peer as that peer sent it), nobody waits for a host
that may still feed it, and two consecutive snapshots agree (so no replica moved in between: a
blocked replica can only move by taking a delivered message, which bumps its progress counter).
A slow replica (a long local op) is "running", never part of a deadlock.
"""

from __future__ import annotations

from replicas.diagnostics.report import Edge, Report, find_cycles
from replicas.diagnostics.state import HOST, ReplicaState
from replicas.errors import DeadlockError


class Monitor:
    def __init__(self, num_replicas: int) -> None:
        self.num_replicas = num_replicas
        self._last: tuple | None = None

    def observe(self, states: list[ReplicaState], host_may_send: bool) -> Report | None:
        """Feed one snapshot; returns a deadlock Report once the deadlock is certain."""
        key = stuck_key(states, host_may_send)
        if key is None:
            self._last = None
            return None
        if key != self._last:
            self._last = key
            return None
        return explain(states)


def stuck_key(states: list[ReplicaState], host_may_send: bool) -> tuple | None:
    """A fingerprint of the global state if it is stuck right now, else None."""
    blocked = [s for s in states if s.status == "blocked"]
    if not blocked or any(s.status == "running" for s in states):
        return None
    for s in blocked:
        if host_may_send and s.block is not None and HOST in s.block.waits_for:
            return None
    for s in states:
        for dst, n in s.sent.items():
            if dst == s.replica or dst == HOST:
                continue
            if 0 <= dst < len(states) and states[dst].received.get(s.replica, 0) < n:
                return None  # in flight: its delivery may unblock the receiver
    return tuple((s.status, s.progress) for s in states)


def explain(states: list[ReplicaState]) -> Report:
    by_id = {s.replica: s for s in states}
    edges: list[Edge] = []
    lines: list[str] = []
    for s in states:
        b = s.block
        if s.status != "blocked" or b is None:
            continue
        for t in b.waits_for:
            edges.append(Edge(s.replica, t, b.needs, b.instruction))
        if b.kind == "collective":
            late = [t for t in b.waits_for if t != HOST]
            finished = [t for t in late if by_id[t].status == "finished"]
            elsewhere = [t for t in late if by_id[t].status == "blocked"]
            coll = f"{b.opcode} #{b.seq} (%{b.instruction})"
            if finished:
                lines.append(f"{_replicas(finished)} finished and will never reach {coll}, "
                             f"which replica {s.replica} is waiting in")
            for t in elsewhere:
                tb = by_id[t].block
                assert tb is not None
                done = by_id[t].collectives_done
                lines.append(f"replica {t} never reached {coll}: it is blocked in %{tb.instruction} "
                             f"({tb.opcode}) after {done} collective{'s' if done != 1 else ''}")
        elif b.kind in ("recv-done", "send-done", "recv"):
            for t in b.waits_for:
                if t == HOST:
                    lines.append(f"replica {s.replica} waits in %{b.instruction} ({b.opcode}) for the host, "
                                 f"which sends nothing more")
                    continue
                ts = by_id[t]
                what = "data" if b.kind == "recv-done" else "its matching recv"
                if ts.status == "finished":
                    lines.append(f"replica {s.replica} waits in %{b.instruction} ({b.opcode}, channel "
                                 f"{b.channel_id}) for {what} from replica {t}, which finished")
                elif ts.block is not None:
                    lines.append(f"replica {s.replica} waits in %{b.instruction} ({b.opcode}, channel "
                                 f"{b.channel_id}) for {what} from replica {t}, blocked in "
                                 f"%{ts.block.instruction} ({ts.block.opcode})")
        elif HOST in b.waits_for:
            lines.append(f"replica {s.replica} waits in %{b.instruction} ({b.opcode}) for the host, "
                         f"which has nothing more to give")
    lines.extend(_lagging_summary(states))
    cycles = find_cycles([e for e in edges if e.target != HOST])
    edges = _relevant(edges, cycles, by_id)
    return Report("deadlock: every unfinished replica is blocked and no message is in flight",
                  states, edges, cycles, lines)


def _lagging_summary(states: list[ReplicaState]) -> list[str]:
    """Group replicas blocked in collectives by how many they completed: the laggards stand out."""
    counts: dict[int, list[int]] = {}
    for s in states:
        if s.block is not None and s.block.kind == "collective":
            counts.setdefault(s.collectives_done, []).append(s.replica)
    if len(counts) < 2:
        return []
    top = max(counts)
    out = []
    for done, reps in sorted(counts.items()):
        if done < top:
            out.append(f"{_replicas(reps)} completed {done} collectives; others completed {top}")
    return out


def _relevant(edges: list[Edge], cycles: list[list[int]], by_id: dict[int, ReplicaState]) -> list[Edge]:
    """Keep the edges that explain the deadlock: those in a cycle, or into a replica that is gone."""
    in_cycle = {r for c in cycles for r in c}
    keep = [e for e in edges
            if (e.waiter in in_cycle and e.target in in_cycle)
            or e.target == HOST
            or by_id.get(e.target, None) is not None and by_id[e.target].status in ("finished", "failed")]
    return keep or edges


def _replicas(reps: list[int]) -> str:
    return f"replica {reps[0]}" if len(reps) == 1 else f"replicas {sorted(reps)}"


def deadlock_error(report: Report) -> DeadlockError:
    head = report.lines[0] if report.lines else f"replicas {report.blocked} are blocked"
    return DeadlockError(f"deadlock: {head}", report)
