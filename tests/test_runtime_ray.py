"""The Ray runtime end to end: real actors, the shared Ray session of this test run."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import replicas as rp

pytestmark = pytest.mark.usefixtures("ray_session")

ALL_REDUCE = """\
HloModule ar, replica_count={n}

add {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}}

ENTRY main {{
  x = f32[{size}] parameter(0)
  id = u32[] replica-id()
  idf = f32[] convert(id)
  off = f32[{size}] broadcast(idf), dimensions={{}}
  mine = f32[{size}] add(x, off)
  sum = f32[{size}] all-reduce(mine), replica_groups={{}}, to_apply=add
  gathered = f32[{gsize}] all-gather(mine), replica_groups={{}}, dimensions={{0}}
  ROOT out = (f32[{size}], f32[{gsize}], u32[]) tuple(sum, gathered, id)
}}
"""

FOREVER = """\
HloModule forever

cond {
  s = s32[] parameter(0)
  ROOT t = pred[] constant(true)
}

body {
  s = s32[] parameter(0)
  one = s32[] constant(1)
  ROOT n = s32[] add(s, one)
}

ENTRY main {
  z = s32[] constant(0)
  ROOT w = s32[] while(z), condition=cond, body=body
}
"""


def all_reduce_module(n: int, size: int = 8) -> rp.Module:
    return rp.parse_hlo(ALL_REDUCE.format(n=n, size=size, gsize=size * n))


@pytest.mark.parametrize("n", [1, 4])
def test_all_reduce_and_all_gather_on_actors(n):
    x = np.arange(8, dtype=np.float32)
    results = rp.run(all_reduce_module(n), [x], num_replicas=n)
    want_sum = n * x + sum(range(n))
    want_gather = np.concatenate([x + r for r in range(n)])
    assert len(results) == n
    for r, (total, gathered, rid) in enumerate(results):
        np.testing.assert_array_equal(total, want_sum)
        np.testing.assert_array_equal(gathered, want_gather)
        assert rid.dtype == np.uint32 and int(rid) == r


def test_per_replica_arguments_and_large_buffers_take_the_sharded_path():
    n, size = 3, 300_000  # 1.2 MB per replica: above the small-message threshold
    rng = np.random.default_rng(0)
    xs = [rng.normal(size=size).astype(np.float32) for _ in range(n)]
    results = rp.run(all_reduce_module(n, size), [[x] for x in xs], num_replicas=n)
    want = sum(x + r for r, x in enumerate(xs))
    np.testing.assert_allclose(results[0][0], want, rtol=1e-5, atol=1e-5)
    for total, _, _ in results[1:]:
        assert total.tobytes() == results[0][0].tobytes()  # bitwise identical on every member


def test_timeout_names_what_each_replica_was_doing_and_the_next_job_starts_cleanly():
    m = rp.parse_hlo(FOREVER)
    with pytest.raises(rp.ExecutionTimeout) as info:
        rp.run(m, [], num_replicas=2, timeout=1.5)
    text = str(info.value)
    assert "replicas [0, 1]: running" in text or ("replica 0: running" in text and "replica 1: running" in text)
    # A second job in the same process starts cleanly after the first was stopped.
    x = np.ones(8, np.float32)
    results = rp.run(all_reduce_module(2), [x], num_replicas=2)
    np.testing.assert_array_equal(results[1][0], 2 * x + 1)


def test_cancel_and_with_block_stop_every_replica_and_return_the_actors():
    from replicas.runtime.ray.backend import POOL

    m = rp.parse_hlo(FOREVER)
    job = rp.launch(m, [], num_replicas=2, timeout=None)
    assert [s.status for s in job.states()] == ["running", "running"]
    job.cancel()
    with pytest.raises(rp.ReplicasError, match="cancelled"):
        job.result()
    idle = POOL.stats()["idle"]
    assert idle >= 2  # both actors stopped their replica and went back to the pool
    with rp.launch(m, [], num_replicas=2, timeout=None) as job2:
        assert not job2.done()
    assert POOL.stats()["idle"] == idle
    gc.collect()


def test_deadlock_under_ray_is_an_error_not_a_hang():
    import importlib.util
    import pathlib

    spec = importlib.util.spec_from_file_location(
        "deadlock_example", pathlib.Path(__file__).parent.parent / "examples" / "deadlock.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    with pytest.raises(rp.DeadlockError) as info:
        rp.run(example.program(), [np.zeros(4, np.float32)], num_replicas=2, timeout=60)
    report = info.value.report
    assert sorted(report.blocked) == [0, 1]
    assert report.cycles == [[0, 1]]
    assert all(s.block.opcode == "send-done" for s in report.states)


def test_argument_errors_name_the_replica_and_parameter():
    m = all_reduce_module(2)
    with pytest.raises(rp.ProgramError, match=r"replica 1: argument 0 \(%x\)"):
        rp.run(m, [[np.zeros(8, np.float32)], [np.zeros(7, np.float32)]], num_replicas=2)
    with pytest.raises(rp.ProgramError, match="replica_count=2"):
        rp.run(m, [np.zeros(8, np.float32)], num_replicas=3)


def test_packed_replicas_share_an_actor():
    x = np.arange(8, dtype=np.float32)
    results = rp.run(all_reduce_module(4), [x], num_replicas=4, replicas_per_actor=2)
    for total, _, _ in results:
        np.testing.assert_array_equal(total, 4 * x + 6)


CUSTOM = """\
HloModule custom, replica_count=2

ENTRY main {
  x = f32[4] parameter(0)
  ROOT y = f32[4] custom-call(x), custom_call_target="double_it"
}
"""


def test_custom_calls_registered_on_the_driver_run_on_the_actors():
    from replicas.ops.custom_call import unregister_custom_call

    m = rp.parse_hlo(CUSTOM)
    rp.register_custom_call("double_it", lambda x: (2 * x).astype(np.float32))
    try:
        results = rp.run(m, [np.arange(4, dtype=np.float32)], num_replicas=2)
    finally:
        unregister_custom_call("double_it")
    for y in results:
        np.testing.assert_array_equal(y, 2 * np.arange(4, dtype=np.float32))


def test_a_replica_that_raises_is_named():
    from replicas.ops.custom_call import unregister_custom_call

    def boom(x):
        raise ValueError("bad batch")

    m = rp.parse_hlo(CUSTOM)
    rp.register_custom_call("double_it", boom)
    try:
        with pytest.raises(rp.ReplicaFailure, match="custom call 'double_it' raised ValueError: bad batch") as info:
            rp.run(m, [np.arange(4, dtype=np.float32)], num_replicas=2)
        assert info.value.replica == 0 and info.value.instruction.startswith("%y (custom-call")
    finally:
        unregister_custom_call("double_it")
