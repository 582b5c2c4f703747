"""The report carried by DeadlockError / ExecutionTimeout: who is blocked where, waiting for whom."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from replicas.hlo.source import NO_SOURCES, SourceMap
from replicas.records import BATCHED_OPCODE, HOST, BlockInfo, ReplicaState, replica_ranges, replicas_text


def _who(r: int) -> str:
    return "the host" if r == HOST else f"replica {r}"


def where(b: BlockInfo, sources: SourceMap = NO_SOURCES, computation: bool = False) -> str:
    """`%r (all-reduce #0)`, `%got (recv-done, channel 3)`, `%in (infeed)`; `computation`: and
    ` in body`; then, when the module has metadata, ` from psum at train.py:42 in step (...)`."""
    if b.opcode == BATCHED_OPCODE:  # not an instruction of the program: one thread runs the group's
        return f"the batched run of {replicas_text(b.group or ())} (one thread runs their program)"
    text = f"%{b.instruction} ({b.opcode}"
    if b.kind == "collective" and b.seq is not None:
        text += f" #{b.seq}"
    if b.channel_id is not None:
        text += f", channel {b.channel_id}"
    text += ")" + (f" in {b.computation}" if computation and b.computation else "")
    return text + source_suffix(sources, b.instruction, b.computation)


def source_suffix(sources: SourceMap, name: str | None, computation: str | None = None) -> str:
    """` from psum at train.py:42 in step (jit(step)/shard_map/psum)`, or "" without metadata."""
    text = sources.text(name, computation) if sources else None
    return f" from {text}" if text else ""


def with_derived_waits(states: list[ReplicaState]) -> list[ReplicaState]:
    """`states` with each collective block's `waits_for` filled in (and `needs="all"`): the group's
    members that have not joined this collective (blocked in the same collective number with the same group). O(N) per
    distinct (collective number, group), not per waiter."""
    # Keyed by the group's identity, not its value: a group of every replica is an N-tuple, and hashing
    # it for each of N waiters was O(N^2). Equal groups that are different objects (states of several
    # processes) are found equal once per object.
    canonical: dict[Any, tuple] = {}
    by_id: dict[int, tuple] = {}
    joined: dict[tuple[int, int], tuple[tuple, set[int]]] = {}
    # A batched run's members (blocked in it) are in whatever collective the member running it is
    # blocked in: one that leaves their process (runtime/batched_spanning.py) has them joined.
    followers: dict[int, list[int]] = {}
    for s in states:
        b = s.block
        if s.status == "blocked" and b is not None and b.opcode == BATCHED_OPCODE and b.group:
            followers.setdefault(b.group[0], []).append(s.replica)
    for s in states:
        b = s.block
        if s.status == "blocked" and b is not None and b.needs == "group":
            group = by_id.get(id(b.group))
            if group is None:
                group = by_id[id(b.group)] = canonical.setdefault(b.group, b.group)
            members = joined.setdefault((b.seq, id(group)), (group, set()))[1]
            members.add(s.replica)
            if b.opcode != BATCHED_OPCODE:
                members.update(followers.get(s.replica, ()))
    missing = {key: tuple(t for t in group or () if t not in members) for key, (group, members) in joined.items()}
    out = []
    for s in states:
        b = s.block
        if s.status == "blocked" and b is not None and b.needs == "group":
            derived = _changed(b, waits_for=missing[(b.seq, id(by_id[id(b.group)]))], needs="all")
            s = _changed(s, block=derived)
        out.append(s)
    return out


def _changed(record: Any, **changes: Any) -> Any:
    """A copy of the plain dataclass `record` with `changes` (what `dataclasses.replace` does, without
    its per-field checks: a report of thousands of blocked replicas makes two per replica)."""
    new = object.__new__(type(record))
    new.__dict__.update(record.__dict__)
    new.__dict__.update(changes)
    return new


_NAMED = re.compile(r"%([A-Za-z_][A-Za-z0-9_.\-]*)")


def with_source(text: str, sources: SourceMap) -> str:
    """`running %x (add)` with the source of the instruction it names first."""
    m = _NAMED.search(text) if sources else None
    return text + source_suffix(sources, m.group(1)) if m else text


def _where(s: ReplicaState, sources: SourceMap = NO_SOURCES) -> str:
    b = s.block
    if b is None:
        return with_source(s.instruction or s.status, sources)
    return where(b, sources, computation=True)


_REPLICA_NUMBER = re.compile(r"(replicas? )\d+")
EVENTS_SHOWN = 5  # per replica in str(report); to_dict() has every event the report keeps
GROUPS_SHOWN = 16  # replica groups in str(report)
EDGE_LINES_SHOWN = 12  # wait-for lines in str(report)
FINDINGS_SHOWN = 12
TAILS_SHOWN = 3  # replicas whose event tails str(report) shows: those the diagnosis names


def _event_text(ev: dict[str, Any], sources: SourceMap = NO_SOURCES) -> str:
    text = f"{ev.get('opcode')} %{ev.get('instruction')}"
    if ev.get("kind") == "collective" and ev.get("seq") is not None:
        text += f" #{ev['seq']}"
    elif ev.get("channel_id") is not None:
        text += f" (channel {ev['channel_id']}" + (f" #{ev['seq']}" if ev.get("seq") is not None else "") + ")"
    return text + source_suffix(sources, ev.get("instruction"), ev.get("computation"))


def _tail_at_snapshot(state: ReplicaState | None, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A replica's events as of its state's snapshot: the recorders are read after the states, so
    a replica still moving (a timeout) may have finished the collective its state is blocked in,
    and started others; the tail then ends in that collective, not finished (or, when the ring
    moved past it, before the first collective it had not started)."""
    b = state.block if state is not None and state.status == "blocked" else None
    if b is None or b.kind != "collective" or b.seq is None:
        return events
    for i, ev in enumerate(events):
        if ev.get("kind") == "collective" and isinstance(ev.get("seq"), int) and ev["seq"] >= b.seq:
            if ev["seq"] == b.seq:
                return events[:i] + [{**ev, "end_us": None}]
            return events[:i]
    return events


