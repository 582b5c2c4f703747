"""Collective-permute's large values on the same-node board (Exchange.send_pairwise / recv_pairwise):
arrays from `shm.MIN_BYTES` up to a board slot are written raw into the sender's board buffer and
copied out by the receiver at once (no message, no arena); larger ones are announced there and
follow as messages. Under Ray, one and two replicas per actor, a ring and a partial permutation of
two dtypes and ranks, each permute used again on its result (a board buffer and a pool
buffer used twice): every result equals numpy's and the threads backend's bitwise, the values went
through the board, and a peer at another permute still raises `CollectiveMismatchError`."""

from __future__ import annotations

import numpy as np
import pytest
from collective_kit import Comp, bits, module
from test_collectives_hierarchy import run_placed
from test_shm import shm_sent

import replicas as rp
from replicas.errors import CollectiveMismatchError
from replicas.transport import board as shared_board
from replicas.transport import shm

N = 4
E = 3 * shm.MIN_BYTES // 4 + 5  # f32 elements: above the arena's threshold, far below a slot
RING = [(r, (r + 1) % N) for r in range(N)]
PARTIAL = [(0, 2), (2, 3), (3, 1)]  # replica 0 gets zeros


def program(elements: int) -> rp.Module:
    """Ring permutes of f32[elements], partial ones of s32[3, elements], each again on its result.
    Outputs: ring once, twice, partial once, twice."""
    c = Comp("main")
    x = c.param(f"f32[{elements}]")
    y = c.param(f"s32[3,{elements}]")
    once = c.op("collective-permute", f"f32[{elements}]", [x], source_target_pairs=RING)
    twice = c.op("collective-permute", f"f32[{elements}]", [once], source_target_pairs=RING)
    p1 = c.op("collective-permute", f"s32[3,{elements}]", [y], source_target_pairs=PARTIAL)
    p2 = c.op("collective-permute", f"s32[3,{elements}]", [p1], source_target_pairs=PARTIAL)
    shapes = [f"f32[{elements}]"] * 2 + [f"s32[3,{elements}]"] * 2
    return module(c.done(c.op("tuple", f"({', '.join(shapes)})", [once, twice, p1, p2])))


def inputs(elements: int) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(elements)
    return [[rng.standard_normal(elements).astype(np.float32),
             rng.integers(-(1 << 30), 1 << 30, (3, elements), dtype=np.int32)] for _ in range(N)]


def expected(args: list[list[np.ndarray]], r: int) -> list[np.ndarray]:
    ring = {t: s for s, t in RING}
    partial = {t: s for s, t in PARTIAL}
    x, y = [a[0] for a in args], [a[1] for a in args]
    out = [x[ring[r]], x[ring[ring[r]]]]
    once = partial.get(r)
    twice = partial.get(once) if once is not None else None
    for source in (once, twice):
        out.append(y[source] if source is not None else np.zeros_like(y[r]))
    return out


def run_on_ray(elements: int, per_actor: int) -> dict[int, dict[int, int]]:
    """Per replica, its sends through shared memory by destination (results checked here)."""
    m = program(elements)
    args = inputs(elements)
    job = rp.launch(m, args, num_replicas=N, replicas_per_actor=per_actor, timeout=120)
    out = job.result()
    sent = shm_sent(job)
    placement = [r // per_actor for r in range(N)]
    want = run_placed(m, args, placement)
    for r in range(N):
        assert [bits(v) for v in out[r]] == [bits(v) for v in want[r]], f"replica {r}"
        assert [bits(v) for v in out[r]] == [bits(v) for v in expected(args, r)], f"replica {r}"
        assert all(v.flags.writeable or not v.flags.owndata for v in out[r])
    return sent


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("per_actor", [1, 2])
def test_large_permutes_go_raw_through_the_board_and_equal_numpy_and_threads_bitwise(per_actor):
    sent = run_on_ray(E, per_actor)
    placement = [r // per_actor for r in range(N)]
    for s, t in RING + PARTIAL:
        if placement[s] != placement[t]:  # across actors: two permutes per list naming the pair, on the board
            assert sent[s].get(t, 0) == 2 * (RING + PARTIAL).count((s, t)), sent


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_a_permute_larger_than_a_slot_is_announced_on_the_board_and_sent_over_the_fabric():
    elements = shared_board.SLOT_BYTES // 4 + 1000
    sent = run_on_ray(elements, 1)
    for s, t in RING + PARTIAL:  # by the arena, a message each
        assert sent[s].get(t, 0) == 2 * (RING + PARTIAL).count((s, t)), sent


MISMATCHED = f"""HloModule mismatched_permutes, replica_count={N}

on_zero {{
  p = f32[{E}] parameter(0)
  ROOT cp_a = f32[{E}] collective-permute(p), source_target_pairs={{{{0,1}},{{1,2}},{{2,3}},{{3,0}}}}
}}

on_others {{
  p = f32[{E}] parameter(0)
  i = s32[{E}] convert(p)
  cp_b = s32[{E}] collective-permute(i), source_target_pairs={{{{0,1}},{{1,2}},{{2,3}},{{3,0}}}}
  ROOT c = f32[{E}] convert(cp_b)
}}

ENTRY main {{
  x = f32[{E}] parameter(0)
  id = u32[] replica-id()
  zero = u32[] constant(0)
  is_zero = pred[] compare(id, zero), direction=EQ
  ROOT r = f32[{E}] conditional(is_zero, x, x), true_computation=on_zero, false_computation=on_others
}}
"""


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("per_actor", [1, 2])
def test_a_large_permute_of_another_dtype_is_a_collective_mismatch_error(per_actor):
    m = rp.parse_hlo(MISMATCHED)
    with pytest.raises(CollectiveMismatchError) as info:
        rp.run(m, [[np.ones(E, np.float32)] for _ in range(N)], num_replicas=N, replicas_per_actor=per_actor,
               timeout=60)
    message = str(info.value)
    assert "%cp_a" in message and "%cp_b" in message
