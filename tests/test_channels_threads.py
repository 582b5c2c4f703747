"""Send/recv channels, host transfers, infeed and outfeed on replicas-as-threads."""

from __future__ import annotations

import numpy as np
import pytest
from collective_kit import Comp, launch_threads, module, run_threads

import replicas as rp
from replicas.errors import DeadlockError, ProgramError
from replicas.shapes import TOKEN, Shape

PAIRS = "_xla_send_recv_source_target_pairs"


def pairs_attr(pairs: list[tuple[int, int]]) -> dict[str, str]:
    return {PAIRS: "{" + ",".join(f"{{{s},{t}}}" for s, t in pairs) + "}"}


def exchange(c: Comp, x: str, shape: str, channel: int, pairs, *, recv_first: bool = True) -> str:
    """Send `x` along `pairs` and receive on the same channel; returns the received data."""
    tok = c.op("after-all", "token[]", [])
    fa = pairs_attr(pairs) if pairs is not None else {}

    def recv():
        return c.op("recv", f"({shape}, u32[], token[])", [tok], channel_id=channel, is_host_transfer=False,
                    frontend_attributes=fa)

    def send():
        return c.op("send", f"({shape}, u32[], token[])", [x, tok], channel_id=channel, is_host_transfer=False,
                    frontend_attributes=fa)

    if recv_first:
        rv, sd = recv(), send()
    else:
        sd, rv = send(), recv()
    rd = c.op("recv-done", f"({shape}, token[])", [rv], channel_id=channel, is_host_transfer=False,
              frontend_attributes=fa)
    c.op("send-done", "token[]", [sd], channel_id=channel, is_host_transfer=False, frontend_attributes=fa)
    return c.op("get-tuple-element", shape, [rd], index=0)


@pytest.mark.parametrize("recv_first", [True, False])
def test_send_recv_ring(recv_first):
    n = 4
    c = Comp("main")
    x = c.param("s32[3]")
    got = exchange(c, x, "s32[3]", 1, [(r, (r + 1) % n) for r in range(n)], recv_first=recv_first)
    out = run_threads(module(c.done(got)), [[np.full(3, r, np.int32)] for r in range(n)], n)
    assert [o.tolist() for o in out] == [[3] * 3, [0] * 3, [1] * 3, [2] * 3]


def test_partial_routing_no_source_no_target():
    c = Comp("main")
    x = c.param("f32[2]")
    got = exchange(c, x, "f32[2]", 7, [(2, 0)])
    out = run_threads(module(c.done(got)), [[np.full(2, r + 1, np.float32)] for r in range(3)], 3)
    assert [o.tolist() for o in out] == [[3, 3], [0, 0], [0, 0]]


def test_missing_routing_is_a_program_error_unless_alone():
    c = Comp("main")
    x = c.param("f32[2]")
    m = module(c.done(exchange(c, x, "f32[2]", 1, None)))
    with pytest.raises(ProgramError, match=PAIRS):
        run_threads(m, [np.ones(2, np.float32)], 2)
    out = run_threads(m, [np.full(2, 5, np.float32)], 1)  # one replica: it sends to itself
    assert out[0].tolist() == [5, 5]


def test_send_recv_in_a_while_loop_pairs_iteration_by_iteration():
    n, trips = 3, 1000
    ring = [(r, (r + 1) % n) for r in range(n)]
    cond = Comp("cond")
    st = cond.param("(s32[], f32[2])")
    i = cond.op("get-tuple-element", "s32[]", [st], index=0)
    lim = cond.op("constant", "s32[]", [], literal=np.asarray(trips, np.int32))
    cond_c = cond.done(cond.op("compare", "pred[]", [i, lim], comparison_direction="LT"))
    body = Comp("body")
    st = body.param("(s32[], f32[2])")
    i = body.op("get-tuple-element", "s32[]", [st], index=0)
    x = body.op("get-tuple-element", "f32[2]", [st], index=1)
    one_i = body.op("constant", "s32[]", [], literal=np.asarray(1, np.int32))
    one_f = body.op("constant", "f32[2]", [], literal=np.ones(2, np.float32))
    got = exchange(body, x, "f32[2]", 3, ring)
    body_c = body.done(body.op("tuple", "(s32[], f32[2])", [body.op("add", "s32[]", [i, one_i]),
                                                           body.op("add", "f32[2]", [got, one_f])]))
    main = Comp("main")
    x0 = main.param("f32[2]")
    zero = main.op("constant", "s32[]", [], literal=np.asarray(0, np.int32))
    w = main.op("while", "(s32[], f32[2])", [main.op("tuple", "(s32[], f32[2])", [zero, x0])],
                condition="cond", body="body")
    m = module(main.done(main.op("get-tuple-element", "f32[2]", [w], index=1)), cond_c, body_c)
    out = run_threads(m, [[np.full(2, 100 * r, np.float32)] for r in range(n)], n, timeout=120)
    for r in range(n):  # value of replica (r - trips) mod n, plus one per hop
        assert out[r].tolist() == [100 * ((r - trips) % n) + trips] * 2


