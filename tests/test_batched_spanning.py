"""A batched run whose all-reduce group spans processes (`runtime/batched_spanning.py`): each
process's members reduce their rows as one partial and only the partials cross processes, with the
documented reduction order's bits (group order in a process, then process order), whether the other
processes run batched or replica by replica. Threads with a placement stand for packed actors; one
Ray job checks the actors."""

from __future__ import annotations

import numpy as np
import pytest

import replicas as rp
from replicas.runtime import batched
from replicas.runtime.compile import compile_module
from replicas.runtime.job import Job
from replicas.runtime.threads import ThreadBackend

LOOP = """\
HloModule loop, replica_count={n}

add {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}}

cond {{
  s = (s32[], f32[{e}], s32[]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  k = s32[] get-tuple-element(s), index=2
  ROOT lt = pred[] compare(i, k), direction=LT
}}

body {{
  s = (s32[], f32[{e}], s32[]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  x = f32[{e}] get-tuple-element(s), index=1
  k = s32[] get-tuple-element(s), index=2
  y = f32[{e}] all-reduce(x), replica_groups={{}}, to_apply=add
  one = s32[] constant(1)
  j = s32[] add(i, one)
  ROOT t = (s32[], f32[{e}], s32[]) tuple(j, y, k)
}}

ENTRY main {{
  x = f32[{e}] parameter(0)
  k = s32[] parameter(1)
  zero = s32[] constant(0)
  s = (s32[], f32[{e}], s32[]) tuple(zero, x, k)
  w = (s32[], f32[{e}], s32[]) while(s), condition=cond, body=body
  ROOT y = f32[{e}] get-tuple-element(w), index=1
}}
"""


def documented(operands: list[np.ndarray], placement: list[int], trips: int) -> np.ndarray:
    """The documented order: each process's members in group order, then the partials in process order."""
    values = list(operands)
    for _ in range(trips):
        processes: dict[int, list[int]] = {}
        for r, p in enumerate(placement):
            processes.setdefault(p, []).append(r)
        partials = []
        for members in processes.values():
            acc = values[members[0]]
            for r in members[1:]:
                acc = acc + values[r]
            partials.append(acc)
        total = partials[0]
        for part in partials[1:]:
            total = total + part
        values = [total] * len(values)
    return values[0]


def operands(n: int, e: int = 64) -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    # Magnitudes far apart: another order of additions gives other bits.
    return [(rng.standard_normal(e) * 10.0 ** rng.integers(-4, 5, e)).astype(np.float32) for _ in range(n)]


def batched_then_alone(m, args: list[list], placement: list[int], runs: int, monkeypatch) -> tuple[list, list]:
    """The job's results as it runs (`runs` of its processes batched), then with batching off."""

    def run() -> list:
        return Job(ThreadBackend(m, args, placement=placement), None, timeout=60, host_may_send=False).result()

    before = dict(batched.RUNS)
    out = run()
    assert batched.RUNS["batched"] - before["batched"] == runs
    monkeypatch.setattr(batched, "ENABLED", False)
    return out, run()


def run_placed(n: int, placement: list[int], args: list[list]) -> list:
    m = rp.parse_hlo(LOOP.format(n=n, e=len(args[0][0])))
    return Job(ThreadBackend(compile_module(m), args, placement=placement), None, timeout=60,
               host_may_send=False).result()


@pytest.mark.parametrize("placement", [[0, 0, 1, 1], [0, 0, 0, 1, 1, 1, 2, 2, 2], [0, 0, 0, 1], [1, 1, 0, 0],
                                       [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8]])
def test_a_spanning_all_reduce_runs_batched_with_the_documented_bits(placement, monkeypatch):
    n = len(placement)
    xs = operands(n)
    k = np.asarray(3, np.int32)  # one object: the loop's bound is every member's, so nobody can diverge
    before = dict(batched.RUNS)
    out = run_placed(n, placement, [[x, k] for x in xs])
    packed = [p for p in set(placement) if placement.count(p) > 1]  # a process of one member runs it alone
    assert batched.RUNS["batched"] - before["batched"] == len(packed)
    assert batched.RUNS["fallback"] == before["fallback"]
    monkeypatch.setattr(batched, "ENABLED", False)
    alone = run_placed(n, placement, [[x, k] for x in xs])
    # Beyond 8 processes the leaders combine partials in a tree (recursive doubling): the unbatched
    # run's bits are the reference there.
    want = documented(xs, placement, 3) if len(set(placement)) <= 8 else alone[0]
    for r, (y, z) in enumerate(zip(out, alone)):
        assert y.tobytes() == want.tobytes() == z.tobytes(), f"replica {r}"


def test_a_process_that_cannot_batch_meets_the_batched_ones_with_the_same_bits():
    placement = [0, 0, 0, 1, 1, 1, 2, 2, 2]
    n = len(placement)
    xs = operands(n)
    k = np.asarray(2, np.int32)
    # Process 1's members get equal bounds as different objects: stacked, its loop might diverge, so
    # it runs replica by replica (its members' leader meets the other processes' batched runs).
    args = [[x, np.asarray(2, np.int32) if placement[r] == 1 else k] for r, x in enumerate(xs)]
    before = dict(batched.RUNS)
    out = run_placed(n, placement, args)
    assert batched.RUNS["batched"] - before["batched"] == 2
    assert batched.RUNS["fallback"] - before["fallback"] == 1
    want = documented(xs, placement, 2)
    for r, y in enumerate(out):
        assert y.tobytes() == want.tobytes(), f"replica {r}"


