"""The wait-for analysis of a stuck job: who waits for whom (collective waits derived from the
groups), the cycles among them, and the deadlock Report or, when a waited-for replica is already
past the collective the others wait in, the CollectiveMismatchError it really is."""

from __future__ import annotations

from typing import Any

from replicas.collectives.mismatch import mismatch_report
from replicas.diagnostics.progress import host_waits
from replicas.diagnostics.report import Edge, Report, find_cycles, source_suffix, where, with_derived_waits
from replicas.errors import CollectiveMismatchError, DeadlockError, ReplicasError
from replicas.hlo.source import NO_SOURCES, SourceMap
from replicas.records import BATCHED_OPCODE, HOST, BlockInfo, ReplicaState, replicas_text

_replicas = replicas_text


def _coll(b: BlockInfo, sources: SourceMap = NO_SOURCES) -> str:
    return f"{b.opcode} #{b.seq} (%{b.instruction}{source_suffix(sources, b.instruction, b.computation)})"


def passed(b: BlockInfo, target: ReplicaState) -> bool:
    """Whether `target` already started its collective number `b.seq` (elsewhere: it did not send to us)."""
    if b.kind != "collective" or b.seq is None or b.opcode == BATCHED_OPCODE:
        # (A batched run's members wait for the member that runs it, wherever that one is blocked: a
        # collective of the run that leaves the process, `runtime/batched_spanning.py`.)
        return False
    started = target.collectives_started
    if target.status == "blocked" and target.block is not None and target.block.kind == "collective" \
            and target.block.seq == b.seq:
        # Same number, other group: they can never meet. (Another instruction of the same form and group is
        # fine when matching is lenient; under strict matching the kernels already raised.)
        return target.block.group != b.group
    return started > b.seq


def explain(states: list[ReplicaState], sources: SourceMap = NO_SOURCES) -> Report:
    """The deadlock Report of stuck `states`; `sources` names where each instruction came from."""
    states = with_derived_waits(states)
    by_id = {s.replica: s for s in states}
    edges: list[Edge] = []
    lines: list[str] = []  # collective findings first: "replica 3 never reached all-reduce #7" leads
    point_to_point: list[str] = []
    mismatches: list[tuple[int, int]] = []  # (waiter, target) pairs that disagree about a collective
    # Collective waits, grouped by (collective number, instruction): one finding per laggard.
    waiting_in: dict[tuple[int | None, str], list[ReplicaState]] = {}
    for s in states:
        b = s.block
        if s.status != "blocked" or b is None:
            continue
        for t in b.waits_for:
            edges.append(Edge(s.replica, t, b.needs, b.instruction))
        if b.opcode == BATCHED_OPCODE:
            continue  # waiting for the member that runs the batch: that one's wait is the finding
        if b.kind == "collective":
            waiting_in.setdefault((b.seq, b.instruction), []).append(s)
        else:
            point_to_point.extend(_point_to_point(s, b, by_id, sources))
    for members in waiting_in.values():
        b = members[0].block
        assert b is not None
        late: dict[int, list[int]] = {}
        for s in members:
            for t in s.block.waits_for if s.block is not None else ():
                if t != HOST:
                    late.setdefault(t, []).append(s.replica)
        finished_before: dict[int, list[int]] = {}  # collectives done -> finished replicas
        for t, waiters in sorted(late.items()):
            ts = by_id[t]
            if passed(b, ts):
                mismatches.extend((w, t) for w in waiters)
                continue
            if ts.status == "finished":
                finished_before.setdefault(ts.collectives_started, []).append(t)
            elif ts.status == "blocked" and ts.block is not None:
                lines.append(f"replica {t} never reached {_coll(b, sources)}, which {_replicas(waiters)} "
                             f"{'is' if len(waiters) == 1 else 'are'} waiting in: it is blocked in "
                             f"{where(ts.block, sources)} waiting for {_peers(ts.block.waits_for)}")
            elif ts.status == "failed":
                lines.append(f"replica {t} failed before {_coll(b, sources)}: {ts.error}")
        for done, reps in sorted(finished_before.items()):
            if done == 0:
                lines.append(f"{_replicas(reps)} finished without any collective and never reached "
                             f"{_coll(b, sources)}")
            else:
                lines.append(f"{_replicas(reps)} finished {b.opcode} #{done - 1} but did not join #{b.seq} "
                             f"(%{b.instruction}{source_suffix(sources, b.instruction, b.computation)})")
    lines.extend(_host_findings(states, sources))
    lines.extend(point_to_point)
    lines.extend(_lagging_summary(states))
    cycles = find_cycles([e for e in edges if e.target != HOST])
    return Report("deadlock: every unfinished replica is blocked and no message is in flight",
                  states, _relevant(edges, cycles, by_id), cycles, list(dict.fromkeys(lines)), mismatches=mismatches,
                  graph=edges, sources=sources)


def _peers(waits_for: tuple[int, ...]) -> str:
    return replicas_text(waits_for) if waits_for else "nothing"


