"""Result buffers in the actor's shared-memory arena (`Outbox.lease`, `collectives/buffers.py`):
an array that lies in a leased block is sent as a descriptor of where it is (no copy), and the
block serves another result only when nothing here refers to it and every receiver released it."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import replicas as rp
from replicas.collectives import buffers
from replicas.collectives.buffers import BufferPool
from replicas.runtime.compile import compile_module
from replicas.runtime.job import Job
from replicas.runtime.threads import ThreadBackend
from replicas.transport.shm import MIN_BYTES, Inbox, Outbox, job_segments

SHAPE = (4, MIN_BYTES // 4)  # f32: each row is MIN_BYTES


def _token() -> str:
    return "t" + np.random.default_rng().bytes(8).hex()


def test_a_part_of_a_leased_buffer_is_sent_in_place_and_read_back_exactly():
    token = _token()
    outbox, inbox = Outbox(token, 0, capacity=1 << 24), Inbox(token)
    try:
        pool = BufferPool(outbox=outbox)
        buf = pool.empty(SHAPE, np.float32)
        buf[...] = np.arange(buf.size, dtype=np.float32).reshape(SHAPE)
        used = outbox.in_use()
        refs = [outbox.put(buf[1:3]), outbox.put(buf[3])]
        assert [r.offset for r in refs] == [refs[0].offset] * 2  # the leased block itself
        assert [r.slot for r in refs] == [0, 1] and refs[1].start == 3 * MIN_BYTES
        assert outbox.in_use() == used  # nothing was placed: no copy
        got = [inbox.array(r) for r in refs]
        np.testing.assert_array_equal(got[0], buf[1:3])
        np.testing.assert_array_equal(got[1], buf[3])
        assert not got[0].flags.writeable
    finally:
        outbox.close()
        inbox.close()
    assert job_segments(token) == []


def test_a_leased_buffer_comes_back_only_when_no_receiver_and_no_local_value_holds_it():
    token = _token()
    outbox, inbox = Outbox(token, 0, capacity=1 << 24), Inbox(token)
    try:
        pool = BufferPool(outbox=outbox)
        first = pool.empty(SHAPE, np.float32)
        first[...] = 1
        address = first.ctypes.data
        view = inbox.array(outbox.put(first[2]))  # a peer reads a part of it
        del first
        second = pool.empty(SHAPE, np.float32)  # lent: another block
        assert second.ctypes.data != address
        second[...] = 2
        np.testing.assert_array_equal(view, 1)  # never written while the peer holds it
        part = view[5:9]
        del view
        gc.collect()
        assert pool.empty(SHAPE, np.float32).ctypes.data not in (address, second.ctypes.data)
        del part
        gc.collect()
        kept = second[1:2]  # a local value still refers to the second block
        del second
        again = pool.empty(SHAPE, np.float32)
        assert again.ctypes.data == address  # released by the peer, and free here
        assert again.flags.writeable
        np.testing.assert_array_equal(kept, 2)
    finally:
        outbox.close()
        inbox.close()


def test_an_array_outside_leased_blocks_is_copied_as_before():
    token = _token()
    outbox, inbox = Outbox(token, 0, capacity=1 << 24), Inbox(token)
    try:
        x = np.ones(SHAPE, np.float32)
        ref = outbox.put(x)
        assert ref.start == 0 and outbox.in_use() >= x.nbytes
        np.testing.assert_array_equal(inbox.array(ref), x)
        strided = BufferPool(outbox=outbox).empty(SHAPE, np.float32)[:, ::2]  # not contiguous: copied
        strided[...] = 3
        ref = outbox.put(strided)
        assert ref.start == 0
        np.testing.assert_array_equal(inbox.array(ref), 3)
    finally:
        outbox.close()
        inbox.close()


def test_an_arena_whose_leased_buffer_is_still_held_is_not_handed_to_the_next_job():
    first, second = _token(), _token()
    outbox = Outbox(first, 0, capacity=1 << 24)
    pool = BufferPool(keeps=True, outbox=outbox)
    outbox.on_close(pool.retire)
    kept = pool.empty(SHAPE, np.float32)
    kept[...] = 7
    outbox.close()
    again = Outbox(second, 0, capacity=1 << 24)
    try:
        other = BufferPool(outbox=again).empty(SHAPE, np.float32)
        other[...] = 8
        np.testing.assert_array_equal(kept, 7)
    finally:
        again.close()


def test_free_buffers_of_a_job_serve_the_next_jobs_pool():
    buffers.SPARE.clear()
    shape = (buffers.MIN_BYTES // 4,)
    pool = BufferPool(keeps=True)
    a, b = pool.empty(shape, np.float32), pool.empty(shape, np.float32)
    a_address = a.ctypes.data
    a.flags.writeable = False
    del a
    assert pool.retire()
    nxt = BufferPool(keeps=True)
    c = nxt.empty(shape, np.float32)
    assert c.ctypes.data == a_address and c.flags.writeable  # b is still held: only a was kept
    assert nxt.empty(shape, np.float32).ctypes.data != b.ctypes.data
    assert BufferPool().empty(shape, np.float32) is not None  # a pool that does not keep takes none
    buffers.SPARE.clear()


LOOP = """\
HloModule leased_loop, replica_count=4

