"""Reused result buffers of large collectives (`collectives/buffers.py`): a buffer comes back only
when nothing else holds it, so results a program keeps are never overwritten by a later collective."""

from __future__ import annotations

import numpy as np
import pytest
from collective_kit import Comp, module, reducer

import replicas as rp
from replicas.collectives.buffers import MIN_BYTES, BufferPool
from replicas.runtime.compile import compile_module
from replicas.runtime.job import Job
from replicas.runtime.threads import ThreadBackend

SIZE = 70_000  # s32: above the pool's MIN_BYTES
assert SIZE * 4 >= MIN_BYTES


def test_a_buffer_comes_back_only_when_nothing_holds_it():
    pool = BufferPool()
    a = pool.empty((SIZE,), np.int32)
    view = a[10:20]
    del a
    b = pool.empty((SIZE,), np.int32)
    assert not np.shares_memory(b, view)  # a view keeps its buffer
    ident = id(b)
    b.flags.writeable = False  # a shared result is made read-only: it comes back writable
    del b
    c = pool.empty((SIZE,), np.int32)
    assert id(c) == ident and c.flags.writeable
    assert pool.empty((10,), np.int32) is not pool.empty((10,), np.int32)  # small: not pooled


def chain() -> rp.Module:
    """Three all-reduces and two all-gathers of one shape, each feeding the next: y1 dies after y2
    (its buffer may serve y3), y2 and y3 and the first gather are kept to the end."""
    c = Comp("main")
    x = c.param(f"s32[{SIZE}]")
    kw = {"replica_groups": [], "to_apply": "add_s32"}
    y1 = c.op("all-reduce", f"s32[{SIZE}]", [x], **kw)
    y2 = c.op("all-reduce", f"s32[{SIZE}]", [y1], **kw)
    y3 = c.op("all-reduce", f"s32[{SIZE}]", [y2], **kw)
    g1 = c.op("all-gather", f"s32[{4 * SIZE}]", [y2], dimensions=[0], replica_groups=[])
    g2 = c.op("all-gather", f"s32[{4 * SIZE}]", [y3], dimensions=[0], replica_groups=[])
    root = c.op("tuple", f"(s32[{SIZE}], s32[{SIZE}], s32[{4 * SIZE}], s32[{4 * SIZE}])", [y2, y3, g1, g2])
    return module(c.done(root), reducer("add", "s32"))


def check(out: list, args: list[list[np.ndarray]]) -> None:
    total = sum(a[0] for a in args)
    for y2, y3, g1, g2 in out:
        np.testing.assert_array_equal(y2, 4 * total)
        np.testing.assert_array_equal(y3, 16 * total)
        np.testing.assert_array_equal(g1, np.tile(4 * total, 4))
        np.testing.assert_array_equal(g2, np.tile(16 * total, 4))


def inputs() -> list[list[np.ndarray]]:
    rng = np.random.default_rng(3)
    return [[rng.integers(-1000, 1000, SIZE, dtype=np.int32)] for _ in range(4)]


@pytest.mark.parametrize("placement", [[0, 0, 0, 0], [0, 1, 2, 3], [0, 0, 1, 1]])
def test_kept_results_survive_later_collectives_on_threads(placement):
    args = inputs()
    backend = ThreadBackend(compile_module(chain()), args, placement=placement)
    check(Job(backend, None, timeout=60, host_may_send=False).result(), args)


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("per_actor", [1, 2])
def test_kept_results_survive_later_collectives_under_ray(per_actor):
    args = inputs()
    check(rp.run(chain(), args, num_replicas=4, replicas_per_actor=per_actor), args)
