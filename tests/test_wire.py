"""The actor-to-actor socket surface, in one process: strangers, wrong keys, garbage, replays and
half-open connections are dropped without disturbing a keyed peer; a refused message is reported,
never a dead reader that blocks its sender; nothing is left in the temp dir.

Every connection goes to this process's own listeners (abstract Unix sockets: no IP at all)."""

from __future__ import annotations

import glob
import os
import pickle
import socket
import struct
import tempfile
import threading

import numpy as np
import pytest

from replicas.transport import wire as wire_module
from replicas.transport.wire import Wire, WireError, max_frame_bytes

KEY = b"k" * 32
WAIT = 20  # seconds: a bound on waits for something that should happen at once


class Inbox:
    def __init__(self) -> None:
        self.messages: list = []
        self.faults: list[BaseException] = []
        self.changed = threading.Condition()

    def deliver(self, message) -> None:
        if isinstance(message, tuple) and message and message[0] == "refuse":
            raise ValueError("refused on purpose")
        with self.changed:
            self.messages.append(message)
            self.changed.notify_all()

    def fault(self, error: BaseException) -> None:
        with self.changed:
            self.faults.append(error)
            self.changed.notify_all()

    def wait_for(self, predicate) -> bool:
        with self.changed:
            return self.changed.wait_for(predicate, WAIT)


@pytest.fixture
def pair():
    inbox = Inbox()
    receiver = Wire(inbox.deliver, KEY, "node", on_fault=inbox.fault)
    sender = Wire(lambda m: None, KEY, "node")
    yield inbox, receiver, sender
    sender.close()
    receiver.close()


def _raw(address: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(WAIT)
    sock.connect(address)
    return sock


def _closed_by_peer(sock: socket.socket) -> bool:
    """True once the other end closed the connection (reads until EOF, bounded)."""
    try:
        while sock.recv(4096):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_a_keyed_peer_delivers_while_strangers_hold_connections(pair):
    inbox, receiver, sender = pair
    strangers = [_raw(receiver.address["unix"]) for _ in range(20)]  # connected, silent
    wrong = Wire(lambda m: None, b"x" * 32, "node")
    with pytest.raises(WireError):
        wrong.send(receiver.address, ("from a wrong key",))
    garbage = _raw(receiver.address["unix"])
    garbage.sendall(os.urandom(4096))
    sender.send(receiver.address, ("hello", np.arange(3)))
    assert inbox.wait_for(lambda: len(inbox.messages) == 1)
    assert inbox.messages[0][0] == "hello" and not inbox.faults
    assert _closed_by_peer(garbage)
    for s in strangers + [garbage]:
        s.close()
    wrong.close()


def test_a_half_open_connection_is_dropped_after_the_handshake_deadline(pair, monkeypatch):
    monkeypatch.setattr(wire_module, "HANDSHAKE_TIMEOUT", 0.3)
    inbox, receiver, sender = pair
    sock = _raw(receiver.address["unix"])
    sock.sendall(b"rpw1")  # starts to answer, never finishes
    assert _closed_by_peer(sock)
    sock.close()
    sender.send(receiver.address, ("after",))
    assert inbox.wait_for(lambda: inbox.messages == [("after",)])


def test_replayed_bytes_of_an_earlier_connection_are_refused(pair):
    inbox, receiver, _ = pair
    # A keyed client's whole session: its answer to the challenge, then one framed message.
    first = _raw(receiver.address["unix"])
    hello = first.recv(36)
    session = wire_module._digest(KEY, b"c", hello[4:]) + os.urandom(32)
    header, parts = wire_module.encode(("genuine",))
    session += header + b"".join(parts)
    first.sendall(session)
    assert inbox.wait_for(lambda: inbox.messages == [("genuine",)])
    first.close()
    # The same bytes replayed on a new connection answer a challenge it was not given: refused.
    replay = _raw(receiver.address["unix"])
    assert replay.recv(36)[:4] == b"rpw1"
    replay.sendall(session)
    assert _closed_by_peer(replay)
    replay.close()
    assert inbox.messages == [("genuine",)] and not inbox.faults


def test_a_refused_message_is_reported_and_its_sender_is_not_left_blocked(pair):
    inbox, receiver, sender = pair
    sender.send(receiver.address, ("refuse",))
    assert inbox.wait_for(lambda: len(inbox.faults) == 1)
    assert "refused on purpose" in str(inbox.faults[0])
    # The receiver closed that connection: the sender learns it (an error, then a fresh connection).
    with pytest.raises(WireError):
        for _ in range(1000):
            sender.send(receiver.address, ("x" * 60000,))
    sender.send(receiver.address, ("again",))
    assert inbox.wait_for(lambda: ("again",) in inbox.messages)


def test_a_frame_over_the_limit_is_a_fault_not_an_allocation(pair):
    inbox, receiver, _ = pair
    client = _raw(receiver.address["unix"])
    wire_module._client_handshake(client, KEY)
    client.sendall(struct.pack("<QQ", 10, 1 << 60))
    assert inbox.wait_for(lambda: len(inbox.faults) == 1)
    assert str(max_frame_bytes()) in str(inbox.faults[0])
    assert _closed_by_peer(client)
    client.close()


def test_bytes_that_do_not_unpickle_are_a_fault(pair):
    inbox, receiver, _ = pair
    client = _raw(receiver.address["unix"])
    wire_module._client_handshake(client, KEY)
    client.sendall(struct.pack("<QQ", 7, 0) + b"garbage")
    assert inbox.wait_for(lambda: len(inbox.faults) == 1)
    client.close()


def test_sockets_leave_nothing_in_the_temp_dir_and_close_with_the_wire():
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "rpw-*")))
    inbox = Inbox()
    a = Wire(inbox.deliver, KEY, "node")
    b = Wire(lambda m: None, KEY, "node")
    b.send(a.address, ("x",))
    assert inbox.wait_for(lambda: inbox.messages == [("x",)])
    assert a.address["unix"].startswith("\0") and a.address["tcp"] is None  # no IP listener on one node
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "rpw-*"))) == before
    a.close()
    b.close()
    assert a.connections == 0 and b.connections == 0
    with pytest.raises(OSError):
        _raw(a.address["unix"])


