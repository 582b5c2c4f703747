"""Collectives on replicas-as-threads: results against numpy references, bitwise agreement inside a
group, replica groups, the sharded path, custom reductions, loops, and mismatch reports."""

from __future__ import annotations

from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest
from collective_kit import Comp, bits, launch_threads, module, one_op, rand, reducer, run_threads
from hypothesis import given, settings
from hypothesis import strategies as st
from xla_oracle import lax_answer

from replicas.collectives import selector
from replicas.collectives.fingerprint import FIELDS, Fingerprint, diff, make_fingerprint
from replicas.collectives.topology import RESULT_LANES
from replicas.errors import CollectiveMismatchError, DeadlockError, ProgramError
from replicas.hlo.ir import Instruction, Module
from replicas.runtime.compile import compile_module
from replicas.runtime.job import Job
from replicas.runtime.threads import ThreadBackend
from replicas.shapes import Shape

BF16 = np.dtype(ml_dtypes.bfloat16)
NS = [1, 2, 3, 4, 8]
TYPES = {"f32": np.float32, "bf16": BF16, "s32": np.int32, "pred": np.bool_}


def seq_reduce(parts: list[np.ndarray], op) -> np.ndarray:
    acc = parts[0]
    for p in parts[1:]:
        acc = np.asarray(op(acc, p), dtype=parts[0].dtype)
    return acc


def assert_same_bits(results: list[np.ndarray], members: list[int]) -> None:
    first = bits(results[members[0]])
    for r in members[1:]:
        assert bits(results[r]) == first, f"replica {r} differs from replica {members[0]}"


# -- all-reduce ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("t", ["f32", "bf16", "s32"])
def test_all_reduce_add_matches_group_order_sum(n, t):
    rng = np.random.default_rng(n)
    xs = [rand((3, 5), TYPES[t], rng) for _ in range(n)]
    m = one_op("all-reduce", f"{t}[3,5]", [f"{t}[3,5]"], [reducer("add", t)], replica_groups=[], to_apply=f"add_{t}")
    out = run_threads(m, [[x] for x in xs], n)
    want = seq_reduce(xs, np.add)
    for r in range(n):
        assert out[r].dtype == TYPES[t] and out[r].shape == (3, 5)
        np.testing.assert_array_equal(out[r], want)
    assert_same_bits(out, list(range(n)))


@pytest.mark.parametrize("n", [2, 3])
def test_all_reduce_scalar_and_empty(n):
    m = one_op("all-reduce", "f32[]", ["f32[]"], [reducer("add", "f32")], to_apply="add_f32")
    out = run_threads(m, [[np.asarray(r + 0.5, np.float32)] for r in range(n)], n)
    assert all(o.shape == () and o == sum(r + 0.5 for r in range(n)) for o in out)
    m = one_op("all-reduce", "f32[0,3]", ["f32[0,3]"], [reducer("add", "f32")], to_apply="add_f32")
    out = run_threads(m, [[np.zeros((0, 3), np.float32)]] * n, n)
    assert all(o.shape == (0, 3) for o in out)


@pytest.mark.parametrize("op,t,ref", [("maximum", "f32", np.maximum), ("minimum", "s32", np.minimum),
                                      ("multiply", "s32", np.multiply), ("or", "pred", np.logical_or),
                                      ("and", "pred", np.logical_and), ("xor", "s32", np.bitwise_xor)])
def test_all_reduce_other_reductions(op, t, ref):
    n = 4
    rng = np.random.default_rng(7)
    xs = [rand((6,), TYPES[t], rng) for _ in range(n)]
    m = one_op("all-reduce", f"{t}[6]", [f"{t}[6]"], [reducer(op, t)], to_apply=f"{op}_{t}")
    out = run_threads(m, [[x] for x in xs], n)
    want = seq_reduce(xs, ref)
    for o in out:
        np.testing.assert_array_equal(o, want)


