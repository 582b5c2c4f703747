"""Deadlocks and mismatches become precise errors (the catalog in buggy_programs.py), no false alarms,
the report's forms (text, JSON, DOT) and the flight recorder.

Every buggy program runs with a generous job timeout (30 s): getting DeadlockError or
CollectiveMismatchError, never ExecutionTimeout, shows the problem was detected, not timed out.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from buggy_programs import BY_NAME, CASES, CORRECT, LENIENT_OK, Case

import replicas as rp
from replicas.diagnostics.report import Report
from replicas.errors import CollectiveMismatchError, DeadlockError, ExecutionTimeout, ProgramError
from replicas.records import HOST

JOB_TIMEOUT = 30


def run_case(case: Case, backend: str = "threads", **kwargs) -> list:
    module = rp.parse_hlo(case.hlo)  # may already raise the ProgramError of an invalid program
    return rp.run(module, case.args(), num_replicas=case.num_replicas, timeout=JOB_TIMEOUT, backend=backend,
                  infeed=case.infeed, **kwargs)


def check_error(case: Case, error: BaseException) -> None:
    assert type(error) is case.error, f"{case.name}: expected {case.error.__name__}, got {error!r}"
    assert not isinstance(error, ExecutionTimeout)
    message = str(error)
    for name in case.instructions:
        assert f"%{name}" in message, f"{case.name}: %{name} not named in:\n{message}"
    for phrase in case.phrases:
        assert phrase in message, f"{case.name}: {phrase!r} not in:\n{message}"
    if isinstance(error, DeadlockError):
        report = error.report
        assert isinstance(report, Report)
        assert set(case.replicas) <= set(report.blocked) | {e.target for e in report.edges}
        blocked_instructions = {s.block.instruction for s in report.states if s.block is not None}
        assert blocked_instructions & set(case.instructions)
        if case.cycle is not None:
            assert case.cycle in report.cycles  # in wait-for order, from the smallest replica
        json.dumps(report.to_dict())  # JSON-able
        assert report.to_dot().startswith("digraph")
    elif isinstance(error, CollectiveMismatchError):
        report = error.report
        json.dumps(report.to_dict())  # JSON-able, like the deadlock Report
        if case.replicas:
            assert sorted(report.replicas) == sorted(case.replicas)
        names = {v["name"] for v in report.instructions.values()}
        assert names <= set(case.instructions) and len(names) == 2
        differing = [f["field"] for f in report.fields]
        assert case.mismatch_field in differing, f"{case.name}: {differing}"
        for f in report.fields:
            assert f["expected"] != f["found"]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_buggy_program_is_reported(case: Case) -> None:
    with pytest.raises(case.error) as info:
        run_case(case)
    check_error(case, info.value)


@pytest.mark.parametrize("case", CORRECT, ids=[c.name for c in CORRECT])
def test_correct_program_raises_nothing(case: Case) -> None:
    results = run_case(case)
    assert len(results) == case.num_replicas


def test_slow_replica_is_not_a_deadlock_and_computes_the_sum() -> None:
    case = BY_NAME["slow_replica_before_all_reduce"]
    results = run_case(case)
    for r in results:
        np.testing.assert_array_equal(r, np.full(4, 1 + 2 + 3, np.float32))


def test_lenient_matching_pairs_different_instructions_of_the_same_form() -> None:
    results = run_case(LENIENT_OK, strict=False)
    for r in results:
        np.testing.assert_array_equal(r, np.full(4, 3, np.float32))


def test_lenient_matching_still_rejects_a_different_form() -> None:
    with pytest.raises(CollectiveMismatchError, match="shapes"):
        run_case(BY_NAME["mismatched_shapes"], strict=False)


def test_deadlock_report_graph_shows_only_the_replicas_that_cause_it() -> None:
    with pytest.raises(DeadlockError) as info:
        run_case(BY_NAME["recv_before_all_reduce_lagging_replica"])
    report = info.value.report
    involved = {e.waiter for e in report.edges} | {e.target for e in report.edges}
    assert involved == {0, 3}  # replicas 1 and 2 wait too, but they are not the cause
    needs = {(e.waiter, e.target): e.needs for e in report.edges}
    assert needs == {(0, 3): "all", (3, 0): "one"}
    assert report.cycles == [[0, 3]]
    assert sorted(report.blocked) == [0, 1, 2, 3]
    text = str(report)
    assert "replica 3: blocked in %got (recv-done, channel 3) in main waiting for replica 0" in text
    assert "cycle: 0 -> 3 -> 0" in text
    dot = report.to_dot()
    assert "r0 -> r3" in dot and "r3 -> r0" in dot and "r1 ->" not in dot
    assert 'label="needs all: %ar"' in dot and 'label="needs one: %got"' in dot
    data = json.loads(report.to_json())
    assert {"waiter": 3, "target": 0, "needs": "one", "instruction": "got"} in data["wait_for"]
    assert data["replicas"][3]["block"]["opcode"] == "recv-done"


def test_finished_replicas_are_named_with_their_last_collective() -> None:
    with pytest.raises(DeadlockError) as info:
        run_case(BY_NAME["while_trip_count_depends_on_replica"])
    report = info.value.report
    states = {s.replica: s for s in report.states}
    assert states[0].status == "finished"
    block = states[1].block
    assert (block.instruction, block.opcode, block.seq, block.kind) == ("ar_loop", "all-reduce", 2, "collective")
    assert block.waits_for == (0,) and block.needs == "all" and block.group == (0, 1)
    assert block.computation == "body"
    assert report.cycles == []
    assert [(e.waiter, e.target) for e in report.edges] == [(1, 0)]


def test_report_carries_the_flight_recorder_tail_of_each_replica() -> None:
    with pytest.raises(DeadlockError) as info:
        run_case(BY_NAME["while_trip_count_depends_on_replica"])
    events = info.value.report.events
    assert set(events) == {0, 1}
    seqs = [ev["seq"] for ev in events[1] if ev["kind"] == "collective"]
    assert seqs == [0, 1, 2]
    assert events[1][-1]["end_us"] is None  # still waiting in #2
    assert all(ev["end_us"] >= ev["start_us"] for ev in events[0])
    assert "last events" in str(info.value.report)


def test_a_failed_jobs_events_are_as_they_were_when_it_ended_and_made_when_read() -> None:
    module = rp.parse_hlo(BY_NAME["while_trip_count_depends_on_replica"].hlo)
    job = rp.launch(module, [np.ones(4, np.float32)], num_replicas=2, backend="threads")
    with pytest.raises(DeadlockError):
        job.result()
    events = job.events()
    # The recorders' rings were taken when the job ended, not their events made: nothing read yet.
    assert sorted(events) == [0, 1] and not events._made  # noqa: SLF001 - the laziness is under test
    # Replica 1 was waiting in its collective #2 when the job ended.
    waiting = events[1][-1]
    assert (waiting["kind"], waiting["seq"], waiting["end_us"]) == ("collective", 2, None)
    assert list(events._made) == [1] and events[1] is events[1]  # noqa: SLF001 - made once, when read
    assert [ev["seq"] for ev in events[0] if ev["kind"] == "collective"][:2] == [0, 1]


def test_report_keeps_at_most_twenty_events_per_replica() -> None:
    hlo = BY_NAME["while_trip_count_depends_on_replica"].hlo.replace("two = s32[] constant(2)",
                                                                    "two = s32[] constant(30)")
    with pytest.raises(DeadlockError, match="replica 0 finished all-reduce #29 but did not join #30") as info:
        rp.run(rp.parse_hlo(hlo), [np.ones(4, np.float32)], num_replicas=2, timeout=JOB_TIMEOUT,
               backend="threads")
    events = info.value.report.events
    assert [len(events[r]) for r in (0, 1)] == [20, 20]
    assert [ev["seq"] for ev in events[1]] == list(range(11, 31))


def test_mismatch_names_both_instructions_as_a_diff() -> None:
    with pytest.raises(CollectiveMismatchError) as info:
        run_case(BY_NAME["mismatched_reductions"])
    report = info.value.report
    assert report.collective == 0
    assert [f["field"] for f in report.fields] == ["reduction", "instruction"]
    diff = report.fields[0]
    assert {diff["expected"], diff["found"]} == {"add(f32)", "maximum(f32)"}
    assert {report.expected["instruction"][1], report.found["instruction"][1]} == {"ar_a", "ar_b"}
    assert "maximum(f32) != add(f32)" in str(info.value) or "add(f32) != maximum(f32)" in str(info.value)
    assert json.loads(report.to_json()) == report.to_dict()
    diff_lines = str(report).splitlines()
    assert diff_lines[0].startswith("collective #0: expected (replica ")
    assert {line[:2] for line in diff_lines[1:]} == {"- ", "+ "}
    assert any(line.endswith("reduction = maximum(f32)") for line in diff_lines)


def test_group_mismatch_found_from_the_flight_recorder_of_a_replica_that_moved_on() -> None:
    with pytest.raises(CollectiveMismatchError) as info:
        run_case(BY_NAME["mismatched_groups_one_replica_alone"])
    report = info.value.report
    assert report.replicas == [0, 1]
    assert report.instructions["0"]["name"] == "ar_a"
    assert report.instructions["1"]["name"] == "ar_b"
    (field,) = [f for f in report.fields if f["field"] == "replica_groups"]
    assert field["expected"] == [[0, 1]] and field["found"] == [[0], [1]]
    assert "replica 1 completed its collective #0 without replica 0" in str(info.value)


def test_infeed_starvation_waits_for_the_host() -> None:
    with pytest.raises(DeadlockError) as info:
        run_case(BY_NAME["infeed_starved"])
    report = info.value.report
    assert {(e.waiter, e.target) for e in report.edges} == {(0, HOST), (1, HOST)}
    assert "replicas [0, 1] -> the host" in str(report)  # waiters in the same situation share a line


def test_launch_with_host_feeding_later_is_not_a_deadlock() -> None:
    module = rp.parse_hlo(BY_NAME["infeed_starved"].hlo)
    with rp.launch(module, [], num_replicas=2, backend="threads", timeout=JOB_TIMEOUT) as job:
        # The replicas block in infeed, but the host may still feed them: no deadlock is declared.
        for r in range(2):
            job.infeed(r, np.full(4, r, np.float32))
        results = job.result()
    assert [r.tolist() for r in results] == [[0] * 4, [1] * 4]


def test_waiting_for_a_host_that_may_still_feed_times_out_with_a_report() -> None:
    module = rp.parse_hlo(BY_NAME["infeed_starved"].hlo)
    with rp.launch(module, [], num_replicas=2, backend="threads", timeout=JOB_TIMEOUT) as job:
        job.infeed(0, np.zeros(4, np.float32))
        with pytest.raises(ExecutionTimeout) as info:
            job.result(timeout=0.2)
    assert "not a deadlock" in str(info.value)
    states = {s.replica: s for s in info.value.report.states}
    assert states[1].block is not None and states[1].block.waits_for == (HOST,)


def test_permute_conflict_is_rejected_before_running() -> None:
    with pytest.raises(ProgramError, match="duplicate target"):  # when parsed or, at the latest, launched
        module = rp.parse_hlo(BY_NAME["collective_permute_conflicting_pairs"].hlo)
        rp.launch(module, [np.ones(4, np.float32)], num_replicas=2, backend="threads")


def test_flight_recorder_records_every_instruction_only_when_asked() -> None:
    module = rp.parse_hlo(BY_NAME["branches_then_one_all_reduce"].hlo)
    args = [np.ones(4, np.float32)]
    with rp.launch(module, args, num_replicas=2, backend="threads", record_every_instruction=True) as job:
        job.result()
        events = job._backend.events()  # noqa: SLF001 - the recorder itself is under test
    ops = [(ev["kind"], ev["instruction"], ev.get("computation")) for ev in events[0]]
    assert ("op", "id", "main") in ops and ("op", "c", "on_zero") in ops and ("op", "r", "main") in ops
    assert ("op", "out", "main") in ops and ("collective", "out", None) in ops
    assert ("op", "c", "on_others") not in ops and ("op", "c", "on_others") in [
        (ev["kind"], ev["instruction"], ev.get("computation")) for ev in events[1]]
    op_ar = next(ev for ev in events[0] if ev["kind"] == "op" and ev["instruction"] == "out")
    coll = next(ev for ev in events[0] if ev["kind"] == "collective")
    assert op_ar["start_us"] <= coll["start_us"] <= coll["end_us"] <= op_ar["end_us"]
    with rp.launch(module, args, num_replicas=2, backend="threads") as job:
        job.result()
        events = job._backend.events()  # noqa: SLF001
    assert [ev["kind"] for ev in events[0]] == ["collective"]


def test_flight_recorder_is_a_bounded_ring() -> None:
    from replicas.diagnostics.recorder import FlightRecorder

    recorder = FlightRecorder(0, capacity=5)
    for i in range(12):
        recorder.end(recorder.begin("op", f"i{i}", "add"))
    marker, *kept = recorder.events()
    assert (marker["kind"], marker["dropped"], marker["capacity"]) == ("truncated", 7, 5)  # an overflow says so
    assert [ev["instruction"] for ev in kept] == [f"i{i}" for i in range(7, 12)]
    assert [ev["instruction"] for ev in recorder.events(last=2)] == ["i10", "i11"]


RAY_CASES = [c for c in CASES if c.ray]


@pytest.mark.parametrize("case", RAY_CASES, ids=[c.name for c in RAY_CASES])
def test_buggy_program_is_reported_under_ray(case: Case, ray_session) -> None:
    with pytest.raises(case.error) as info:
        run_case(case, backend="ray")
    check_error(case, info.value)


def test_recorders_of_one_process_share_one_clock(monkeypatch):
    """A preemption between the monotonic and the wall-clock read (here: the wall clock jumping 5 ms
    at every read) must not shift one replica's times against another's in the same process."""
    import time

    from replicas.diagnostics import recorder

    wall = iter(range(time.time_ns(), time.time_ns() + 10**12, 5_000_000))
    monkeypatch.setattr(recorder.time, "time_ns", lambda: next(wall))
    monkeypatch.setattr(recorder, "_anchor", None)
    first, second = recorder.FlightRecorder(0), recorder.FlightRecorder(1)
    earlier = second.begin("collective", "a", "all-reduce")
    later = first.begin("collective", "b", "all-reduce")
    assert earlier["start_us"] <= later["start_us"]


def test_a_timeout_report_tells_a_stuck_job_from_a_long_one() -> None:
    stuck = rp.parse_hlo(BY_NAME["infeed_starved"].hlo)
    with rp.launch(stuck, [], num_replicas=2, backend="threads", timeout=JOB_TIMEOUT) as job:
        job.infeed(0, np.zeros(4, np.float32))
        with pytest.raises(ExecutionTimeout) as info:
            job.result(timeout=1.2)  # past Movement.RECENT
    assert "no message moved in the last" in str(info.value), str(info.value)
    assert "advancing" not in str(info.value)

    long = rp.parse_hlo(PING_PONG_FOREVER)
    with pytest.raises(ExecutionTimeout) as info:
        rp.run(long, [np.ones(4, np.float32)], num_replicas=2, backend="threads", timeout=0.5)
    assert "replicas [0, 1] took or received messages in the last 1 s before the timeout" in str(info.value)
    assert "the job was advancing" in str(info.value)


PAIRS = 'frontend_attributes={_xla_send_recv_source_target_pairs="{{0,1},{1,0}}"}'
PING_PONG_FOREVER = f"""HloModule ping_pong, replica_count=2

cond {{
  p = (s32[], f32[4]) parameter(0)
  ROOT always = pred[] constant(true)
}}

body {{
  p = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  x = f32[4] get-tuple-element(p), index=1
  tok = token[] after-all()
  s = (f32[4], u32[], token[]) send(x, tok), channel_id=1, {PAIRS}
  r = (f32[4], u32[], token[]) recv(tok), channel_id=1, {PAIRS}
  d = (f32[4], token[]) recv-done(r), channel_id=1, {PAIRS}
  sd = token[] send-done(s), channel_id=1, {PAIRS}
  y = f32[4] get-tuple-element(d), index=0
  ROOT t = (s32[], f32[4]) tuple(i, y)
}}

ENTRY main {{
  x = f32[4] parameter(0)
  zero = s32[] constant(0)
  init = (s32[], f32[4]) tuple(zero, x)
  loop = (s32[], f32[4]) while(init), condition=cond, body=body
  ROOT out = f32[4] get-tuple-element(loop), index=1
}}
"""
