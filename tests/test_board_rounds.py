"""The leaders' rounds of all-gather, all-to-all and reduce-scatter on the same-node board
(collectives/board_round.py): raw arrays written straight from the operands and read straight into
the results. Under Ray with processes of unequal sizes (5 replicas, 2 per actor: 2 + 2 + 1), variadic
operands, both dimensions, and each collective twice in a job (a board buffer and its kept layout
used again): every result equals numpy's and the threads backend's with the same placement bitwise,
and the rounds went through the board."""

from __future__ import annotations

import numpy as np
import pytest
from collective_kit import Comp, bits, module, reducer
from test_collectives_hierarchy import run_placed
from test_shm import shm_sent

import replicas as rp

N, PER_ACTOR = 5, 2


def program(dim: int) -> rp.Module:
    """A variadic all-gather of (f32[5,10], s32[5,10]), all-to-all and reduce-scatter of each, along
    `dim`; then each again, on the all-to-all's results. Outputs: all-gather f32, s32; all-to-all
    f32, s32; reduce-scatter f32, s32; the second all-gather (f32), all-to-all (s32) and
    reduce-scatter (f32)."""
    c = Comp("main")
    x = c.param("f32[5,10]")
    y = c.param("s32[5,10]")
    wide = "f32[25,10]" if dim == 0 else "f32[5,50]"
    narrow = "f32[1,10]" if dim == 0 else "f32[5,2]"
    kw = {"replica_groups": [], "dimensions": [dim]}
    ag = c.op("all-gather", f"({wide}, {wide.replace('f32', 's32')})", [x, y], **kw)
    outs = [c.op("get-tuple-element", wide, [ag], index=0),
            c.op("get-tuple-element", wide.replace("f32", "s32"), [ag], index=1),
            c.op("all-to-all", "f32[5,10]", [x], **kw),
            c.op("all-to-all", "s32[5,10]", [y], **kw),
            c.op("reduce-scatter", narrow, [x], to_apply="add_f32", **kw),
            c.op("reduce-scatter", narrow.replace("f32", "s32"), [y], to_apply="add_s32", **kw)]
    a2a_x, a2a_y = outs[2], outs[3]
    # Again, on the all-to-all's results: the same board buffers, in the same layouts.
    outs += [c.op("all-gather", wide, [a2a_x], **kw),
             c.op("all-to-all", "s32[5,10]", [a2a_y], **kw),
             c.op("reduce-scatter", narrow, [a2a_x], to_apply="add_f32", **kw)]
    shapes = [wide, wide.replace("f32", "s32"), "f32[5,10]", "s32[5,10]", narrow, narrow.replace("f32", "s32"),
              wide, "s32[5,10]", narrow]
    root = c.op("tuple", f"({', '.join(shapes)})", outs)
    return module(c.done(root), reducer("add", "f32"), reducer("add", "s32"))


def expected(args: list[list[np.ndarray]], dim: int) -> list[list[np.ndarray]]:
    """Integer results from numpy (the float ones are compared with threads)."""
    ys = [a[1] for a in args]
    out = []
    for i in range(N):
        ag = np.concatenate(ys, axis=dim)
        a2a = np.concatenate([np.split(y, N, axis=dim)[i] for y in ys], axis=dim)
        rs = np.split(np.sum(ys, axis=0, dtype=np.int32), N, axis=dim)[i]
        out.append([ag, a2a, rs])
    return out


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("dim", [0, 1])
def test_board_rounds_of_unequal_processes_equal_numpy_and_threads_bitwise(dim):
    m = program(dim)
    rng = np.random.default_rng(11 + dim)
    args = [[(rng.standard_normal((5, 10)) * 10.0 ** rng.integers(-3, 4, (5, 10))).astype(np.float32),
             rng.integers(-1000, 1000, (5, 10), dtype=np.int32)] for _ in range(N)]
    job = rp.launch(m, args, num_replicas=N, replicas_per_actor=PER_ACTOR, timeout=120)
    out = job.result()
    sent = shm_sent(job)
    # Every process's leader wrote its eight rounds on the board, as its first member, for each peer.
    leaders = [0, 2, 4]
    for r in leaders:
        assert {q: sent[r].get(q, 0) for q in leaders if q != r} == {q: 8 for q in leaders if q != r}, sent
    want = run_placed(m, args, [r // PER_ACTOR for r in range(N)])
    for r in range(N):
        assert [bits(v) for v in out[r]] == [bits(v) for v in want[r]], f"replica {r}"
    for r, (ag, a2a, rs) in enumerate(expected(args, dim)):
        np.testing.assert_array_equal(out[r][1], ag)
        np.testing.assert_array_equal(out[r][3], a2a)
        np.testing.assert_array_equal(out[r][5], rs)
        assert bits(out[r][0]) == bits(np.concatenate([a[0] for a in args], axis=dim))
    # The second all-to-all of the first's results gives the operands back.
    for r in range(N):
        np.testing.assert_array_equal(out[r][7], args[r][1])