def custom_reducer() -> object:
    """(a, b) -> a * 0.5 + b: not associative, so the result shows the reduction order."""
    c = Comp("half_then_add")
    a = c.param("f32[]", "x")
    b = c.param("f32[]", "y")
    half = c.op("constant", "f32[]", [], literal=np.asarray(0.5, np.float32))
    scaled = c.op("multiply", "f32[]", [a, half])
    return c.done(c.op("add", "f32[]", [scaled, b]))


@pytest.mark.parametrize("n", [3, 4])
@pytest.mark.parametrize("size", [7, 70_000])  # one round, and the sharded path
def test_all_reduce_custom_computation_in_group_order(n, size):
    rng = np.random.default_rng(size)
    xs = [rand((size,), np.float32, rng) for _ in range(n)]
    groups = [[2, 0, 3, 1][:n]] if n == 4 else [[2, 0, 1]]
    m = one_op("all-reduce", f"f32[{size}]", [f"f32[{size}]"], [custom_reducer()], replica_groups=groups,
               to_apply="half_then_add")
    out = run_threads(m, [[x] for x in xs], n)
    order = groups[0]
    want = seq_reduce([xs[r] for r in order], lambda a, b: a * np.float32(0.5) + b)
    for o in out:
        np.testing.assert_array_equal(o, want)
    assert_same_bits(out, list(range(n)))


@pytest.mark.parametrize("n", [2, 3, 4, 8])
@pytest.mark.parametrize("t", ["f32", "bf16"])
def test_large_all_reduce_takes_sharded_path_and_agrees_bitwise(n, t, monkeypatch):
    size = 150_001
    monkeypatch.setattr(selector, "THRESHOLDS", replace(selector.THRESHOLDS, small_bytes=256 * 1024))
    assert size * np.dtype(TYPES[t]).itemsize >= selector.THRESHOLDS.small_bytes
    rng = np.random.default_rng(n)
    xs = [rand((size,), TYPES[t], rng) for _ in range(n)]
    m = one_op("all-reduce", f"{t}[{size}]", [f"{t}[{size}]"], [reducer("add", t)], to_apply=f"add_{t}")
    out = run_threads(m, [[x] for x in xs], n)
    np.testing.assert_array_equal(out[0], seq_reduce(xs, np.add))
    assert_same_bits(out, list(range(n)))


def test_variadic_all_reduce_tuple_result():
    n = 3
    rng = np.random.default_rng(3)
    fs = [rand((4,), np.float32, rng) for _ in range(n)]
    ss = [rand((2, 2), np.int32, rng) for _ in range(n)]
    m = one_op("all-reduce", "(f32[4], s32[2,2])", ["f32[4]", "s32[2,2]"], [reducer("add", "f32")],
               to_apply="add_f32")
    out = run_threads(m, [[f, s] for f, s in zip(fs, ss)], n)
    for o in out:
        assert isinstance(o, tuple) and len(o) == 2
        np.testing.assert_array_equal(o[0], seq_reduce(fs, np.add))
        np.testing.assert_array_equal(o[1], seq_reduce(ss, np.add))


def test_all_reduce_explicit_groups():
    n = 4
    groups = [[3, 1], [0, 2]]
    xs = [np.full((2,), 10.0 ** r, np.float32) for r in range(n)]
    m = one_op("all-reduce", "f32[2]", ["f32[2]"], [reducer("add", "f32")], replica_groups=groups, to_apply="add_f32")
    out = run_threads(m, [[x] for x in xs], n)
    assert out[1][0] == out[3][0] == 1010.0
    assert out[0][0] == out[2][0] == 101.0


@pytest.mark.parametrize("groups", [[[0, 1], [1, 2]], [[0, 1]], [[0, 1, 2, 5]]])
def test_bad_groups_are_program_errors(groups):
    m = one_op("all-reduce", "f32[2]", ["f32[2]"], [reducer("add", "f32")], replica_groups=groups, to_apply="add_f32")
    with pytest.raises(ProgramError, match="replica_groups"):
        run_threads(m, [np.zeros(2, np.float32)], 3)


