"""The report carried by DeadlockError / ExecutionTimeout: who is blocked where, waiting for whom."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from replicas.diagnostics.state import HOST, ReplicaState


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
    return what + ")"


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
            attrs = f'label="{e.needs}: %{e.instruction}"'
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
                for ev in evs[-5:]:
                    end = "not finished" if ev.get("end_us") is None else f"{(ev['end_us'] - base) / 1000:.3f}"
                    out.append(f"  replica {r}: {ev.get('kind')} %{ev.get('instruction')} "
                               f"{(ev.get('start_us', 0) - base) / 1000:.3f} .. {end}")
        return "\n".join(out)


def find_cycles(edges: list[Edge]) -> list[list[int]]:
    """Strongly connected components with a cycle (Tarjan), each as a list of replicas."""
    graph: dict[int, list[int]] = {}
    for e in edges:
        graph.setdefault(e.waiter, []).append(e.target)
        graph.setdefault(e.target, [])
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    sccs: list[list[int]] = []
    counter = [0]

    def visit(v: int) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph[v]:
                sccs.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sccs
