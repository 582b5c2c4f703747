"""The flight recorder: a bounded ring of what a replica did (collectives, channels, feeds, and
with `every_instruction` every local op). A ring that overflowed says so: `events()` then starts
with a `{"kind": "truncated", "dropped": n, "capacity": c}` record."""

from __future__ import annotations

import hashlib
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from time import perf_counter_ns
from typing import Any

DEFAULT_CAPACITY = 4096  # events kept per replica (`trace_events=` / `--trace-events`)


def clock_anchor() -> tuple[int, float]:
    """(monotonic ns, wall-clock us) read at one instant. Shared by the recorders a process makes
    within a few minutes, so replicas of one process compare exactly (one anchor per recorder put a
    preemption between its two reads into that replica's times: milliseconds under load, enough to
    show a recv-done ending before the matching send started); re-read after a while, so a long-lived
    actor follows the wall clock that lines its times up with other processes'."""
    global _anchor
    now = time.perf_counter_ns()
    if _anchor is None or now - _anchor[0] > ANCHOR_LIFETIME_NS:
        best = None
        for _ in range(5):  # the read least likely to have been preempted in between
            before = time.perf_counter_ns()
            wall = time.time_ns()
            gap = time.perf_counter_ns() - before
            if best is None or gap < best[0]:
                best = (gap, before + gap // 2, wall / 1000)
        _anchor = best[1], best[2]
    return _anchor


ANCHOR_LIFETIME_NS = 600 * 10**9
_NONE = (None, None)
_anchor: tuple[int, float] | None = None


class FlightRecorder:
    """Records events with start/end times. `every_instruction` also records local ops; "values"
    (a divergence hunt: `replicas.jax.divergence`) also each op's value, as `event["value"]`: a
    digest of its bytes, or the value itself when compared within a tolerance ("values~")."""

    observe: Any = None  # (event, value) -> None after each local op, when values are recorded

    def __init__(self, replica: int, capacity: int = DEFAULT_CAPACITY, every_instruction: bool | str = False
                 ) -> None:
        self.replica = replica
        if every_instruction in ("values", "values~"):
            self.observe = self._digest if every_instruction == "values" else self._keep
        self.capacity = capacity
        self.every_instruction = every_instruction
        # Times are microseconds on the wall clock (so replicas in different processes line up),
        # advanced by the monotonic clock (so durations are exact).
        self._t0, self._epoch_us = clock_anchor()
        self.recorded = 0  # every event begun, kept or since dropped
        self._events: deque[Any] = deque(maxlen=capacity)  # event dicts and `record_deferred` entries
        # id(wire) -> (wire, its JSON-able dict), for the events' fingerprints (see `collective_template`).
        self._fingerprints: dict[int, tuple[tuple, dict[str, Any]]] = {}

    def begin(self, kind: str, instruction: str, opcode: str, **info: Any) -> dict[str, Any]:
        event = {"kind": kind, "instruction": instruction, "opcode": opcode,
                 "replica": self.replica, "start_us": self._now_us(), "end_us": None, **info}
        self._events.append(event)
        self.recorded += 1
        return event

    def collective_template(self, group: tuple[int, ...], wire: tuple, fingerprint: dict[str, Any],
                            instruction: str, opcode: str) -> dict[str, Any]:
        """What every event of one collective instruction shares, for `begin_collective` (made once
        per instruction and job: every member of every collective records one event per call).

        The event holds the fingerprint's `wire` (a tuple of plain values, like the group) and
        `events()` puts its dict in: once the collector has seen those (interned) tuples, they are
        untracked, and so is a dict of plain values and its copies: the ring (up to `capacity` events
        per replica, thousands of replicas per process) adds nothing to its collections, which
        otherwise took a noticeable share of the CPU with hundreds of replica threads."""
        if self._fingerprints.get(id(wire), _NONE)[0] is not wire:
            self._fingerprints[id(wire)] = (wire, fingerprint)
        return {"kind": "collective", "instruction": instruction, "opcode": opcode, "replica": self.replica,
                "start_us": None, "end_us": None, "seq": None, "group": group, "fingerprint": wire}

    def begin_collective(self, template: dict[str, Any], seq: int) -> dict[str, Any]:
        """`begin("collective", ..., seq=, group=, fingerprint=)` from the instruction's template: a copy
        of a dict and two stores, where building the event cost twice as much."""
        event = template.copy()
        event["start_us"] = self._epoch_us + (perf_counter_ns() - self._t0) / 1000
        event["seq"] = seq
        self._events.append(event)
        self.recorded += 1
        return event

    def record_deferred(self, source: Any, arg: Any, count: int) -> None:
        """`count` events kept by `source` and made only when read: `source.events(arg, replica)` gives
        them, or the last of them (a batched run's collectives, the same for thousands of replicas:
        recorded once for all of them, O(1) per replica however many collectives the run made)."""
        self._events.append((source, arg))
        self.recorded += count

    def ended(self, event: dict[str, Any]) -> None:
        """`end(event)` without the keyword dict."""
        event["end_us"] = self._epoch_us + (perf_counter_ns() - self._t0) / 1000

    def end(self, event: dict[str, Any], **info: Any) -> None:
        event["end_us"] = self._now_us()
        if info:
            event.update(info)

    @staticmethod
    def _digest(event: dict[str, Any], value: Any) -> None:
        event["value"] = value_digest(value)

    @staticmethod
    def _keep(event: dict[str, Any], value: Any) -> None:
        event["value"] = _copied(value)

    def _now_us(self) -> float:
        return self._epoch_us + (time.perf_counter_ns() - self._t0) / 1000

    def events(self, last: int | None = None) -> list[dict[str, Any]]:
        # Copies: a report keeps what was true when it was taken, while an aborted wait then ends its event.
        # list() takes the ring in one step (the replica may be appending meanwhile); `recorded` is read
        # first, so a ring that is not full never looks truncated.
        recorded = self.recorded
        return self.made(recorded, list(self._events), last)

    def taken(self) -> tuple[int, list[Any]]:
        """The ring as it is now, for `made` later: its entries (the unfinished events copied, the
        only ones that still change) and how many events were recorded."""
        recorded = self.recorded
        return recorded, [e.copy() if type(e) is dict and e.get("end_us") is None else e for e in list(self._events)]

    def made(self, recorded: int, entries: list[Any], last: int | None = None) -> list[dict[str, Any]]:
        """The events of `entries`, a copy of the ring when `recorded` events had been recorded."""
        events: list[dict[str, Any]] = []
        fingerprints = self._fingerprints
        for entry in entries:
            if type(entry) is not dict:  # record_deferred's
                events += entry[0].events(entry[1], self.replica)
                continue
            e = dict(entry)
            if e["kind"] == "collective" and type(e.get("fingerprint")) is tuple:
                e["fingerprint"] = fingerprints[id(e["fingerprint"])][1]
            events.append(e)
        if len(events) > self.capacity:
            events = events[-self.capacity:]
        if last:
            return events[-last:]
        dropped = recorded - len(events)
        if dropped > 0:
            events.insert(0, truncated(self.replica, dropped, self.capacity))
        return events


class RecordedEvents(Mapping[int, list[dict[str, Any]]]):
    """Replicas' flight recorders as `{replica: [event, ...]}`, taken at once and each replica's events
    made when first read: a job's end keeps every ring (its entries, not its events) without making
    the events of thousands of replicas that nobody may read."""

    def __init__(self, recorders: Iterable[tuple[int, FlightRecorder]]) -> None:
        self._taken = {r: (recorder, *recorder.taken()) for r, recorder in recorders}
        self._made: dict[int, list[dict[str, Any]]] = {}

    def __getitem__(self, replica: int) -> list[dict[str, Any]]:
        made = self._made.get(replica)
        if made is None:
            recorder, recorded, entries = self._taken[replica]
            made = self._made[replica] = recorder.made(recorded, entries)
        return made

    def __iter__(self) -> Iterator[int]:
        return iter(self._taken)

    def __len__(self) -> int:
        return len(self._taken)


def truncated(replica: int, dropped: int, capacity: int) -> dict[str, Any]:
    return {"kind": "truncated", "replica": replica, "dropped": dropped, "capacity": capacity,
            "instruction": None, "opcode": None, "start_us": None, "end_us": None}


def value_digest(value: Any) -> Any:
    """What two bitwise-equal values share and different ones do not (16 bytes of BLAKE2b of the
    bytes, with the dtype and shape); tuples element by element."""
    if isinstance(value, (tuple, list)):
        return tuple(value_digest(v) for v in value)
    array = getattr(value, "__array_interface__", None) is not None or hasattr(value, "dtype")
    if not array:
        return repr(value)
    import numpy as np

    a = np.ascontiguousarray(value)
    return (a.dtype.str, a.shape, hashlib.blake2b(a.view(np.uint8).reshape(-1) if a.size else b"",
                                                  digest_size=16).hexdigest())


def _copied(value: Any) -> Any:
    if isinstance(value, (tuple, list)):
        return tuple(_copied(v) for v in value)
    return value.copy() if hasattr(value, "copy") and hasattr(value, "dtype") else value