@dataclass
class Edge:
    waiter: int
    target: int
    needs: str  # "all" (a collective waits for every target) or "one" (a recv waits for its source)
    instruction: str

    def to_dict(self) -> dict[str, Any]:
        return {"waiter": self.waiter, "target": self.target, "needs": self.needs,
                "instruction": self.instruction}


@dataclass
class Report:
    """A snapshot of a stuck job. `str(report)` is for terminals; `to_dict()` is JSON-able."""

    title: str
    states: list[ReplicaState]
    edges: list[Edge] = field(default_factory=list)
    cycles: list[list[int]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)  # the explanation, one finding a line
    events: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # flight recorder tails
    # (waiter, target): the target already ran the waiter's collective number elsewhere (a mismatch)
    mismatches: list[tuple[int, int]] = field(default_factory=list)
    # Every wait-for edge (`edges` keeps those that explain the deadlock); empty: the same as `edges`.
    graph: list[Edge] = field(default_factory=list)
    # Where the module's instructions came from (its metadata): `str()` names the source of each.
    sources: SourceMap = field(default=NO_SOURCES, repr=False, compare=False)

    def __post_init__(self) -> None:
        # A collective's block names its group, not whom it waits for: derive that, or a snapshot
        # taken while the job still runs (a timeout) says "waiting for nothing".
        self.states = with_derived_waits(self.states)

    @property
    def blocked(self) -> list[int]:
        return [s.replica for s in self.states if s.status == "blocked"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "replicas": [s.to_dict() for s in self.states],
            "wait_for": [e.to_dict() for e in self.edges],
            "wait_for_all": [e.to_dict() for e in self.graph or self.edges],
            "cycles": self.cycles,
            "findings": self.lines,
            "events": {str(k): v for k, v in self.events.items()},
            "sources": self._sources_dict(),
        }

    def _sources_dict(self) -> dict[str, Any]:
        """instruction name -> its source, for every instruction the states and events name."""
        if not self.sources:
            return {}
        names = [(s.block.instruction, s.block.computation) for s in self.states if s.block is not None]
        names += [(ev.get("instruction"), ev.get("computation")) for evs in self.events.values() for ev in evs]
        out = {}
        for name, computation in names:
            if name and name not in out:
                source = self.sources.lookup(name, computation)
                if source is not None:
                    out[name] = source.to_dict()
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)

    def to_dot(self, full: bool = False) -> str:
        """Graphviz of the edges that explain the deadlock (cycles in red); `full=True`: every edge."""
        edges = (self.graph or self.edges) if full else self.edges
        out = ["digraph wait_for {", "  rankdir=LR;"]
        involved = {e.waiter for e in edges} | {e.target for e in edges}
        by_id = {s.replica: s for s in self.states}
        for r in sorted(involved):
            s = by_id.get(r)
            label = "host" if r == HOST else f"replica {r}\\n{_where(s) if s else ''}"
            style = ' style=dashed' if s is not None and s.status in ("finished", "failed") else ""
            out.append(f'  r{r if r >= 0 else "host"} [label="{label}"{style}];')
        in_cycle = {(c[i], c[(i + 1) % len(c)]) for c in self.cycles for i in range(len(c))}
        for e in edges:
            attrs = f'label="needs {e.needs}: %{e.instruction}"'
            if (e.waiter, e.target) in in_cycle:
                attrs += " color=red"
            if e.needs == "one":
                attrs += " style=dashed"
            tgt = f"r{e.target}" if e.target >= 0 else "rhost"
            out.append(f"  r{e.waiter} -> {tgt} [{attrs}];")
        out.append("}")
        return "\n".join(out)

    def __str__(self) -> str:
        """Fits a terminal at any N: replicas in the same situation share a line, ranges are
        compressed, the wait-for graph is summarized, event tails only for the replicas named."""
        return self._text(self.title, self.lines)

    def under(self, headline: str) -> str:
        """The report as the lines under an error's `headline`: a headline that states the first
        finding (a DeadlockError's) is not repeated below it, nor is the title's `deadlock: `."""
        if self.lines and headline.endswith(self.lines[0]):
            return self._text(self.title.split(": ", 1)[-1], self.lines[1:])
        return self._text(self.title, self.lines)

    def _text(self, title: str, findings: list[str]) -> str:
        sources = self.sources
        out = [title]
        out.extend(f"  {line}" for line in _capped(findings, FINDINGS_SHOWN, "findings (report.lines)"))
        out.append("replicas:")
        groups = self._groups()
        shown = [f"{replicas_text(ids)}: {text}" for ids, text in groups]
        out.extend(f"  {line}" for line in _capped(shown, GROUPS_SHOWN, "groups (report.to_dict() has every replica)"))
        if self.edges:
            out.append("wait-for graph (waiter -> needed" + (f"; {len(self.edges)} of {len(self.graph)} edges "
                       "explain it, to_dot(full=True) draws all" if len(self.graph) > len(self.edges) else "")
                       + "):")
            out.extend(f"  {line}" for line in _capped(_edge_lines(self.edges, sources), EDGE_LINES_SHOWN,
                                                          "edge lines (report.edges)"))
        for c in self.cycles:
            members = c + c[:1]
            text = " -> ".join(map(str, members)) if len(members) <= 13 else \
                " -> ".join(map(str, members[:6])) + f" -> ... -> {' -> '.join(map(str, members[-6:]))}"
            out.append(f"cycle: {text}" + (f" ({len(c)} replicas)" if len(members) > 13 else ""))
        by_id = {s.replica: s for s in self.states}
        tails = {r: _tail_at_snapshot(by_id.get(r), self.events[r]) for r in self._named_replicas()
                 if r in self.events}
        starts = [ev.get("start_us", 0) for evs in tails.values() for ev in evs[-EVENTS_SHOWN:]]
        if starts:
            base = min(starts)
            named = "" if len(tails) == len(self.events) else " of " + replicas_text(tails)
            out.append(f"last events{named} (ms since the first shown):")
            for r, evs in sorted(tails.items()):
                for ev in evs[-EVENTS_SHOWN:]:
                    end = "not finished" if ev.get("end_us") is None else f"{(ev['end_us'] - base) / 1000:.3f}"
                    out.append(f"  replica {r}: {_event_text(ev, sources)}  {(ev.get('start_us', 0) - base) / 1000:.3f}"
                               f" .. {end}")
        return "\n".join(out)

    def _groups(self) -> list[tuple[list[int], str]]:
        """`_state_groups` of the states, made once per states list (an error's text asks twice)."""
        made = self.__dict__.get("_made_groups")
        if made is None or made[0] is not self.states:
            made = self.__dict__["_made_groups"] = (self.states, _state_groups(self.states, self.sources))
        return made[1]

    def _named_replicas(self) -> list[int]:
        """The replicas the diagnosis is about: those waited for, then one waiter; every one when few."""
        if len(self.events) <= TAILS_SHOWN:
            return sorted(self.events)
        named: list[int] = []
        for c in self.cycles:
            named.extend(c)
        named.extend(e.target for e in self.edges if e.target != HOST)
        named.extend(r for pair in self.mismatches for r in pair)
        named.extend(s.replica for s in self.states if s.status == "failed")
        named.extend(self.blocked[:1])  # one waiter shows what the others wait in
        return sorted(list(dict.fromkeys(named))[:TAILS_SHOWN])


