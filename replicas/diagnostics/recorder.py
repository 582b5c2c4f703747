"""The flight recorder: a bounded ring of what a replica did (collectives, channels, feeds)."""

from __future__ import annotations

import time
from collections import deque
from typing import Any


class FlightRecorder:
    """Records events with start/end times. `every_instruction` also records local ops."""

    def __init__(self, replica: int, capacity: int = 4096, every_instruction: bool = False) -> None:
        self.replica = replica
        self.every_instruction = every_instruction
        self._events: deque[dict[str, Any]] = deque(maxlen=capacity)
        # Times are microseconds on the wall clock (so replicas in different processes line up),
        # advanced by the monotonic clock (so durations are exact).
        self._t0 = time.perf_counter_ns()
        self._epoch_us = time.time_ns() / 1000

    def begin(self, kind: str, instruction: str, opcode: str, **info: Any) -> dict[str, Any]:
        event = {"kind": kind, "instruction": instruction, "opcode": opcode,
                 "replica": self.replica, "start_us": self._now_us(), "end_us": None, **info}
        self._events.append(event)
        return event

    def end(self, event: dict[str, Any], **info: Any) -> None:
        event["end_us"] = self._now_us()
        if info:
            event.update(info)

    def _now_us(self) -> float:
        return self._epoch_us + (time.perf_counter_ns() - self._t0) / 1000

    def events(self, last: int | None = None) -> list[dict[str, Any]]:
        events = list(self._events)
        return events[-last:] if last else events
