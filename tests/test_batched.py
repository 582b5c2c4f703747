"""Batched execution (`runtime/batched.py`): the replicas of one process run as one interpreter over
stacked values. Every program here runs on threads twice, batched and replica by replica
(`batched.ENABLED` off), and each replica's result must be bitwise the same; the runs counted by
`batched.RUNS` say which path ran (batched, or batched and then fallen back)."""

from __future__ import annotations

import numpy as np
import pytest

import replicas as rp
from replicas.runtime import batched


def run_both(monkeypatch: pytest.MonkeyPatch, text: str, args: list, n: int, expect: str = "batched") -> list:
    """The program's per-replica results, batched and not: bitwise equal. `expect`: which path the
    batched run took ("batched", "fallback" or "none": not batched at all)."""
    monkeypatch.setattr(batched, "ENABLED", False)
    alone = rp.run(text, args, n, backend="threads", timeout=60)
    monkeypatch.setattr(batched, "ENABLED", True)
    before = dict(batched.RUNS)
    together = rp.run(text, args, n, backend="threads", timeout=60)
    ran = {k: batched.RUNS[k] - before[k] for k in before}
    assert ran == {"batched": int(expect == "batched"), "fallback": int(expect == "fallback")}, ran
    assert len(alone) == len(together) == n
    for r, (a, b) in enumerate(zip(alone, together)):
        same(a, b, r)
    return together


def same(a, b, where) -> None:
    if isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, (where, i))
        return
    a, b = np.asarray(a), np.asarray(b)
    assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape, (where, a, b)
    assert a.tobytes() == b.tobytes(), (where, a, b)


def per_replica(n: int, shape: tuple, seed: int = 0, dtype=np.float32) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [[rng.standard_normal(shape).astype(dtype)] for _ in range(n)]


ADD = """
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}
"""

MLP = """HloModule mlp, replica_count=4
""" + ADD + """
ENTRY main {
  x = f32[8,16] parameter(0)
  w = f32[16,32] parameter(1)
  h = f32[8,32] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  t = f32[8,32] tanh(h)
  e = f32[8,32] exponential(t)
  l = f32[8,32] log-plus-one(e)
  s = f32[8,32] sine(l)
  g = f32[16,32] dot(x, s), lhs_contracting_dims={0}, rhs_contracting_dims={0}
  gs = f32[16,32] all-reduce(g), replica_groups={{0,1,2,3}}, to_apply=add
  zero = f32[] constant(0)
  loss = f32[] reduce(s, zero), dimensions={0,1}, to_apply=add
  ls = f32[] all-reduce(loss), replica_groups={}, to_apply=add
  rate = f32[] constant(0.125)
  rb = f32[16,32] broadcast(rate), dimensions={}
  step = f32[16,32] multiply(gs, rb)
  nw = f32[16,32] subtract(w, step)
  ROOT out = (f32[16,32], f32[], f32[8,32]) tuple(nw, ls, t)
}
"""


def test_mlp_step_shared_and_per_replica_arguments(monkeypatch):
    w = np.random.default_rng(1).standard_normal((16, 32)).astype(np.float32)
    xs = per_replica(4, (8, 16))
    together = run_both(monkeypatch, MLP, [[x[0], w] for x in xs], 4)  # w: the same object for all
    assert together[0][0] is together[3][0] and not together[0][0].flags.writeable  # computed once, shared
    run_both(monkeypatch, MLP, [[x[0], w.copy()] for x in xs], 4)  # w: every member's own copy


GROUPS = """HloModule groups, replica_count=4
""" + ADD + """
ENTRY main {
  x = f32[6,4] parameter(0)
  r = u32[] replica-id()
  rf = f32[] convert(r)
  rb = f32[6,4] broadcast(rf), dimensions={}
  y = f32[6,4] add(x, rb)
  pair = f32[6,4] all-reduce(y), replica_groups={{0,2},{3,1}}, to_apply=add
  every = f32[6,4] all-reduce(pair), replica_groups={{3,2,1,0}}, to_apply=add
  gathered = f32[12,4] all-gather(y), replica_groups={{1,0},{2,3}}, dimensions={0}
  scattered = f32[3,4] reduce-scatter(y), replica_groups={{0,1},{2,3}}, dimensions={0}, to_apply=add
  moved = f32[6,4] collective-permute(y), source_target_pairs={{0,1},{1,2},{2,0}}
  swapped = f32[6,4] all-to-all(y), replica_groups={{1,0},{3,2}}, dimensions={0}
  ROOT out = (f32[6,4], f32[6,4], f32[12,4], f32[3,4], f32[6,4], f32[6,4])
    tuple(pair, every, gathered, scattered, moved, swapped)
}
"""


def test_collectives_among_members_in_group_order(monkeypatch):
    together = run_both(monkeypatch, GROUPS, per_replica(4, (6, 4), seed=2), 4)
    assert not together[3][4].any()  # nobody sends to replica 3