def _capped(lines: list[str], limit: int, what: str) -> list[str]:
    lines = _alike_collapsed(lines)
    if len(lines) <= limit:
        return lines
    return lines[:limit - 1] + [f"... {len(lines) - limit + 1} more {what}"]


def _alike_collapsed(lines: list[str]) -> list[str]:
    """Lines that differ only in replica numbers (a ring of recvs: `replica 5 waits ... from replica 4`)
    become their first line and a count, once more than 3 of them would be printed."""
    groups: dict[str, list[str]] = {}
    for line in lines:
        groups.setdefault(_REPLICA_NUMBER.sub(r"\1#", line), []).append(line)
    out = []
    for alike in groups.values():
        out.append(alike[0] if len(alike) <= 3 else f"{alike[0]}  (and {len(alike) - 1} more like it)")
        out.extend(alike[1:] if len(alike) <= 3 else [])
    return out


def _state_text(s: ReplicaState, waits: str | None, groups: dict[int, str] | None = None,
                sources: SourceMap = NO_SOURCES) -> str:
    """`groups`: id(group tuple) -> its text, kept by the caller across the states of one report (a
    group's tuple is shared by its members: writing it once per member was quadratic in the group
    and most of a large deadlock report's time)."""
    b = s.block
    if s.status == "blocked" and b is not None:
        text = f"blocked in {_where(s, sources)}"
        if waits is not None:
            text += f" waiting for {waits}"
        if b.group is not None:
            if groups is None:
                text += f" (group {replica_ranges(b.group)})"
            else:
                group_text = groups.get(id(b.group))
                if group_text is None:
                    group_text = groups[id(b.group)] = replica_ranges(b.group)
                text += f" (group {group_text})"
        return text
    if s.status == "running" and s.instruction:
        return f"running {with_source(s.instruction, sources)}"
    if s.status == "failed" and s.error:
        return f"failed: {s.error}"
    return s.status


