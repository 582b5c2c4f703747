"""Replica threads of one job kept on one core (tuning/affinity.py): pinned while the job runs, every
thread's own affinity back after it, the same bits either way. Linux only (sched_setaffinity)."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
from buggy_programs import loop_the_last_replica_skips

import replicas as rp
from replicas.runtime.compile import compile_module, light
from replicas.tuning import affinity
from replicas.tuning.cores import cores

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="thread affinity is Linux's")

# Each replica all-reduces its operand, then asks (a custom call, run in the replica's thread) which
# CPUs its thread may run on: a bit mask.
PROGRAM = """HloModule pinned, replica_count={n}
add {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}}

ENTRY main {{
  x = f32[64] parameter(0)
  y = f32[64] all-reduce(x), replica_groups={{}}, to_apply=add
  z = f32[64] all-reduce(y), replica_groups={{}}, to_apply=add
  m = s64[] custom-call(z), custom_call_target="thread_cpus"
  ROOT out = (f32[64], s64[]) tuple(z, m)
}}
"""


def mask(cpus: set[int]) -> int:
    return sum(1 << c for c in cpus)


@pytest.fixture
def thread_cpus():
    rp.register_custom_call("thread_cpus", lambda z: np.int64(mask(os.sched_getaffinity(0))))
    yield
    rp.unregister_custom_call("thread_cpus")


def threads_affinity() -> dict[int, set[int]]:
    return {t.native_id: os.sched_getaffinity(t.native_id) for t in threading.enumerate() if t.native_id}


def operands(n: int) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(7)
    return [[rng.standard_normal(64).astype(np.float32)] for _ in range(n)]


def test_the_rule_and_the_environment(monkeypatch):
    allowed = sorted(os.sched_getaffinity(0))
    for setting in ("auto", None):  # unset is "auto"
        if setting is None:
            monkeypatch.delenv(affinity.ENV)
        else:
            monkeypatch.setenv(affinity.ENV, setting)
        assert affinity.choose_cpu(1) is None  # one replica thread: nothing to hand over
        two = affinity.choose_cpu(2)  # they serialize on the GIL however many cores there are
        assert two is None if len(allowed) < 2 else two in allowed
    monkeypatch.setenv(affinity.ENV, "off")
    assert affinity.choose_cpu(1000) is None
    monkeypatch.setenv(affinity.ENV, str(allowed[-1]))
    assert affinity.choose_cpu(1) == allowed[-1]  # a CPU given: always that one
    monkeypatch.setenv(affinity.ENV, str(max(allowed) + 1))
    with pytest.raises(ValueError, match=affinity.ENV):
        affinity.choose_cpu(1)
    monkeypatch.setenv(affinity.ENV, "first")
    with pytest.raises(ValueError, match=affinity.ENV):
        affinity.choose_cpu(1)


@pytest.mark.usefixtures("thread_cpus")
def test_replica_threads_run_pinned_and_get_their_affinity_back(monkeypatch):
    before = threads_affinity()
    cpu = sorted(os.sched_getaffinity(0))[-1]
    n = 6
    module = rp.parse_hlo(PROGRAM.format(n=n))
    monkeypatch.setenv(affinity.ENV, "off")
    free = rp.run(module, operands(n), num_replicas=n, backend="threads")
    monkeypatch.setenv(affinity.ENV, str(cpu))
    pinned = rp.run(module, operands(n), num_replicas=n, backend="threads")
    assert [int(m) for _, m in pinned] == [mask({cpu})] * n
    assert [int(m) for _, m in free] == [mask(os.sched_getaffinity(0))] * n
    # The same bits on every member and either way.
    assert all(p.tobytes() == pinned[0][0].tobytes() for p, _ in pinned)
    assert [p.tobytes() for p, _ in pinned] == [f.tobytes() for f, _ in free]
    # Every thread of the process, the pooled workers that ran the replicas included, has its own
    # affinity back once the job returned (the driver's was never changed).
    after = threads_affinity()
    assert all(after[t] == before.get(t, os.sched_getaffinity(0)) for t in after)


# Each replica writes its operand to the host, then waits for the host's value and all-reduces it.
FED = """HloModule fed, replica_count={n}
add {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}}

