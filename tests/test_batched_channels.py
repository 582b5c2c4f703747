"""Send and Recv between the members of a batched run (`runtime/batched_channels.py`): each program
runs on threads batched and replica by replica, with bitwise the same results per replica, the
same channel events on each replica's flight recorder, and the path `batched.RUNS` counted."""

from __future__ import annotations

import numpy as np
import pytest
from test_batched import per_replica, run_both

import replicas as rp
from replicas.runtime import batched, batched_channels


def pairs(text: str) -> str:
    return f'frontend_attributes={{_xla_send_recv_source_target_pairs="{text}"}}'


TO_1, TO_0 = pairs("{{0,1}}"), pairs("{{1,0}}")

PING_PONG = f"""HloModule ping_pong, replica_count=2

cond {{
  st = (s32[], s32[], f32[5]) parameter(0)
  i = s32[] get-tuple-element(st), index=0
  k = s32[] get-tuple-element(st), index=1
  ROOT more = pred[] compare(i, k), direction=LT
}}

body {{
  st = (s32[], s32[], f32[5]) parameter(0)
  i = s32[] get-tuple-element(st), index=0
  k = s32[] get-tuple-element(st), index=1
  x = f32[5] get-tuple-element(st), index=2
  tok = token[] after-all()
  s1 = (f32[5], u32[], token[]) send(x, tok), channel_id=1, {TO_1}
  r1 = (f32[5], u32[], token[]) recv(tok), channel_id=1, {TO_1}
  d1 = (f32[5], token[]) recv-done(r1), channel_id=1, {TO_1}
  sd1 = token[] send-done(s1), channel_id=1, {TO_1}
  y = f32[5] get-tuple-element(d1), index=0
  two = f32[5] broadcast(f32[] constant(2)), dimensions={{}}
  y2 = f32[5] multiply(y, two)
  t1 = token[] get-tuple-element(d1), index=1
  s2 = (f32[5], u32[], token[]) send(y2, t1), channel_id=2, {TO_0}
  r2 = (f32[5], u32[], token[]) recv(t1), channel_id=2, {TO_0}
  d2 = (f32[5], token[]) recv-done(r2), channel_id=2, {TO_0}
  sd2 = token[] send-done(s2), channel_id=2, {TO_0}
  z = f32[5] get-tuple-element(d2), index=0
  back = f32[5] add(z, x)
  i2 = s32[] add(i, s32[] constant(1))
  ROOT next = (s32[], s32[], f32[5]) tuple(i2, k, back)
}}

ENTRY main {{
  x = f32[5] parameter(0)
  k = s32[] parameter(1)
  init = (s32[], s32[], f32[5]) tuple(s32[] constant(0), k, x)
  loop = (s32[], s32[], f32[5]) while(init), condition=cond, body=body
  ROOT z = f32[5] get-tuple-element(loop), index=2
}}
"""

RING = f"""HloModule ring, replica_count=3
ENTRY main {{
  x = f32[2,3] parameter(0)
  tok = token[] after-all()
  r = (f32[2,3], u32[], token[]) recv(tok), channel_id=7, {pairs("{{0,1},{1,2},{2,0}}")}
  s = (f32[2,3], u32[], token[]) send(x, tok), channel_id=7, {pairs("{{0,1},{1,2},{2,0}}")}
  d = (f32[2,3], token[]) recv-done(r), channel_id=7, {pairs("{{0,1},{1,2},{2,0}}")}
  sd = token[] send-done(s), channel_id=7, {pairs("{{0,1},{1,2},{2,0}}")}
  ROOT y = f32[2,3] get-tuple-element(d), index=0
}}
"""

# Replica 0 sends to 1 only: replica 2 is no end of the channel, and replica 0 receives nothing.
ONE_WAY = RING.replace("{{0,1},{1,2},{2,0}}", "{{0,1}}")

# SendDone before its Recv: replica 0 waits for replica 1's Recv, which lock step cannot give.
SEND_DONE_FIRST = f"""HloModule send_done_first, replica_count=2
ENTRY main {{
  x = f32[3] parameter(0)
  tok = token[] after-all()
  s = (f32[3], u32[], token[]) send(x, tok), channel_id=1, {TO_1}
  sd = token[] send-done(s), channel_id=1, {TO_1}
  r = (f32[3], u32[], token[]) recv(sd), channel_id=1, {TO_1}
  d = (f32[3], token[]) recv-done(r), channel_id=1, {TO_1}
  ROOT y = f32[3] get-tuple-element(d), index=0
}}
"""

