"""A warm job (pooled actors that know their wire address and hold the program) costs one actor
call per actor under `rp.run`: launch, run and report in one reply. Counted, not timed."""

from __future__ import annotations

import numpy as np
import pytest

import replicas as rp
from replicas.runtime.driver import _prepared, start
from replicas.runtime.options import LaunchOptions

pytestmark = [pytest.mark.usefixtures("ray_session"), pytest.mark.ray]

SUM = """\
HloModule sum, replica_count={n}

add {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}}

ENTRY main {{
  x = f32[4] parameter(0)
  id = u32[] replica-id()
  idf = f32[] convert(id)
  off = f32[4] broadcast(idf), dimensions={{}}
  y = f32[4] {op}(x, off)
  ROOT z = f32[4] all-reduce(y), replica_groups={{}}, to_apply=add
}}
"""

FED = """\
HloModule fed

ENTRY main {
  tok = token[] after-all()
  in = (f32[4], token[]) infeed(tok)
  x = f32[4] get-tuple-element(in), index=0
  t2 = token[] get-tuple-element(in), index=1
  out = token[] outfeed(x, t2), outfeed_shape=f32[4]
  ROOT y = f32[4] add(x, x)
}
"""

X = np.arange(4, dtype=np.float32)


def sum_module(n: int, op: str = "add") -> rp.Module:
    return rp.parse_hlo(SUM.format(n=n, op=op))


def run_counted(module: rp.Module, n: int, args=(X,), **kwargs):
    """rp.run's path, keeping the job to read what its backend called."""
    infeed = kwargs.pop("infeed", None)
    options = LaunchOptions.of(**{"timeout": 60, "trace_events": 1000, **kwargs})
    executable, per_replica = _prepared(module, list(args), n, options, infeed)
    job = start(executable, per_replica, options, infeed, run_to_end=True)
    job.close_host_input()
    with job:
        return job.result(), dict(job._backend.calls)  # noqa: SLF001


@pytest.mark.parametrize("n", [1, 4])
def test_a_warm_run_is_one_call_per_actor(n):
    module = sum_module(n)
    want = n * X + n * (n - 1) / 2
    # One actor per replica (the default packs 4 replicas on 2 CPUs into 2 actors).
    run_counted(module, n, replicas_per_actor=1)  # the actors start, learn their addresses and the program
    results, calls = run_counted(module, n, replicas_per_actor=1)
    for got in results:
        np.testing.assert_array_equal(got, want)
    # Several actors: set up (waited for: a peer's first message must find its mailbox), then begin
    # and report in one call, then a reset (shared memory a peer may read until every replica ended).
    assert calls == ({"launch": 1} if n == 1 else {"launch": n, "begin": n, "reset": n})


def test_a_new_program_travels_to_warm_actors_and_the_old_one_again():
    n = 2
    run_counted(sum_module(n), n)
    for op, shift in (("multiply", 0), ("add", 1), ("multiply", 0)):
        results, calls = run_counted(sum_module(n, op), n)
        for got in results:
            np.testing.assert_array_equal(got, 2 * X * (1 if op == "add" else 0.5) + shift)
        assert calls["launch"] == n and "wire_address" not in calls


def test_launch_on_warm_actors_keeps_host_values_and_feeds():
    module = rp.parse_hlo(FED)
    for _ in range(2):  # cold, then warm
        job = rp.launch(module, [], 1, infeed=[[X]], timeout=60)
        np.testing.assert_array_equal(job.result()[0], 2 * X)
        np.testing.assert_array_equal(job.outfeed(0), X)  # taken from the actor with the results
        with pytest.raises(rp.ReplicasError, match="no more outfeed"):
            job.outfeed(0)
    assert job._backend.calls["launch"] == 1 and "wire_address" not in job._backend.calls  # noqa: SLF001


def test_a_warm_job_that_waits_is_watched_by_the_monitor():
    module = rp.parse_hlo(FED)
    rp.run(module, [], 1, infeed=[[X]], timeout=60)
    with pytest.raises(rp.DeadlockError):  # rp.run feeds nothing more: the infeed never comes
        run_counted(module, 1, args=())
    results, _ = run_counted(module, 1, args=(), infeed=[[X]])  # the actor was reset and pooled again
    np.testing.assert_array_equal(results[0], 2 * X)