def test_all_reduce_start_done():
    c = Comp("main")
    p = c.param("f32[3]")
    s = c.op("all-reduce-start", "f32[3]", [p], to_apply="add_f32", replica_groups=[])
    d = c.op("all-reduce-done", "f32[3]", [s])
    m = module(c.done(d), reducer("add", "f32"))
    out = run_threads(m, [[np.full(3, r, np.float32)] for r in range(3)], 3)
    assert all((o == 3).all() for o in out)


# -- all-gather, reduce-scatter, all-to-all, broadcast -------------------------------------------------

@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("t", ["f32", "bf16", "s32", "pred"])
def test_all_gather(n, t):
    rng = np.random.default_rng(n)
    xs = [rand((2, 3), TYPES[t], rng) for _ in range(n)]
    m = one_op("all-gather", f"{t}[2,{3 * n}]", [f"{t}[2,3]"], dimensions=[1], replica_groups=[])
    out = run_threads(m, [[x] for x in xs], n)
    want = np.concatenate(xs, axis=1)
    for o in out:
        assert o.dtype == TYPES[t]
        np.testing.assert_array_equal(o, want)


def test_all_gather_group_order_decides_concatenation():
    xs = [np.full((1,), r, np.int32) for r in range(4)]
    m = one_op("all-gather", "s32[2]", ["s32[1]"], dimensions=[0], replica_groups=[[3, 0], [2, 1]])
    out = run_threads(m, [[x] for x in xs], 4)
    assert [o.tolist() for o in out] == [[3, 0], [2, 1], [2, 1], [3, 0]]


def test_all_gather_variadic_and_start_done():
    c = Comp("main")
    a = c.param("f32[2]")
    b = c.param("s32[1]")
    s = c.op("all-gather-start", "((f32[2], s32[1]), (f32[4], s32[2]))", [a, b], dimensions=[0], replica_groups=[])
    d = c.op("all-gather-done", "(f32[4], s32[2])", [s])
    m = module(c.done(d))
    args = [[np.full(2, r, np.float32), np.full(1, 10 + r, np.int32)] for r in range(2)]
    out = run_threads(m, args, 2)
    for o in out:
        assert o[0].tolist() == [0, 0, 1, 1] and o[1].tolist() == [10, 11]


@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("t", ["f32", "s32", "bf16"])
def test_reduce_scatter(n, t):
    rng = np.random.default_rng(n)
    xs = [rand((2 * n, 3), TYPES[t], rng) for _ in range(n)]
    m = one_op("reduce-scatter", f"{t}[2,3]", [f"{t}[{2 * n},3]"], [reducer("add", t)], dimensions=[0],
               replica_groups=[], to_apply=f"add_{t}")
    out = run_threads(m, [[x] for x in xs], n)
    total = seq_reduce(xs, np.add)
    for r in range(n):
        np.testing.assert_array_equal(out[r], total[2 * r:2 * r + 2])


def test_reduce_scatter_group_order_and_divisibility():
    xs = [np.arange(4, dtype=np.int32) * (r + 1) for r in range(4)]
    m = one_op("reduce-scatter", "s32[2]", ["s32[4]"], [reducer("add", "s32")], dimensions=[0],
               replica_groups=[[2, 0], [1, 3]], to_apply="add_s32")
    out = run_threads(m, [[x] for x in xs], 4)
    assert out[2].tolist() == [0, 4] and out[0].tolist() == [8, 12]  # group {2,0}: sum = 4*[0,1,2,3]
    assert out[1].tolist() == [0, 6] and out[3].tolist() == [12, 18]  # group {1,3}: sum = 6*[0,1,2,3]
    bad = one_op("reduce-scatter", "s32[1]", ["s32[5]"], [reducer("add", "s32")], dimensions=[0],
                 replica_groups=[], to_apply="add_s32")
    with pytest.raises(ProgramError, match="divisible"):
        run_threads(bad, [np.zeros(5, np.int32)], 2)