@pytest.mark.parametrize("wait_in", ["recv-done", "send-done"])
def test_unmatched_channel_is_a_deadlock_naming_the_wait(wait_in):
    c = Comp("main")
    x = c.param("f32[2]")
    tok = c.op("after-all", "token[]", [])
    fa = pairs_attr([(0, 1)])
    if wait_in == "recv-done":
        rv = c.op("recv", "(f32[2], u32[], token[])", [tok], channel_id=1, frontend_attributes=fa)
        c.op("recv-done", "(f32[2], token[])", [rv], channel_id=1, frontend_attributes=fa)
    else:
        sd = c.op("send", "(f32[2], u32[], token[])", [x, tok], channel_id=1, frontend_attributes=fa)
        c.op("send-done", "token[]", [sd], channel_id=1, frontend_attributes=fa)
    m = module(c.done(x))
    with pytest.raises(DeadlockError, match=wait_in) as info:
        run_threads(m, [np.zeros(2, np.float32)], 2, timeout=30)
    assert "replica" in str(info.value)


def test_received_data_of_the_wrong_shape_names_both_replicas():
    c = Comp("main")
    x = c.param("f32[2]")
    tok = c.op("after-all", "token[]", [])
    fa = pairs_attr([(0, 1)])
    sd = c.op("send", "(f32[2], u32[], token[])", [x, tok], channel_id=1, frontend_attributes=fa)
    rv = c.op("recv", "(f32[3], u32[], token[])", [tok], channel_id=1, frontend_attributes=fa)
    rd = c.op("recv-done", "(f32[3], token[])", [rv], channel_id=1, frontend_attributes=fa)
    c.op("send-done", "token[]", [sd], channel_id=1, frontend_attributes=fa)
    m = module(c.done(c.op("get-tuple-element", "f32[3]", [rd], index=0)))
    with pytest.raises(ProgramError, match=r"replica 1 expects f32\[3\].*replica 0 sent float32\[2\]"):
        run_threads(m, [np.zeros(2, np.float32)], 2)


# -- host transfers --------------------------------------------------------------------------------

def host_echo_module() -> object:
    """Receive f32[3] from the host on channel 6, send it back doubled... as is, on channel 5."""
    c = Comp("main")
    tok = c.op("after-all", "token[]", [])
    rv = c.op("recv", "(f32[3], u32[], token[])", [tok], channel_id=6, is_host_transfer=True)
    rd = c.op("recv-done", "(f32[3], token[])", [rv], channel_id=6, is_host_transfer=True)
    d = c.op("get-tuple-element", "f32[3]", [rd], index=0)
    sd = c.op("send", "(f32[3], u32[], token[])", [d, tok], channel_id=5, is_host_transfer=True)
    c.op("send-done", "token[]", [sd], channel_id=5, is_host_transfer=True)
    return module(c.done(d))


def test_host_transfers_both_ways():
    n = 2
    with launch_threads(host_echo_module(), [], n) as job:
        for r in range(n):
            job.send(r, 6, np.full(3, r + 0.5, np.float32))
        out = job.result(timeout=30)
        echoed = [job.recv(r, 5, timeout=5) for r in range(n)]
    for r in range(n):
        assert out[r].tolist() == [r + 0.5] * 3 and echoed[r].tolist() == [r + 0.5] * 3


