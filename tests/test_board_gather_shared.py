"""All-gather into one result the node shares (collectives/board_round.py `board_all_gather`): the
first process's leader writes its members' parts into a result leased from its arena and publishes
where it lies; every other leader writes its members' parts there and publishes that it did.
Operands large enough for leased results (256 KiB), under Ray with processes of unequal sizes
(5 replicas, 2 per actor: 2 + 2 + 1), the group in order and interleaved (a process's parts not
adjacent), both dimensions, variadic (f32 and s32): five results alive at once (none may be
overwritten while held), and a loop of 40 whose result buffers are reused once released; integers
equal numpy's, floats bitwise equal the threads backend's with the same placement, and every
leader's rounds went through the board."""

from __future__ import annotations

import numpy as np
import pytest
from collective_kit import bits
from test_collectives_hierarchy import run_placed
from test_shm import shm_sent

import replicas as rp

N, PER_ACTOR, ROWS, COLS, LOOPS = 5, 2, 64, 1024, 40


def program(dim: int, group: list[int]) -> rp.Module:
    """Five all-gathers of (x + j, y + j), j = 0..4, all returned; then a loop of `LOOPS` all-gathers
    of (x + i, y + i) whose last result is returned."""
    part = f"[{ROWS},{COLS}]"
    wide = f"[{ROWS * N},{COLS}]" if dim == 0 else f"[{ROWS},{COLS * N}]"
    kw = f"replica_groups={{{{{','.join(map(str, group))}}}}}, dimensions={{{dim}}}"
    gathered = f"(f32{wide}, s32{wide})"
    state = f"(s32[], f32{part}, s32{part}, {gathered})"
    lines = []
    for j in range(5):
        lines += [f"  cf{j} = f32[] constant({j})", f"  ci{j} = s32[] constant({j})",
                  f"  bf{j} = f32{part} broadcast(cf{j}), dimensions={{}}",
                  f"  bi{j} = s32{part} broadcast(ci{j}), dimensions={{}}",
                  f"  x{j} = f32{part} add(x, bf{j})", f"  y{j} = s32{part} add(y, bi{j})",
                  f"  g{j} = {gathered} all-gather(x{j}, y{j}), {kw}"]
    return rp.parse_hlo(f"""HloModule shared_gather, replica_count={N}

cond {{
  st = {state} parameter(0)
  i = s32[] get-tuple-element(st), index=0
  k = s32[] constant({LOOPS})
  ROOT more = pred[] compare(i, k), direction=LT
}}

body {{
  st = {state} parameter(0)
  i = s32[] get-tuple-element(st), index=0
  x = f32{part} get-tuple-element(st), index=1
  y = s32{part} get-tuple-element(st), index=2
  g = {gathered} all-gather(x, y), {kw}
  one = s32[] constant(1)
  fone = f32[] constant(1)
  i2 = s32[] add(i, one)
  bx = f32{part} broadcast(fone), dimensions={{}}
  by = s32{part} broadcast(one), dimensions={{}}
  x2 = f32{part} add(x, bx)
  y2 = s32{part} add(y, by)
  ROOT next = {state} tuple(i2, x2, y2, g)
}}

ENTRY main {{
  x = f32{part} parameter(0)
  y = s32{part} parameter(1)
{chr(10).join(lines)}
  zero = s32[] constant(0)
  init = {state} tuple(zero, x, y, g0)
  loop = {state} while(init), condition=cond, body=body
  last = {gathered} get-tuple-element(loop), index=3
  ROOT out = ({', '.join([gathered] * 6)}) tuple(g0, g1, g2, g3, g4, last)
}}
""")


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("group", [list(range(N)), [0, 2, 4, 1, 3]], ids=["in-order", "interleaved"])
def test_shared_all_gather_results_equal_numpy_and_threads_bitwise(dim, group):
    m = program(dim, group)
    rng = np.random.default_rng(3 + dim + len(set(group[:2])))
    args = [[(rng.standard_normal((ROWS, COLS)) * 10.0 ** rng.integers(-3, 4, (ROWS, COLS))).astype(np.float32),
             rng.integers(-1000, 1000, (ROWS, COLS), dtype=np.int32)] for _ in range(N)]
    job = rp.launch(m, args, num_replicas=N, replicas_per_actor=PER_ACTOR, timeout=120)
    out = job.result()
    sent = shm_sent(job)
    # Every process's leader published each of its 5 + LOOPS rounds on the board, for each peer.
    leaders = sorted({min(r for r in group if r // PER_ACTOR == a) for a in range(-(-N // PER_ACTOR))})
    for r in leaders:
        assert {q: sent[r].get(q, 0) for q in leaders if q != r} == {q: 5 + LOOPS for q in leaders if q != r}, sent
    want = run_placed(m, args, [r // PER_ACTOR for r in range(N)])
    for r in range(N):
        assert [bits(v) for g in out[r] for v in g] == [bits(v) for g in want[r] for v in g], f"replica {r}"
        for j, shift in enumerate([0, 1, 2, 3, 4, LOOPS - 1]):
            np.testing.assert_array_equal(out[r][j][1], np.concatenate([args[q][1] + shift for q in group], axis=dim))
