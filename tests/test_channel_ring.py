"""Send/Recv between actors of one node through the channel rings (transport/channel_ring.py):
results equal the threads backend bitwise, a ring that is full falls back to the other paths
with each channel's order kept, values are judged by the message bounds, deadlocks and mismatches
are still reported, and no segment survives a job, a cancel or a killed actor."""

from __future__ import annotations

import os
import secrets

import numpy as np
import pytest

import replicas as rp
from replicas.errors import DeadlockError, ProgramError
from replicas.transport import channel_ring, keys, spin
from replicas.transport.mailbox import Mailbox
from replicas.transport.message_bounds import MessageBounds
from replicas.transport.shm import job_segments
from replicas.transport.wire import RefusedMessage


def route(*pairs: tuple[int, int]) -> str:
    inner = ",".join(f"{{{s},{t}}}" for s, t in pairs)
    return f'frontend_attributes={{_xla_send_recv_source_target_pairs="{{{inner}}}"}}'


def exchange(name: str, x: str, shape: str, channel: int, attrs: str, tok: str = "tok") -> list[str]:
    """HLO lines: send `x` and receive on `channel`; the received data is `name`."""
    return [f"  {name}_r = ({shape}, u32[], token[]) recv({tok}), channel_id={channel}, {attrs}",
            f"  {name}_s = ({shape}, u32[], token[]) send({x}, {tok}), channel_id={channel}, {attrs}",
            f"  {name}_d = ({shape}, token[]) recv-done({name}_r), channel_id={channel}, {attrs}",
            f"  {name}_sd = token[] send-done({name}_s), channel_id={channel}, {attrs}",
            f"  {name} = {shape} get-tuple-element({name}_d), index=0"]


RING3 = route((0, 1), (1, 2), (2, 0))
TRIPS = 60

# Three actors in a ring: small arrays (in the ring), bf16 and pred, a tuple (pickled), a 256 KiB
# array (the arena, its descriptor in the ring), and a While loop that pairs iteration by iteration.
MIXED = "\n".join([
    "HloModule mixed, replica_count=3",
    "cond {",
    "  st = (s32[], f32[2]) parameter(0)",
    "  i = s32[] get-tuple-element(st), index=0",
    f"  n = s32[] constant({TRIPS})",
    "  ROOT more = pred[] compare(i, n), direction=LT",
    "}",
    "body {",
    "  st = (s32[], f32[2]) parameter(0)",
    "  i = s32[] get-tuple-element(st), index=0",
    "  x = f32[2] get-tuple-element(st), index=1",
    "  tok = token[] after-all()",
    *exchange("got", "x", "f32[2]", 9, RING3),
    "  one = f32[] constant(1)",
    "  ones = f32[2] broadcast(one), dimensions={}",
    "  y = f32[2] add(got, ones)",
    "  j = s32[] constant(1)",
    "  i2 = s32[] add(i, j)",
    "  ROOT next = (s32[], f32[2]) tuple(i2, y)",
    "}",
    "ENTRY main {",
    "  a = f32[1024] parameter(0)",
    "  b = bf16[7,3] parameter(1)",
    "  p = pred[5] parameter(2)",
    "  big = u8[262144] parameter(3)",
    "  tok = token[] after-all()",
    *exchange("ga", "a", "f32[1024]", 1, RING3),
    *exchange("gb", "b", "bf16[7,3]", 2, RING3),
    *exchange("gp", "p", "pred[5]", 3, RING3),
    "  t = (f32[1024], pred[5]) tuple(a, p)",
    *exchange("gt", "t", "(f32[1024], pred[5])", 4, RING3),
    *exchange("gbig", "big", "u8[262144]", 5, RING3),
    "  z = s32[] constant(0)",
    "  init2 = f32[2] slice(ga), slice={[0:2]}",
    "  init3 = (s32[], f32[2]) tuple(z, init2)",
    "  loop = (s32[], f32[2]) while(init3), condition=cond, body=body",
    "  looped = f32[2] get-tuple-element(loop), index=1",
    "  ROOT out = (f32[1024], bf16[7,3], pred[5], (f32[1024], pred[5]), u8[262144], f32[2]) "
    "tuple(ga, gb, gp, gt, gbig, looped)",
    "}",
])


