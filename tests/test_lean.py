"""The leaner per-replica path of a collective and a While loop (bench/LOG-2026.md, "lean"): a kernel that
raises in a loop's body or condition is still named, a finished job's collectives keep nothing of it
alive through a reference cycle, and the collector's threshold follows the replica threads."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import replicas as rp
from replicas.ops.custom_call import unregister_custom_call
from replicas.tuning import gil_slice

LOOP = """\
HloModule lean_loop, replica_count=2

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

cond {
  st = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(st), index=0
  c = s32[] custom-call(i), custom_call_target="lean_cond"
  k = s32[] constant(5)
  ROOT more = pred[] compare(c, k), direction=LT
}

body {
  st = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(st), index=0
  x = f32[4] get-tuple-element(st), index=1
  y = f32[4] custom-call(x, i), custom_call_target="lean_body"
  z = f32[4] all-reduce(y), replica_groups={}, to_apply=add
  one = s32[] constant(1)
  i2 = s32[] add(i, one)
  ROOT next = (s32[], f32[4]) tuple(i2, z)
}

ENTRY main {
  x = f32[4] parameter(0)
  zero = s32[] constant(0)
  init = (s32[], f32[4]) tuple(zero, x)
  loop = (s32[], f32[4]) while(init), condition=cond, body=body
  ROOT out = f32[4] get-tuple-element(loop), index=1
}
"""


def _counter(fails_at: int | None):
    def call(i):
        if fails_at is not None and int(i) == fails_at:
            raise ValueError("the loop's kernel refuses")
        return i
    return call


def _body(fails_at: int | None):
    def call(x, i):
        if fails_at is not None and int(i) == fails_at:
            raise ValueError("the loop's kernel refuses")
        return x
    return call


def _run(cond_fails_at: int | None = None, body_fails_at: int | None = None) -> list:
    rp.register_custom_call("lean_cond", _counter(cond_fails_at))
    rp.register_custom_call("lean_body", _body(body_fails_at))
    try:
        return rp.run(rp.parse_hlo(LOOP), [np.ones(4, np.float32)], num_replicas=2, backend="threads", timeout=60)
    finally:
        unregister_custom_call("lean_cond")
        unregister_custom_call("lean_body")


def test_a_loop_runs_to_its_end():
    assert [r.tolist() for r in _run()] == [[32.0] * 4] * 2


@pytest.mark.parametrize("where,fails", [("%y (custom-call", {"body_fails_at": 2}),
                                         ("%c (custom-call", {"cond_fails_at": 3})])
def test_a_kernel_raising_in_a_loop_is_named(where, fails):
    with pytest.raises(rp.ReplicaFailure, match="the loop's kernel refuses") as info:
        _run(**fails)
    assert info.value.instruction.startswith(where)


def test_a_finished_job_keeps_no_fabric_alive_through_its_collectives():
    text = LOOP.replace('custom-call(i), custom_call_target="lean_cond"', "copy(i)")
    module = rp.parse_hlo(text.replace('custom-call(x, i), custom_call_target="lean_body"', "copy(x)"))
    rp.run(module, [np.ones(4, np.float32)], num_replicas=2, backend="threads")  # binds (the pooled interpreters)
    gc.collect()
    gc.disable()
    try:
        job = rp.launch(module, [np.ones(4, np.float32)], num_replicas=2, backend="threads")
        assert [r.tolist() for r in job.result()] == [[32.0] * 4] * 2
        fabrics = [weakref.ref(runner.fabric) for runner in job._backend._replicas]  # noqa: SLF001
        del job
        assert all(f() is None for f in fabrics)
    finally:
        gc.enable()


def test_the_collectors_threshold_is_raised_with_many_replica_threads_and_restored():
    before = gc.get_threshold()
    entered = 0
    try:
        for _ in range(gil_slice.MANY):
            gil_slice.enter()
            entered += 1
        assert gc.get_threshold() == before
        gil_slice.enter()
        entered += 1
        assert gc.get_threshold() == (gil_slice.YOUNG, *before[1:])
    finally:
        for _ in range(entered):
            gil_slice.leave()
    assert gc.get_threshold() == before
