"""The report carried by DeadlockError / ExecutionTimeout: who is blocked where, waiting for whom."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from replicas.records import HOST, ReplicaState


def _who(r: int) -> str:
    return "the host" if r == HOST else f"replica {r}"


def _where(s: ReplicaState) -> str:
    b = s.block
    if b is None:
        return s.instruction or s.status
    what = f"%{b.instruction} ({b.opcode}"
    if b.kind == "collective" and b.seq is not None:
        what += f" #{b.seq}"
    if b.channel_id is not None:
        what += f", channel {b.channel_id}"
    what += ")"
    if b.computation:
        what += f" in {b.computation}"
    return what


EVENTS_SHOWN = 5  # per replica in str(report); to_dict() has every event the report keeps


def _event_text(ev: dict[str, Any]) -> str:
    text = f"{ev.get('opcode')} %{ev.get('instruction')}"
    if ev.get("kind") == "collective" and ev.get("seq") is not None:
        text += f" #{ev['seq']}"
    elif ev.get("channel_id") is not None:
        text += f" (channel {ev['channel_id']}" + (f" #{ev['seq']}" if ev.get("seq") is not None else "") + ")"
    return text


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

    @property
    def blocked(self) -> list[int]:
        return [s.replica for s in self.states if s.status == "blocked"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "replicas": [s.to_dict() for s in self.states],
            "wait_for": [e.to_dict() for e in self.edges],
            "cycles": self.cycles,
            "findings": self.lines,
            "events": {str(k): v for k, v in self.events.items()},
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)

    def to_dot(self) -> str:
        out = ["digraph wait_for {", "  rankdir=LR;"]
        involved = {e.waiter for e in self.edges} | {e.target for e in self.edges}
        by_id = {s.replica: s for s in self.states}
        for r in sorted(involved):
            s = by_id.get(r)
            label = "host" if r == HOST else f"replica {r}\\n{_where(s) if s else ''}"
            style = ' style=dashed' if s is not None and s.status in ("finished", "failed") else ""
            out.append(f'  r{r if r >= 0 else "host"} [label="{label}"{style}];')
        in_cycle = {(c[i], c[(i + 1) % len(c)]) for c in self.cycles for i in range(len(c))}
        for e in self.edges:
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
        out = [self.title]
        out.extend(f"  {line}" for line in self.lines)
        out.append("replicas:")
        for s in self.states:
            state = s.status
            if s.block is not None:
                b = s.block
                waits = ", ".join(_who(r) for r in b.waits_for) or "nothing"
                need = "all of" if b.needs == "all" and len(b.waits_for) > 1 else ""
                state = f"blocked in {_where(s)} waiting for {need + ' ' if need else ''}{waits}"
                if b.group is not None:
                    state += f" (group {list(b.group)})"
            elif s.status == "running" and s.instruction:
                state = f"running {s.instruction}"
            elif s.status == "failed" and s.error:
                state = f"failed: {s.error}"
            out.append(f"  replica {s.replica}: {state}")
        if self.edges:
            out.append("wait-for graph (waiter -> needed):")
            for e in self.edges:
                out.append(f"  {_who(e.waiter)} -> {_who(e.target)}  [{e.needs}] in %{e.instruction}")
        for c in self.cycles:
            out.append("cycle: " + " -> ".join(str(r) for r in c + c[:1]))
        starts = [ev.get("start_us", 0) for evs in self.events.values() for ev in evs]
        if starts:
            base = min(starts)
            out.append("last events (ms since the first shown):")
            for r, evs in sorted(self.events.items()):
                for ev in evs[-EVENTS_SHOWN:]:
                    end = "not finished" if ev.get("end_us") is None else f"{(ev['end_us'] - base) / 1000:.3f}"
                    out.append(f"  replica {r}: {_event_text(ev)}  {(ev.get('start_us', 0) - base) / 1000:.3f}"
                               f" .. {end}")
        return "\n".join(out)


class MismatchReport(dict):
    """The report of a CollectiveMismatchError: a JSON-able dict (collective, replicas, instructions,
    fields [{field, expected, found}], expected, found fingerprints) whose `str` is the diff."""

    def to_dict(self) -> dict[str, Any]:
        return dict(self)

    def to_json(self) -> str:
        return json.dumps(self, indent=2, default=str)

    def __str__(self) -> str:
        return mismatch_diff(self)


def mismatch_diff(report: dict[str, Any]) -> str:
    """`- replica 0 %ar_a: shapes = [[4]]` / `+ replica 1 %ar_b: shapes = [[2]]`, one pair per field."""
    replicas = report.get("replicas") or []
    if len(replicas) != 2:
        return json.dumps(report, default=str)
    expected_by, found_by = replicas
    names = report.get("instructions") or {}

    def who(r: int) -> str:
        name = (names.get(str(r)) or {}).get("name")
        return f"replica {r}" + (f" %{name}" if name else "")

    lines = [f"collective #{report.get('collective')}: expected ({who(expected_by)}) vs found ({who(found_by)})"]
    for f in report.get("fields") or []:
        lines.append(f"- {who(expected_by)}: {f['field']} = {f['expected']}")
        lines.append(f"+ {who(found_by)}: {f['field']} = {f['found']}")
    return "\n".join(lines)


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
