"""Send/Recv ordering under randomized delays: a replica made slow at random points still gives
the same results, and the flight recorder shows the document's rules held in every run."""

from __future__ import annotations

import random
import threading

import numpy as np
import pytest

import replicas as rp
from replicas.ops.custom_call import register_custom_call, unregister_custom_call

ROUTE = 'frontend_attributes={_xla_send_recv_source_target_pairs="{{0,1},{1,2},{2,0}}"}'

RING = f"""\
HloModule ring, replica_count=3

cond {{
  st = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(st), index=0
  n = s32[] constant(25)
  ROOT more = pred[] compare(i, n), direction=LT
}}

body {{
  st = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(st), index=0
  x = f32[4] get-tuple-element(st), index=1
  slow = f32[4] custom-call(x), custom_call_target="jitter"
  tok = token[] after-all()
  rcv = (f32[4], u32[], token[]) recv(tok), channel_id=7, {ROUTE}
  snd = (f32[4], u32[], token[]) send(slow, tok), channel_id=7, {ROUTE}
  got = (f32[4], token[]) recv-done(rcv), channel_id=7, {ROUTE}
  late = f32[4] custom-call(x), custom_call_target="jitter"
  sent = token[] send-done(snd), channel_id=7, {ROUTE}
  y = f32[4] get-tuple-element(got), index=0
  one = f32[] constant(1)
  ones = f32[4] broadcast(one), dimensions={{}}
  y2 = f32[4] add(y, ones)
  j = s32[] constant(1)
  i2 = s32[] add(i, j)
  ROOT next = (s32[], f32[4]) tuple(i2, y2)
}}

ENTRY main {{
  x = f32[4] parameter(0)
  z = s32[] constant(0)
  init = (s32[], f32[4]) tuple(z, x)
  loop = (s32[], f32[4]) while(init), condition=cond, body=body
  ROOT out = f32[4] get-tuple-element(loop), index=1
}}
"""


@pytest.fixture
def jitter():
    """A custom call that stalls its replica for a random 0-3 ms (perturbs timing, never orders)."""
    local = threading.local()

    def stall(x):
        rng = getattr(local, "rng", None)
        if rng is None:
            rng = local.rng = random.Random(hash((threading.get_ident(), jitter.seed)))
        threading.Event().wait(rng.random() * 0.003)
        return x

    jitter.seed = 0
    register_custom_call("jitter", stall)
    yield jitter
    unregister_custom_call("jitter")


@pytest.mark.parametrize("seed", range(4))
def test_ring_exchange_gives_the_same_answer_under_random_delays(jitter, seed):
    jitter.seed = seed
    xs = [np.full(4, 100.0 * r, np.float32) for r in range(3)]
    job = rp.launch(rp.parse_hlo(RING), [[x] for x in xs], num_replicas=3, backend="threads", timeout=60)
    results = job.result()
    # After 25 hops to the right, replica r holds replica (r - 25) mod 3's value plus 25.
    for r, y in enumerate(results):
        np.testing.assert_array_equal(y, xs[(r - 25) % 3] + 25)
    _assert_document_rules(job.events())


def _assert_document_rules(events: dict[int, list[dict]]) -> None:
    """Send before RecvDone completes; the peer's Recv posted before SendDone completes; each
    context's start before its done."""
    by = {}
    for r, evs in events.items():
        for ev in evs:
            by.setdefault((ev["opcode"], r), []).append(ev)
    checked = 0
    for src in range(3):
        dst = (src + 1) % 3
        sends, send_dones = by[("send", src)], by[("send-done", src)]
        recvs, recv_dones = by[("recv", dst)], by[("recv-done", dst)]
        assert len(sends) == len(send_dones) == len(recvs) == len(recv_dones) == 25
        for k in range(25):
            assert sends[k]["start_us"] <= recv_dones[k]["end_us"]  # Send before RecvDone
            assert recvs[k]["start_us"] <= send_dones[k]["end_us"]  # the peer's Recv before SendDone
            assert recvs[k]["start_us"] <= recv_dones[k]["end_us"]
            assert sends[k]["start_us"] <= send_dones[k]["end_us"]
            checked += 1
    assert checked == 75