def test_host_transfer_bytes_and_wrong_shape():
    with launch_threads(host_echo_module(), [], 1) as job:
        job.send(0, 6, np.arange(3, dtype=np.float32).tobytes())
        assert job.result(timeout=30)[0].tolist() == [0, 1, 2]
    with launch_threads(host_echo_module(), [], 2) as job:
        job.send(0, 6, np.zeros(3, np.float32))
        job.send(1, 6, np.zeros(4, np.float32))
        with pytest.raises(ProgramError, match=r"replica 1.*expects f32\[3\], got f32\[4\]"):
            job.result(timeout=30)


# -- infeed / outfeed ------------------------------------------------------------------------------

def infeed_module(data_shape: str) -> object:
    c = Comp("main")
    tok = c.op("after-all", "token[]", [])
    inf = c.op("infeed", f"({data_shape}, token[])", [tok], name="feed")
    return module(c.done(c.op("get-tuple-element", data_shape, [inf], index=0)))


def test_infeed_arrays_in_order_per_replica():
    c = Comp("main")
    tok = c.op("after-all", "token[]", [])
    a = c.op("infeed", "(s32[2], token[])", [tok])
    t2 = c.op("get-tuple-element", "token[]", [a], index=1)
    b = c.op("infeed", "(s32[2], token[])", [t2])
    root = c.op("tuple", "(s32[2], s32[2])", [c.op("get-tuple-element", "s32[2]", [a], index=0),
                                                c.op("get-tuple-element", "s32[2]", [b], index=0)])
    feeds = [[np.full(2, 10 * r, np.int32), np.full(2, 10 * r + 1, np.int32)] for r in range(3)]
    out = run_threads(module(c.done(root)), [], 3, infeed=feeds)
    for r in range(3):
        assert out[r][0].tolist() == [10 * r] * 2 and out[r][1].tolist() == [10 * r + 1] * 2


def test_infeed_tuple_bytes_and_empty_tuple():
    out = run_threads(infeed_module("(f32[2], s32[])"), [], 1,
                      infeed=[[(np.ones(2, np.float32), np.asarray(7, np.int32))]])
    assert out[0][0].tolist() == [1, 1] and int(out[0][1]) == 7
    raw = np.arange(6, dtype=np.int16).reshape(2, 3)
    out = run_threads(infeed_module("s16[2,3]"), [], 1, infeed=[[raw.tobytes()]])
    np.testing.assert_array_equal(out[0], raw)
    out = run_threads(infeed_module("()"), [], 2)  # reads nothing: no host value needed
    assert out == [(), ()]


def test_infeed_shape_errors():
    with pytest.raises(ProgramError, match=r"replica 1: infeed expects f32\[2\], got f32\[3\]") as info:
        run_threads(infeed_module("f32[2]"), [], 2,
                    infeed=[[np.zeros(2, np.float32)], [np.zeros(3, np.float32)]])
    assert "%feed" in str(info.value)
    with pytest.raises(ProgramError, match=r"expects f32\[2\], got array|expects f32\[2\], got s32\[2\]"):
        run_threads(infeed_module("f32[2]"), [], 1, infeed=[[np.zeros(2, np.int32)]])
    with pytest.raises(ProgramError, match="expects"):
        run_threads(infeed_module("(f32[2], s32[])"), [], 1, infeed=[[np.zeros(2, np.float32)]])
    with pytest.raises(ProgramError, match="nested tuple"):
        run_threads(infeed_module("((f32[2]), s32[])"), [], 1, infeed=[[((np.zeros(2, np.float32),), 1)]])


def test_outfeed_values_reach_the_host_in_order():
    c = Comp("main")
    x = c.param("f32[2]")
    tok = c.op("after-all", "token[]", [])
    t1 = c.op("outfeed", "token[]", [x, tok], outfeed_shape=Shape.parse("f32[2]"))
    pair = c.op("tuple", "(f32[2], f32[2])", [x, x])
    c.op("outfeed", "token[]", [pair, t1], outfeed_shape=Shape.parse("(f32[2], f32[2])"))
    m = module(c.done(x))
    with launch_threads(m, [[np.full(2, r, np.float32)] for r in range(2)], 2) as job:
        job.result(timeout=30)
        for r in range(2):
            assert job.outfeed(r, timeout=5).tolist() == [r, r]
            second = job.outfeed(r, timeout=5)
            assert isinstance(second, tuple) and second[1].tolist() == [r, r]


