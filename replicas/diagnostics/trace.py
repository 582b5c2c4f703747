"""Chrome trace-event export (Perfetto, chrome://tracing): a track per replica, a slice per op,
flow arrows from each Send to its Recv and across each collective's members."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_PID = 1


def trace_events(events: dict[int, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for r in sorted(events):
        out.append({"ph": "M", "name": "thread_name", "pid": _PID, "tid": r, "args": {"name": f"replica {r}"}})
        out.append({"ph": "M", "name": "thread_sort_index", "pid": _PID, "tid": r, "args": {"sort_index": r}})
    collectives: dict[Any, list[tuple[int, dict[str, Any]]]] = {}
    sends: dict[Any, tuple[int, dict[str, Any]]] = {}
    recvs: dict[Any, tuple[int, dict[str, Any]]] = {}
    for r, evs in events.items():
        for ev in evs:
            start = ev.get("start_us")
            if start is None:
                continue
            end = ev.get("end_us")
            args = {k: _jsonable(v) for k, v in ev.items() if k not in ("start_us", "end_us")}
            out.append({"name": f"{ev.get('opcode', ev.get('kind'))} %{ev.get('instruction')}",
                        "cat": str(ev.get("kind")), "ph": "X", "ts": start,
                        "dur": max((end if end is not None else start) - start, 0.001),
                        "pid": _PID, "tid": r, "args": args})
            kind = ev.get("kind")
            if kind == "collective" and ev.get("seq") is not None:
                collectives.setdefault((ev["seq"], ev.get("instruction")), []).append((r, ev))
            elif ev.get("opcode") == "send" and ev.get("peer") is not None:
                sends[(ev.get("channel_id"), r, ev["peer"], ev.get("seq"))] = (r, ev)
            elif ev.get("opcode") in ("recv-done", "recv") and ev.get("peer") is not None:
                recvs[(ev.get("channel_id"), ev["peer"], r, ev.get("seq"))] = (r, ev)
    flow_id = 0
    for key, (src, sev) in sends.items():
        if key in recvs:
            dst, rev = recvs[key]
            flow_id += 1
            out.extend(_flow(flow_id, "send->recv", src, sev["start_us"], dst, rev.get("end_us") or rev["start_us"]))
    for members in collectives.values():
        if len(members) < 2:
            continue
        # Arrows from the last member to arrive to every other member: who everybody waited for.
        last_r, last = max(members, key=lambda m: m[1]["start_us"])
        for r, ev in members:
            if r == last_r:
                continue
            flow_id += 1
            out.extend(_flow(flow_id, "collective", last_r, last["start_us"], r, ev.get("end_us") or ev["start_us"]))
    return out


def _flow(flow_id: int, name: str, src: int, ts_src: float, dst: int, ts_dst: float) -> list[dict[str, Any]]:
    return [{"ph": "s", "id": flow_id, "name": name, "cat": "flow", "pid": _PID, "tid": src, "ts": ts_src},
            {"ph": "f", "bp": "e", "id": flow_id, "name": name, "cat": "flow", "pid": _PID, "tid": dst,
             "ts": ts_dst}]


def _jsonable(v: Any) -> Any:
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return str(v)


def write_trace(path: str | Path, events: dict[int, list[dict[str, Any]]]) -> None:
    Path(path).write_text(json.dumps({"traceEvents": trace_events(events), "displayTimeUnit": "ms"}))