@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("t", ["f32", "bf16", "s32", "pred"])
def test_all_to_all_array_form(n, t):
    rng = np.random.default_rng(n)
    xs = [rand((3, 2 * n), TYPES[t], rng) for _ in range(n)]
    m = one_op("all-to-all", f"{t}[3,{2 * n}]", [f"{t}[3,{2 * n}]"], dimensions=[1], replica_groups=[])
    out = run_threads(m, [[x] for x in xs], n)
    for i in range(n):
        want = np.concatenate([np.split(xs[j], n, axis=1)[i] for j in range(n)], axis=1)
        assert out[i].dtype == TYPES[t]
        np.testing.assert_array_equal(out[i], want)


def test_all_to_all_non_contiguous_group():
    groups = [[2, 0, 1]]
    xs = [np.arange(3, dtype=np.int32) + 10 * r for r in range(3)]
    m = one_op("all-to-all", "s32[3]", ["s32[3]"], dimensions=[0], replica_groups=groups)
    out = run_threads(m, [[x] for x in xs], 3)
    # replica 2 is member 0: it receives chunk 0 of members 2, 0, 1 in that order.
    assert out[2].tolist() == [20, 0, 10]
    assert out[0].tolist() == [21, 1, 11]
    assert out[1].tolist() == [22, 2, 12]


def test_all_to_all_tuple_form():
    n = 3
    m = one_op("all-to-all", "(s32[2], s32[2], s32[2])", ["s32[2]"] * n, replica_groups=[])
    args = [[np.full(2, 10 * r + j, np.int32) for j in range(n)] for r in range(n)]
    out = run_threads(m, args, n)
    for i in range(n):
        assert [o[0] for o in out[i]] == [10 * j + i for j in range(n)]


@pytest.mark.parametrize("n", [1, 3])
def test_collective_broadcast(n):
    xs = [np.full((2,), r + 1, np.float32) for r in range(n)]
    groups = [list(range(n))[::-1]]
    m = one_op("collective-broadcast", "f32[2]", ["f32[2]"], replica_groups=groups)
    out = run_threads(m, [[x] for x in xs], n)
    assert all(o.tolist() == [n, n] for o in out)


# -- collective-permute, ids ---------------------------------------------------------------------------

def test_collective_permute_partial_pairs_give_zeros():
    n = 4
    xs = [np.full((2,), r + 1, BF16) for r in range(n)]
    m = one_op("collective-permute", "bf16[2]", ["bf16[2]"], source_target_pairs=[(0, 2), (2, 3), (1, 1)])
    out = run_threads(m, [[x] for x in xs], n)
    assert [o.astype(np.float32).tolist() for o in out] == [[0, 0], [2, 2], [1, 1], [3, 3]]
    assert all(o.dtype == BF16 for o in out)


def test_collective_permute_cycle_and_start_done():
    n = 3
    c = Comp("main")
    p = c.param("s32[2]")
    s = c.op("collective-permute-start", "(s32[2], s32[2], u32[], u32[])", [p],
             source_target_pairs=[(r, (r + 1) % n) for r in range(n)], channel_id=1)
    d = c.op("collective-permute-done", "s32[2]", [s])
    out = run_threads(module(c.done(d)), [[np.full(2, r, np.int32)] for r in range(n)], n)
    assert [o[0] for o in out] == [2, 0, 1]


@pytest.mark.parametrize("pairs", [[(0, 1), (0, 2)], [(0, 1), (2, 1)], [(0, 5)]])
def test_collective_permute_bad_pairs(pairs):
    m = one_op("collective-permute", "f32[1]", ["f32[1]"], source_target_pairs=pairs)
    with pytest.raises(ProgramError, match="source_target_pairs"):
        run_threads(m, [np.zeros(1, np.float32)], 3)


def test_replica_and_partition_ids():
    c = Comp("main")
    r = c.op("replica-id", "u32[]")
    p = c.op("partition-id", "u32[]")
    root = c.op("tuple", "(u32[], u32[])", [r, p])
    out = run_threads(module(c.done(root)), [], 3)
    assert [(int(a), int(b)) for a, b in out] == [(0, 0), (1, 0), (2, 0)]
    assert out[1][0].dtype == np.uint32 and out[1][0].shape == ()
    spmd = module(c.comp, num_partitions=3, replica_count=1)
    out = run_threads(spmd, [], 3)
    assert [(int(a), int(b)) for a, b in out] == [(0, 0), (0, 1), (0, 2)]


