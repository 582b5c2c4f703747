"""While loops update their state in place (no copy per iteration) without anyone seeing it."""

from __future__ import annotations

import numpy as np
import pytest
from xla_oracle import jax_text, lax_answer

import replicas as rp

jax = pytest.importorskip("jax")
jnp = jax.numpy

ALIASED = """HloModule aliased
cond {
  s = (s32[], f32[4], f32[4]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  n = s32[] constant(4)
  ROOT lt = pred[] compare(i, n), direction=LT
}
body {
  s = (s32[], f32[4], f32[4]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  a = f32[4] get-tuple-element(s), index=1
  b = f32[4] get-tuple-element(s), index=2
  fi = f32[] convert(i)
  one = f32[] constant(1)
  v = f32[] add(fi, one)
  u = f32[1] broadcast(v), dimensions={}
  a2 = f32[4] dynamic-update-slice(a, u, i)
  b2 = f32[4] dynamic-update-slice(b, u, i)
  k = s32[] constant(1)
  i2 = s32[] add(i, k)
  ROOT t = (s32[], f32[4], f32[4]) tuple(i2, a2, a2)
}
ENTRY main {
  x = f32[4] parameter(0)
  z = s32[] constant(0)
  s0 = (s32[], f32[4], f32[4]) tuple(z, x, x)
  w = (s32[], f32[4], f32[4]) while(s0), condition=cond, body=body
  ROOT r = f32[4] get-tuple-element(w), index=2
}
"""


def test_state_elements_that_alias_are_not_overwritten_through_each_other():
    x = np.full(4, -1, np.float32)
    got = rp.evaluate(rp.parse_hlo(ALIASED), [x])
    # b2 = update of the previous a2 (== a, aliased): each step writes its own slot once.
    np.testing.assert_array_equal(got, [1, 2, 3, 4])
    np.testing.assert_array_equal(x, [-1, -1, -1, -1])  # the caller's array is never written


@pytest.mark.parametrize("form", ["lowered", "compiled"])
def test_scan_accumulators_are_right_and_the_arguments_untouched(form):
    def f(xs, h0):
        def step(h, x):
            h = jnp.tanh(h * 0.5 + x)
            return h, h * 2

        h, ys = jax.lax.scan(step, h0, xs)
        return h, ys, jax.lax.fori_loop(0, 5, lambda i, a: a.at[i].set(a[i] + i), xs[0])

    rng = np.random.default_rng(0)
    xs = rng.normal(size=(12, 6)).astype(np.float32)
    h0 = rng.normal(size=(6,)).astype(np.float32)
    keep = xs.copy(), h0.copy()
    module = rp.parse_hlo(jax_text(f, [xs, h0], form))
    want = lax_answer(f, xs, h0)
    for _ in range(2):  # the second run reuses the pooled interpreter
        got = rp.run(module, [xs, h0], num_replicas=1, backend="threads")[0]
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(xs, keep[0])
    np.testing.assert_array_equal(h0, keep[1])


CONSTANT_STATE = """HloModule constant_state
cond {
  s = (s32[], f32[4], f32[4]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  n = s32[] constant(3)
  ROOT lt = pred[] compare(i, n), direction=LT
}
body {
  s = (s32[], f32[4], f32[4]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  x = f32[4] get-tuple-element(s), index=1
  one = s32[] constant(1)
  j = s32[] add(i, one)
  u = f32[1] constant({7})
  y = f32[4] dynamic-update-slice(x, u, i)
  k = f32[4] constant({1, 2, 3, 4})
  ROOT t = (s32[], f32[4], f32[4]) tuple(j, k, y)
}
ENTRY main {
  x = f32[4] parameter(0)
  z = s32[] constant(0)
  s = (s32[], f32[4], f32[4]) tuple(z, x, x)
  w = (s32[], f32[4], f32[4]) while(s), condition=cond, body=body
  ROOT r = f32[4] get-tuple-element(w), index=2
}
"""


def test_a_constant_that_becomes_loop_state_is_updated_in_a_copy():
    # From the second iteration on, the element updated in place is the body's constant k: a value
    # every run shares (read-only), so the loop copies it instead of writing into it.
    module = rp.parse_hlo(CONSTANT_STATE)
    for _ in range(2):
        np.testing.assert_array_equal(rp.evaluate(module, [np.zeros(4, np.float32)]), [1, 2, 7, 4])
