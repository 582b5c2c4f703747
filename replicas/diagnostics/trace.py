"""Chrome trace-event export (Perfetto, chrome://tracing): a track per replica, a slice per op,
flow arrows from each Send to its RecvDone (and from each Recv's acknowledgement to the SendDone
that waited for it) and across each collective's members.

Input: the flight recorders' events, `{replica: [event, ...]}` as `FlightRecorder.events()` gives
them. The fields read here are those the kernels record: every event has kind, instruction,
opcode, start_us, end_us (None while unfinished); collectives add seq and group; channel events add
channel_id, seq and peer (recv, recv-done) or peers (send); "op" events (record_every_instruction)
add the computation.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from replicas.hlo.source import NO_SOURCES, SourceMap

_PID = 1
_EPSILON_US = 0.01  # flow ends must fall inside their slice


def trace_events(events: dict[int, list[dict[str, Any]]], sources: SourceMap = NO_SOURCES) -> list[dict[str, Any]]:
    """The trace events (a `traceEvents` list) for the recorded events of every replica; a slice
    whose instruction has metadata is named by its source too (`all-reduce %ar.3: psum at t.py:4`)."""
    out: list[dict[str, Any]] = [{"ph": "M", "name": "process_name", "pid": _PID, "args": {"name": "replicas job"}}]
    for r in sorted(events):
        out.append({"ph": "M", "name": "thread_name", "pid": _PID, "tid": r, "args": {"name": f"replica {r}"}})
        out.append({"ph": "M", "name": "thread_sort_index", "pid": _PID, "tid": r, "args": {"sort_index": r}})
    starts = [ev["start_us"] for evs in events.values() for ev in evs if ev.get("start_us") is not None]
    if not starts:
        return out
    # Relative times: absolute epoch microseconds lose their fraction in a double.
    base = min(starts)
    last = max([ev["end_us"] for evs in events.values() for ev in evs if ev.get("end_us") is not None] + starts)
    slices: dict[int, list[tuple[float, float, dict[str, Any]]]] = {}
    for r, evs in events.items():
        for ev in evs:
            start = ev.get("start_us")
            if start is None:  # a "truncated" record, or an event never begun
                continue
            end = ev.get("end_us")
            args = {k: _jsonable(v) for k, v in ev.items() if k not in ("start_us", "end_us", "fingerprint")}
            if end is None:
                args["unfinished"] = True
                end = last
            ts, dur = start - base, max(end - start, _EPSILON_US * 4)
            slices.setdefault(r, []).append((ts, ts + dur, ev))
            name = f"{ev.get('opcode', ev.get('kind'))} %{ev.get('instruction')}"
            source = sources.lookup(ev.get("instruction"), ev.get("computation")) if sources else None
            if source is not None:
                args["source"] = str(source)
                name += f": {source.op} at {source.location}" if source.location and source.op else ""
            out.append({"name": name,
                        "cat": str(ev.get("kind")), "ph": "X", "ts": ts, "dur": dur, "pid": _PID, "tid": r,
                        "args": args})
    out.extend(_flows(slices))
    return out


def _flows(slices: dict[int, list[tuple[float, float, dict[str, Any]]]]) -> list[dict[str, Any]]:
    sends: dict[tuple, tuple[int, float, float]] = {}  # (channel, src, dst, seq) -> the Send slice
    recv_dones: dict[tuple, tuple[int, float, float]] = {}
    recvs: dict[tuple, tuple[int, float, float]] = {}
    send_dones: dict[tuple, tuple[int, float, float]] = {}  # (channel, src, seq)
    collectives: dict[tuple, list[tuple[int, float, float]]] = {}
    for r, items in slices.items():
        for start, end, ev in items:
            kind, seq, channel = ev.get("kind"), ev.get("seq"), ev.get("channel_id")
            where = (r, start, end)
            if kind == "collective" and seq is not None:
                collectives.setdefault((seq, tuple(ev.get("group") or ())), []).append(where)
            elif kind == "send" and seq is not None:
                for peer in ev.get("peers") or ([ev["peer"]] if isinstance(ev.get("peer"), int) else []):
                    sends[(channel, r, peer, seq)] = where
            elif kind == "recv-done" and isinstance(ev.get("peer"), int):
                recv_dones[(channel, ev["peer"], r, seq)] = where
            elif kind == "recv" and isinstance(ev.get("peer"), int):
                recvs[(channel, ev["peer"], r, seq)] = where
            elif kind == "send-done" and seq is not None:
                send_dones[(channel, r, seq)] = where
    out: list[dict[str, Any]] = []
    flow_id = 0
    for key, src in sends.items():
        if key in recv_dones:
            flow_id += 1
            out.extend(_flow(flow_id, f"channel {key[0]} #{key[3]}", src, recv_dones[key]))
    for (channel, sender, _receiver, seq), src in recvs.items():
        dst = send_dones.get((channel, sender, seq))
        if dst is not None:
            flow_id += 1
            out.extend(_flow(flow_id, f"channel {channel} #{seq} ack", src, dst))
    for (seq, _group), members in collectives.items():
        if len(members) < 2:
            continue
        # From the last member to arrive to every other member: the one everybody waited for.
        last = max(members, key=lambda m: m[1])
        for m in members:
            if m is not last:
                flow_id += 1
                out.extend(_flow(flow_id, f"collective #{seq}", last, m))
    return out


def _flow(flow_id: int, name: str, src: tuple[int, float, float], dst: tuple[int, float, float]
          ) -> list[dict[str, Any]]:
    src_r, src_start, src_end = src
    dst_r, dst_start, dst_end = dst
    ts_src = min(src_start + _EPSILON_US, src_end)
    ts_dst = max(dst_end - _EPSILON_US, dst_start)
    return [{"ph": "s", "id": flow_id, "name": name, "cat": "flow", "pid": _PID, "tid": src_r, "ts": ts_src},
            {"ph": "f", "bp": "e", "id": flow_id, "name": name, "cat": "flow", "pid": _PID, "tid": dst_r,
             "ts": ts_dst}]


def _jsonable(v: Any) -> Any:
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return str(v)


def truncation(events: dict[int, list[dict[str, Any]]]) -> dict[int, int]:
    """Replica -> how many of its earliest events its flight recorder dropped (ring full)."""
    return {r: evs[0]["dropped"] for r, evs in events.items() if evs and evs[0].get("kind") == "truncated"}


def write_trace(path: str | Path, events: dict[int, list[dict[str, Any]]], sources: SourceMap = NO_SOURCES
                ) -> str | None:
    """Write a Chrome trace-event JSON file (open it in https://ui.perfetto.dev). A truncated trace
    says so in the file (`otherData`, and a marker at the start of each truncated replica's track);
    the returned note says so too (None when nothing was dropped)."""
    dropped = truncation(events)
    trace: dict[str, Any] = {"traceEvents": trace_events(events, sources), "displayTimeUnit": "ms"}
    if dropped:
        capacity = next(evs[0]["capacity"] for evs in events.values() if evs and evs[0].get("kind") == "truncated")
        trace["otherData"] = {"truncated": True, "events_kept_per_replica": capacity,
                              "dropped_events": {str(r): n for r, n in sorted(dropped.items())},
                              "note": truncation_note(dropped, capacity)}
        for r, n in dropped.items():
            first = min((ev["start_us"] for ev in events[r] if ev.get("start_us") is not None), default=None)
            starts = [ev["start_us"] for evs in events.values() for ev in evs if ev.get("start_us") is not None]
            ts = (first - min(starts)) if first is not None else 0
            trace["traceEvents"].append({"ph": "i", "s": "t", "name": f"trace truncated: {n} earlier events dropped",
                                         "pid": _PID, "tid": r, "ts": ts, "cat": "truncated"})
    Path(path).write_text(json.dumps(trace))
    return trace["otherData"]["note"] if dropped else None


def truncation_note(dropped: dict[int, int], capacity: int) -> str:
    from replicas.records import replicas_text

    return (f"truncated: {replicas_text(dropped)} recorded more than {capacity} events; the trace keeps the last "
            f"{capacity} of each (raise trace_events= / --trace-events)")
