"""XlaBuilder collectives, channels and feeds: shapes, attributes (docs/ir.md), verification, and the
all-to-all reshuffle XLA's AllToAll performs when the concat dimension differs from the split one."""

from __future__ import annotations

import numpy as np
import pytest

from replicas.errors import ProgramError
from replicas.hlo.builder import XlaBuilder
from replicas.hlo.ir import Module
from replicas.hlo.verify import verify
from replicas.shapes import Shape


def S(text: str) -> Shape:
    return Shape.parse(text)


def binary(opname: str, t: str = "f32") -> Module:
    b = XlaBuilder(f"{opname}_{t}")
    return b.build(getattr(b, opname)(b.parameter(0, f"{t}[]"), b.parameter(1, f"{t}[]")))


def insts(m: Module, opcode: str | None = None) -> list:
    return [i for i in m.entry_computation.instructions if opcode is None or i.opcode == opcode]


def check(m: Module, num_replicas: int | None = None) -> Module:
    verify(m, num_replicas=num_replicas)
    names = [i.name for _, i in m.instructions()]
    assert len(names) == len(set(names))
    return m


# -- collectives and channels ----------------------------------------------------------------------------

def test_collectives_with_replica_count() -> None:
    add = binary("add")
    b = XlaBuilder("main", replica_count=4)
    x = b.parameter(0, "f32[8,6]")
    outs = [b.all_reduce(x, add), b.all_reduce(x, add, [[0, 1], [2, 3]], channel_id=3),
            b.cross_replica_sum(x), b.all_gather(x, 1), b.all_gather(x, 0, replica_groups=[[0, 2], [1, 3]]),
            b.reduce_scatter(x, add, 0), b.all_to_all(x, 0, 0, 4), b.all_to_all(x, 0, 1, 4),
            b.collective_permute(x, [(0, 1), (1, 2), (2, 3), (3, 0)]), b.replica_id(), b.partition_id(),
            b.collective_broadcast(x, [[0, 1, 2, 3]])]
    m = check(b.build(outs), num_replicas=4)
    want = ["f32[8,6]", "f32[8,6]", "f32[8,6]", "f32[8,24]", "f32[16,6]", "f32[2,6]", "f32[8,6]", "f32[2,24]",
            "f32[8,6]", "u32[]", "u32[]", "f32[8,6]"]
    assert [o.shape for o in outs] == [S(w) for w in want]
    ar = insts(m, "all-reduce")
    assert ar[0].attrs["replica_groups"] == [] and ar[1].attrs["channel_id"] == 3
    with pytest.raises(ProgramError, match="do not cover"):
        b.all_reduce(x, add, [[0, 1]])
    with pytest.raises(ProgramError, match="not divisible by the group size 4"):
        b.reduce_scatter(b.parameter(1, "f32[6]"), add, 0)
    with pytest.raises(ProgramError, match="duplicate target"):
        b.collective_permute(x, [(0, 1), (2, 1)])
    with pytest.raises(ProgramError, match="not divisible by split_count"):
        b.all_to_all(b.parameter(2, "f32[6]"), 0, 0, 4)


def test_collectives_without_replica_count() -> None:
    add = binary("add")
    b = XlaBuilder("main")
    x = b.parameter(0, "f32[8]")
    assert b.all_gather(x, 0, shard_count=2).shape == S("f32[16]")
    assert b.all_gather(x, 0, replica_groups=[[0, 1, 2]]).shape == S("f32[24]")
    assert b.reduce_scatter(x, add, 0, replica_groups=[[0, 1], [2, 3]]).shape == S("f32[4]")
    with pytest.raises(ProgramError, match="group size is unknown"):
        b.all_gather(x, 0)
    with pytest.raises(ProgramError, match="differs from the replica group size"):
        b.all_gather(x, 0, shard_count=3, replica_groups=[[0, 1]])


def _run_reshape_transpose_chain(m: Module, value: np.ndarray, after: str) -> np.ndarray:
    """Apply the reshape/transpose instructions after the all-to-all, with numpy."""
    started = False
    for inst in insts(m):
        if inst.name == after:
            started = True
            continue
        if not started:
            continue
        if inst.opcode == "reshape":
            value = value.reshape(inst.shape.dimensions)
        elif inst.opcode == "transpose":
            value = value.transpose(inst.attrs["dimensions"])
    return value