ENTRY main {{
  x = f32[4] parameter(0)
  tok = token[] after-all()
  o = token[] outfeed(x, tok), outfeed_shape=f32[4]
  in = (f32[4], token[]) infeed(o)
  v = f32[4] get-tuple-element(in), index=0
  ROOT y = f32[4] all-reduce(v), replica_groups={{}}, to_apply=add
}}
"""


@pytest.mark.skipif(cores() < 2, reason="needs two cores")
def test_more_replicas_than_cores_are_pinned_by_default_while_the_job_runs(monkeypatch):
    monkeypatch.setenv(affinity.ENV, "auto")
    # The starting rule only: no earlier job's verdict, and no window long enough to move them.
    monkeypatch.setattr(affinity, "_last", [float("-inf"), None])
    monkeypatch.setattr(affinity, "_WINDOW", 1e9)
    n = cores() + 1
    x = np.ones(4, np.float32)
    with rp.launch(rp.parse_hlo(FED.format(n=n)), [x], num_replicas=n, backend="threads") as job:
        for r in range(n):
            job.outfeed(r, timeout=60)  # every replica's thread runs
        assert job._backend._pin.activated.wait(60)  # the last thread to start pins them all
        pinned = job._backend._pin.pinned()
        assert len(pinned) == n
        assert {frozenset(os.sched_getaffinity(t)) for t in pinned} == {frozenset({job._backend._pin.cpu})}
        for r in range(n):
            job.infeed(r, x)
        assert all(np.array_equal(y, np.full(4, n, np.float32)) for y in job.result())
    alive = {t.native_id for t in threading.enumerate()}  # pooled (at most workers.MAX_IDLE stay)
    assert all(os.sched_getaffinity(t) == own for t, own in pinned.items() if t in alive)


@pytest.mark.skipif(cores() < 2, reason="needs two cores")
def test_programs_that_may_work_outside_the_gil_are_not_pinned(monkeypatch):
    monkeypatch.setenv(affinity.ENV, "auto")
    n = cores() + 1
    small = compile_module(rp.parse_hlo(FED.format(n=n)), num_replicas=n)
    assert affinity.choose_cpu(n, light(small)) is not None
    large = compile_module(rp.parse_hlo(FED.format(n=n).replace("f32[4]", f"f32[{affinity.LIGHT_BYTES}]")),
                           num_replicas=n)
    assert affinity.choose_cpu(n, light(large)) is None  # 4 x LIGHT_BYTES bytes: numpy's loops release the GIL
    calls = compile_module(rp.parse_hlo(PROGRAM.format(n=n)), num_replicas=n)
    assert affinity.choose_cpu(n, light(calls)) is None  # a custom call may run anything
    monkeypatch.setenv(affinity.ENV, str(sorted(os.sched_getaffinity(0))[0]))
    assert affinity.choose_cpu(n, light(calls)) is not None  # unless told


@pytest.mark.usefixtures("thread_cpus")
def test_threads_of_a_failed_job_get_their_affinity_back(monkeypatch):
    """A planted deadlock: the blocked replicas are woken by the abort, unpinned before they end."""
    monkeypatch.setenv(affinity.ENV, str(sorted(os.sched_getaffinity(0))[0]))
    n = 5
    job = rp.launch(rp.parse_hlo(loop_the_last_replica_skips(n, elements=4, trips=2)), [np.ones(4, np.float32)],
                    num_replicas=n, backend="threads")
    with pytest.raises(rp.DeadlockError):
        job.result()
    for runner in job._backend._replicas:
        assert runner.join(60)
    assert all(cpus == os.sched_getaffinity(0) for cpus in threads_affinity().values())


@pytest.mark.skipif(cores() < 2, reason="needs two cores")
def test_a_move_takes_the_pinned_threads_along():
    first, second = sorted(os.sched_getaffinity(0))[:2]
    pin = affinity.Pin(first)
    entered, moved, done = threading.Event(), threading.Event(), threading.Event()
    seen: list[set[int]] = []

    def replica() -> None:
        pin.enter()
        seen.append(os.sched_getaffinity(0))
        entered.set()
        moved.wait(60)
        seen.append(os.sched_getaffinity(0))
        pin.leave()
        seen.append(os.sched_getaffinity(0))
        done.set()

    own = os.sched_getaffinity(0)
    t = threading.Thread(target=replica)
    t.start()
    assert entered.wait(60)
    pin.move(second)
    moved.set()
    assert done.wait(60)
    t.join()
    assert seen == [{first}, {second}, own]
    assert pin.moves == 1 and pin.pinned() == {}


@pytest.mark.usefixtures("thread_cpus")
def test_a_large_job_is_aborted_by_a_helper_thread_with_the_jobs_error():
    """Beyond ABORT_INLINE replicas the blocked threads are woken off the caller's path: every one
    still ends cancelled by the job's own error, and the next job runs."""
    from replicas.runtime.threads import ABORT_INLINE

    n = ABORT_INLINE + 8
    job = rp.launch(rp.parse_hlo(loop_the_last_replica_skips(n, elements=4, trips=2)), [np.ones(4, np.float32)],
                    num_replicas=n, backend="threads")
    with pytest.raises(rp.DeadlockError) as info:
        job.result()
    runners = job._backend._replicas
    for runner in runners:
        assert runner.join(60)
    assert all(r.mailbox.aborted is info.value for r in runners[:-1])  # the last one finished on its own
    assert [s.status for s in job.states()] == ["cancelled"] * (n - 1) + ["finished"]
    out = rp.run(rp.parse_hlo(PROGRAM.format(n=2)), operands(2), num_replicas=2, backend="threads")
    assert out[0][0].tobytes() == out[1][0].tobytes()