def _mixed_inputs() -> list[list[np.ndarray]]:
    import ml_dtypes

    rng = np.random.default_rng(11)
    return [[rng.standard_normal(1024).astype(np.float32), rng.standard_normal((7, 3)).astype(ml_dtypes.bfloat16),
             rng.random(5) < 0.5, rng.integers(0, 256, 262144, dtype=np.uint8)] for _ in range(3)]


def _same(got, want) -> None:
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want)
        for g, w in zip(got, want):
            _same(g, w)
    else:
        assert got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes()


def _paths(job: rp.Job) -> tuple[dict, dict]:
    """(messages sent through shared memory, channel messages a ring declined) per replica, by destination."""
    import ray

    sent, declined = {}, {}
    for actor in job._backend._actors:
        sent.update(ray.get(actor.shm_sent.remote()))
        declined.update(ray.get(actor.ring_declined.remote()))
    return sent, declined


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("per_actor", [1, 2])
def test_channels_between_actors_go_through_the_rings_and_equal_the_threads_backend_bitwise(per_actor):
    m = rp.parse_hlo(MIXED)
    args = _mixed_inputs()
    want = rp.run(m, args, num_replicas=3, backend="threads")
    job = rp.launch(m, args, num_replicas=3, timeout=120, replicas_per_actor=per_actor)
    got = job.result()
    for r in range(3):
        _same(got[r], want[r])
        # Replica r got replica r-1's values; the loop's value went round TRIPS times, +1 per hop.
        np.testing.assert_array_equal(got[r][0], args[(r - 1) % 3][0])
    sent, declined = _paths(job)
    # Per pair of actors: data on 5 channels + TRIPS, and the acknowledgements the other way; replicas
    # of one actor hand theirs over in-process.
    actor = [r // per_actor for r in range(3)]
    for r in range(3):
        for peer in ((r + 1) % 3, (r - 1) % 3):
            assert sent[r].get(peer, 0) == (5 + TRIPS if actor[peer] != actor[r] else 0), sent
    assert declined == {0: {}, 1: {}, 2: {}}
    assert job_segments(job._backend._token) == []
    # The flight recorder still has every send and recv.
    events = job.events()
    for r in range(3):
        opcodes = [e["opcode"] for e in events[r]]
        assert opcodes.count("send") == opcodes.count("recv") == 5 + TRIPS


BURST = 48  # values per channel, two channels: ~5.6 MiB of 60 KiB values through a 1 MiB ring
E = 15 * 1024  # f32 elements: 60 KiB, under shm.MIN_BYTES (a value kept in the ring)


def burst_program() -> str:
    """Replica 0 sends BURST values on channels 1 and 2, interleaved, before replica 1 (held by
    its infeed until the test feeds it) receives any; then the acknowledgements."""
    to1 = route((0, 1))
    lines = ["HloModule burst, replica_count=2", "ENTRY main {", f"  x = f32[{E}] parameter(0)",
             "  tok = token[] after-all()", f"  in = (f32[{E}], token[]) infeed(tok)",
             f"  held = f32[{E}] get-tuple-element(in), index=0", "  t0 = token[] get-tuple-element(in), index=1"]
    sends, names = [], []
    for k in range(2 * BURST):
        channel = 1 + k % 2
        lines += [f"  c{k} = f32[] constant({k})", f"  b{k} = f32[{E}] broadcast(c{k}), dimensions={{}}",
                  f"  v{k} = f32[{E}] add(x, b{k})",
                  f"  s{k} = (f32[{E}], u32[], token[]) send(v{k}, tok), channel_id={channel}, {to1}"]
        sends.append((k, channel))
    lines.append(f"  posted = token[] outfeed(held, t0), outfeed_shape=f32[{E}]")
    for k, channel in sends:
        lines += [f"  r{k} = (f32[{E}], u32[], token[]) recv(posted), channel_id={channel}, {to1}",
                  f"  d{k} = (f32[{E}], token[]) recv-done(r{k}), channel_id={channel}, {to1}",
                  f"  g{k} = f32[{E}] get-tuple-element(d{k}), index=0"]
        names.append(f"g{k}")
    for k, channel in sends:
        lines.append(f"  sd{k} = token[] send-done(s{k}), channel_id={channel}, {to1}")
    shape = "(" + ", ".join([f"f32[{E}]"] * len(names)) + ")"
    lines += [f"  ROOT out = {shape} tuple({', '.join(names)})", "}"]
    return "\n".join(lines)


@pytest.mark.usefixtures("ray_session")
def test_a_burst_larger_than_the_ring_falls_back_and_keeps_each_channels_order():
    m = rp.parse_hlo(burst_program())
    x = [np.arange(E, dtype=np.float32) * (r + 1) for r in range(2)]
    job = rp.launch(m, [[v] for v in x], num_replicas=2, timeout=120)
    job.infeed(0, np.zeros(E, np.float32))
    job.outfeed(0, timeout=60)  # replica 0 has posted every send
    job.infeed(1, np.zeros(E, np.float32))
    got = job.result()
    for k in range(2 * BURST):
        np.testing.assert_array_equal(got[1][k], x[0] + np.float32(k))
    sent, declined = _paths(job)
    assert sent[0].get(1, 0) > 0 and declined[0].get(1, 0) > 0, (sent, declined)
    assert sent[0][1] + declined[0][1] == 2 * BURST


def _deadlock_module(wait_in: str) -> rp.Module:
    attrs = route((0, 1))
    if wait_in == "recv-done":
        ops = [f"  r = (f32[2], u32[], token[]) recv(tok), channel_id=1, {attrs}",
               f"  d = (f32[2], token[]) recv-done(r), channel_id=1, {attrs}"]
    else:
        ops = [f"  s = (f32[2], u32[], token[]) send(x, tok), channel_id=1, {attrs}",
               f"  sd = token[] send-done(s), channel_id=1, {attrs}"]
    return rp.parse_hlo("\n".join(["HloModule unmatched, replica_count=2", "ENTRY main {",
                                   "  x = f32[2] parameter(0)", "  tok = token[] after-all()", *ops,
                                   "  ROOT out = f32[2] copy(x)", "}"]))


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("wait_in", ["recv-done", "send-done"])
def test_an_unmatched_channel_between_actors_is_a_deadlock_naming_the_wait(wait_in):
    """The acknowledgement (recv-done) or the value (send-done) sits in the peer's ring, which nobody
    waiting reads: the poll delivers it, and the deadlock is found."""
    with pytest.raises(DeadlockError, match=wait_in) as info:
        rp.run(_deadlock_module(wait_in), [np.zeros(2, np.float32)], num_replicas=2, timeout=60)
    assert "replica" in str(info.value)


@pytest.mark.usefixtures("ray_session")
def test_data_of_the_wrong_shape_through_a_ring_names_both_replicas():
    attrs = route((0, 1))
    m = rp.parse_hlo("\n".join([
        "HloModule wrong, replica_count=2", "ENTRY main {", "  x = f32[2] parameter(0)", "  tok = token[] after-all()",
        f"  s = (f32[2], u32[], token[]) send(x, tok), channel_id=1, {attrs}",
        f"  r = (f32[3], u32[], token[]) recv(tok), channel_id=1, {attrs}",
        f"  d = (f32[3], token[]) recv-done(r), channel_id=1, {attrs}",
        f"  sd = token[] send-done(s), channel_id=1, {attrs}",
        "  ROOT out = f32[3] get-tuple-element(d), index=0", "}"]))
    with pytest.raises(ProgramError, match=r"replica 1 expects f32\[3\].*replica 0 sent float32\[2\]"):
        rp.run(m, [np.zeros(2, np.float32)], num_replicas=2, timeout=60)


STUCK = "\n".join([
    "HloModule stuck, replica_count=2",
    "cond {", "  s = s32[] parameter(0)", "  ROOT t = pred[] constant(true)", "}",
    "body {", "  s = s32[] parameter(0)", "  one = s32[] constant(1)", "  ROOT n = s32[] add(s, one)", "}",
    "ENTRY main {", "  x = f32[1024] parameter(0)", "  tok = token[] after-all()",
    *exchange("got", "x", "f32[1024]", 1, route((0, 1), (1, 0))),
    "  done = token[] outfeed(got, tok), outfeed_shape=f32[1024]",
    "  z = s32[] constant(0)", "  w = s32[] while(z), condition=cond, body=body",
    "  ROOT out = (f32[1024], s32[]) tuple(got, w)", "}",
])


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("end", ["cancel", "kill"])
def test_the_rings_are_removed_when_a_job_is_cancelled_or_loses_an_actor(end):
    import ray

    job = rp.launch(rp.parse_hlo(STUCK), [[np.full(1024, r, np.float32)] for r in range(2)], num_replicas=2,
                    timeout=None)
    for r in range(2):
        assert job.outfeed(r, timeout=60).tolist() == [1 - r] * 1024  # past the exchange
    token = job._backend._token
    rings = [p for p in job_segments(token) if os.path.basename(p).startswith(f"rpl-{token}-c")]
    assert len(rings) == 2  # a ring segment per actor
    if end == "cancel":
        job.cancel()
    else:
        ray.kill(job._backend._actors[1], no_restart=True)
        with pytest.raises(rp.ReplicasError):
            job.result(timeout=60)
    assert job_segments(token) == []


# -- the rings alone, in one process ---------------------------------------------------------------

SMALL = "\n".join(["HloModule small, replica_count=2", "ENTRY main {", "  x = f32[1000] parameter(0)",
                   "  tok = token[] after-all()", *exchange("got", "x", "f32[1000]", 1, route((0, 1))),
                   "  ROOT out = f32[1000] copy(got)", "}"])


def _pair(capacity: int) -> tuple[channel_ring.ChannelRings, channel_ring.ChannelRings, Mailbox, list]:
    """Two actors' rings in this process: replica 0's actor writes, replica 1's reads."""
    token = secrets.token_hex(8)
    bounds = MessageBounds(rp.parse_hlo(SMALL), 2)
    box, faults = Mailbox(1), []
    placement, node = [0, 1], frozenset({0, 1})
    writer = channel_ring.ChannelRings(token, [0], placement, node, bounds, {0: Mailbox(0)}, faults.append,
                                        capacity=capacity)
    reader = channel_ring.ChannelRings(token, [1], placement, node, bounds, {1: box}, faults.append, capacity=capacity)
    return writer, reader, box, faults


@pytest.mark.skipif(not channel_ring.available(), reason="needs Linux x86-64 futexes and /dev/shm")
def test_a_full_ring_declines_wraps_around_and_keeps_order():
    writer, reader, box, faults = _pair(64 << 10)
    # Named like the job's other segments: removed with them (and as orphans of a killed driver).
    assert len(job_segments(writer.token)) == 2
    try:
        values = [np.full(1000, k, np.float32) for k in range(40)]
        taken = sent = 0
        for k, v in enumerate(values):
            while not writer.send(1, 0, keys.channel(1, k), v, None):  # full: the receiver reads, then room
                assert sent - taken >= 10, "declined with room left"
                reader.drain()
                got = [box.take(0, keys.channel(1, j), None) for j in range(taken, sent)]
                assert [int(g[0]) for g in got] == list(range(taken, sent))
                taken = sent
            sent += 1
        reader.drain()
        for j in range(taken, sent):
            np.testing.assert_array_equal(box.take(0, keys.channel(1, j), None), values[j])
        assert box.state.received == 40 and faults == []
    finally:
        writer.close()
        reader.close()
    assert not os.path.exists(f"/dev/shm/{channel_ring.segment_name(writer.token, 0)}")
    assert not os.path.exists(f"/dev/shm/{channel_ring.segment_name(writer.token, 1)}")


@pytest.mark.skipif(not channel_ring.available(), reason="needs Linux x86-64 futexes and /dev/shm")
@pytest.mark.parametrize("key, value, refused", [
    (keys.channel(1, 0), (b"\0" * 100_000,), "where the program expects at most"),  # pickled: 100 kB
    (keys.channel(2, 0), np.zeros(10, np.float32), "sends nothing on channel 2"),
])
def test_a_ring_record_over_its_channels_bound_is_refused_before_it_is_read(key, value, refused):
    writer, reader, box, faults = _pair(1 << 20)
    try:
        assert writer.send(1, 0, key, value, None)
        reader.drain()
        assert len(faults) == 1 and isinstance(faults[0], RefusedMessage)
        assert refused in str(faults[0]) and "through a channel ring" in str(faults[0])
        assert box.leftovers() == {}
    finally:
        writer.close()
        reader.close()


@pytest.mark.skipif(not channel_ring.available(), reason="needs Linux x86-64 futexes and /dev/shm")
def test_every_layout_comes_out_of_a_ring_as_it_went_in():
    """Arrays go into a ring by one memcpy when they can (C-contiguous, a type with a buffer format) and
    by numpy otherwise; a ring keeps the last layout it read: alternating layouts must not mix."""
    import ml_dtypes

    grid = np.arange(40, dtype=np.float32).reshape(5, 8)
    values = [grid, grid[:, ::2], np.full((), 7.5, np.float32), np.arange(9, dtype=np.float16),
              np.arange(6).astype(ml_dtypes.bfloat16), np.asfortranarray(grid), grid.reshape(40),
              np.array([True, False, True]), grid, np.zeros((0, 3), np.int32), grid[1]]
    writer, reader, box, faults = _pair(1 << 20)
    try:
        for k, v in enumerate(values):
            assert writer.send(1, 0, keys.channel(1, k), v, None)
        reader.drain()
        for k, v in enumerate(values):
            got = box.take(0, keys.channel(1, k), None)
            assert got.dtype == v.dtype and got.shape == v.shape and got.flags.writeable
            np.testing.assert_array_equal(got, v)
        assert faults == [] and box.state.received == len(values)
    finally:
        writer.close()
        reader.close()


@pytest.mark.skipif(not channel_ring.available(), reason="needs Linux x86-64 futexes and /dev/shm")
def test_closed_rings_decline_and_ignore_bells():
    """After `close` (the views onto the segments released), a late send declines (the caller posts by
    the other paths), a late bell or drain does nothing, and a spin on the released doorbell ends."""
    writer, reader, box, faults = _pair(1 << 20)
    assert writer.send(1, 0, keys.channel(1, 0), np.ones(4, np.float32), None)
    doorbell = reader._own_views[0]
    writer.close()
    reader.close()
    assert not writer.send(1, 0, keys.channel(1, 1), np.ones(4, np.float32), None)
    reader.ring_doorbell(1)
    writer.ring_doorbell(0, always=True)
    reader.drain()
    assert spin.Spinner(1.0).watch_words(doorbell, 0, lambda: False)
    assert faults == []


@pytest.mark.skipif(not channel_ring.available(), reason="needs Linux x86-64 futexes and /dev/shm")
def test_acknowledgements_are_words_and_a_waited_record_skips_the_mailbox():
    """A Recv's acknowledgement is a word of the Send side's segment (never in flight: counted neither
    sent nor received), acknowledging every earlier Recv of its channel too; a record the waiting
    replica reads itself is counted received once and leaves nothing in the mailbox."""
    writer, reader, box, faults = _pair(1 << 20)
    try:
        # Replica 0 (writer's actor) posts its Recvs number 0 and 1 of channel 1 from replica 1.
        assert writer.post_ack(1, 0, keys.channel_ack(1, 0), True)
        assert writer.post_ack(1, 0, keys.channel_ack(1, 1), True)
        assert not writer.post_ack(1, 0, keys.channel_ack(7, 0), True)  # no such channel: a record then
        assert not writer.post_ack(1, 0, keys.channel(1, 0), np.ones(2, np.float32))  # data is no acknowledgement
        for seq in (1, 0):
            assert reader.take(1, 0, keys.channel_ack(1, seq), box, None) is True
        assert box.state.received == 0 and box.leftovers() == {}
        values = [np.full(1000, k, np.float32) for k in range(3)]
        for k, v in enumerate(values):
            assert writer.send(1, 0, keys.channel(1, k), v, None)
        np.testing.assert_array_equal(reader.take(1, 0, keys.channel(1, 1), box, None), values[1])  # not first
        assert box.state.received == 3  # record 0 went to the mailbox on the way, record 2 too
        for k in (0, 2):
            np.testing.assert_array_equal(reader.take(1, 0, keys.channel(1, k), box, None), values[k])
        assert box.state.received == 3 and box.leftovers() == {} and faults == []
    finally:
        writer.close()
        reader.close()
