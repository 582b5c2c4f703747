"""Reduce-scatter's round on the same-node board (collectives/board_round.py: each leader publishes
only the partials of the other processes' members' chunks, sums its own members' chunks into their
results, hands the other local members theirs first). Three processes of two members (the third
process's leader sums its own partial into a scratch buffer before adding the others in process
order), with the group in order and interleaved across the processes (each process's members'
chunks not adjacent), along both dimensions, each reduce-scatter twice in the job (a board buffer
reused with its kept layout): integers equal numpy's, floats bitwise equal the threads backend's
with the same placement, and every leader's rounds went through the board."""

from __future__ import annotations

import numpy as np
import pytest
from collective_kit import Comp, bits, module, reducer
from test_collectives_hierarchy import run_placed
from test_shm import shm_sent

import replicas as rp

N, PER_ACTOR = 6, 2


def program(dim: int, group: list[int]) -> rp.Module:
    """Reduce-scatter of f32[6,12] and of s32[6,12] along `dim`, then of the f32 result's sum with
    the operand again (a second round in the same board buffers)."""
    c = Comp("main")
    x = c.param("f32[6,12]")
    y = c.param("s32[6,12]")
    kw = {"replica_groups": [group], "dimensions": [dim]}
    narrow = "f32[1,12]" if dim == 0 else "f32[6,2]"
    rs_x = c.op("reduce-scatter", narrow, [x], to_apply="add_f32", **kw)
    rs_y = c.op("reduce-scatter", narrow.replace("f32", "s32"), [y], to_apply="add_s32", **kw)
    twice = c.op("add", "f32[6,12]", [x, x])
    rs_again = c.op("reduce-scatter", narrow, [twice], to_apply="add_f32", **kw)
    root = c.op("tuple", f"({narrow}, {narrow.replace('f32', 's32')}, {narrow})", [rs_x, rs_y, rs_again])
    return module(c.done(root), reducer("add", "f32"), reducer("add", "s32"))


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("group", [list(range(N)), [0, 2, 4, 1, 3, 5]], ids=["in-order", "interleaved"])
def test_board_reduce_scatter_of_three_processes_equals_numpy_and_threads_bitwise(dim, group):
    m = program(dim, group)
    rng = np.random.default_rng(7 + dim + len(set(group[:2])))
    args = [[(rng.standard_normal((6, 12)) * 10.0 ** rng.integers(-3, 4, (6, 12))).astype(np.float32),
             rng.integers(-1000, 1000, (6, 12), dtype=np.int32)] for _ in range(N)]
    job = rp.launch(m, args, num_replicas=N, replicas_per_actor=PER_ACTOR, timeout=120)
    out = job.result()
    sent = shm_sent(job)
    # Every process's leader wrote its three rounds on the board, as its first member, for each peer.
    leaders = sorted({min(r for r in group if r // PER_ACTOR == a) for a in range(N // PER_ACTOR)})
    for r in leaders:
        assert {q: sent[r].get(q, 0) for q in leaders if q != r} == {q: 3 for q in leaders if q != r}, sent
    want = run_placed(m, args, [r // PER_ACTOR for r in range(N)])
    total = np.sum([a[1] for a in args], axis=0, dtype=np.int32)
    for i, r in enumerate(group):
        assert [bits(v) for v in out[r]] == [bits(v) for v in want[r]], f"replica {r}"
        np.testing.assert_array_equal(out[r][1], np.split(total, N, axis=dim)[i])
