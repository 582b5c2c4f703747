"""Chrome trace-event files: a track per replica, a slice per recorded op, flow arrows Send -> RecvDone
and across collective members; written on success and on a deadlock."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from buggy_programs import BY_NAME

import replicas as rp
from replicas.cli import main as cli_main
from replicas.diagnostics.trace import trace_events


def load(path: Path) -> list[dict]:
    data = json.loads(path.read_text())
    assert data["displayTimeUnit"] == "ms"
    return data["traceEvents"]


def slices(events: list[dict]) -> list[dict]:
    return [e for e in events if e["ph"] == "X"]


def flows(events: list[dict]) -> dict[int, tuple[dict, dict]]:
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    assert starts.keys() == ends.keys()
    return {i: (starts[i], ends[i]) for i in starts}


def enclosing(events: list[dict], tid: int, ts: float) -> dict:
    """The slice of track `tid` a flow point at `ts` binds to (the innermost one containing it)."""
    found = [e for e in slices(events) if e["tid"] == tid and e["ts"] <= ts <= e["ts"] + e["dur"]]
    assert found, f"no slice on replica {tid} contains {ts}"
    return min(found, key=lambda e: e["dur"])


def test_tracks_slices_and_send_recv_flows(tmp_path: Path) -> None:
    case = BY_NAME["send_recv_ok"]
    path = tmp_path / "trace.json"
    rp.run(rp.parse_hlo(case.hlo), case.args(), num_replicas=2, backend="threads", timeout=30, trace=str(path))
    events = load(path)
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names == {0: "replica 0", 1: "replica 1"}
    for r in (0, 1):
        ops = [e["name"] for e in slices(events) if e["tid"] == r]
        assert sorted(ops) == sorted(["recv %rcv", "send %snd", "recv-done %got", "send-done %sent"])
    assert all(e["ts"] >= 0 and e["dur"] > 0 for e in slices(events))
    pairs = set()
    for start, end in flows(events).values():
        src = enclosing(events, start["tid"], start["ts"])
        dst = enclosing(events, end["tid"], end["ts"])
        pairs.add((src["tid"], src["name"], dst["tid"], dst["name"]))
        assert end["bp"] == "e"
    # Data: each Send to the peer's RecvDone; acknowledgement: each Recv to the peer's SendDone.
    assert pairs == {(0, "send %snd", 1, "recv-done %got"), (1, "send %snd", 0, "recv-done %got"),
                     (0, "recv %rcv", 1, "send-done %sent"), (1, "recv %rcv", 0, "send-done %sent")}


def test_collective_flows_connect_every_member(tmp_path: Path) -> None:
    case = BY_NAME["slow_replica_before_all_reduce"]
    path = tmp_path / "trace.json"
    module = rp.parse_hlo(case.hlo)
    with rp.launch(module, case.args(), num_replicas=3, backend="threads", trace=str(path),
                   record_every_instruction=True) as job:
        job.result()
    events = load(path)
    coll = [e for e in slices(events) if e["cat"] == "collective"]
    assert sorted(e["tid"] for e in coll) == [0, 1, 2]
    assert all(e["args"]["seq"] == 0 and e["args"]["group"] == [0, 1, 2] for e in coll)
    # Every instruction has its slice, nested ones (the branch's dot) included.
    dots = [e for e in slices(events) if e["name"].startswith("dot ")]
    assert {e["tid"] for e in dots} == {0}
    arrows = flows(events)
    assert len(arrows) == 2
    (last,) = {s["tid"] for s, _ in arrows.values()}  # the member that arrived last: everybody waited for it
    assert {f["tid"] for _, f in arrows.values()} == {0, 1, 2} - {last}
    for s, f in arrows.values():
        assert enclosing(events, s["tid"], s["ts"])["cat"] in ("collective", "op")
        assert "all-reduce" in enclosing(events, f["tid"], f["ts"])["name"]


def test_trace_is_written_when_the_job_deadlocks(tmp_path: Path) -> None:
    case = BY_NAME["send_done_cycle"]
    path = tmp_path / "deadlock.json"
    with pytest.raises(rp.DeadlockError):
        rp.run(rp.parse_hlo(case.hlo), case.args(), num_replicas=2, backend="threads", timeout=30,
               trace=str(path))
    events = load(path)
    stuck = [e for e in slices(events) if e["args"].get("unfinished")]
    assert sorted((e["tid"], e["name"]) for e in stuck) == [(0, "send-done %sent"), (1, "send-done %sent")]


def test_trace_events_from_recorded_events_directly() -> None:
    t = 1.7e15  # epoch microseconds: the trace must rebase them (a double loses their fraction)
    recorded = {
        0: [{"kind": "send", "instruction": "s", "opcode": "send", "start_us": t, "end_us": t + 1, "channel_id": 4,
             "peers": [1, 2], "seq": 0}],
        1: [{"kind": "recv-done", "instruction": "d", "opcode": "recv-done", "start_us": t + 0.5,
             "end_us": t + 3, "channel_id": 4, "peer": 0, "seq": 0}],
        2: [{"kind": "recv-done", "instruction": "d", "opcode": "recv-done", "start_us": t + 2, "end_us": None,
             "channel_id": 4, "peer": 0, "seq": 0}],
    }
    events = trace_events(recorded)
    xs = {e["tid"]: e for e in slices(events)}
    assert xs[0]["ts"] == 0 and xs[1]["ts"] == 0.5 and xs[2]["ts"] == 2
    assert xs[2]["args"]["unfinished"] is True and xs[2]["dur"] == pytest.approx(1)
    assert sorted(f["tid"] for _, f in flows(events).values()) == [1, 2]
    assert trace_events({}) == [e for e in events if e["ph"] == "M" and e["name"] == "process_name"]


def test_cli_trace_writes_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    program = tmp_path / "ok.hlo"
    program.write_text(BY_NAME["all_reduce_ok"].hlo)
    args = tmp_path / "args.npz"
    np.savez(args, arg0=np.arange(4, dtype=np.float32))
    out = tmp_path / "t.json"
    code = cli_main(["trace", str(program), "--replicas", "2", "--args", str(args), "--out", str(out)])
    assert code == 0
    assert str(out) in capsys.readouterr().out
    events = load(out)
    assert sorted(e["tid"] for e in slices(events)) == [0, 1]
    assert len(flows(events)) == 1