def test_outfeed_shape_must_match_operand():
    c = Comp("main")
    x = c.param("f32[2]")
    tok = c.op("after-all", "token[]", [])
    c.op("outfeed", "token[]", [x, tok], outfeed_shape=Shape.parse("f32[3]"))
    with pytest.raises(ProgramError, match="outfeed_shape"):
        run_threads(module(c.done(x)), [np.zeros(2, np.float32)], 1)


def test_channel_ops_and_feeds_are_recorded():
    from replicas.runtime.compile import compile_module
    from replicas.runtime.job import Job
    from replicas.runtime.threads import ThreadBackend

    c = Comp("main")
    x = c.param("f32[2]")
    got = exchange(c, x, "f32[2]", 2, [(0, 1), (1, 0)])
    tok = c.op("after-all", "token[]", [])
    c.op("outfeed", "token[]", [got, tok])
    backend = ThreadBackend(compile_module(module(c.done(got))), [[np.ones(2, np.float32)]] * 2)
    assert Job(backend, None, timeout=30, host_may_send=False).result()[0].tolist() == [1, 1]
    kinds = [e["kind"] for e in backend.events()[0]]
    assert {"recv", "send", "recv-done", "send-done", "outfeed"} <= set(kinds)
    assert TOKEN is not None


def test_tuple_data_over_a_channel():
    c = Comp("main")
    x = c.param("(f32[2], s32[])")
    got = exchange(c, x, "(f32[2], s32[])", 4, [(0, 1), (1, 0)])
    args = [[(np.full(2, r, np.float32), np.asarray(10 + r, np.int32))] for r in range(2)]
    out = run_threads(module(c.done(got)), args, 2)
    assert out[0][0].tolist() == [1, 1] and int(out[0][1]) == 11
    assert out[1][0].tolist() == [0, 0] and int(out[1][1]) == 10


def test_zeros_of_a_replica_that_is_no_target_are_fresh_every_iteration():
    """Replica 0 is no target of channel 1: its recv-done yields zeros each iteration, which an
    in-place update must never change for the next one (they are shared and read-only)."""
    fa = 'frontend_attributes={_xla_send_recv_source_target_pairs="{{0,1}}"}'
    text = f"""HloModule m, replica_count=2

cond {{
  p = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  three = s32[] constant(3)
  ROOT lt = pred[] compare(i, three), direction=LT
}}

body {{
  p = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  x = f32[4] get-tuple-element(p), index=1
  tok = token[] after-all()
  r = (f32[4], u32[], token[]) recv(tok), channel_id=1, {fa}
  s = (f32[4], u32[], token[]) send(x, tok), channel_id=1, {fa}
  d = (f32[4], token[]) recv-done(r), channel_id=1, {fa}
  sd = token[] send-done(s), channel_id=1, {fa}
  got = f32[4] get-tuple-element(d), index=0
  one = f32[1] constant({{1}})
  marked = f32[4] dynamic-update-slice(got, one, i)
  k = s32[] constant(1)
  next = s32[] add(i, k)
  ROOT t = (s32[], f32[4]) tuple(next, marked)
}}

ENTRY main {{
  x = f32[4] parameter(0)
  zero = s32[] constant(0)
  init = (s32[], f32[4]) tuple(zero, x)
  loop = (s32[], f32[4]) while(init), condition=cond, body=body
  ROOT out = f32[4] get-tuple-element(loop), index=1
}}
"""
    out = run_threads(rp.parse_hlo(text), [[np.full(4, 5, np.float32)]] * 2, 2)
    assert out[0].tolist() == [0, 0, 1, 0]  # zeros, marked at the last iteration's index only
    assert out[1].tolist() == [0, 1, 1, 0]  # replica 0's second iteration's value, marked
