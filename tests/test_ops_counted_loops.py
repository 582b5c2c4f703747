"""Loops whose program fixes their trip count (`compile.static_trips`): a small program with such
loops and only built-in kernels ends at once (`runs_quickly`), so a threads job runs it in the
caller's thread; a loop whose count depends on values, a long one, or a user's custom call keeps
the program on a replica thread of its own, where a deadline can leave it."""

from __future__ import annotations

import numpy as np
import pytest

import replicas as rp
from replicas.ops.custom_call import register_custom_call, unregister_custom_call
from replicas.runtime.compile import compile_module, runs_quickly, static_trips


def counted(start: int, bound: int, step: int, direction: str = "LT", counter: str = "s32",
            swapped: bool = False) -> str:
    """A loop `for (i = start; i <direction> bound; i += step) x = x * 2` over a (counter, f32[4]) state."""
    test = f"compare(n, i), direction={direction}" if swapped else f"compare(i, n), direction={direction}"
    return f"""HloModule counted

cond {{
  st = ({counter}[], f32[4]) parameter(0)
  i = {counter}[] get-tuple-element(st), index=0
  n = {counter}[] constant({bound})
  ROOT more = pred[] {test}
}}

body {{
  st = ({counter}[], f32[4]) parameter(0)
  i = {counter}[] get-tuple-element(st), index=0
  x = f32[4] get-tuple-element(st), index=1
  two = f32[4] constant({{2, 2, 2, 2}})
  y = f32[4] multiply(x, two)
  step = {counter}[] constant({step})
  next = {counter}[] add(i, step)
  ROOT out = ({counter}[], f32[4]) tuple(next, y)
}}

ENTRY main {{
  x = f32[4] parameter(0)
  start = {counter}[] constant({start})
  init = ({counter}[], f32[4]) tuple(start, x)
  loop = ({counter}[], f32[4]) while(init), condition=cond, body=body
  ROOT y = f32[4] get-tuple-element(loop), index=1
}}
"""


# XLA's optimized form (what JAX's scan and fori_loop compile to): the counter's add and compare in
# single-op wrapper fusions, the loop in a computation called with the initial state.
WRAPPED = """HloModule wrapped

wrapped_add {
  a = s32[] parameter(0)
  b = s32[] parameter(1)
  ROOT s = s32[] add(a, b)
}

wrapped_compare {
  a = s32[] parameter(0)
  b = s32[] parameter(1)
  ROOT lt = pred[] compare(a, b), direction=LT
}

body {
  st = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(st), index=0
  x = f32[4] get-tuple-element(st), index=1
  c = s32[] copy(i)
  one = s32[] constant(1)
  next = s32[] fusion(c, one), kind=kLoop, calls=wrapped_add
  y = f32[4] add(x, x)
  ROOT out = (s32[], f32[4]) tuple(next, y)
}

cond {
  st = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(st), index=0
  n = s32[] constant(7)
  ROOT more = pred[] fusion(i, n), kind=kLoop, calls=wrapped_compare
}

loop_computation {
  st = (s32[], f32[4]) parameter(0)
  ROOT w = (s32[], f32[4]) while(st), condition=cond, body=body
}

ENTRY main {
  x = f32[4] parameter(0)
  zero = s32[] constant(0)
  z = s32[] copy(zero)
  init = (s32[], f32[4]) tuple(z, x)
  called = (s32[], f32[4]) call(init), to_apply=loop_computation
  ROOT y = f32[4] get-tuple-element(called), index=1
}
"""


def trips_of(text: str) -> int | None:
    module = rp.parse_hlo(text)
    (found,) = [static_trips(module, comp, inst) for comp, inst in module.instructions() if inst.opcode == "while"]
    return found


@pytest.mark.parametrize(("start", "bound", "step", "direction", "swapped", "trips"), [
    (0, 10, 1, "LT", False, 10),
    (0, 10, 3, "LT", False, 4),  # 0 3 6 9
    (0, 10, 3, "LE", False, 4),  # 0 3 6 9
    (0, 9, 3, "LE", False, 4),  # 0 3 6 9
    (5, 5, 1, "LT", False, 0),
    (10, 0, -2, "GT", False, 5),  # 10 8 6 4 2
    (10, 0, -2, "GE", False, 6),
    (0, 10, 1, "GT", True, 10),  # 10 > i
    (0, 10, 1, "GT", False, None),  # a counter stepping away from its bound: refused (even when no trip runs)
    (0, 10, -1, "LT", False, None),
    (0, 10, 0, "LT", False, None),
])
def test_trip_counts_of_counted_loops(start, bound, step, direction, swapped, trips):
    assert trips_of(counted(start, bound, step, direction, swapped=swapped)) == trips


def test_a_counter_that_could_wrap_around_has_no_fixed_count():
    assert trips_of(counted(0, 126, 1, counter="s8")) == 126
    assert trips_of(counted(0, 127, 2, counter="s8")) is None  # 126 + 2 wraps before `i < 127` fails
    assert trips_of(counted(0, 255, 1, "LE", counter="u8")) is None


def test_xla_wrapped_loops_have_their_count_and_run_like_the_plain_loop():
    assert trips_of(WRAPPED) == 7
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(rp.run(WRAPPED, [x], backend="threads")[0], x * 128)


def test_a_loop_whose_count_depends_on_values_or_is_long_keeps_its_thread():
    forever = counted(0, 1, 1).replace("n = s32[] constant(1)", "n = s32[] get-tuple-element(st), index=0")
    assert trips_of(forever) is None
    assert not runs_quickly(compile_module(rp.parse_hlo(forever)))
    assert runs_quickly(compile_module(rp.parse_hlo(counted(0, 1000, 1))))
    assert not runs_quickly(compile_module(rp.parse_hlo(counted(0, 1 << 20, 1))))  # too many instructions run


@pytest.mark.parametrize("trips", [0, 1, 9])
def test_counted_loops_give_the_same_results_in_the_callers_thread(trips):
    text = counted(0, trips, 1)
    assert runs_quickly(compile_module(rp.parse_hlo(text)))
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(rp.run(text, [x], backend="threads", timeout=30)[0], x * 2.0 ** trips)


def test_a_jitted_fori_loop_runs_as_under_jax():
    jax = pytest.importorskip("jax")

    def f(v):
        return jax.lax.fori_loop(0, 9, lambda i, u: u * 0.5 + i, v)

    step = rp.jax.jit(f, backend="threads")
    x = np.arange(4, dtype=np.float32)
    for _ in range(3):
        np.testing.assert_array_equal(np.asarray(step(x)), np.asarray(jax.jit(f)(x)))
    assert runs_quickly(step._last.session.executable)
    step.close()


def test_only_built_in_custom_call_targets_end_at_once():
    text = """HloModule cc
ENTRY main {
  x = f32[8] parameter(0)
  ROOT t = (f32[2], s32[2]) custom-call(x), custom_call_target="TopK"
}
"""
    assert runs_quickly(compile_module(rp.parse_hlo(text)))
    user = text.replace('"TopK"', '"test.counted.user"').replace("(f32[2], s32[2])", "f32[8]")
    register_custom_call("test.counted.user", lambda x: x)
    try:
        assert not runs_quickly(compile_module(rp.parse_hlo(user)))
        np.testing.assert_array_equal(rp.run(user, [np.ones(8, np.float32)], backend="threads")[0], np.ones(8))
    finally:
        unregister_custom_call("test.counted.user")
