"""The report of a CollectiveMismatchError: which collective, the differing fields as a diff, and
which replicas are on each side. Built here only (`mismatch_report`), read like the deadlock
`Report`: attributes, `to_dict()`, `str()` for terminals."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from replicas.errors import CollectiveMismatchError, ReplicasError
from replicas.records import replicas_text

if TYPE_CHECKING:
    from replicas.diagnostics.report import Report


@dataclass
class MismatchReport:
    """`replicas` = [expected_by, found_by]: the replica that found the disagreement, and its peer;
    `fields` = [{field, expected, found}]; `sides` = the replicas that ran each side's instruction
    as their collective #`collective` (filled from the flight recorders when the job ends)."""

    collective: int
    replicas: list[int]
    instructions: dict[str, dict[str, Any]]  # str(replica) -> {computation, name, opcode}
    fields: list[dict[str, Any]]
    expected: dict[str, Any] | None = None  # the expecting replica's fingerprint
    found: dict[str, Any] | None = None
    sides: list[list[int]] = field(default_factory=list)  # [expected side, found side]
    deadlock: Report | None = None  # when the mismatch showed as a deadlock (a replica went elsewhere)
    sources: dict[str, str] = field(default_factory=dict)  # instruction name -> where it came from

    def to_dict(self) -> dict[str, Any]:
        return {"collective": self.collective, "replicas": self.replicas, "instructions": self.instructions,
                "fields": self.fields, "expected": self.expected, "found": self.found, "sides": self.sides,
                "deadlock": self.deadlock.to_dict() if self.deadlock is not None else None,
                "sources": self.sources}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)

    def _who(self, r: int, source: bool = False) -> str:
        name = (self.instructions.get(str(r)) or {}).get("name")
        return f"replica {r}" + (f" %{name}{self._from(name) if source else ''}" if name else "")

    def _from(self, name: str | None) -> str:
        text = self.sources.get(str(name)) if name else None
        return f" from {text}" if text else ""

    def __str__(self) -> str:
        """`- replica 0 %ar_a: shapes = [[4]]` / `+ replica 1 %ar_b: shapes = [[2]]`, and the sides."""
        expected_by, found_by = self.replicas
        lines = [f"collective #{self.collective}: expected ({self._who(expected_by, True)}) vs found "
                 f"({self._who(found_by, True)})"]
        for f in self.fields:
            lines.append(f"- {self._who(expected_by)}: {f['field']} = {value_text(f['field'], f['expected'])}")
            lines.append(f"+ {self._who(found_by)}: {f['field']} = {value_text(f['field'], f['found'])}")
        if len(self.sides) == 2 and all(self.sides):
            ran = [self._side_name(side) for side in self.sides]
            lines.append(f"- side: {replicas_text(self.sides[0])} ran {ran[0]} as collective #{self.collective}")
            lines.append(f"+ side: {replicas_text(self.sides[1])} ran {ran[1]} as collective #{self.collective}")
        return "\n".join(lines)

    def _side_name(self, side: list[int]) -> str:
        for r in (*self.replicas, *side):
            name = (self.instructions.get(str(r)) or {}).get("name")
            if r in side and name:
                return f"%{name}{self._from(name)}"
        return "another instruction"


def value_text(field: str, value: Any) -> str:
    """A fingerprint field's value as HLO text writes it: `{{0,1},{2,3}}`, `[4], [2]`, `%ar (all-reduce) in main`."""
    try:
        return _value_text(field, value)
    except (TypeError, ValueError):  # a peer's malformed fingerprint: shown as it came
        return str(value)


def _value_text(field: str, value: Any) -> str:
    if value is None:
        return "none"
    if field == "instruction":
        comp, name, opcode = value
        return f"%{name} ({opcode}) in {comp}"
    if field == "shapes":
        return ", ".join("[" + ",".join(map(str, dims)) + "]" for dims in value)
    if field == "dtypes":
        return ", ".join(value)
    if field in ("replica_groups", "source_target_pairs"):
        return "{" + ",".join("{" + ",".join(map(str, g)) + "}" for g in value) + "}"
    if field == "dimensions":
        return "{" + ",".join(map(str, value)) + "}"
    return str(value)


def mismatch_report(seq: int, me: int, mine: dict[str, Any], peer: int, theirs: dict[str, Any],
                    differences: list[tuple[str, Any, Any]], expected: dict[str, Any] | None,
                    found: dict[str, Any] | None, deadlock: Report | None = None) -> MismatchReport:
    """The one constructor: `mine`/`theirs` are {computation, name, opcode} of each side's instruction."""
    return MismatchReport(seq, [me, peer], {str(me): mine, str(peer): theirs},
                          [{"field": f, "expected": _jsonable(e), "found": _jsonable(x)} for f, e, x in differences],
                          expected, found, deadlock=deadlock)


def with_sides(error: ReplicasError, events: dict[int, list[dict[str, Any]]]) -> ReplicasError:
    """`error` with its mismatch report's sides filled from every replica's flight recorder: the
    replicas whose collective #k was the expecting replica's instruction, and the others'."""
    report = getattr(error, "report", None)
    if not isinstance(error, CollectiveMismatchError) or not isinstance(report, MismatchReport):
        return error
    by_name: dict[str, list[int]] = {}
    for r, evs in events.items():
        for ev in reversed(evs):
            if ev.get("kind") == "collective" and ev.get("seq") == report.collective:
                by_name.setdefault(str(ev.get("instruction")), []).append(r)
                break
    expected_by, found_by = report.replicas
    mine = (report.instructions.get(str(expected_by)) or {}).get("name")
    theirs = (report.instructions.get(str(found_by)) or {}).get("name")
    expected_side = sorted(by_name.get(str(mine), [expected_by]))
    found_side = sorted(r for name, reps in by_name.items() if name != str(mine) for r in reps) \
        if mine != theirs else [found_by]
    report.sides = [expected_side, found_side or [found_by]]
    headline = str(error).split("\n", 1)[0]
    return CollectiveMismatchError(headline, report)


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    return value