LOOP = """HloModule loop, replica_count=4
""" + ADD + """
cond {
  s = (s32[], f32[5], s32[]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  n = s32[] get-tuple-element(s), index=2
  ROOT lt = pred[] compare(i, n), direction=LT
}

body {
  s = (s32[], f32[5], s32[]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  v = f32[5] get-tuple-element(s), index=1
  n = s32[] get-tuple-element(s), index=2
  one = s32[] constant(1)
  j = s32[] add(i, one)
  t = f32[5] tanh(v)
  u = f32[5] all-reduce(t), replica_groups={}, to_apply=add
  ROOT next = (s32[], f32[5], s32[]) tuple(j, u, n)
}

ENTRY main {
  v = f32[5] parameter(0)
  n = s32[] parameter(1)
  zero = s32[] constant(0)
  init = (s32[], f32[5], s32[]) tuple(zero, v, n)
  ROOT w = (s32[], f32[5], s32[]) while(init), condition=cond, body=body
}
"""

LOCAL_LOOP = LOOP.replace("  u = f32[5] all-reduce(t), replica_groups={}, to_apply=add\n", "").replace(
    "tuple(j, u, n)", "tuple(j, t, n)")


def test_loop_of_stacked_state_with_agreed_trip_count(monkeypatch):
    n = np.array(7, np.int32)
    run_both(monkeypatch, LOOP, [[v[0], n] for v in per_replica(4, (5,), seed=3)], 4)


def test_divergent_trip_counts_fall_back_to_each_replica(monkeypatch):
    args = [[v[0], np.array(3 + r, np.int32)] for r, v in enumerate(per_replica(4, (5,), seed=4))]
    out = run_both(monkeypatch, LOCAL_LOOP, args, 4, expect="fallback")
    assert [int(o[0]) for o in out] == [3, 4, 5, 6]


def test_divergent_collectives_fall_back_and_report_as_before(monkeypatch):
    """Members that would run different numbers of all-reduces: the batched run falls back, and the
    replicas' own run reports the deadlock it always did."""
    args = [[v[0], np.array(3 + r, np.int32)] for r, v in enumerate(per_replica(4, (5,), seed=4))]
    monkeypatch.setattr(batched, "ENABLED", True)
    with pytest.raises((rp.DeadlockError, rp.CollectiveMismatchError)):
        rp.run(LOOP, args, 4, backend="threads", timeout=60)


CONDITIONAL = """HloModule cond, replica_count=2
""" + ADD + """
double {
  x = f32[3] parameter(0)
  ROOT y = f32[3] add(x, x)
}

negate {
  x = f32[3] parameter(0)
  ROOT y = f32[3] negate(x)
}

ENTRY main {
  x = f32[3] parameter(0)
  p = pred[] parameter(1)
  c = f32[3] conditional(p, x, x), true_computation=double, false_computation=negate
  ROOT s = f32[3] all-reduce(c), replica_groups={}, to_apply=add
}
"""


def test_conditional_agreed_runs_batched_divergent_falls_back(monkeypatch):
    xs = per_replica(2, (3,), seed=5)
    run_both(monkeypatch, CONDITIONAL, [[x[0], np.array(True)] for x in xs], 2)
    out = run_both(monkeypatch, CONDITIONAL, [[x[0], np.array(r == 0)] for r, x in enumerate(xs)], 2,
                   expect="fallback")
    np.testing.assert_array_equal(out[1], xs[0][0] * 2 - xs[1][0])


MIXED = """HloModule mixed, replica_count=3
""" + ADD + """

max {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] maximum(a, b)
}

lt {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = pred[] compare(a, b), direction=LT
}

ENTRY main {
  x = f32[4,6] parameter(0)
  i = s32[] parameter(1)
  t = f32[6,4] transpose(x), dimensions={1,0}
  r = f32[24] reshape(t)
  rev = f32[24] reverse(r), dimensions={0}
  sl = f32[10] slice(rev), slice={[2:22:2]}
  zero = f32[] constant(0)
  pd = f32[13] pad(sl, zero), padding=1_2_0
  cat = f32[37] concatenate(pd, r), dimensions={0}
  ds = f32[5] dynamic-slice(cat, i), dynamic_slice_sizes={5}
  five = f32[5] constant({1, 2, 3, 4, 5})
  up = f32[37] dynamic-update-slice(cat, five, i)
  ninf = f32[] constant(-inf)
  m = f32[4] reduce(x, ninf), dimensions={1}, to_apply=max
  win = f32[4,3] reduce-window(x, ninf), window={size=1x2 stride=1x2}, to_apply=max
  sorted = f32[4,6] sort(x), dimensions={1}, to_apply=lt
  lo = f32[] constant(-0.5)
  hi = f32[] constant(0.5)
  cl = f32[4,6] clamp(lo, x, hi)
  total = f32[4] all-reduce(m), replica_groups={}, to_apply=add
  ROOT out = (f32[5], f32[37], f32[4], f32[4,3], f32[4,6], f32[4,6]) tuple(ds, up, total, win, sorted, cl)
}
"""


