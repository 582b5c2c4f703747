"""The documented reduction order, bit for bit: in a process, its members' operands in group order;
across processes, those partial sums in process order (the order of each process's first member
in the group). Reductions accumulate in place into reused buffers, so this checks that no path
(a process's own chunk summed straight into its result, the sharded all-reduce, one round)
changes the order of a single addition."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from collective_kit import Comp, bits, module, reducer

from replicas.collectives import selector
from replicas.runtime.compile import compile_module
from replicas.runtime.job import Job
from replicas.runtime.threads import ThreadBackend


def documented_sum(operands: list[np.ndarray], placement: list[int]) -> np.ndarray:
    processes: dict[int, list[int]] = {}
    for r, p in enumerate(placement):
        processes.setdefault(p, []).append(r)  # dicts keep insertion order: process order
    partials = []
    for members in processes.values():
        acc = operands[members[0]]
        for r in members[1:]:
            acc = acc + operands[r]
        partials.append(acc)
    total = partials[0]
    for part in partials[1:]:
        total = total + part
    return total


@pytest.mark.parametrize("placement", [[0, 0, 1, 1], [0, 1, 0, 1], [1, 1, 0, 0], [0, 0, 1, 1, 2, 2],
                                       [0, 1, 1, 2, 2, 0], [0, 0, 0, 0], [0, 1, 2, 3]])
# One round of small and of pooled partials, and reduce-scatter + all-gather among leaders (the
# threshold set either way: the same size takes either algorithm, and both give the documented bits).
@pytest.mark.parametrize(("size", "sharded_from"), [(96, None), (96_000, 64 << 20), (96_000, 256 * 1024)])
@pytest.mark.parametrize("block_bytes", [None, 4096])  # whole arrays / many blocks summed in cache
def test_reductions_follow_the_documented_order_bitwise(placement, size, sharded_from, block_bytes, monkeypatch):
    if block_bytes is not None:
        monkeypatch.setattr(selector, "THRESHOLDS", replace(selector.THRESHOLDS, block_bytes=block_bytes))
    if sharded_from is not None:
        monkeypatch.setattr(selector, "THRESHOLDS", replace(selector.THRESHOLDS, small_bytes=sharded_from))
    n = len(placement)
    width = size * n
    assert (width * 4 >= selector.THRESHOLDS.small_bytes) == (sharded_from == 256 * 1024)
    c = Comp("main")
    x = c.param(f"f32[{width}]")
    ar = c.op("all-reduce", f"f32[{width}]", [x], to_apply="add_f32", replica_groups=[])
    rs = c.op("reduce-scatter", f"f32[{size}]", [x], to_apply="add_f32", replica_groups=[], dimensions=[0])
    root = c.op("tuple", f"(f32[{width}], f32[{size}])", [ar, rs])
    m = module(c.done(root), reducer("add", "f32"))
    rng = np.random.default_rng(7)
    # Values of very different magnitudes: another order of additions gives other bits.
    args = [[(rng.standard_normal(width) * 10.0 ** rng.integers(-4, 5, width)).astype(np.float32)]
            for _ in range(n)]
    backend = ThreadBackend(compile_module(m), args, placement=placement)
    out = Job(backend, None, timeout=60, host_may_send=False).result()
    want = documented_sum([a[0] for a in args], placement)
    for r, (ar_r, rs_r) in enumerate(out):
        assert bits(ar_r) == bits(want), f"all-reduce on replica {r}"
        assert bits(rs_r) == bits(want[r * size:(r + 1) * size]), f"reduce-scatter on replica {r}"


@pytest.mark.parametrize("placement", [[0, 0, 1, 1], [0, 1, 0, 1], [0, 0, 0, 0], [0, 1, 1, 2, 2, 0]])
@pytest.mark.parametrize("assembly_bytes", [None, 0])  # the leader / each member copies the results
def test_all_to_all_results_whoever_assembles_them(placement, assembly_bytes, monkeypatch):
    if assembly_bytes is not None:
        monkeypatch.setattr(selector, "THRESHOLDS",
                            replace(selector.THRESHOLDS, member_assembly_min_bytes=assembly_bytes))
    n = len(placement)
    c = Comp("main")
    x = c.param(f"s32[{n},{6 * n}]")
    a2a = c.op("all-to-all", f"s32[{n},{6 * n}]", [x], replica_groups=[], dimensions=[1])
    m = module(c.done(a2a))
    rng = np.random.default_rng(3)
    args = [[rng.integers(-1000, 1000, (n, 6 * n), dtype=np.int32)] for _ in range(n)]
    for a in args:
        a[0].flags.writeable = False  # operands nobody can change: members may read them late
    backend = ThreadBackend(compile_module(m), args, placement=placement)
    out = Job(backend, None, timeout=60, host_may_send=False).result()
    for r in range(n):
        want = np.concatenate([np.split(args[j][0], n, axis=1)[r] for j in range(n)], axis=1)
        np.testing.assert_array_equal(out[r], want)