def test_tcp_listens_only_where_asked_and_authenticates_too():
    inbox = Inbox()
    a = Wire(inbox.deliver, KEY, "node-a")
    a.open_tcp("127.0.0.1")
    b = Wire(lambda m: None, KEY, "node-b")
    try:
        assert a.address["tcp"][0] == "127.0.0.1"
        stranger = socket.create_connection(tuple(a.address["tcp"]), timeout=WAIT)
        b.send(a.address, ("over tcp",))
        assert inbox.wait_for(lambda: inbox.messages == [("over tcp",)])
        stranger.close()
    finally:
        a.close()
        b.close()


def test_the_latest_bytes_from_each_host_are_noted_small_and_streamed_messages_alike():
    """What tells the driver a busy host is alive (cluster/liveness.py): a Unix-socket peer is never
    noted, a TCP peer's address is, by a small message and by each piece of a large one."""
    inbox = Inbox()
    a = Wire(inbox.deliver, KEY, "node-a")
    a.open_tcp("127.0.0.1")
    b = Wire(lambda m: None, KEY, "node-b")
    try:
        b.send(dict(a.address, node="node-b"), ("over unix",))  # a peer of b's own node: its Unix socket
        assert inbox.wait_for(lambda: len(inbox.messages) == 1)
        assert a.heard() == {}
        b.send(a.address, ("small",))
        assert inbox.wait_for(lambda: len(inbox.messages) == 2)
        assert list(a.heard()) == ["127.0.0.1"] and a.heard()["127.0.0.1"] >= 0
        noted = a._heard["127.0.0.1"]  # noqa: SLF001 - when, on the wire's clock
        b.send(a.address, ("large", np.ones(3 << 20, np.uint8)))  # streamed: read into its own buffer
        assert inbox.wait_for(lambda: len(inbox.messages) == 3)
        assert a._heard["127.0.0.1"] > noted  # noqa: SLF001
    finally:
        a.close()
        b.close()


def test_a_body_over_what_its_head_allows_is_refused_before_it_is_read():
    inbox = Inbox()

    def check(head, size):
        if size > 100:
            raise WireError(f"{size} bytes under {head[0]!r}, where at most 100 are expected")

    receiver = Wire(inbox.deliver, KEY, "node", on_fault=inbox.fault, check=check)
    client = _raw(receiver.address["unix"])
    wire_module._client_handshake(client, KEY)
    header, parts = wire_module.encode(("small-key", np.zeros(1 << 16, np.uint8)))
    head_size, body_size = struct.unpack("<QQ", header)
    client.sendall(header + bytes(parts[0])[:head_size])  # the head only: the body is never sent
    assert inbox.wait_for(lambda: len(inbox.faults) == 1)
    fault = str(inbox.faults[0])
    assert f"{body_size} bytes under 'small-key'" in fault and f"peer process {os.getpid()}" in fault
    assert _closed_by_peer(client) and not inbox.messages
    client.close()
    receiver.close()


