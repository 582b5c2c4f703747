"""Answers that used to differ from XLA's: each program runs here and on XLA:CPU (through JAX)."""

from __future__ import annotations

import numpy as np
import pytest
from xla_oracle import jax_text, jit_answer

import replicas as rp

jax = pytest.importorskip("jax")
jnp = jax.numpy


def _run_one(text: str, args: list[np.ndarray]) -> np.ndarray:
    return rp.run(rp.parse_hlo(text), args, num_replicas=1, backend="threads")[0]


GATHER_ONE = """HloModule gather_one
ENTRY e {
  x = f32[5] parameter(0)
  i = s32[1] parameter(1)
  ROOT g = f32[] gather(x, i), offset_dims={}, collapsed_slice_dims={0}, start_index_map={0},
    index_vector_dim=0, slice_sizes={1}
}
"""


def test_gather_of_one_element_with_the_index_vector_as_only_dimension_is_a_scalar():
    x = np.arange(5, dtype=np.float32) * 1.5
    got = _run_one(GATHER_ONE, [x, np.array([3], np.int32)])
    assert np.shape(got) == () and got == x[3]


@pytest.mark.parametrize("form", ["lowered", "compiled"])
def test_percentile_runs_like_jax(form):
    x = np.random.default_rng(1).normal(size=(17,)).astype(np.float32)
    f = lambda v: jnp.percentile(v, 30.0)  # noqa: E731
    got = _run_one(jax_text(f, [x], form), [x])
    (want,) = jit_answer(f, [x])
    assert np.shape(got) == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6)


SEND_RECV_CROSS_REPLICA = """
HloModule test

ENTRY computation {
  rid = u32[] replica-id()
  c10 = u32[] constant(10)
  rid_plus_ten = u32[] add(rid, c10)
  after_all = token[] after-all()
  send = (u32[], u32[], token[]) send(rid_plus_ten, after_all),
      frontend_attributes={_xla_send_recv_source_target_pairs="{{1,0}}"}
  recv = (u32[], u32[], token[]) recv(after_all),
      frontend_attributes={_xla_send_recv_source_target_pairs="{{1,0}}"}
  send_done = token[] send-done(send)
  recv_done = (u32[], token[]) recv-done(recv)
  ROOT recv_data = u32[] get-tuple-element(recv_done), index=0
}
"""


def test_send_recv_without_channel_id_runs_as_in_xla():
    # XLA's collective_ops_test SendRecvCrossReplica expects 11 on replica 0 and 0 on replica 1.
    got = rp.run(rp.parse_hlo(SEND_RECV_CROSS_REPLICA), num_replicas=2, backend="threads")
    assert [int(v) for v in got] == [11, 0]


def test_two_channel_less_pairs_get_distinct_channels():
    text = SEND_RECV_CROSS_REPLICA.replace("ROOT recv_data", "recv_data").replace(
        "\n}\n", """
  send2 = (u32[], u32[], token[]) send(rid, after_all),
      frontend_attributes={_xla_send_recv_source_target_pairs="{{0,1}}"}
  recv2 = (u32[], u32[], token[]) recv(after_all),
      frontend_attributes={_xla_send_recv_source_target_pairs="{{0,1}}"}
  send_done2 = token[] send-done(send2)
  recv_done2 = (u32[], token[]) recv-done(recv2)
  data2 = u32[] get-tuple-element(recv_done2), index=0
  ROOT both = (u32[], u32[]) tuple(recv_data, data2)
}
""")
    got = rp.run(rp.parse_hlo(text), num_replicas=2, backend="threads")
    assert [(int(a), int(b)) for a, b in got] == [(11, 0), (0, 0)]


@pytest.mark.parametrize("length", [1, 2, 5, 7, 12])
@pytest.mark.parametrize("form", ["lowered", "compiled"])
def test_variadic_reduce_applies_a_non_identity_init_once(length, form):
    rng = np.random.default_rng(length)
    x = rng.normal(size=(3, length)).astype(np.float32)
    y = rng.integers(-5, 5, size=(3, length)).astype(np.int32)

    def reducer(a, b):
        return a[0] + b[0], a[1] + b[1]

    f = lambda u, v: jax.lax.reduce((u, v), (np.float32(1.5), np.int32(7)), reducer, (1,))  # noqa: E731
    got = _run_one(jax_text(f, [x, y], form), [x, y])
    want = jit_answer(f, [x, y])
    np.testing.assert_allclose(got[0], np.asarray(want[0]), rtol=1e-5)
    np.testing.assert_array_equal(got[1], np.asarray(want[1]))