def _waits_text(b: BlockInfo) -> str:
    if not b.waits_for:
        return "its group, all joined" if b.kind == "collective" else "nothing"
    need = "all of " if b.needs == "all" and len(b.waits_for) > 1 else ""
    return need + replicas_text(b.waits_for)


def _state_groups(states: list[ReplicaState], sources: SourceMap = NO_SOURCES) -> list[tuple[list[int], str]]:
    """Replicas in the same situation, one group each, in order of their first replica. Replicas
    blocked in the same place but waiting for different peers (a ring of recvs) share one group
    once they would make more than 3 lines."""
    by_place: dict[str, dict[str, list[int]]] = {}
    group_texts: dict[int, str] = {}  # the states hold their groups alive meanwhile: ids stay unique
    # Replicas in one situation share its texts, made once: by what a state's texts depend on (the
    # group and the waited-for tuple by identity: shared by the members of one collective).
    texts: dict[tuple, tuple[str, str]] = {}
    for s in states:
        b = s.block
        if s.status == "blocked" and b is not None:
            key: tuple = (b.kind, b.instruction, b.opcode, b.computation, b.seq, b.channel_id, b.detail,
                          id(b.group), id(b.waits_for), b.needs)
        else:
            key = (s.status, s.instruction, s.error)
        found = texts.get(key)
        if found is None:
            waits = _waits_text(b) if s.status == "blocked" and b is not None else ""
            found = texts[key] = (_state_text(s, None, group_texts, sources), waits)
        by_place.setdefault(found[0], {}).setdefault(found[1], []).append(s.replica)
    groups: list[tuple[list[int], str]] = []
    for place, by_waits in by_place.items():
        if len(by_waits) > 3:
            ids = sorted(r for reps in by_waits.values() for r in reps)
            groups.append((ids, place.replace(" (group", " each waiting for its own peers (group", 1)
                           if "(group" in place else place + " each waiting for its own peers"))
            continue
        for waits, ids in by_waits.items():
            text = place if not waits else place.replace(" (group", f" waiting for {waits} (group", 1) \
                if "(group" in place else f"{place} waiting for {waits}"
            groups.append((ids, text))
    return sorted(groups, key=lambda g: g[0][0])