# Two Sends on one channel: which Recv each pairs with is the replicas' order, not lock step's.
TWO_SENDS = f"""HloModule two_sends, replica_count=2
ENTRY main {{
  x = f32[3] parameter(0)
  tok = token[] after-all()
  s = (f32[3], u32[], token[]) send(x, tok), channel_id=1, {TO_1}
  r = (f32[3], u32[], token[]) recv(tok), channel_id=1, {TO_1}
  d = (f32[3], token[]) recv-done(r), channel_id=1, {TO_1}
  sd = token[] send-done(s), channel_id=1, {TO_1}
  t = token[] get-tuple-element(d), index=1
  s2 = (f32[3], u32[], token[]) send(x, t), channel_id=1, {TO_1}
  r2 = (f32[3], u32[], token[]) recv(t), channel_id=1, {TO_1}
  d2 = (f32[3], token[]) recv-done(r2), channel_id=1, {TO_1}
  sd2 = token[] send-done(s2), channel_id=1, {TO_1}
  y = f32[3] get-tuple-element(d), index=0
  y2 = f32[3] get-tuple-element(d2), index=0
  ROOT out = f32[3] add(y, y2)
}}
"""


def test_ping_pong_loop_runs_batched(monkeypatch):
    xs = per_replica(2, (5,), seed=3)
    out = run_both(monkeypatch, PING_PONG, [[x[0], np.array(4, np.int32)] for x in xs], 2)
    x = xs[0][0]
    for _ in range(4):  # replica 0's buffer: what came back (doubled by replica 1), plus its own
        x = 2 * x + x
    assert np.array_equal(out[0], x)


@pytest.mark.parametrize("program", [RING, ONE_WAY], ids=["ring", "one-way"])
def test_routes_among_three_members(monkeypatch, program):
    xs = per_replica(3, (2, 3), seed=4)
    out = run_both(monkeypatch, program, xs, 3)
    if program is RING:
        for r in range(3):
            assert np.array_equal(out[r], xs[(r - 1) % 3][0])
    else:
        assert np.array_equal(out[1], xs[0][0]) and not out[0].any() and not out[2].any()


def test_an_order_lock_step_cannot_run_falls_back(monkeypatch):
    xs = per_replica(2, (3,), seed=5)
    out = run_both(monkeypatch, SEND_DONE_FIRST, xs, 2, expect="fallback")
    assert np.array_equal(out[1], xs[0][0])


# A Send whose RecvDone never runs: alone, its message stays where `replicas check` finds it.
UNRECEIVED = f"""HloModule unreceived, replica_count=2
ENTRY main {{
  x = f32[3] parameter(0)
  tok = token[] after-all()
  s = (f32[3], u32[], token[]) send(x, tok), channel_id=1, {TO_1}
  r = (f32[3], u32[], token[]) recv(tok), channel_id=1, {TO_1}
  sd = token[] send-done(s), channel_id=1, {TO_1}
  ROOT y = f32[3] copy(x)
}}
"""


def test_a_message_nobody_receives_falls_back(monkeypatch):
    xs = per_replica(2, (3,), seed=9)
    run_both(monkeypatch, UNRECEIVED, xs, 2, expect="fallback")


def test_a_channel_of_two_sends_runs_replica_by_replica(monkeypatch):
    xs = per_replica(2, (3,), seed=6)
    out = run_both(monkeypatch, TWO_SENDS, xs, 2, expect="none")
    assert np.array_equal(out[1], 2 * xs[0][0])


def test_large_messages_run_replica_by_replica(monkeypatch):
    elements = batched_channels.MESSAGE_BYTES // 4 + 1  # alone a message is the sender's array, not a copy
    program = PING_PONG.replace("f32[5]", f"f32[{elements}]")
    xs = per_replica(2, (elements,), seed=8)
    run_both(monkeypatch, program, [[x[0], np.array(2, np.int32)] for x in xs], 2, expect="none")


def _channel_events(program: str, args: list, n: int) -> dict[int, list[tuple]]:
    with rp.launch(rp.parse_hlo(program), args, num_replicas=n, backend="threads", timeout=60) as job:
        job.result()
        events = job.events()
    keep = ("kind", "instruction", "channel_id", "peer", "peers", "seq")
    return {r: [tuple(e.get(k) for k in keep) for e in events[r] if e["kind"] in ("send", "recv", "send-done",
                                                                                  "recv-done")]
            for r in range(n)}


def test_each_member_records_the_channel_events_of_its_own_run(monkeypatch):
    args = [[x[0], np.array(3, np.int32)] for x in per_replica(2, (5,), seed=7)]
    monkeypatch.setattr(batched, "ENABLED", False)
    alone = _channel_events(PING_PONG, args, 2)
    monkeypatch.setattr(batched, "ENABLED", True)
    before = batched.RUNS["batched"]
    together = _channel_events(PING_PONG, args, 2)
    assert batched.RUNS["batched"] == before + 1
    assert len(alone[0]) == len(alone[1]) == 3 * 4  # three trips, a Send or Recv and its Done per channel
    for r in range(2):
        assert sorted(together[r], key=repr) == sorted(alone[r], key=repr)