def test_a_deadlock_across_batched_processes_is_reported():
    placement = [0, 0, 1, 1]
    xs = operands(4)
    k3, k4 = np.asarray(3, np.int32), np.asarray(4, np.int32)
    # Process 0 loops once more than process 1, whose replicas finish after 3 all-reduces.
    args = [[x, k4 if placement[r] == 0 else k3] for r, x in enumerate(xs)]
    with pytest.raises(rp.DeadlockError) as info:
        run_placed(4, placement, args)
    text = str(info.value)
    assert "all-reduce #3" in text and "replicas [2, 3] finished" in text, text
    report = info.value.report
    assert sorted(report.blocked) == [0, 1]
    # The run's collectives so far are on its members' recorders while it waits (as without batching).
    for r in (0, 1):
        assert [e["seq"] for e in report.events[r] if e.get("kind") == "collective"] == [0, 1, 2], r


def test_packed_actors_run_a_spanning_all_reduce_batched(ray_session):
    n, per = 8, 2
    placement = [r // per for r in range(n)]
    xs = operands(n)
    k = np.asarray(3, np.int32)
    m = rp.parse_hlo(LOOP.format(n=n, e=64))
    with rp.launch(m, [[x, k] for x in xs], num_replicas=n, replicas_per_actor=per, timeout=120) as job:
        out = job.result()
        events = job.events()
    assert {e.get("algorithm") for evs in events.values() for e in evs if e.get("kind") == "collective"} == {"batched"}
    assert all(len([e for e in evs if e.get("kind") == "collective"]) == 3 for evs in events.values())
    want = documented(xs, placement, 3)
    for r, y in enumerate(out):
        assert y.tobytes() == want.tobytes(), f"replica {r}"


def test_each_member_records_the_runs_collectives_once_numbered_in_order():
    placement = [0, 0, 0, 1, 1, 1]
    xs = operands(6)
    k = np.asarray(4, np.int32)
    m = rp.parse_hlo(LOOP.format(n=6, e=64))
    job = Job(ThreadBackend(compile_module(m), [[x, k] for x in xs], placement=placement), None, timeout=60,
              host_may_send=False)
    job.result()
    events = job.events()
    for r in range(6):
        collectives = [e for e in events[r] if e.get("kind") == "collective"]
        assert [e["seq"] for e in collectives] == [0, 1, 2, 3], r
        assert {e["algorithm"] for e in collectives} == {"batched"}, r


REDUCE = """\
HloModule one, replica_count={n}

red {{
  a = {t}[] parameter(0)
  b = {t}[] parameter(1)
  ROOT s = {t}[] {op}(a, b)
}}

ENTRY main {{
  x = {t}[16] parameter(0)
  ROOT y = {t}[16] all-reduce(x), replica_groups={{}}, to_apply=red
}}
"""


@pytest.mark.parametrize(("t", "op", "dtype"), [("s8", "add", np.int8), ("f32", "maximum", np.float32),
                                                ("f64", "multiply", np.float64), ("u32", "add", np.uint32)])
def test_other_types_and_reductions_give_the_unbatched_bits(t, op, dtype, monkeypatch):
    placement = [0, 0, 0, 1, 1, 1, 2, 2]
    n = len(placement)
    rng = np.random.default_rng(5)
    raw = rng.standard_normal((n, 16)) * 100
    xs = [raw[r].astype(dtype) if dtype in (np.float32, np.float64) else
          rng.integers(0 if dtype == np.uint32 else -128, 127, 16).astype(dtype) for r in range(n)]
    m = compile_module(rp.parse_hlo(REDUCE.format(n=n, t=t, op=op)))
    out, alone = batched_then_alone(m, [[x] for x in xs], placement, 3, monkeypatch)
    for r, (y, z) in enumerate(zip(out, alone)):
        assert y.dtype == z.dtype == dtype and y.tobytes() == z.tobytes(), f"replica {r}"


TUPLE = """\
HloModule pair, replica_count={n}

red {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  s = f32[] add(a, b)
  half = f32[] constant(0.5)
  ROOT h = f32[] multiply(s, half)
}}

ENTRY main {{
  x = f32[8] parameter(0)
  y = f32[4] parameter(1)
  ROOT z = (f32[8], f32[4]) all-reduce(x, y), replica_groups={{}}, to_apply=red
}}
"""


def test_a_tuple_all_reduce_with_a_computed_reduction_gives_the_unbatched_bits(monkeypatch):
    placement = [0, 0, 0, 1, 1, 2, 2, 2]
    n = len(placement)
    xs = operands(n, 8)
    rng = np.random.default_rng(9)
    ys = [rng.standard_normal(4).astype(np.float32) for _ in range(n)]
    m = compile_module(rp.parse_hlo(TUPLE.format(n=n)))
    out, alone = batched_then_alone(m, [[x, y] for x, y in zip(xs, ys)], placement, 3, monkeypatch)
    for r, (got, want) in enumerate(zip(out, alone)):
        assert [v.tobytes() for v in got] == [v.tobytes() for v in want], f"replica {r}"
