"""The same-node board (transport/board.py): leaders of actors on one node exchange collective
operands through shared memory. Results equal numpy and the threads backend bitwise, mismatches
and deadlocks are still reported as such, and the publish/release protocol never lets a writer
reuse a buffer a reader still holds."""

from __future__ import annotations

import gc
import os
import secrets
from types import SimpleNamespace

import numpy as np
import pytest
from buggy_programs import BY_NAME, branches
from collective_kit import Comp, bits, module, rand, reducer
from test_collectives_hierarchy import run_placed
from test_diagnostics import check_error, run_case
from test_shm import shm_sent

import replicas as rp
from replicas.collectives.exchange import Exchange
from replicas.errors import CollectiveMismatchError, DeadlockError
from replicas.transport import board as shared_board

PERMUTES = [[(0, 1), (1, 2), (2, 3), (3, 0)], [(0, 2), (2, 3), (3, 1)]]
DTYPES = [("f32", np.float32), ("f64", np.float64), ("s32", np.int32), ("u8", np.uint8), ("s64", np.int64)]


def program(groups: list[list[int]], g: int) -> rp.Module:
    """All-reduce per dtype, and every other collective, on [3, 4g] operands."""
    w = 4 * g
    c = Comp("main")
    outs, shapes = [], []
    for name, _ in DTYPES:
        x = c.param(f"{name}[3,{w}]")
        outs.append(c.op("all-reduce", f"{name}[3,{w}]", [x], to_apply=f"add_{name}", replica_groups=groups))
        shapes.append(f"{name}[3,{w}]")
        if name == "s32":
            y = x
    kw = {"replica_groups": groups}
    for opcode, shape, extra in [("all-gather", f"s32[3,{w * g}]", {"dimensions": [1]}),
                                 ("reduce-scatter", "s32[3,4]", {"dimensions": [1], "to_apply": "add_s32"}),
                                 ("all-to-all", f"s32[3,{w}]", {"dimensions": [1]}),
                                 ("collective-broadcast", f"s32[3,{w}]", {})]:
        outs.append(c.op(opcode, shape, [y], **kw, **extra))
        shapes.append(shape)
    for pairs in PERMUTES:  # a ring, and a partial one (replica 0 gets zeros)
        outs.append(c.op("collective-permute", f"s32[3,{w}]", [y], source_target_pairs=pairs))
        shapes.append(f"s32[3,{w}]")
    root = c.op("tuple", f"({', '.join(shapes)})", outs)
    return module(c.done(root), *[reducer("add", name) for name, _ in DTYPES])


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("groups", [[], [[0, 2], [3, 1]]], ids=["all", "pairs"])
def test_every_collective_and_dtype_on_the_board_equals_numpy_and_threads_bitwise(groups):
    n = 4
    g = len(groups[0]) if groups else n
    m = program(groups, g)
    rng = np.random.default_rng(3)
    args = [[rand((3, 4 * g), dt, rng) for _, dt in DTYPES] for _ in range(n)]
    job = rp.launch(m, args, num_replicas=n, replicas_per_actor=1, timeout=120)
    out = job.result()
    sent = shm_sent(job)
    assert all(sum(sent[r].values()) > 0 for r in range(n)), sent  # small payloads went through the board
    reference = run_placed(m, args, list(range(n)))
    for got, want in zip(out, reference):
        assert [bits(v) for v in got] == [bits(v) for v in want]
    for group in groups or [list(range(n))]:
        for i, r in enumerate(group):
            got = out[r]
            for k, (_, dt) in enumerate(DTYPES):
                want = np.sum([args[q][k] for q in group], axis=0, dtype=dt)
                if dt in (np.float32, np.float64):
                    np.testing.assert_allclose(got[k], want, rtol=1e-6)
                    assert bits(got[k]) == bits(out[group[0]][k])
                else:
                    np.testing.assert_array_equal(got[k], want)
            ys = [args[q][2] for q in group]
            ag, rs, a2a, bc = got[len(DTYPES):len(DTYPES) + 4]
            np.testing.assert_array_equal(ag, np.concatenate(ys, axis=1))
            np.testing.assert_array_equal(rs, np.sum(ys, axis=0, dtype=np.int32)[:, 4 * i:4 * i + 4])
            np.testing.assert_array_equal(a2a, np.concatenate([np.split(y, g, axis=1)[i] for y in ys], axis=1))
            np.testing.assert_array_equal(bc, ys[0])
    for k, pairs in enumerate(PERMUTES):
        source_of = {t: s for s, t in pairs}
        for r in range(n):
            want = args[source_of[r]][2] if r in source_of else np.zeros_like(args[r][2])
            np.testing.assert_array_equal(out[r][len(DTYPES) + 4 + k], want)


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_a_payload_larger_than_a_slot_is_announced_on_the_board_and_sent_over_the_fabric():
    size = shared_board.SLOT_BYTES // 4 + 1000  # f32 elements: just over one buffer of a slot
    c = Comp("main")
    x = c.param(f"f32[{size}]")
    ar = c.op("all-reduce", f"f32[{size}]", [x], to_apply="add_f32", replica_groups=[])
    m = module(c.done(ar), reducer("add", "f32"))
    rng = np.random.default_rng(5)
    args = [[np.round(rng.standard_normal(size).astype(np.float32) * 100)] for _ in range(3)]
    out = rp.run(m, args, num_replicas=3, replicas_per_actor=1, timeout=120)
    want = args[0][0] + args[1][0] + args[2][0]  # integer-valued floats: exact in any order
    assert all(bits(o) == bits(want) for o in out)


