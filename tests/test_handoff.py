"""The last local member to arrive leads a collective's in-process level, and the board's reused layouts.

`Mailbox.meet` is where a process's members of a group meet (collectives/topology.py): the last to
arrive gets every member's value and mailbox by rank and leads; the first ones wait for their
results. On the same-node board, a buffer keeps its layout, fingerprint and views from its last use
(`Board.publish_into`), and a reader its views (`Board.open`), as long as what is written there stays
the same; anything else is laid out again.
"""

from __future__ import annotations

import gc
import secrets

import numpy as np
import pytest
from collective_kit import Comp, bits, module, reducer
from test_shm import shm_sent

import replicas as rp
from replicas.errors import CollectiveMismatchError
from replicas.transport import board as shared_board
from replicas.transport.mailbox import Mailbox


def test_the_last_member_to_arrive_gets_every_value_and_mailbox_by_rank():
    host = Mailbox(0)
    boxes = [host, Mailbox(1), Mailbox(2)]
    fingerprint = ("all-reduce", ("f32",))
    checked: list[tuple] = []

    def check(first, theirs):
        checked.append((first, theirs))

    assert host.meet(7, 2, 3, fingerprint, 2, "c", boxes[2], check) is None
    assert host.meet(7, 0, 3, fingerprint, 0, "a", boxes[0], check) is None
    values, got = host.meet(7, 1, 3, fingerprint, 1, "b", boxes[1], check)
    assert values == ["a", "b", "c"] and got == boxes
    assert checked == []  # the very same fingerprint: nothing to compare
    assert host.meet(8, 0, 3, fingerprint, 0, "x", boxes[0], check) is None  # the next collective starts anew
    assert host.state.sent == host.state.received == 0  # nothing is a message: nothing in flight


def test_a_member_with_another_fingerprint_is_checked_before_it_leaves_its_value():
    host = Mailbox(0)

    def check(first, theirs):
        raise CollectiveMismatchError(f"{first}: {theirs}")

    assert host.meet(0, 0, 2, ("all-reduce", ("f32",)), 0, "a", host, check) is None
    with pytest.raises(CollectiveMismatchError, match="0: "):
        host.meet(0, 1, 2, ("all-gather", ("f32",)), 1, "b", Mailbox(1), check)


def test_fingerprints_are_compared_with_the_first_members_whatever_the_order_of_arrival():
    """As a fixed leader compared the deposits: a mismatch names replica 0 and the first member in
    rank order that differs, so the report does not depend on who came first."""
    a, b = ("all-reduce", ("f32",)), ("all-gather", ("f32",))
    compared: list[tuple] = []

    def check(first, theirs):
        compared.append((first, theirs))
        if theirs is not a:
            raise CollectiveMismatchError(f"replica {first}")

    host = Mailbox(0)
    assert host.meet(0, 3, 4, b, 13, "d", Mailbox(13), check) is None  # no first member yet: nothing compared
    assert host.meet(0, 2, 4, a, 12, "c", Mailbox(12), check) is None
    assert compared == []
    with pytest.raises(CollectiveMismatchError, match="replica 13"):
        host.meet(0, 0, 4, a, 10, "a", host, check)  # the first member compares every earlier arrival
    assert compared == [(13, b)]


def test_an_aborted_mailbox_refuses_a_meeting():
    host = Mailbox(0)
    host.abort(RuntimeError("job stopped"))
    with pytest.raises(RuntimeError, match="job stopped"):
        host.meet(0, 0, 2, (), 0, "a", host, lambda first, theirs: None)


