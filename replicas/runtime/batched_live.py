"""What the members of a batched run (`batched.py`) show of it: while it runs, their live states
(the collectives it ran so far, the instruction it runs), and its collectives on their flight
recorders.

A member's own interpreter runs nothing while its process's batched run computes it, and the run
numbers its collectives on the members' fabrics only once it succeeded (`replay`): a run that
falls back numbers them as if it never happened. So while it runs, each member's fabric holds the
run and the member's count before it (`LIVE`), and `ReplicaRunner.state` reads the run's count
and instruction from there (`during`): the same counter and instruction an unbatched replica
publishes, at no cost to the run's kernels (its generated code sets its context's `current`
anyway, and each collective appends to its log).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from replicas.diagnostics.recorder import clock_anchor
from replicas.hlo.ir import Instruction

# kernel_state of a member while a batched run computes it: (the run's context, the member's
# collectives before the run). A new tuple per run: a reader tells a run that ended by identity.
LIVE = "batched: live run"


def mark(ctx: Any, fabrics: Sequence[Any]) -> None:
    """The run of `ctx` starts for the members of `fabrics` (in member order)."""
    ctx.current = None
    for fabric in fabrics:
        fabric.kernel_state[LIVE] = (ctx, fabric.collectives_started())


def _unmark(fabrics: Sequence[Any]) -> None:
    for fabric in fabrics:
        fabric.kernel_state.pop(LIVE, None)


def during(state: dict[str, Any]) -> tuple[int, Instruction | None] | None:
    """(collectives started, the instruction running) of the member whose `kernel_state` is `state`
    while a batched run computes it; None when none does (its fabric and interpreter tell)."""
    found = state.get(LIVE)
    if found is None:
        return None
    ctx, before = found
    started, current = before + len(ctx.log), ctx.current
    # Its run ended meanwhile (the log is emptied once every member was numbered and let go): the
    # member's fabric counts them now.
    return (started, current) if state.get(LIVE) is found else None


def failed(ctx: Any, fabrics: Sequence[Any]) -> None:
    """A run that raised (it falls back, or fails): its members are let go, their counts as before
    it; their recorders keep what it ran, as it was (`go_live`)."""
    _unmark(fabrics)
    live, ctx.live = ctx.live, None
    if live is not None:
        log = list(ctx.log)
        live.freeze(log, len(log))


def replay(ctx: Any, fabrics: Sequence[Any]) -> None:
    """Number and record the run's collectives on every member, in the order they ran: one
    `Replayed` log the members' flight recorders share (recording stays O(1) per member and run);
    then let the members go."""
    log = list(ctx.log)  # the kernels append to this very list: emptied, never replaced
    live, ctx.live = ctx.live, None
    if not log:
        if live is not None:
            live.freeze([], 0)
        _unmark(fabrics)
        return
    recorders = [fabric.recorder for fabric in fabrics if fabric.recorder is not None]
    keep = max((r.capacity for r in recorders), default=0)  # what a member's ring can show of it
    kept = log[len(log) - keep:] if keep else []
    if live is not None:  # already on the recorders (`go_live`): its final log, then the count
        live.freeze(kept, len(log))
    replayed = live or Replayed(ctx.collectives, kept, len(log))
    state = LIVE
    for k, fabric in enumerate(fabrics):
        first = fabric.next_collectives(len(log))
        # Numbered first, let go after: a state read meanwhile counts the run once (`during`).
        fabric.kernel_state.pop(state, None)
        if fabric.recorder is not None:
            if live is None:
                fabric.recorder.record_deferred(replayed, (k, first), len(log))
            else:
                fabric.recorder.recorded += len(log)
    ctx.log.clear()


def go_live(ctx: Any, fabrics: Sequence[Any]) -> None:
    """Put the run on its members' flight recorders now, its log read as it grows (a run that can
    no longer fall back and waits for other processes: a report made meanwhile shows what it ran,
    as the unbatched path records each collective when it runs). Once per run."""
    if ctx.live is not None:
        return
    live = ctx.live = Replayed(ctx.collectives, ctx.log, 0, live=True)
    for k, fabric in enumerate(fabrics):
        if fabric.recorder is not None:
            fabric.recorder.record_deferred(live, (k, fabric.collectives_started()), 0)


class Replayed:
    """The collectives one batched run made, as each member's flight recorder shows them (expanded
    when read: `FlightRecorder.record_deferred`): the last `log` entries (index in `collectives`,
    start ns, end ns) of the `count` the run made; `live`: `log` is the running run's own, read as
    it grows, until `freeze`."""

    __slots__ = ("collectives", "log", "count", "anchor", "live")

    def __init__(self, collectives: list[tuple[Instruction, list[tuple[tuple[int, ...], Any]]]],
                 log: list[tuple[int, int, int]], count: int, live: bool = False) -> None:
        self.collectives, self.log, self.count, self.live = collectives, log, count, live
        self.anchor = clock_anchor()

    def freeze(self, log: list[tuple[int, int, int]], count: int) -> None:
        self.log, self.count, self.live = log, count, False

    def events(self, member: tuple[int, int], replica: int) -> list[dict[str, Any]]:
        """Member k's events, its collectives numbered from `first` (`member` = (k, first))."""
        k, first = member
        t0, epoch_us = self.anchor
        log = list(self.log) if self.live else self.log
        count = len(log) if self.live else self.count
        seq = first + count - len(log)
        templates: dict[int, dict[str, Any]] = {}
        out = []
        for j, (index, start, end) in enumerate(log):
            template = templates.get(index)
            if template is None:
                inst, per_member = self.collectives[index]
                group, fp = per_member[k]
                template = templates[index] = {"kind": "collective", "instruction": inst.name, "opcode": inst.opcode,
                                               "replica": replica, "start_us": None, "end_us": None, "seq": None,
                                               "group": group, "fingerprint": fp.as_dict(), "algorithm": "batched"}
            event = template.copy()
            event["start_us"] = epoch_us + (start - t0) / 1000
            event["end_us"] = epoch_us + (end - t0) / 1000
            event["seq"] = seq + j
            out.append(event)
        return out