def test_spmd_groups_name_partitions():
    xs = [np.full(1, r + 1, np.float32) for r in range(4)]
    m = one_op("all-reduce", "f32[1]", ["f32[1]"], [reducer("add", "f32")], to_apply="add_f32",
               replica_groups=[[0, 1], [2, 3]], channel_id=1, use_global_device_ids=True)
    m.attrs.update(num_partitions=4, replica_count=1)
    out = run_threads(m, [[x] for x in xs], 4)
    assert [o[0] for o in out] == [3, 3, 7, 7]
    # Without a channel id the collective is cross-replica: one replica, so each partition alone.
    m2 = one_op("all-reduce", "f32[1]", ["f32[1]"], [reducer("add", "f32")], to_apply="add_f32", replica_groups=[])
    m2.attrs.update(num_partitions=4, replica_count=1)
    out = run_threads(m2, [[x] for x in xs], 4)
    assert [o[0] for o in out] == [1, 2, 3, 4]


@pytest.mark.parametrize("n", [4, 3 + 2 * RESULT_LANES])
def test_all_reduce_in_one_process_moves_one_message_per_member(n):
    """The members meet in-process and the last to arrive leads (no message for an operand); the
    result goes down RESULT_LANES chains of the other members (the leader starts each, a member
    forwards to the next of its chain): n - 1 messages, not n (n - 1)."""
    size = 100_000
    m = one_op("all-reduce", f"f32[{size}]", [f"f32[{size}]"], [reducer("add", "f32")], to_apply="add_f32")
    with launch_threads(m, [[np.full(size, r, np.float32)] for r in range(n)], n) as job:
        out = job.result()
        states = job.states()
    assert all((o == n * (n - 1) // 2).all() for o in out)
    received = [s.received for s in states]
    assert sorted(received) == [0] + [1] * (n - 1)  # the one that led got nothing: it had it all
    acting = received.index(0)
    others = [r for r in range(n) if r != acting]  # the lanes, in rank order
    forwards = {r: 1 if k + RESULT_LANES < n - 1 else 0 for k, r in enumerate(others)}
    assert [s.sent for s in states] == [min(n - 1, RESULT_LANES) if r == acting else forwards[r] for r in range(n)]
    assert sum(s.sent for s in states) == n - 1


def test_flight_recorder_and_sequence_numbers():
    c = Comp("main")
    p = c.param("f32[2]")
    a = c.op("all-reduce", "f32[2]", [p], to_apply="add_f32", replica_groups=[])
    g = c.op("all-gather", "f32[4]", [a], dimensions=[0], replica_groups=[])
    m = module(c.done(g), reducer("add", "f32"))
    backend = ThreadBackend(compile_module(m), [[np.ones(2, np.float32)]] * 2)
    job = Job(backend, None, timeout=30, host_may_send=False)
    out = job.result()
    assert all(o.tolist() == [2, 2, 2, 2] for o in out)
    events = backend.events()
    for r in range(2):
        colls = [e for e in events[r] if e["kind"] == "collective"]
        assert [(e["opcode"], e["seq"], list(e["group"])) for e in colls] == [("all-reduce", 0, [0, 1]),
                                                                              ("all-gather", 1, [0, 1])]
        assert all(e["end_us"] is not None for e in colls)


# -- loops ---------------------------------------------------------------------------------------------

def counting_loop(body_ops, state_shape: str, trips: int, extra: list = ()) -> Module:
    """while (i < trips) { i += 1; x = body_ops(x) } over state (s32[] i, x)."""
    cond = Comp("cond")
    st = cond.param(f"(s32[], {state_shape})")
    i = cond.op("get-tuple-element", "s32[]", [st], index=0)
    lim = cond.op("constant", "s32[]", [], literal=np.asarray(trips, np.int32))
    cond_c = cond.done(cond.op("compare", "pred[]", [i, lim], comparison_direction="LT"))
    body = Comp("body")
    st = body.param(f"(s32[], {state_shape})")
    i = body.op("get-tuple-element", "s32[]", [st], index=0)
    x = body.op("get-tuple-element", state_shape, [st], index=1)
    one = body.op("constant", "s32[]", [], literal=np.asarray(1, np.int32))
    i2 = body.op("add", "s32[]", [i, one])
    x2 = body_ops(body, x)
    body_c = body.done(body.op("tuple", f"(s32[], {state_shape})", [i2, x2]))
    main = Comp("main")
    x0 = main.param(state_shape)
    zero = main.op("constant", "s32[]", [], literal=np.asarray(0, np.int32))
    init = main.op("tuple", f"(s32[], {state_shape})", [zero, x0])
    w = main.op("while", f"(s32[], {state_shape})", [init], condition="cond", body="body")
    root = main.op("get-tuple-element", state_shape, [w], index=1)
    return module(main.done(root), cond_c, body_c, *extra)


def test_collectives_inside_a_while_loop():
    n, trips = 3, 10

    def body(b, x):
        s = b.op("all-reduce", "f32[2]", [x], to_apply="add_f32", replica_groups=[])
        g = b.op("all-gather", "f32[6]", [s], dimensions=[0], replica_groups=[])
        return b.op("slice", "f32[2]", [g], slice=[(2, 4, 1)])

    m = counting_loop(body, "f32[2]", trips, [reducer("add", "f32")])
    xs = [np.full(2, r, np.float32) for r in range(n)]
    out = run_threads(m, [[x] for x in xs], n)
    want = 3.0 * 3.0 ** (trips - 1)  # first sum 0+1+2, then times n per trip
    assert all(o.tolist() == [want, want] for o in out)


# -- mismatches ----------------------------------------------------------------------------------------

def branch(name: str, opcode: str, operand: str, result: str, **attrs) -> object:
    c = Comp(name)
    p = c.param(operand)
    c.op(opcode, result, [p], name=f"{name}.coll", **attrs)
    return c.done(c.op("tuple", "()", []))


def branchy(branches: list, operands: list[str], *extra) -> Module:
    """Replica r runs branch index[r] (given as its first argument)."""
    c = Comp("main")
    idx = c.param("s32[]")
    ops = [c.param(s) for s in operands]
    root = c.op("conditional", "()", [idx, *ops], branch_computations=[b.name for b in branches])
    return module(c.done(root), *branches, *extra)


def branch_args(choice: list[int], operands: list[str]) -> list[list]:
    vals = [np.ones(Shape.parse(s).dimensions, Shape.parse(s).dtype) for s in operands]
    return [[np.asarray(b, np.int32), *vals] for b in choice]


def expect_mismatch(m, choice, operands, field, n=2, **kw) -> CollectiveMismatchError:
    with pytest.raises(CollectiveMismatchError) as info:
        run_threads(m, branch_args(choice, operands), n, **kw)
    e = info.value
    assert field in [f["field"] for f in e.report.fields], e.report
    assert e.report.collective == 0
    assert str(e).startswith("collective #0: replica ")
    assert f"{field}: " in str(e)
    return e


def test_mismatch_kind():
    ops = ["f32[4]", "f32[4]"]
    m = branchy([branch("b0", "all-reduce", "f32[4]", "f32[4]", to_apply="add_f32", replica_groups=[]),
                 branch("b1", "all-gather", "f32[4]", "f32[8]", dimensions=[0], replica_groups=[])],
                ops, reducer("add", "f32"))
    e = expect_mismatch(m, [0, 1], ops, "kind")
    msg = str(e)
    assert "%b0.coll (all-reduce f32[4])" in msg and "%b1.coll (all-gather f32[4])" in msg
    assert "kind: all-reduce != all-gather" in msg or "kind: all-gather != all-reduce" in msg
    names = {d["name"] for d in e.report.instructions.values()}
    assert names == {"b0.coll", "b1.coll"}
    assert sorted(e.report.replicas) == [0, 1]


def test_mismatch_shape_and_dtype():
    ops = ["f32[4]", "f32[8]"]
    m = branchy([branch("b0", "all-reduce", "f32[4]", "f32[4]", to_apply="add_f32", replica_groups=[]),
                 branch("b1", "all-reduce", "f32[8]", "f32[8]", to_apply="add_f32", replica_groups=[])],
                ops, reducer("add", "f32"))
    expect_mismatch(m, [0, 1], ops, "shapes", strict=False)
    ops = ["f32[4]", "s32[4]"]
    m = branchy([branch("b0", "all-gather", "f32[4]", "f32[8]", dimensions=[0], replica_groups=[]),
                 branch("b1", "all-gather", "s32[4]", "s32[8]", dimensions=[0], replica_groups=[])], ops)
    expect_mismatch(m, [0, 1], ops, "dtypes", strict=False)


def test_mismatch_groups_and_reduction():
    ops = ["f32[4]", "f32[4]"]
    m = branchy([branch("b0", "all-reduce", "f32[4]", "f32[4]", to_apply="add_f32", replica_groups=[]),
                 branch("b1", "all-reduce", "f32[4]", "f32[4]", to_apply="add_f32",
                        replica_groups=[[0, 1], [2, 3]])], ops, reducer("add", "f32"))
    expect_mismatch(m, [1, 0, 0, 0], ops, "replica_groups", n=4, strict=False)
    m = branchy([branch("b0", "all-reduce", "f32[4]", "f32[4]", to_apply="add_f32", replica_groups=[]),
                 branch("b1", "all-reduce", "f32[4]", "f32[4]", to_apply="maximum_f32", replica_groups=[])],
                ops, reducer("add", "f32"), reducer("maximum", "f32"))
    expect_mismatch(m, [0, 1], ops, "reduction", strict=False)


def test_identity_compared_only_when_strict():
    ops = ["f32[4]", "f32[4]"]
    # Two structurally equal reductions under different names are the same reduction.
    m = branchy([branch("b0", "all-reduce", "f32[4]", "f32[4]", to_apply="add_f32", replica_groups=[]),
                 branch("b1", "all-reduce", "f32[4]", "f32[4]", to_apply="plus", replica_groups=[])],
                ops, reducer("add", "f32"), reducer("add", "f32", name="plus"))
    e = expect_mismatch(m, [0, 1], ops, "instruction")
    assert [f["field"] for f in e.report.fields] == ["instruction"]
    out = run_threads(m, branch_args([0, 1], ops), 2, strict=False)
    assert out == [(), ()]


def test_fingerprint_diff_and_dict():
    i1 = Instruction("ar", "all-reduce", Shape.parse("f32[4]"), ["p"], {"replica_groups": [], "channel_id": 3})
    i2 = Instruction("ag", "all-gather", Shape.parse("f32[8]"), ["p"], {"dimensions": [0], "channel_id": 3})
    f1 = make_fingerprint(i1, "main", [Shape.parse("f32[4]")], None, groups=((0, 1),))
    f2 = make_fingerprint(i2, "main", [Shape.parse("f32[4]")], None, groups=((0, 1),))
    assert isinstance(f1, Fingerprint) and diff(f1, f1) == []
    fields = [d[0] for d in diff(f1, f2)]
    assert fields == ["kind", "dimensions", "instruction"]
    assert [d[0] for d in diff(f1, f2, strict=False)] == ["kind", "dimensions"]
    as_dict = f1.as_dict()
    assert list(as_dict) == list(FIELDS) and as_dict["replica_groups"] == [[0, 1]]
    assert f1.describe() == "%ar (all-reduce f32[4])"


def test_a_collective_one_replica_never_reaches_is_a_deadlock():
    ops = ["f32[4]"]
    empty = Comp("b1")
    empty.param("f32[4]")
    b1 = empty.done(empty.op("tuple", "()", []))
    m = branchy([branch("b0", "all-reduce", "f32[4]", "f32[4]", to_apply="add_f32", replica_groups=[]), b1],
                ["f32[4]", "f32[4]"], reducer("add", "f32"))
    with pytest.raises(DeadlockError, match="all-reduce"):
        run_threads(m, branch_args([0, 1], ops * 2), 2, timeout=30)


# -- JAX on CPU as the oracle of the semantics ----------------------------------------------------------

def test_semantics_agree_with_jax_pmap():
    jax = pytest.importorskip("jax")
    if jax.local_device_count() < 4:
        pytest.skip("needs 4 CPU devices")
    from jax import lax

    n = 4
    rng = np.random.default_rng(0)
    xs = np.stack([rand((8, 8), np.int32, rng) for _ in range(n)])

    def f(x):
        return (lax.all_to_all(x, "i", 1, 1, tiled=True), lax.psum_scatter(x, "i", scatter_dimension=0, tiled=True),
                lax.all_gather(x, "i", axis=1, tiled=True), lax.ppermute(x, "i", [(0, 2), (2, 3), (3, 1)]),
                lax.psum(x, "i", axis_index_groups=[[0, 2], [1, 3]]))

    def on_devices(x):
        import jax

        return jax.pmap(f, axis_name="i", devices=jax.devices()[:n])(x)

    want = lax_answer(on_devices, xs)
    c = Comp("main")
    p = c.param("s32[8,8]")
    outs = [c.op("all-to-all", "s32[8,8]", [p], dimensions=[1], replica_groups=[]),
            c.op("reduce-scatter", "s32[2,8]", [p], dimensions=[0], replica_groups=[], to_apply="add_s32"),
            c.op("all-gather", "s32[8,32]", [p], dimensions=[1], replica_groups=[]),
            c.op("collective-permute", "s32[8,8]", [p], source_target_pairs=[(0, 2), (2, 3), (3, 1)]),
            c.op("all-reduce", "s32[8,8]", [p], replica_groups=[[0, 2], [1, 3]], to_apply="add_s32")]
    root = c.op("tuple", "(s32[8,8], s32[2,8], s32[8,32], s32[8,8], s32[8,8])", outs)
    got = run_threads(module(c.done(root), reducer("add", "s32")), [[x] for x in xs], n)
    for k in range(len(outs)):
        for r in range(n):
            np.testing.assert_array_equal(got[r][k], np.asarray(want[k][r]), err_msg=f"output {k}, replica {r}")


@settings(max_examples=15, deadline=None)
@given(st.data())
def test_random_groups_all_gather_and_reduce_scatter(data):
    n_groups = data.draw(st.integers(1, 3))
    size = data.draw(st.integers(1, 3))
    n = n_groups * size
    order = data.draw(st.permutations(range(n)))
    groups = [list(order[g * size:(g + 1) * size]) for g in range(n_groups)]
    rank = data.draw(st.integers(1, 3))
    dims = [data.draw(st.integers(1, 3)) for _ in range(rank)]
    d = data.draw(st.integers(0, rank - 1))
    dims[d] *= size
    rng = np.random.default_rng(data.draw(st.integers(0, 1000)))
    xs = [rand(tuple(dims), np.int32, rng) for _ in range(n)]
    gathered = list(dims)
    gathered[d] *= size
    scattered = list(dims)
    scattered[d] //= size
    text = ",".join(map(str, dims))
    c = Comp("main")
    p = c.param(f"s32[{text}]")
    ag = c.op("all-gather", Shape.array("s32", gathered), [p], dimensions=[d], replica_groups=groups)
    rs = c.op("reduce-scatter", Shape.array("s32", scattered), [p], dimensions=[d], replica_groups=groups,
              to_apply="add_s32")
    root = c.op("tuple", Shape.tuple([Shape.array("s32", gathered), Shape.array("s32", scattered)]), [ag, rs])
    out = run_threads(module(c.done(root), reducer("add", "s32")), [[x] for x in xs], n)
    for g in groups:
        total = seq_reduce([xs[r] for r in g], np.add)
        for i, r in enumerate(g):
            np.testing.assert_array_equal(out[r][0], np.concatenate([xs[q] for q in g], axis=d))
            np.testing.assert_array_equal(out[r][1], np.split(total, size, axis=d)[i])