@pytest.mark.parametrize("n", [2, 5])
def test_whoever_leads_every_member_gets_the_same_bits_on_threads(n):
    """One process: the members meet and the last leads. Float sums in group order whoever leads:
    bitwise the same on every member and from run to run."""
    size = 260
    c = Comp("main")
    x = c.param(f"f32[{size}]")
    ar = c.op("all-reduce", f"f32[{size}]", [x], to_apply="add_f32", replica_groups=[])
    rs = c.op("reduce-scatter", f"f32[{size // n}]", [x], dimensions=[0], to_apply="add_f32", replica_groups=[])
    m = module(c.done(c.op("tuple", f"(f32[{size}], f32[{size // n}])", [ar, rs])), reducer("add", "f32"))
    rng = np.random.default_rng(11)
    args = [[rng.standard_normal(size).astype(np.float32)] for _ in range(n)]
    want = args[0][0].copy()
    for a in args[1:]:
        want = want + a[0]  # group order
    for _ in range(3):
        out = rp.run(m, args, num_replicas=n, backend="threads", timeout=60)
        assert all(bits(o[0]) == bits(want) for o in out)
        assert all(bits(o[1]) == bits(want[r * (size // n):(r + 1) * (size // n)]) for r, o in enumerate(out))


def _board() -> shared_board.Board:
    return shared_board.Board(f"t{secrets.token_hex(6)}", [0, 1])


def _never(done, address):
    raise AssertionError("waited for a buffer that was never read")


def test_a_buffer_in_a_loop_keeps_its_layout_and_views_and_a_change_lays_it_out_again():
    board = _board()
    try:
        fingerprint = board.fingerprint_bytes(("all-reduce", ("f32",)))
        layout = ((np.dtype(np.float32), (4,)),)
        seen = []
        for k in range(6):  # a loop: three uses of each of the two buffers of the slot
            tag = shared_board.tag_of(k, 1)
            views = board.publish_into(0, tag, fingerprint, layout, (1,), _never if k < 2 else lambda d, a: None)
            views[0][...] = np.arange(4, dtype=np.float32) + k
            board.commit(0, tag)
            theirs, value, via_fabric, read = board.open(board.find(0, tag), tag, 1)
            assert theirs == fingerprint and not via_fabric and not value[0].flags.writeable
            assert bits(value[0]) == bits(np.arange(4, dtype=np.float32) + k)
            seen.append((views[0], value[0]))
            read.release()
        assert seen[0][0] is seen[2][0] is seen[4][0] and seen[1][0] is seen[3][0]  # the writer's views kept
        assert seen[0][1] is seen[2][1]  # and the reader's
        # Another layout, then another fingerprint, in the same buffer: laid out anew, read right.
        other = board.fingerprint_bytes(("all-reduce", ("s32",)))
        for k, (fp, payload) in enumerate([(fingerprint, (np.arange(3, dtype=np.int64),)),
                                           (other, (np.arange(3, dtype=np.int64) * 5,)),
                                           (other, [np.ones(2, np.int8), "text"])], start=6):
            tag = shared_board.tag_of(k, 1)
            assert board.publish(0, tag, fp, payload, (1,), lambda d, a: None)
            theirs, value, _, read = board.open(board.find(0, tag), tag, 1)
            assert theirs == fp
            if isinstance(payload, tuple):
                assert bits(value[0]) == bits(payload[0])
            else:
                assert bits(value[0]) == bits(payload[0]) and value[1] == "text"
            read.release()
        del seen, views, value, read
    finally:
        gc.collect()
        assert board.close()  # the kept views go with the board: it unmaps


def test_arrays_too_large_for_a_buffer_claim_nothing_and_are_announced_by_publish():
    board = _board()
    try:
        fingerprint = board.fingerprint_bytes(("all-reduce", ("u8",)))
        big = ((np.dtype(np.uint8), (board.capacity,)),)
        assert board.publish_into(0, shared_board.tag_of(0, 1), fingerprint, big, (1,), _never) is None
        assert board.find(0, shared_board.tag_of(0, 1)) is None
        tag = shared_board.tag_of(1, 1)
        assert not board.publish(0, tag, fingerprint, (np.zeros(board.capacity, np.uint8),), (1,), _never)
        theirs, value, via_fabric, read = board.open(board.find(0, tag), tag, 1)
        assert via_fabric and value is None and theirs == fingerprint
        read.release()
    finally:
        board.close()


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_packed_actors_lead_by_the_last_to_arrive_and_match_threads_placed_alike_bitwise():
    """2 actors of 2: the all-reduce and reduce-scatter rounds go on the board, each process's
    partial summed into its board buffer by whichever member arrived last; every member gets the
    bits of the threads backend with the same placement, and the board's writes are counted as the
    first member's (the slot the peers read)."""
    from replicas.runtime.compile import compile_module
    from replicas.runtime.job import Job
    from replicas.runtime.threads import ThreadBackend

    size = 1000
    c = Comp("main")
    x = c.param(f"f32[{size}]")
    ar = c.op("all-reduce", f"f32[{size}]", [x], to_apply="add_f32", replica_groups=[])
    rs = c.op("reduce-scatter", f"f32[{size // 4}]", [x], dimensions=[0], to_apply="add_f32", replica_groups=[])
    ar2 = c.op("all-reduce", f"f32[{size}]", [ar], to_apply="add_f32", replica_groups=[])
    m = module(c.done(c.op("tuple", f"(f32[{size}], f32[{size // 4}], f32[{size}])", [ar, rs, ar2])),
               reducer("add", "f32"))
    rng = np.random.default_rng(2)
    args = [[rng.standard_normal(size).astype(np.float32)] for _ in range(4)]
    placed = ThreadBackend(compile_module(m), [list(a) for a in args], placement=[0, 0, 1, 1])
    want = Job(placed, None, timeout=120, host_may_send=False).result()
    job = rp.launch(m, args, num_replicas=4, timeout=120, replicas_per_actor=2)
    got = job.result()
    assert all(bits(a) == bits(b) for r in range(4) for a, b in zip(got[r], want[r]))
    sent = shm_sent(job)
    assert sent[0].get(2, 0) == 3 and sent[2].get(0, 0) == 3  # three rounds, each written as the first member
    assert not sent[1] and not sent[3]
