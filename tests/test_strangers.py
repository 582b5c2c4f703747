"""No stranger holds a slot of an actor's socket: another user's process is refused before its
handshake begins (`SO_PEERCRED`), one peer's flood of silent connections (a process on the Unix
socket, an address over TCP) takes only that peer's slots, and a real job runs through 1,000 of
them with the right values.

Every connection is on loopback or an abstract Unix socket of this machine, bounded in count, and
closed at the end of its test."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

import replicas as rp
from replicas.transport import wire as wire_module
from replicas.transport.wire import Wire

KEY = b"s" * 32
WAIT = 20  # seconds: a bound on waits for something that should happen at once
FLOOD = 1000


@contextlib.contextmanager
def silent_connections(connect, count: int):
    """`count` connections made by `connect()`, held open (never a byte sent) until the block ends."""
    held: list[socket.socket] = []
    try:
        for _ in range(count):
            held.append(connect())
        yield held
    finally:
        for s in held:
            s.close()


def _unix(address: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(address)  # blocking: with a timeout, a full backlog is EAGAIN at once instead of a wait
    s.settimeout(WAIT)
    return s


def _argv(address: str) -> str:
    """An abstract socket's name for a command line (which cannot hold its leading NUL)."""
    assert address.startswith("\0")
    return address[1:]


def _hello_or_eof(s: socket.socket) -> bytes:
    """The first bytes the listener sends (its challenge), or b"" once it closed the connection."""
    try:
        return s.recv(4)
    except ConnectionResetError:
        return b""


def _closed_by_listener(s: socket.socket) -> bool:
    try:
        while s.recv(4096):
            pass
        return True
    except ConnectionResetError:
        return True


class Inbox:
    def __init__(self) -> None:
        import threading

        self.messages: list = []
        self.changed = threading.Condition()

    def deliver(self, message) -> None:
        with self.changed:
            self.messages.append(message)
            self.changed.notify_all()

    def wait_for(self, predicate) -> bool:
        with self.changed:
            return self.changed.wait_for(predicate, WAIT)


@pytest.mark.skipif(os.geteuid() != 0 or not sys.platform.startswith("linux"),
                    reason="needs root to connect as another user")
def test_another_users_process_is_refused_before_any_handshake():
    import pwd

    receiver = Wire(lambda m: None, KEY, "node")
    try:
        assert _first_bytes_as(pwd.getpwnam("nobody"), receiver.address["unix"]) == b""  # closed at accept
        mine = _unix(receiver.address["unix"])
        assert _hello_or_eof(mine) == b"rpw1"  # this user's process gets the handshake's challenge
        mine.close()
    finally:
        receiver.close()


def _first_bytes_as(user, address: str) -> bytes:
    """What a process of `user` reads first from `address` (b"" when it is closed on it): a forked
    child that only drops to that user, connects and reads (no exec: that user may not reach this
    Python), then reports through a pipe."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: system calls only, then _exit
        code = 1
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(address)
            s.settimeout(WAIT)
            try:
                data = s.recv(4)
            except ConnectionResetError:
                data = b""
            os.write(write_end, b"ok:" + data)
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        with os.fdopen(read_end, "rb") as f:
            report = f.read()
    finally:
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and report.startswith(b"ok:"), (status, report)
    return report[3:]


def test_a_flood_from_one_process_takes_only_its_own_slots():
    inbox = Inbox()
    receiver = Wire(inbox.deliver, KEY, "node")
    try:
        with silent_connections(lambda: _unix(receiver.address["unix"]), FLOOD) as held:
            # This process is one peer: past its slots, its connections are closed at accept.
            assert _closed_by_listener(held[-1])
            # A peer in another process still gets a slot, its handshake and its message through.
            code = ("import sys; from replicas.transport.wire import Wire; "
                    "w = Wire(lambda m: None, b's' * 32, 'node'); "
                    "w.send({'node': 'node', 'unix': '\\0' + sys.argv[1], 'tcp': None}, ('from a peer',)); w.close()")
            out = subprocess.run([sys.executable, "-c", code, _argv(receiver.address["unix"])], capture_output=True,
                                 text=True, timeout=120)
            assert out.returncode == 0, out.stderr
            assert inbox.wait_for(lambda: inbox.messages == [("from a peer",)])
    finally:
        receiver.close()


def test_a_flood_from_one_address_does_not_refuse_a_peer_at_another():
    inbox = Inbox()
    receiver = Wire(inbox.deliver, KEY, "node-a")
    receiver.open_tcp("127.0.0.1")
    sender = Wire(lambda m: None, KEY, "node-b")

    def from_second_loopback_address() -> socket.socket:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(WAIT)
        s.bind(("127.0.0.2", 0))
        s.connect(tuple(receiver.address["tcp"]))
        return s

    try:
        with silent_connections(from_second_loopback_address, FLOOD) as held:
            assert _closed_by_listener(held[-1])  # 127.0.0.2 is past its slots
            sender.send(receiver.address, ("over tcp from 127.0.0.1",))  # another address: its own slots
            assert inbox.wait_for(lambda: inbox.messages == [("over tcp from 127.0.0.1",)])
    finally:
        sender.close()
        receiver.close()


# A collective-broadcast's leaders exchange messages (never the same-node board): over the sockets.
BROADCAST = """\
HloModule broadcast, replica_count=2

ENTRY main {
  tok = token[] after-all()
  in = (f32[4], token[]) infeed(tok)
  x = f32[4] get-tuple-element(in), index=0
  ROOT y = f32[4] collective-broadcast(x), replica_groups={{1,0}}
}
"""


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_a_job_runs_while_a_stranger_holds_a_thousand_connections_to_each_actor():
    from replicas.runtime.ray.backend import _AUTHKEY

    job = rp.launch(rp.parse_hlo(BROADCAST), [], num_replicas=2, replicas_per_actor=1, timeout=120)
    backend = job._backend  # noqa: SLF001 - the actors' socket addresses
    addresses = backend._get([a.wire_address.remote(_AUTHKEY) for a in backend._actors])  # noqa: SLF001
    assert len({a["unix"] for a in addresses}) == 2
    with contextlib.ExitStack() as stack:
        for address in addresses:
            stack.enter_context(silent_connections(lambda a=address: _unix(a["unix"]), FLOOD))
        # Only now do the replicas send: each actor connects to the other's flooded socket.
        job.infeed(0, np.full(4, 1, np.float32))
        job.infeed(1, np.full(4, 2, np.float32))
        results = job.result()
    np.testing.assert_array_equal(results[0], np.full(4, 2, np.float32))  # replica 1's, first in the group
    np.testing.assert_array_equal(results[1], np.full(4, 2, np.float32))


def test_the_limits_are_what_the_documentation_says():
    assert wire_module.MAX_PENDING_PER_PEER < wire_module.MAX_PENDING <= FLOOD