@pytest.mark.usefixtures("thread_cpus")
def test_a_new_job_starts_once_the_threads_of_an_aborted_one_have_ended():
    """The error of a large aborted job reaches its caller before its threads unwind; the next job's
    threads must not start beside them (1024 new threads beside 1023 unwinding ones took tens of
    seconds to start)."""
    from replicas.runtime.threads import ABORT_INLINE

    n = ABORT_INLINE + 8
    job = rp.launch(rp.parse_hlo(loop_the_last_replica_skips(n, elements=4, trips=2)), [np.ones(4, np.float32)],
                    num_replicas=n, backend="threads")
    with pytest.raises(rp.DeadlockError):
        job.result()
    with rp.launch(rp.parse_hlo(PROGRAM.format(n=2)), operands(2), num_replicas=2, backend="threads") as after:
        assert all(runner.join(0) for runner in job._backend._replicas)
        out = after.result()
    assert out[0][0].tobytes() == out[1][0].tobytes()


def test_the_threads_leave_a_core_others_keep_busy_for_an_idler_one_or_stay():
    # where the threads are, each CPU's busy share over a window, this process's CPU over it (in CPUs)
    assert affinity.better_cpu(0, {0: 0.9, 1: 0.0}, ours=0.9) == 0  # core 0 busy with us only: stay
    assert affinity.better_cpu(0, {0: 1.0, 1: 0.1}, ours=0.5) == 1  # a hog takes half of core 0: move
    assert affinity.better_cpu(1, {0: 0.2, 1: 0.9, 2: 0.05}, ours=0.3) == 2
    assert affinity.better_cpu(0, {0: 1.0, 1: 1.0}, ours=0.5) == 0  # no core idler: stay
    assert affinity.better_cpu(None, {0: 1.0, 1: 1.0}, ours=0.6) is None  # still busy: stay unpinned
    assert affinity.better_cpu(None, {0: 0.3, 1: 0.2}, ours=0.4) == 1  # room again: the idlest core


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 or affinity.current_cpu() is None,
                    reason="needs two CPUs and sched_getcpu")
def test_a_thread_woken_on_its_wakers_cpu_moves_off_it():
    """The doorbell's actor thread leaves the CPU its driver rang from (`move_off`), and stays where
    it is when it runs elsewhere already."""
    allowed = sorted(os.sched_getaffinity(0))
    moved: list[tuple[set[int], int]] = []

    def thread() -> None:
        os.sched_setaffinity(0, {allowed[0]})  # where the waker is
        affinity.move_off(allowed[0])
        after = set(os.sched_getaffinity(0))
        moved.append((after, affinity.current_cpu()))
        affinity.move_off(allowed[0])  # elsewhere already: nothing changes
        assert set(os.sched_getaffinity(0)) == after

    worker = threading.Thread(target=thread)
    worker.start()
    worker.join()
    after, cpu = moved[0]
    assert after == set(allowed) - {allowed[0]} and cpu != allowed[0]
    assert set(os.sched_getaffinity(0)) == set(allowed)  # only the calling thread moved