def test_large_arrays_cross_out_of_band_and_arrive_equal_and_writable(pair):
    """A body's contiguous arrays travel after its pickle from their own memory (the path every
    message between nodes takes); non-contiguous ones and scalars ride in the pickle."""
    inbox, receiver, sender = pair
    big = np.arange(3 << 20, dtype=np.float32)  # 12 MiB: several reads of the socket
    strided = np.arange(64, dtype=np.int16)[::3]
    sender.send(receiver.address, ("key", (big, strided, np.float64(2.5), {"k": big[:5]})))
    assert inbox.wait_for(lambda: len(inbox.messages) == 1)
    got_big, got_strided, scalar, mapping = inbox.messages[0][1]
    np.testing.assert_array_equal(got_big, big)
    np.testing.assert_array_equal(got_strided, strided)
    assert scalar == 2.5 and got_big.dtype == np.float32 and got_big.flags.writeable
    np.testing.assert_array_equal(mapping["k"], big[:5])


def test_a_body_whose_layout_does_not_add_up_is_a_fault(pair):
    inbox, receiver, _ = pair
    client = _raw(receiver.address["unix"])
    wire_module._client_handshake(client, KEY)
    head = pickle.dumps(("key",))
    body = struct.pack("<QQQ", 4, 1, 1 << 40) + b"meta"  # one buffer declared far beyond the body
    client.sendall(struct.pack("<QQ", len(head), len(body)) + head + body)
    assert inbox.wait_for(lambda: len(inbox.faults) == 1)
    assert "does not add up" in str(inbox.faults[0]) and not inbox.messages
    client.close()


def test_two_actors_that_connect_to_each_other_at_once_both_get_through():
    """Each end's first send connects while it holds its connection table; the other end's accept
    of that connection must not wait for the same table (both would wait for each other)."""
    inboxes = [Inbox(), Inbox()]
    wires = [Wire(inbox.deliver, KEY, "node", on_fault=inbox.fault) for inbox in inboxes]
    both = threading.Barrier(2)
    errors: list[BaseException] = []

    def send(mine: int) -> None:
        both.wait()
        try:
            wires[mine].send(wires[1 - mine].address, (f"from {mine}",))
        except BaseException as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    try:
        senders = [threading.Thread(target=send, args=(i,)) for i in range(2)]
        for t in senders:
            t.start()
        for t in senders:
            t.join()
        assert not errors, errors
        assert inboxes[0].wait_for(lambda: inboxes[0].messages == [("from 1",)])
        assert inboxes[1].wait_for(lambda: inboxes[1].messages == [("from 0",)])
    finally:
        for wire in wires:
            wire.close()


def test_large_arrays_are_received_into_buffers_nothing_refers_to_any_more(pair) -> None:
    """A reader receives a large array into a buffer of an earlier message once nothing holds that
    message's arrays (no fresh pages per message), never into one still held."""
    inbox, receiver, sender = pair
    size = 1 << 19  # 2 MiB of float32
    sender.send(receiver.address, ("a", np.full(size, 1, np.float32)))
    assert inbox.wait_for(lambda: len(inbox.messages) == 1)
    held = inbox.messages[0][1]
    sender.send(receiver.address, ("b", np.full(size, 2, np.float32)))
    assert inbox.wait_for(lambda: len(inbox.messages) == 2)
    second = inbox.messages[1][1]
    assert not np.shares_memory(held, second) and (held == 1).all()  # the first is still held
    address = second.__array_interface__["data"][0]
    del inbox.messages[1], second  # nothing refers to the second any more
    sender.send(receiver.address, ("c", np.full(size, 3, np.float32)))
    assert inbox.wait_for(lambda: len(inbox.messages) == 2)
    third = inbox.messages[1][1]
    assert third.__array_interface__["data"][0] == address and (third == 3).all() and (held == 1).all()
    assert third.flags.writeable