def _point_to_point(s: ReplicaState, b: BlockInfo, by_id: dict[int, ReplicaState], sources: SourceMap
                    ) -> list[str]:
    lines = []
    what = {"recv-done": "data", "send-done": "its matching recv"}.get(b.kind, "a message")
    for t in b.waits_for:
        if t == HOST:
            continue  # grouped by _host_findings
        ts = by_id.get(t)
        if ts is None:
            continue
        if ts.status == "finished":
            never = "posting it" if b.kind == "send-done" else "sending it"
            lines.append(f"replica {s.replica} waits in {where(b, sources)} for {what} from replica {t}, "
                         f"which finished without {never}")
        elif ts.status == "failed":
            lines.append(f"replica {s.replica} waits in {where(b, sources)} for {what} from replica {t}, "
                         "which failed")
        elif ts.block is not None:
            same = ts.block.instruction == b.instruction and ts.block.computation == b.computation
            lines.append(f"replica {s.replica} waits in {where(b, sources)} for {what} from replica {t}, "
                         f"which is blocked in {where(ts.block, NO_SOURCES if same else sources)}")
    return lines


def _host_findings(states: list[ReplicaState], sources: SourceMap) -> list[str]:
    """`replicas [1, 2, 3] wait in %in (infeed) for the host, which has nothing more to give`."""
    return [f"{line}, which has nothing more to give" for line in host_waits(states, sources)]


def _lagging_summary(states: list[ReplicaState]) -> list[str]:
    """Group replicas blocked in collectives by how many they started: the laggards stand out."""
    counts: dict[int, list[int]] = {}
    for s in states:
        if s.block is not None and s.block.kind == "collective":
            counts.setdefault(s.collectives_started, []).append(s.replica)
    if len(counts) < 2:
        return []
    top = max(counts)
    return [f"{_replicas(reps)} started {done} collectives; others started {top}"
            for done, reps in sorted(counts.items()) if done < top]


def _relevant(edges: list[Edge], cycles: list[list[int]], by_id: dict[int, ReplicaState]) -> list[Edge]:
    """Keep the edges that explain the deadlock: those in a cycle, or into a replica that is gone."""
    in_cycle = {r for c in cycles for r in c}
    keep = [e for e in edges
            if (e.waiter in in_cycle and e.target in in_cycle)
            or e.target == HOST
            or by_id.get(e.target, None) is not None and by_id[e.target].status in ("finished", "failed")]
    return keep or edges


def deadlock_error(report: Report) -> ReplicasError:
    """DeadlockError for `report`, or CollectiveMismatchError when a waited-for replica is past the collective."""
    if report.mismatches:
        return _mismatch_from_history(report, *report.mismatches[0])
    head = report.lines[0] if report.lines else f"replicas {report.blocked} are blocked"
    return DeadlockError(f"deadlock: {head}", report)


def _mismatch_from_history(report: Report, waiter: int, target: int) -> CollectiveMismatchError:
    from replicas.collectives.fingerprint import FIELDS, Fingerprint, diff, mismatch_error

    by_id = {s.replica: s for s in report.states}
    b = by_id[waiter].block
    assert b is not None and b.seq is not None
    theirs = _collective_event(report.events.get(target, []), b.seq)
    own_event = _collective_event(report.events.get(waiter, []), b.seq)
    own_fp = own_event.get("fingerprint") if own_event is not None else None
    if theirs is not None and own_fp is not None and theirs.get("fingerprint") is not None:
        own = Fingerprint(_wire(own_fp, FIELDS))
        their_wire = _wire(theirs["fingerprint"], FIELDS)
        differences = diff(own, their_wire) or [("instruction", own.wire[-1], their_wire[-1])]
        error = mismatch_error(b.seq, waiter, own, target, their_wire, differences)
        error.report.deadlock = report
        status = by_id[target].status
        moved = "finished" if status == "finished" else f"moved on to {where(by_id[target].block, report.sources)}" \
            if by_id[target].block is not None else status
        headline = str(error.args[0]).split("\n", 1)[0]
        message = (f"{headline} (replica {target} completed its collective #{b.seq} without replica "
                   f"{waiter} and {moved}; replica {waiter} waits in {where(b, report.sources)})")
    else:
        their_name = f"%{theirs['instruction']} ({theirs['opcode']})" if theirs else "another collective"
        message = (f"collective #{b.seq}: replica {waiter} is in {where(b, report.sources)} with group "
                   f"{list(b.group or ())} but replica {target} executed its collective #{b.seq} as "
                   f"{their_name} without it")
        their_identity = {"name": theirs.get("instruction"), "opcode": theirs.get("opcode")} if theirs else {}
        mine = {"computation": b.computation, "name": b.instruction, "opcode": b.opcode}
        return CollectiveMismatchError(message, mismatch_report(b.seq, waiter, mine, target, their_identity, [],
                                                                own_fp, None, deadlock=report))
    return CollectiveMismatchError(message, error.report)


def _wire(fingerprint: dict[str, Any], fields: tuple[str, ...]) -> tuple:
    def tupled(v: Any) -> Any:
        return tuple(tupled(x) for x in v) if isinstance(v, (list, tuple)) else v

    return tuple(tupled(fingerprint.get(f)) for f in fields)


def _collective_event(events: list[dict[str, Any]], seq: int) -> dict[str, Any] | None:
    for ev in reversed(events):
        if ev.get("kind") == "collective" and ev.get("seq") == seq:
            return ev
    return None