MISMATCHES = ["mismatched_shapes", "mismatched_dtypes", "mismatched_kinds", "branches_into_different_all_reduces"]


@pytest.mark.ray
@pytest.mark.parametrize("name", MISMATCHES)
def test_a_mismatch_found_on_the_board_is_a_collective_mismatch_error(name, ray_session):
    case = BY_NAME[name]
    with pytest.raises(CollectiveMismatchError) as info:
        run_case(case, backend="ray", replicas_per_actor=1)
    check_error(case, info.value)


SKIPS_THE_ALL_REDUCE = branches(4, "  ROOT c = f32[4] copy(p)",
                                "  ROOT ar_b = f32[4] all-reduce(p), replica_groups={}, to_apply=add")


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_leaders_waiting_on_the_board_for_a_replica_that_never_comes_are_a_deadlock():
    m = rp.parse_hlo(SKIPS_THE_ALL_REDUCE)
    with pytest.raises(DeadlockError) as info:
        rp.run(m, [[np.ones(4, np.float32)] for _ in range(4)], num_replicas=4, replicas_per_actor=1, timeout=60)
    message = str(info.value)
    assert "%ar_b" in message and "replica 0" in message


# -- the protocol, in one process --------------------------------------------------------------------

def test_publish_open_release_and_a_writer_waits_for_its_readers():
    board = shared_board.Board(f"t{secrets.token_hex(6)}", [0, 1, 2])
    try:
        fingerprint = board.fingerprint_bytes(("all-reduce", ("f32",)))
        asked: list[bool] = []

        def no_wait(done, address):  # the first two publications reuse nothing
            raise AssertionError("waited for a buffer that was never read")

        payloads = [(np.arange(6, dtype=np.float32).reshape(2, 3), [np.int64(7)]), (np.ones(5, np.uint8),)]
        for k, payload in enumerate(payloads):
            assert board.publish(0, shared_board.tag_of(k, 1), fingerprint, payload, (1, 2), no_wait)
        reads = []
        for k, payload in enumerate(payloads):
            tag = shared_board.tag_of(k, 1)
            found = board.find(0, tag)
            assert found is not None and board.find(0, shared_board.tag_of(k + 5, 1)) is None
            theirs, value, via_fabric, read = board.open(found, tag, 1)
            assert theirs == fingerprint and not via_fabric
            assert bits(value[0]) == bits(payload[0]) and not value[0].flags.writeable
            reads.append(read)

        releases = [reads[0].release,  # reader 1 done with the first buffer; then reader 2
                    lambda: board.open(board.find(0, shared_board.tag_of(0, 1)), shared_board.tag_of(0, 1), 2)[3]
                    .release()]

        def wait(done, address):
            asked.append(done())
            releases[len(asked) // 2]()
            asked.append(done())

        assert board.publish(0, shared_board.tag_of(2, 1), fingerprint, (np.zeros(3),), (1,), wait)
        assert asked == [False, True, False, True]  # it wrote only once each reader had released
        assert bits(board.open(board.find(0, shared_board.tag_of(2, 1)), shared_board.tag_of(2, 1), 1)[1][0]) \
            == bits(np.zeros(3))
        big = np.zeros(board.capacity, np.uint8)
        assert not board.publish(1, shared_board.tag_of(0, 1), fingerprint, (big,), (0,), no_wait)
        tag = shared_board.tag_of(0, 1)
        theirs, value, via_fabric, _ = board.open(board.find(1, tag), tag, 0)
        assert via_fabric and value is None and theirs == fingerprint
    finally:
        board.close()
    assert not os.path.exists(board.path)


def test_a_settled_collective_leaves_the_board_closable_without_a_collection():
    """What a collective read from a peer's slot is copied out and released when it settles, and
    nothing it made keeps a view in a reference cycle: the board unmaps at the job's end without
    the cycle collector (a collection per job cost a 2-actor job ~100 ms)."""
    board = shared_board.Board(f"t{secrets.token_hex(6)}", [0, 1])
    gc.collect()
    gc.disable()
    try:
        tag = shared_board.tag_of(0, 1)
        payload = (np.arange(6, dtype=np.float32), [np.ones(3, np.int32)])
        fingerprint = board.fingerprint_bytes(("all-gather", ("f32",)))
        assert board.publish(0, tag, fingerprint, payload, (1,), None)
        _, value, _, read = board.open(board.find(0, tag), tag, 1)
        exchange = Exchange(SimpleNamespace(replica_id=1), 0, None, None, None)
        exchange._reads.append(read)  # noqa: SLF001 - as Exchange._read does
        kept = exchange.settle(value)
        del value, read
        assert bits(kept[0]) == bits(payload[0]) and bits(kept[1][0]) == bits(payload[1][0])
        assert board.close()
    finally:
        gc.enable()
        board.close()