add {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}}

cond {{
  st = (s32[], f32[{e}], f32[{e}], f32[{e}], f32[{g}]) parameter(0)
  i = s32[] get-tuple-element(st), index=0
  three = s32[] constant(3)
  ROOT more = pred[] compare(i, three), direction=LT
}}

body {{
  st = (s32[], f32[{e}], f32[{e}], f32[{e}], f32[{g}]) parameter(0)
  i = s32[] get-tuple-element(st), index=0
  x = f32[{e}] get-tuple-element(st), index=1
  y = f32[{e}] get-tuple-element(st), index=2
  sum = f32[{e}] all-reduce(x), replica_groups={{}}, to_apply=add
  swapped = f32[{e}] all-to-all(y), replica_groups={{}}, dimensions={{0}}
  gathered = f32[{g}] all-gather(sum), replica_groups={{}}, dimensions={{0}}
  one = s32[] constant(1)
  i2 = s32[] add(i, one)
  ROOT next = (s32[], f32[{e}], f32[{e}], f32[{e}], f32[{g}]) tuple(i2, sum, swapped, x, gathered)
}}

ENTRY main {{
  x = f32[{e}] parameter(0)
  zero = s32[] constant(0)
  fz = f32[] constant(0)
  g0 = f32[{g}] broadcast(fz), dimensions={{}}
  init = (s32[], f32[{e}], f32[{e}], f32[{e}], f32[{g}]) tuple(zero, x, x, x, g0)
  ROOT loop = (s32[], f32[{e}], f32[{e}], f32[{e}], f32[{g}]) while(init), condition=cond, body=body
}}
"""


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("per_actor", [1, 2])
def test_results_fed_back_through_leased_buffers_equal_the_threads_backend_bitwise(per_actor):
    """Every iteration's all-reduce, all-to-all and all-gather read operands that are earlier
    results (in the arena, sent in place) and write into reused buffers: same bits as threads."""
    # f32 elements: every part sent is >= MIN_BYTES, the all-reduce sends members in place and the
    # all-to-all results are assembled by each member (selector.Thresholds.member_assembly_min_bytes)
    e = (9 << 20) // 4
    module = rp.parse_hlo(LOOP.format(e=e, g=4 * e))
    rng = np.random.default_rng(5)
    args = [[rng.standard_normal(e).astype(np.float32)] for _ in range(4)]
    placement = [r // per_actor for r in range(4)]  # the reduction order follows the placement
    expected = Job(ThreadBackend(compile_module(module), args, placement=placement), None, timeout=60,
                   host_may_send=False).result()
    for _ in range(2):  # the second job reuses the arena and the kept buffers
        got = rp.run(module, args, num_replicas=4, replicas_per_actor=per_actor)
        for want, have in zip(expected, got):
            for w, h in zip(want, have):
                assert np.asarray(w).tobytes() == np.asarray(h).tobytes()