def _edge_lines(edges: list[Edge], sources: SourceMap = NO_SOURCES) -> list[str]:
    """`replicas 0-1022 -> replica 1023  [all] in %r`: waiters with the same targets share a line."""
    targets: dict[tuple[int, str, str], list[int]] = {}
    for e in edges:
        targets.setdefault((e.waiter, e.needs, e.instruction), []).append(e.target)
    lines: dict[tuple[tuple[int, ...], str, str], list[int]] = {}
    for (waiter, needs, instruction), ts in targets.items():
        lines.setdefault((tuple(sorted(ts)), needs, instruction), []).append(waiter)
    return [f"{replicas_text(waiters)} -> {replicas_text(ts)}  [{needs}] in %{instruction}"
            f"{source_suffix(sources, instruction)}"
            for (ts, needs, instruction), waiters in lines.items()]


def find_cycles(edges: list[Edge]) -> list[list[int]]:
    """Strongly connected components with a cycle (Tarjan, iterative), each as a list of replicas: in
    wait-for order from its smallest replica when the component is one simple cycle, else sorted."""
    graph: dict[int, list[int]] = {}
    for e in edges:
        graph.setdefault(e.waiter, []).append(e.target)
        graph.setdefault(e.target, [])
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    sccs: list[list[int]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = len(index)
                stack.append(v)
                on_stack.add(v)
            successors = graph[v]
            if i < len(successors):
                work.append((v, i + 1))
                w = successors[i]
                if w not in index:
                    work.append((w, 0))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1 or v in graph[v]:
                    sccs.append(_cycle_order(comp, graph))
    return sccs


def _cycle_order(comp: list[int], graph: dict[int, list[int]]) -> list[int]:
    members = set(comp)
    inside = {v: [w for w in dict.fromkeys(graph[v]) if w in members] for v in comp}
    if any(len(ws) != 1 for ws in inside.values()):
        return sorted(comp)
    order = [min(comp)]
    while len(order) < len(comp):
        order.append(inside[order[-1]][0])
    return order
