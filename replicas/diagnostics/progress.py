"""Where a running job is, as data (`Job.progress()`) and as a live status line on a terminal."""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

from replicas.diagnostics.report import where, with_source
from replicas.hlo.source import NO_SOURCES, SourceMap
from replicas.records import BATCHED_OPCODE, HOST, ReplicaState, replicas_text


def host_waits(states: list[ReplicaState], sources: SourceMap = NO_SOURCES) -> list[str]:
    """`replicas [1, 2, 3] wait in %in (infeed) for the host`, one line per place they wait."""
    waiting: dict[str, list[int]] = {}
    for s in states:
        if s.status == "blocked" and s.block is not None and HOST in s.block.waits_for:
            waiting.setdefault(where(s.block, sources), []).append(s.replica)
    return [f"{replicas_text(reps)} {'waits' if len(reps) == 1 else 'wait'} in {place} for the host"
            for place, reps in waiting.items()]


@dataclass(frozen=True)
class Progress:
    """A snapshot of a job: `str()` is the live status line; `to_dict()` is JSON-able."""

    elapsed: float  # seconds since launch
    running: int
    blocked: int
    finished: int
    failed: int
    slowest: int | None  # the replica that started the fewest collectives (lowest id on ties)
    instruction: str | None  # what the slowest replica executes or waits in: `%ar (all-reduce #7)`
    # The slowest replica's collective number: the one it waits in, else the next it will start.
    collective: int
    collectives_per_second: float  # the slowest replica's collectives over the elapsed time
    waiting_for_host: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        text = (f"{self.elapsed:6.1f} s  running {self.running}  blocked {self.blocked}  "
                f"finished {self.finished}")
        if self.failed:
            text += f"  failed {self.failed}"
        if self.slowest is not None:
            text += f"  slowest: replica {self.slowest}"
            if self.instruction:
                text += f" in {self.instruction}"
            text += f", collective #{self.collective}"
        text += f"  {self.collectives_per_second:.1f} collectives/s"
        if self.waiting_for_host:
            text += "  (" + "; ".join(self.waiting_for_host) + ")"
        return text


def _in_batched_run(s: ReplicaState) -> bool:
    return s.status == "blocked" and s.block is not None and s.block.opcode == BATCHED_OPCODE


def progress_of(states: list[ReplicaState], elapsed: float, sources: SourceMap = NO_SOURCES) -> Progress:
    counts = {"running": 0, "blocked": 0, "finished": 0, "failed": 0}
    for s in states:
        if _in_batched_run(s):
            counts["running"] += 1  # its process's batched run computes it (runtime/batched.py)
        elif s.status in counts:
            counts[s.status] += 1
    active = [s for s in states if s.status in ("running", "blocked")]
    # A batched run's members are where their leader is: the slowest is chosen among the others.
    active = [s for s in active if not _in_batched_run(s)] or active
    slowest = min(active, key=lambda s: (s.collectives_started, s.replica)) if active else None
    instruction = None
    started = slowest.collectives_started if slowest is not None else \
        min((s.collectives_started for s in states), default=0)
    collective = started
    if slowest is not None:
        b = slowest.block
        instruction = where(b, sources) if b is not None else \
            with_source(slowest.instruction, sources) if slowest.instruction else None
        if b is not None and b.kind == "collective" and b.seq is not None:
            collective = b.seq  # the number its instruction shows
    rate = started / elapsed if elapsed > 0 else 0.0
    return Progress(elapsed, counts["running"], counts["blocked"], counts["finished"], counts["failed"],
                    slowest.replica if slowest is not None else None, instruction, collective, rate,
                    host_waits(states, sources))


class LiveStatus:
    """A status line redrawn in place on `stream` (rich), only when it is a terminal."""

    REFRESH_SECONDS = 0.25

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = bool(getattr(self.stream, "isatty", lambda: False)())
        self._live: Any = None
        self._shown = 0.0

    def show(self, progress: Progress) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._shown < self.REFRESH_SECONDS:
            return
        self._shown = now
        from rich.text import Text

        if self._live is None:
            from rich.console import Console
            from rich.live import Live

            self._live = Live(Text(str(progress)), console=Console(file=self.stream), transient=True,
                              auto_refresh=False)
            self._live.start()
        self._live.update(Text(str(progress)), refresh=True)

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
