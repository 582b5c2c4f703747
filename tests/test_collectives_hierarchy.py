"""Hierarchical collectives: the same results whatever the placement of replicas in processes.

Placements are simulated on threads (ThreadBackend's `placement`: the collectives then take their
cross-process paths, leaders and all) and real under Ray (packed and unpacked actors). Integer
results equal numpy's exactly; float results are bitwise identical on every member, from run to
run, and between Ray and threads for the same placement (the reduction order depends on the
placement only)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from collective_kit import Comp, bits, module, rand, reducer

import replicas as rp
from replicas.collectives import selector
from replicas.runtime.compile import compile_module
from replicas.runtime.job import Job
from replicas.runtime.threads import ThreadBackend


def program(n: int, groups: list[list[int]]) -> rp.Module:
    """Every collective of one group shape on f32[4,6g] and s32[4,6g] (g = group size)."""
    g = len(groups[0]) if groups else n
    w = 6 * g
    c = Comp("main")
    x = c.param(f"f32[4,{w}]")
    y = c.param(f"s32[4,{w}]")
    kw = {"replica_groups": groups}
    ar_f = c.op("all-reduce", f"f32[4,{w}]", [x], to_apply="add_f32", **kw)
    ar_i = c.op("all-reduce", f"s32[4,{w}]", [y], to_apply="add_s32", **kw)
    ag = c.op("all-gather", f"s32[4,{w * g}]", [y], dimensions=[1], **kw)
    rs = c.op("reduce-scatter", "s32[4,6]", [y], dimensions=[1], to_apply="add_s32", **kw)
    rs_f = c.op("reduce-scatter", "f32[4,6]", [x], dimensions=[1], to_apply="add_f32", **kw)
    a2a = c.op("all-to-all", f"s32[4,{w}]", [y], dimensions=[1], **kw)
    bc = c.op("collective-broadcast", f"f32[4,{w}]", [x], **kw)
    root = c.op("tuple", f"(f32[4,{w}], s32[4,{w}], s32[4,{w * g}], s32[4,6], f32[4,6], s32[4,{w}], f32[4,{w}])",
                [ar_f, ar_i, ag, rs, rs_f, a2a, bc])
    return module(c.done(root), reducer("add", "f32"), reducer("add", "s32"))


def inputs(n: int, groups: list[list[int]], seed: int = 0) -> list[list[np.ndarray]]:
    g = len(groups[0]) if groups else n
    rng = np.random.default_rng(seed)
    return [[rand((4, 6 * g), np.float32, rng), rand((4, 6 * g), np.int32, rng)] for _ in range(n)]


def run_placed(m: rp.Module, args: list[list[np.ndarray]], placement: list[int],
               nodes: list[int] | None = None) -> list:
    backend = ThreadBackend(compile_module(m), args, placement=placement, nodes=nodes)
    return Job(backend, None, timeout=60, host_may_send=False).result()


def check_against_numpy(out: list, args: list[list[np.ndarray]], groups: list[list[int]]) -> None:
    n = len(args)
    for group in groups or [list(range(n))]:
        g = len(group)
        ys = [args[r][1] for r in group]
        total = np.sum(ys, axis=0, dtype=np.int32)
        for i, r in enumerate(group):
            ar_f, ar_i, ag, rs, rs_f, a2a, bc = out[r]
            np.testing.assert_array_equal(ar_i, total)
            np.testing.assert_array_equal(ag, np.concatenate(ys, axis=1))
            np.testing.assert_array_equal(rs, total[:, 6 * i:6 * i + 6])
            want_a2a = np.concatenate([np.split(ys[j], g, axis=1)[i] for j in range(g)], axis=1)
            np.testing.assert_array_equal(a2a, want_a2a)
            assert bits(bc) == bits(args[group[0]][0])
            np.testing.assert_allclose(ar_f, np.sum([args[q][0] for q in group], axis=0), rtol=1e-5, atol=1e-4)
            np.testing.assert_allclose(rs_f, ar_f[:, 6 * i:6 * i + 6], rtol=1e-5, atol=1e-4)
            assert bits(ar_f) == bits(out[group[0]][0]), f"replica {r} differs from its group's first member"


CASES = [  # (n, groups, placement)
    (6, [], [0] * 6),
    (6, [], list(range(6))),
    (6, [], [0, 0, 1, 1, 2, 2]),
    (6, [], [0, 1, 2, 0, 1, 2]),
    (6, [[4, 0, 2], [1, 5, 3]], [0, 0, 1, 1, 2, 2]),
    (12, [], list(range(12))),  # 12 processes: recursive doubling with 4 folded in
    (10, [list(range(10))[::-1]], [r % 5 for r in range(10)]),
    (9, [[8, 1, 2], [3, 4, 5], [6, 7, 0]], [r % 9 for r in range(9)]),
]


@pytest.mark.parametrize("n,groups,placement", CASES)
def test_every_collective_under_every_placement(n, groups, placement):
    m = program(n, groups)
    args = inputs(n, groups)
    out = run_placed(m, args, placement)
    check_against_numpy(out, args, groups)
    again = run_placed(m, args, placement)
    assert [bits(o[0]) for o in again] == [bits(o[0]) for o in out]  # the same bits from run to run


NODE_CASES = [  # (n, groups, placement, the node of each process): collectives/nodes.py, and beyond 8 nodes
    (6, [], list(range(6)), [0, 1, 0, 1, 0, 1]),
    (6, [], [0, 0, 1, 1, 2, 2], [0, 1, 0]),
    (8, [], [r // 2 for r in range(8)], [0, 1, 0, 1]),  # N=8 packed two per process over 2 nodes
    (8, [], [r // 2 for r in range(8)], [0, 0, 1, 1]),
    (6, [[4, 0, 2], [1, 5, 3]], [0, 0, 1, 1, 2, 2], [0, 1, 1]),
    (9, [], list(range(9)), [0, 1, 2] * 3),
    (12, [], list(range(12)), [k % 2 for k in range(12)]),  # 12 processes on 2 nodes
    (10, [], list(range(10)), list(range(10))),  # 10 nodes: recursive doubling
]


@pytest.mark.parametrize("local_direct", [False, True])
@pytest.mark.parametrize("n,groups,placement,process_nodes", NODE_CASES)
def test_every_collective_across_nodes(n, groups, placement, process_nodes, local_direct, monkeypatch):
    """`local_direct`: a node's processes other than its leader exchange their all-to-all chunks
    directly (large chunks), or through the leader (small ones)."""
    if local_direct:
        monkeypatch.setattr(selector, "THRESHOLDS", replace(selector.THRESHOLDS, local_direct_min_bytes=0))
    m = program(n, groups)
    args = inputs(n, groups, seed=3)
    nodes = [process_nodes[placement[r]] for r in range(n)]
    out = run_placed(m, args, placement, nodes)
    check_against_numpy(out, args, groups)
    again = run_placed(m, args, placement, nodes)
    assert [[bits(v) for v in o] for o in again] == [[bits(v) for v in o] for o in out]
    if len(set(process_nodes)) <= 8:  # the node leaders: a reduce-scatter sums as the all-reduce does
        for group in groups or [list(range(n))]:
            for i, r in enumerate(group):
                assert bits(out[r][4]) == bits(np.ascontiguousarray(out[r][0][:, 6 * i:6 * i + 6]))


@pytest.mark.parametrize("streamed", [False, True])
def test_large_all_reduce_across_nodes_is_reduced_in_node_order(streamed, monkeypatch):
    """Streamed in chunks or sent whole, the sum is ((x0 + x2) + (x1 + x3)) with replicas 0, 2 on
    node 0 and 1, 3 on node 1 (one process each): process order in a node, then node order."""
    n, size = 4, 150_001
    chunk = 64 << 10 if streamed else 64 << 20
    monkeypatch.setattr(selector, "THRESHOLDS", replace(selector.THRESHOLDS, stream_chunk_bytes=chunk))
    c = Comp("main")
    x = c.param(f"f32[{size}]")
    ar = c.op("all-reduce", f"f32[{size}]", [x], to_apply="add_f32", replica_groups=[])
    m = module(c.done(ar), reducer("add", "f32"))
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal(size).astype(np.float32) for _ in range(n)]
    out = run_placed(m, [[x] for x in xs], [0, 1, 2, 3], [0, 1, 0, 1])
    want = (xs[0] + xs[2]) + (xs[1] + xs[3])
    assert all(bits(o) == bits(want) for o in out)


@pytest.mark.parametrize("placement", [[0, 0, 0, 0], [0, 1, 2, 3], [0, 0, 1, 1], [0, 1, 0, 1]])
@pytest.mark.parametrize("sharded_from", [64 << 20, 256 * 1024])  # one round / reduce-scatter + all-gather
def test_large_all_reduce_leader_paths_agree_bitwise(placement, sharded_from, monkeypatch):
    n, size = 4, 150_001
    monkeypatch.setattr(selector, "THRESHOLDS", replace(selector.THRESHOLDS, small_bytes=sharded_from))
    assert (size * 4 >= selector.THRESHOLDS.small_bytes) == (sharded_from == 256 * 1024)
    c = Comp("main")
    x = c.param(f"f32[{size}]")
    ar = c.op("all-reduce", f"f32[{size}]", [x], to_apply="add_f32", replica_groups=[])
    m = module(c.done(ar), reducer("add", "f32"))
    rng = np.random.default_rng(1)
    args = [[rng.standard_normal(size).astype(np.float32)] for _ in range(n)]
    out = run_placed(m, args, placement)
    assert len({bits(o) for o in out}) == 1
    np.testing.assert_allclose(out[0], sum(a[0] for a in args), rtol=1e-5, atol=1e-5)
    ints = [[np.round(a[0] * 100)] for a in args]  # integer-valued floats: every order gives the same sum
    out = run_placed(m, ints, placement)
    np.testing.assert_array_equal(out[0], ints[0][0] + ints[1][0] + ints[2][0] + ints[3][0])


def test_a_shared_result_is_never_written_in_place():
    """Members of one process share the leader's result array: an element-wise chain after the
    collective (large enough for the interpreter to reuse dead buffers) must not change it."""
    size = 70_000
    c = Comp("main")
    x = c.param(f"f32[{size}]")
    ar = c.op("all-reduce", f"f32[{size}]", [x], to_apply="add_f32", replica_groups=[])
    one = c.op("constant", "f32[]", [], literal=np.asarray(1, np.float32))
    ones = c.op("broadcast", f"f32[{size}]", [one], dimensions=[])
    a = c.op("add", f"f32[{size}]", [ar, ones])
    b = c.op("multiply", f"f32[{size}]", [a, a])
    d = c.op("add", f"f32[{size}]", [b, ones])
    root = c.op("tuple", f"(f32[{size}], f32[{size}])", [ar, d])
    m = module(c.done(root), reducer("add", "f32"))
    args = [[np.full(size, r, np.float32)] for r in range(4)]
    out = run_placed(m, args, [0, 0, 0, 0])
    for total, chained in out:
        assert (total == 6).all() and (chained == 50).all()
    assert not out[0][0].flags.writeable  # the one array every member holds


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("per_actor", [1, 2, 3])
def test_ray_packed_and_unpacked_match_threads_with_the_same_placement(per_actor):
    n, groups = 6, [[4, 0, 2], [1, 5, 3]]
    m = program(n, groups)
    args = inputs(n, groups, seed=per_actor)
    out = rp.run(m, args, num_replicas=n, replicas_per_actor=per_actor)
    check_against_numpy(out, args, groups)
    reference = run_placed(m, args, [r // per_actor for r in range(n)])
    for got, want in zip(out, reference):
        assert [bits(v) for v in got] == [bits(v) for v in want]