def test_data_movement_reductions_and_per_member_kernels(monkeypatch):
    xs = per_replica(3, (4, 6), seed=6)
    run_both(monkeypatch, MIXED, [[x[0], np.array(4, np.int32)] for x in xs], 3)  # shared index
    run_both(monkeypatch, MIXED, [[x[0], np.array(3 * r, np.int32)] for r, x in enumerate(xs)], 3)  # each its own


def test_one_replica_and_refused_programs_run_alone(monkeypatch):
    run_both(monkeypatch, MLP.replace("replica_count=4", "replica_count=1").replace("{{0,1,2,3}}", "{{0}}"),
             [np.ones((8, 16), np.float32), np.ones((16, 32), np.float32)], 1, expect="none")
    feed = """HloModule feed, replica_count=2
ENTRY main {
  x = f32[2] parameter(0)
  tok = token[] after-all()
  ROOT out = token[] outfeed(x, tok), outfeed_shape=f32[2]
}
"""
    monkeypatch.setattr(batched, "ENABLED", True)
    assert not batched.batchable(rp.parse_hlo(feed))


def test_jax_training_step_matches_each_replica(monkeypatch):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    def step(w, x, y):
        loss, grad = jax.value_and_grad(lambda w: jnp.mean((jnp.tanh(x @ w) - y) ** 2))(w)
        grad, loss = jax.lax.pmean((grad, loss), "x")
        key = jax.random.fold_in(jax.random.key(0), jax.lax.axis_index("x"))
        noise = jax.random.normal(key, w.shape) * 1e-3
        return w - 0.5 * grad, loss, jnp.cumsum(noise, axis=0), jnp.argmax(x, axis=1)

    x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(16, 4)
    y = np.tanh(x @ np.full((4, 2), 0.5, np.float32))
    w = np.zeros((4, 2), np.float32)
    compiled = rp.jax.compile_jax(step, w, x, y, num_replicas=4, in_specs=(P(), P("x"), P("x")),
                                  out_specs=(P(), P(), P("x"), P("x")))
    run_both(monkeypatch, compiled.module, compiled.split((w, x, y)), 4)


def test_large_arguments_run_replica_by_replica(monkeypatch):
    monkeypatch.setattr(batched, "STACK_BYTES", 1000)
    run_both(monkeypatch, CONDITIONAL, [[x[0], np.array(True)] for x in per_replica(2, (3,), seed=5)], 2)
    w = np.ones((16, 32), np.float32)  # 2 KB, the same object for every replica: never copied
    run_both(monkeypatch, MLP, [[x[0], w] for x in per_replica(4, (8, 16))], 4, expect="fallback")


def test_programs_that_cannot_wait_run_alone(monkeypatch):
    """Their replicas may run one after the other in one thread (a persistent job's quick calls):
    they never meet, so they are never batched."""
    quick = """HloModule quick, replica_count=2
ENTRY main {
  x = f32[3] parameter(0)
  r = u32[] replica-id()
  f = f32[] convert(r)
  b = f32[3] broadcast(f), dimensions={}
  ROOT y = f32[3] add(x, b)
}
"""
    run_both(monkeypatch, quick, [[x[0]] for x in per_replica(2, (3,), seed=5)], 2, expect="none")
    jax = pytest.importorskip("jax")
    from jax.sharding import PartitionSpec as P

    step = rp.jax.jit(lambda x: x * 2 + 1, num_replicas=2, in_specs=(P("x"),), out_specs=P("x"),
                      backend="threads")
    try:
        for _ in range(3):
            np.testing.assert_array_equal(np.asarray(step(np.arange(4, dtype=np.float32))),
                                          np.arange(4, dtype=np.float32) * 2 + 1)
    finally:
        step.close()
    del jax


CHAIN = """HloModule chain, replica_count=2
""" + ADD + """
cond {
  s = (s32[], f32[2]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  bound = s32[] constant(TRIPS)
  ROOT lt = pred[] compare(i, bound), direction=LT
}

body {
  s = (s32[], f32[2]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  x = f32[2] get-tuple-element(s), index=1
  one = s32[] constant(1)
  j = s32[] add(i, one)
  half = f32[2] constant({0.5, 0.25})
  h = f32[2] multiply(x, half)
  y = f32[2] sine(h)
  ROOT next = (s32[], f32[2]) tuple(j, y)
}

ENTRY main {
  x = f32[2] parameter(0)
  zero = s32[] constant(0)
  init = (s32[], f32[2]) tuple(zero, x)
  w = (s32[], f32[2]) while(init), condition=cond, body=body
  y = f32[2] get-tuple-element(w), index=1
  ROOT total = f32[2] all-reduce(y), replica_groups={}, to_apply=add
}
"""


@pytest.mark.parametrize("trips, expect", [(300, "none"), (8, "batched")])
def test_a_long_loop_of_a_few_numbers_runs_replica_by_replica(monkeypatch, trips, expect):
    """Its members' loops then run as per-element (or machine) code instead of numpy calls on stacked
    rows every trip; a short loop (threefry's rounds in a training step) stays batched. The same
    bits either way."""
    run_both(monkeypatch, CHAIN.replace("TRIPS", str(trips)), per_replica(2, (2,), seed=6), 2, expect=expect)