@pytest.mark.parametrize("split,concat", [(0, 1), (1, 0), (2, 0), (1, 2)])
def test_all_to_all_with_different_concat_dimension_is_xla_semantics(split: int, concat: int) -> None:
    n = 3
    shape = [6, 3, 9]
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(shape).astype(np.float32) for _ in range(n)]
    b = XlaBuilder("main", replica_count=n)
    out = b.all_to_all(b.parameter(0, Shape.array("f32", shape)), split, concat, n)
    m = check(b.build(out), num_replicas=n)
    a2a = insts(m, "all-to-all")[0]
    assert a2a.attrs["dimensions"] == [split]
    for r in range(n):
        # The all-to-all along `split`: chunk r of every replica, in replica order.
        exchanged = np.concatenate([np.split(x, n, axis=split)[r] for x in inputs], axis=split)
        got = _run_reshape_transpose_chain(m, exchanged, a2a.name)
        want = np.concatenate([np.split(x, n, axis=split)[r] for x in inputs], axis=concat)
        assert got.shape == tuple(out.shape.dimensions)
        np.testing.assert_array_equal(got, want)


def test_send_recv_combined_and_explicit() -> None:
    b = XlaBuilder("main")
    x = b.parameter(0, "f32[4]")
    done = b.send(x, channel_id=1, source_target_pairs=[(0, 1), (1, 2)])
    data = b.recv(S("f32[4]"), channel_id=2, source_target_pairs=[(1, 0)])
    token = b.create_token()
    s = b.send_start(x, token, 5, is_host_transfer=True)
    r = b.recv_start(token, "f32[4]", 6)
    rd = b.recv_done(r)
    sd = b.send_done(s)
    m = check(b.build([done, data, rd, sd]))
    assert done.shape == S("token[]") and data.shape == S("f32[4]")
    assert s.shape == S("(f32[4], u32[], token[])") and rd.shape == S("(f32[4], token[])")
    sends = insts(m, "send")
    assert sends[0].attrs["frontend_attributes"] == {"_xla_send_recv_source_target_pairs": "{{0,1},{1,2}}"}
    assert sends[1].attrs["is_host_transfer"] is True and sends[1].attrs["channel_id"] == 5
    recv_dones = insts(m, "recv-done")
    assert recv_dones[0].attrs["frontend_attributes"] == {"_xla_send_recv_source_target_pairs": "{{1,0}}"}
    assert [i.attrs["channel_id"] for i in insts(m, "send-done")] == [1, 5]
    # Automatic channel ids do not reuse explicit ones.
    assert b.send_start(x, token).name and insts(b.build(), "send")[-1].attrs["channel_id"] == 7


def test_document_orderings_build() -> None:
    # The document's Send/SendDone/Recv/RecvDone orderings are expressible (the verifier accepts them).
    b = XlaBuilder("main")
    x = b.parameter(0, "f32[2]")
    t = b.after_all([])
    r = b.recv_start(t, "f32[2]", 1)
    s = b.send_start(x, t, 2)
    rd = b.recv_done(r)
    sd = b.send_done(s)
    check(b.build([b.get_tuple_element(rd, 0), sd]))


def test_infeed_outfeed_custom_call_barrier() -> None:
    b = XlaBuilder("main")
    x = b.infeed(S("f32[3]"), config="cfg")
    t = b.create_token()
    pair = b.infeed_with_token(t, "(s32[], f32[2])")
    o = b.outfeed(x)
    o2 = b.outfeed_with_token(x, b.get_tuple_element(pair, 1), None, "oc")
    cc = b.custom_call("my_target", [x], S("f32[7]"), opaque="cfg", has_side_effect=True)
    ob = b.optimization_barrier(b.tuple([x, cc]))
    dep = b.add_dependency(x, o)
    m = check(b.build([x, o, o2, ob, dep]))
    assert x.shape == S("f32[3]") and o.shape == S("token[]") and ob.shape == S("(f32[3], f32[7])")
    assert insts(m, "infeed")[0].attrs["infeed_config"] == "cfg"
    assert insts(m, "outfeed")[0].attrs["outfeed_shape"] == S("f32[3]")
    assert insts(m, "custom-call")[0].attrs["custom_call_target"] == "my_target"
