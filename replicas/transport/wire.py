"""Direct actor-to-actor messages: a socket per pair of replica actors, beside Ray.

A Ray actor call costs milliseconds of CPU on a small machine; a message written to a socket
that a reader thread in the peer hands to its mailbox costs tens of microseconds. Between nodes
every message takes this path, its arrays streamed from their own memory into the receiver's
buffers (pickle's out-of-band buffers: no pickled copy on either side); between actors of one node
large ones go through shared memory instead (or Ray's object store, zero-copy on one node).

The surface is closed:
- Between actors of one node the socket is a Unix socket in Linux's abstract namespace (no file,
  so nothing is left in the temp dir even when an actor is killed); a TCP listener is opened only
  when the job spans nodes, on this node's address.
- A connection is admitted before it costs anything but its accept: on the Unix socket only
  from a process of this process's user (`SO_PEERCRED`: the abstract namespace has no file
  permissions, so any local user could connect), and a peer (a process on the Unix socket, an
  address over TCP) may have at most `MAX_PENDING_PER_PEER` connections in their handshake: a flood
  from one peer is closed at accept and never takes another peer's place. At most `MAX_PENDING`
  handshakes run at once over all peers (each is a thread).
- Every admitted connection is authenticated (mutual HMAC-SHA256 challenge/response with the
  driver's key) before any message is read, within `HANDSHAKE_TIMEOUT`, in that connection's own
  thread: a silent stranger, a wrong key or garbage costs one thread for at most that long and
  never delays another connection.
- Only an authenticated peer's messages are deserialized. A message is a tuple framed as two
  lengths, its head (every element but the last: who it is for and its key, at most
  `MAX_HEAD_BYTES`) and its body (the last element: the payload). The head is read and judged
  first: `check(head, body_bytes)` refuses a body larger than what the program's collective or
  channel named by the head can hold (transport/message_bounds.py), so such a body, or one over
  `max_frame_bytes()`, is refused before a byte of it is allocated. A refused message is reported
  to `on_fault` naming the peer (its process, or its address) and the connection is closed, so
  its sender gets an error instead of blocking on a reader that is gone.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import pickle
import secrets
import socket
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from replicas import limits

# Between actors of one node, messages with more array bytes than this go through shared memory
# (or Ray's object store); between nodes every message takes the wire, streamed from the arrays.
WIRE_MAX_BYTES = 1 << 20
MAX_HEAD_BYTES = 64 << 10  # a message's head: job token, destination, source and key
# A frame at most this long is read in one call before its head is judged (a bounded allocation).
_ONE_READ = 64 << 10
# The congestion control of the connections between nodes (what sends the bytes; "" keeps the
# system's). Why not the default where it is BBR: without the fq qdisc the kernel paces BBR's
# segments itself, with a timer per burst, and a collective's transfers are bursts of a few MiB:
# an exchange of one such burst each way between two hosts took clearly more CPU and time than
# under CUBIC (bench/LOG-2026.md, "alltoall").
CONGESTION = os.environ.get("REPLICAS_TCP_CONGESTION", "cubic")
# Seconds a new connection has to prove it holds the key (real peers on a loaded machine need long).
HANDSHAKE_TIMEOUT = 30.0
SEND_TIMEOUT = 60.0  # seconds a send may wait for a peer that stopped reading
MAX_PENDING = 256  # connections allowed to be in their handshake at once, over all peers
# Per peer (a process on the Unix socket, an address over TCP): a real peer opens one connection per
# sending actor and job, so this only bounds what one stranger can hold.
MAX_PENDING_PER_PEER = 32

_HELLO = b"rpw1"
_CHALLENGE_BYTES = 32
_DIGEST_BYTES = 32
_LENGTHS = struct.Struct("<QQ")  # a frame's head and body lengths
_BODY = struct.Struct("<QQ")  # a body's pickle length and its number of out-of-band buffers
_LENGTH = struct.Struct("<Q")  # one out-of-band buffer's length


class WireError(RuntimeError):
    """A peer connection failed (handshake refused, peer gone, frame too large)."""


class RefusedMessage(WireError):
    """An authenticated peer sent something this end refuses; `peer` names the sender."""

    def __init__(self, peer: str, error: BaseException) -> None:
        detail = str(error) if isinstance(error, WireError) else f"{type(error).__name__}: {error}"
        super().__init__(f"a message from {peer} was refused: {detail}")
        self.peer = peer
        self.error = error


def max_frame_bytes() -> int:
    """The most a frame's body may hold whatever its key: a value of the byte ceiling
    (`REPLICAS_MAX_BYTES`) plus framing. The program's own bound (`check`) is usually far lower."""
    return limits.current().max_bytes + (1 << 20)


def payload_bytes(value: Any) -> int:
    """The array bytes in a message (arrays, nested in tuples, lists and dicts)."""
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, (tuple, list)):
        return sum(payload_bytes(v) for v in value)
    if isinstance(value, dict):
        return sum(payload_bytes(v) for v in value.values())
    return 0


def _digest(key: bytes, role: bytes, challenge: bytes) -> bytes:
    return hmac.new(key, _HELLO + role + challenge, hashlib.sha256).digest()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    return bytes(_recv_into(sock, bytearray(n)))


def _recv_into(sock: socket.socket, buffer: Any, heard: Callable[[], None] | None = None) -> Any:
    """Fill `buffer` from the socket (a large body lands where it will be used: no second copy);
    `heard()` after each piece."""
    view, got = memoryview(buffer), 0
    while got < len(buffer):
        n = sock.recv_into(view[got:], min(len(buffer) - got, 4 << 20))
        if not n:
            raise EOFError("connection closed")
        got += n
        if heard is not None:
            heard()
    return buffer


def _server_handshake(sock: socket.socket, key: bytes) -> None:
    """Prove the client holds `key` (and that we do); raises on anything else."""
    challenge = secrets.token_bytes(_CHALLENGE_BYTES)
    sock.sendall(_HELLO + challenge)
    answer = _recv_exact(sock, _DIGEST_BYTES + _CHALLENGE_BYTES)
    if not hmac.compare_digest(answer[:_DIGEST_BYTES], _digest(key, b"c", challenge)):
        raise WireError("wrong key")
    sock.sendall(_digest(key, b"s", answer[_DIGEST_BYTES:]))


def _client_handshake(sock: socket.socket, key: bytes) -> None:
    hello = _recv_exact(sock, len(_HELLO) + _CHALLENGE_BYTES)
    if hello[:len(_HELLO)] != _HELLO:
        raise WireError("the peer does not speak this protocol")
    mine = secrets.token_bytes(_CHALLENGE_BYTES)
    sock.sendall(_digest(key, b"c", hello[len(_HELLO):]) + mine)
    if not hmac.compare_digest(_recv_exact(sock, _DIGEST_BYTES), _digest(key, b"s", mine)):
        raise WireError("the peer does not hold the job's key")


class Wire:
    """One actor's end: listeners whose reader threads call `deliver(message)`, and a
    connection (with a lock, shared by the actor's replicas) to each peer it has written to.

    `on_fault(error)` is called with a `RefusedMessage` when an authenticated peer sends something
    this end refuses (a frame too large, bytes that do not unpickle, a head and body size `check`
    raises on, a message `deliver` raises on). Messages are tuples (see the module doc)."""

    def __init__(self, deliver: Callable[[Any], None], authkey: bytes, node: str, node_ip: str | None = None,
                 on_fault: Callable[[BaseException], None] | None = None,
                 check: Callable[[tuple, int], None] | None = None) -> None:
        self._deliver = deliver
        self._on_fault = on_fault
        self._check = check
        self._authkey = authkey
        self._closed = False
        self._lock = threading.Lock()
        self._conns: dict[str, tuple[socket.socket, threading.Lock]] = {}
        self._served: set[socket.socket] = set()  # accepted connections, closed with the wire
        # peer -> its connections in their handshake. A lock of its own: `send` holds `_lock` while it
        # connects, and a peer connecting to us at the same moment must still be accepted (two actors
        # that connect to each other at once would otherwise wait for each other's accept forever).
        self._pending: dict[Any, int] = {}
        self._pending_lock = threading.Lock()
        self._listeners: list[socket.socket] = []
        self._dir: str | None = None
        # Where a large array arriving from another node is received instead of the reader's own
        # buffers, when it will be forwarded to a process of this node (collectives/forwarding.py):
        # `placer(head, sizes)` gives writable uint8 buffers of those sizes (None for one the reader
        # keeps itself), or None.
        self.placer: Callable[[tuple, list[int]], list[np.ndarray | None] | None] | None = None
        # Peer address (TCP) -> `time.monotonic()` of the latest bytes read from it: a host whose
        # actor is too busy to answer the driver still shows it is alive (cluster/liveness.py).
        self._heard: dict[str, float] = {}
        self.address: dict[str, Any] = {"node": node, "unix": self._listen_unix(), "tcp": None}
        if node_ip is not None:
            self.open_tcp(node_ip)

    # -- listening ---------------------------------------------------------------------------------
    def _listen_unix(self) -> str:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if sys.platform.startswith("linux"):
            address = "\0rpw-" + secrets.token_hex(16)  # abstract: no file to leave behind
        else:
            self._dir = tempfile.mkdtemp(prefix="rpw-")
            address = os.path.join(self._dir, "s")
        sock.bind(address)
        self._start_listener(sock)
        return address

    def open_tcp(self, host: str) -> None:
        """Listen on `host` too (once): for peers on other nodes."""
        with self._lock:
            if self.address["tcp"] is not None:
                return
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            self.address["tcp"] = sock.getsockname()[:2]
            self._start_listener(sock)

    def _start_listener(self, sock: socket.socket) -> None:
        sock.listen(128)
        self._listeners.append(sock)
        threading.Thread(target=self._accept, args=(sock,), daemon=True, name="wire-accept").start()

    def _accept(self, listener: socket.socket) -> None:
        while not self._closed:
            try:
                conn, _ = listener.accept()
            except OSError:
                if self._closed:
                    return
                continue
            peer = self._admit(conn)
            if peer is None:
                conn.close()  # another user, or too many of this peer's connections mid-handshake
                continue
            try:
                threading.Thread(target=self._serve, args=(conn, peer), daemon=True, name="wire-read").start()
            except RuntimeError:  # no thread to spare: refused like a flood, never an accept loop that dies
                self._done_pending(peer)
                conn.close()

    def _admit(self, conn: socket.socket) -> Any:
        """The peer `conn` counts against (its process, or its address), with a handshake slot taken;
        None when it is refused: another user's process, or its peer (or all peers) at their limit."""
        try:
            if conn.family == socket.AF_UNIX:
                pid, uid, _ = _peer_credentials(conn)
                if uid != os.getuid():
                    return None
                peer: Any = ("pid", pid)
            else:
                peer = ("host", conn.getpeername()[0])
        except (OSError, struct.error):
            return None
        with self._pending_lock:
            mine = self._pending.get(peer, 0)
            if mine >= MAX_PENDING_PER_PEER or sum(self._pending.values()) >= MAX_PENDING:
                return None
            self._pending[peer] = mine + 1
        return peer

    def _done_pending(self, peer: Any) -> None:
        with self._pending_lock:
            left = self._pending[peer] - 1
            if left:
                self._pending[peer] = left
            else:
                del self._pending[peer]

    def _serve(self, conn: socket.socket, peer: Any) -> None:
        """Authenticate within the deadline, then read frames until the peer or the wire closes."""
        try:
            conn.settimeout(HANDSHAKE_TIMEOUT)
            _server_handshake(conn, self._authkey)
            conn.settimeout(None)
        except (OSError, EOFError, WireError):
            conn.close()
            return
        finally:
            self._done_pending(peer)
        with self._lock:
            if self._closed:
                conn.close()
                return
            self._served.add(conn)
        try:
            self._read(conn, peer[1] if peer[0] == "host" else None)
        except Exception as e:  # noqa: BLE001 - a refused message fails the job, never this thread
            self._fault(conn, e)
        finally:
            with self._lock:
                self._served.discard(conn)
            conn.close()

    def _read(self, conn: socket.socket, host: str | None = None) -> None:
        """Deliver the peer's messages until it closes; raise on the first one refused. `host`: the
        peer's address over TCP, whose latest bytes are noted (`heard`)."""
        buffers = _Buffers()
        heard = None if host is None else (lambda: self._heard.__setitem__(host, time.monotonic()))
        while True:
            try:
                head_size, body_size = _LENGTHS.unpack(_recv_exact(conn, _LENGTHS.size))
                if heard is not None:
                    heard()
                if head_size > MAX_HEAD_BYTES:
                    raise WireError(f"a message head of {head_size} bytes (the limit is {MAX_HEAD_BYTES})")
                if body_size > max_frame_bytes():
                    raise WireError(f"a frame of {body_size} bytes (the limit is {max_frame_bytes()})")
                together = head_size + body_size <= _ONE_READ
                data = _recv_exact(conn, head_size + body_size if together else head_size)
            except (OSError, EOFError):
                return  # the peer closed, or the wire did
            # Only an authenticated peer (an actor of this driver) gets here: see the module doc.
            view = memoryview(data)
            head = pickle.loads(view[:head_size])  # noqa: S301
            if not isinstance(head, tuple):
                raise WireError(f"a message head must be a tuple, got {type(head).__name__}")
            if self._check is not None:
                self._check(head, body_size)
            try:
                body = decode_body(view[head_size:]) if together else _read_body(conn, body_size, buffers,
                                                                                  head, self.placer, heard)
            except (OSError, EOFError):
                return
            self._deliver(head + (body,))
            del body  # held here until the next message, its buffers could not serve that one

    def _fault(self, conn: socket.socket, error: BaseException) -> None:
        if self._on_fault is not None and not self._closed:
            self._on_fault(RefusedMessage(_peer_name(conn), error))

    # -- sending -----------------------------------------------------------------------------------
    def send(self, peer: dict[str, Any], message: tuple) -> None:
        """Write `message` (a non-empty tuple: see the module doc) to the peer's actor."""
        key = f"{peer['node']}|{peer['unix']}"
        entry = self._conns.get(key)
        if entry is None:
            with self._lock:
                entry = self._conns.get(key)
                if entry is None:
                    entry = self._conns[key] = (self._connect(peer), threading.Lock())
        conn, lock = entry
        header, parts = encode(message)
        with lock:
            try:
                if len(parts) == 1 and len(parts[0]) < 65536:
                    conn.sendall(header + parts[0])  # one system call for the usual small message
                else:  # arrays go out from their own memory, not a pickled copy
                    _send_all(conn, [header, *parts])
            except OSError as e:
                self._drop(key, conn)
                raise WireError(f"cannot send to the actor at {peer['unix']!r}: {type(e).__name__}: {e}") from None

    def _connect(self, peer: dict[str, Any]) -> socket.socket:
        if peer["node"] == self.address["node"]:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            target: Any = peer["unix"]
        else:
            if peer.get("tcp") is None:
                raise WireError(f"the actor on node {peer['node']} has no TCP listener")
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            # A message is written in pieces (its lengths, then its arrays): without this, Nagle's
            # algorithm holds each message's last short segment until the previous one is acknowledged.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _congestion(sock)
            target = tuple(peer["tcp"])
        try:
            sock.settimeout(HANDSHAKE_TIMEOUT)
            sock.connect(target)
            _client_handshake(sock, self._authkey)
            # Blocking, with the kernel's send timeout (what a send to a peer that stopped reading waits):
            # a Python timeout socket polls before each send, which made a large message across a
            # shaped link arrive at a fraction of the link's rate.
            sock.settimeout(None)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", int(SEND_TIMEOUT), 0))
        except (OSError, EOFError, WireError) as e:
            sock.close()
            raise WireError(f"cannot connect to the actor at {target!r}: {type(e).__name__}: {e}") from None
        return sock

    def _drop(self, key: str, conn: socket.socket) -> None:
        with self._lock:
            if self._conns.get(key, (None,))[0] is conn:
                del self._conns[key]
        conn.close()

    # -- closing -----------------------------------------------------------------------------------
    def drop_peers(self) -> None:
        """Close this end's outgoing connections (a job ended; the next job connects afresh)."""
        with self._lock:
            conns, self._conns = list(self._conns.values()), {}
        for conn, _ in conns:
            _shut(conn)

    def close(self) -> None:
        """Stop listening and close every connection, both directions."""
        with self._lock:
            self._closed = True
            served, self._served = list(self._served), set()
        for sock in self._listeners:
            _shut(sock)
        for conn in served:
            _shut(conn)
        self.drop_peers()
        if self._dir is not None:
            import shutil

            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def heard(self) -> dict[str, float]:
        """Seconds since the latest bytes from each peer address over TCP."""
        now = time.monotonic()
        return {host: now - at for host, at in list(self._heard.items())}

    @property
    def connections(self) -> int:
        """Open connections (outgoing and authenticated incoming): for leak checks."""
        with self._lock:
            return len(self._conns) + len(self._served)


def encode(message: tuple) -> tuple[bytes, list[Any]]:
    """A message's frame: its two lengths, then its head pickled, then its body (module doc): the
    body's pickle with its contiguous arrays left out of band and written after it as they are."""
    head = pickle.dumps(message[:-1], protocol=pickle.HIGHEST_PROTOCOL)
    buffers: list[pickle.PickleBuffer] = []
    meta = pickle.dumps(message[-1], protocol=5, buffer_callback=buffers.append)
    raws = [b.raw() for b in buffers]
    prefix = _BODY.pack(len(meta), len(raws)) + b"".join(_LENGTH.pack(r.nbytes) for r in raws)
    body_size = len(prefix) + len(meta) + sum(r.nbytes for r in raws)
    if body_size > max_frame_bytes() or len(head) > MAX_HEAD_BYTES:
        raise WireError(f"a message of {body_size} bytes is over the frame limit of {max_frame_bytes()}")
    first = head + prefix + meta
    if sum(r.nbytes for r in raws) < 65536:
        return _LENGTHS.pack(len(head), body_size), [b"".join([first, *raws])]
    return _LENGTHS.pack(len(head), body_size), [first, *raws]


def _body_layout(prefix: bytes | memoryview, body_size: int) -> tuple[int, int]:
    """The body's pickle length and its number of out-of-band buffers, checked against its size."""
    if body_size < _BODY.size:
        raise WireError(f"a message body of {body_size} bytes has no layout")
    meta_size, count = _BODY.unpack(bytes(prefix[:_BODY.size]))
    if _BODY.size + count * _LENGTH.size + meta_size > body_size:
        raise WireError(f"a message body of {body_size} bytes declares more than it holds")
    return meta_size, count


def _buffer_sizes(data: bytes | memoryview, count: int, meta_size: int, body_size: int) -> list[int]:
    sizes = [_LENGTH.unpack_from(data, i * _LENGTH.size)[0] for i in range(count)]
    if _BODY.size + count * _LENGTH.size + meta_size + sum(sizes) != body_size:
        raise WireError(f"a message body of {body_size} bytes does not add up")
    return sizes


def decode_body(view: memoryview) -> Any:
    """A body read whole (a small frame): its arrays are copied out of the read buffer."""
    meta_size, count = _body_layout(view, len(view))
    at = _BODY.size + count * _LENGTH.size
    sizes = _buffer_sizes(view[_BODY.size:at], count, meta_size, len(view))
    meta, at = view[at:at + meta_size], at + meta_size
    buffers = []
    for size in sizes:
        buffers.append(bytearray(view[at:at + size]))
        at += size
    return pickle.loads(meta, buffers=buffers)  # noqa: S301 - an authenticated peer's (module doc)


# A reader keeps at most this many received arrays' buffers to receive into again, once nothing
# refers to them: a fresh buffer is fresh pages (a bytearray is also zeroed first), which cost
# more than receiving the bytes into pages already mapped.
KEPT_BUFFERS = 4
KEPT_MIN_BYTES = 1 << 20
_FREE_REFS = 2  # references to a free kept buffer as `_Buffers.take` looks: the list's and getrefcount's argument


class _Buffers:
    """One reader's buffers for the arrays of large bodies (a reader thread per connection: no lock)."""

    __slots__ = ("kept",)

    def __init__(self) -> None:
        self.kept: list[np.ndarray] = []

    def take(self, size: int) -> np.ndarray:
        if size < KEPT_MIN_BYTES:
            return np.empty(size, np.uint8)
        kept = self.kept
        free = -1
        for k in range(len(kept)):
            if sys.getrefcount(kept[k]) == _FREE_REFS:
                if kept[k].size == size:
                    return kept[k]
                free = k
        buffer = np.empty(size, np.uint8)
        if len(kept) < KEPT_BUFFERS:
            kept.append(buffer)
        elif free >= 0:  # a free one of another size makes room (its pages go back)
            kept[free] = buffer
        return buffer


def _read_body(conn: socket.socket, body_size: int, buffers: _Buffers | None = None, head: tuple = (),
               placer: Callable[[tuple, list[int]], list[np.ndarray | None] | None] | None = None,
               heard: Callable[[], None] | None = None) -> Any:
    """A large body read from the socket: each array straight into its own buffer (where `placer`
    gives one, there; else one of `buffers` that nothing refers to any more, where one of the size is)."""
    if body_size < _BODY.size:
        raise WireError(f"a message body of {body_size} bytes has no layout")
    meta_size, count = _body_layout(_recv_exact(conn, _BODY.size), body_size)
    sizes = _buffer_sizes(_recv_exact(conn, count * _LENGTH.size), count, meta_size, body_size)
    meta = _recv_exact(conn, meta_size)
    kept = buffers if buffers is not None else _Buffers()
    places = placer(head, sizes) if placer is not None and sizes else None
    arrays = []
    for k, size in enumerate(sizes):
        into = places[k] if places is not None else None
        arrays.append(_recv_into(conn, kept.take(size) if into is None else into, heard))
    return pickle.loads(meta, buffers=arrays)  # noqa: S301 - an authenticated peer's (module doc)


_IOV_MAX = 1024  # buffers one sendmsg takes at most (Linux's UIO_MAXIOV)


def _send_all(conn: socket.socket, buffers: list[Any]) -> None:
    """`buffers` (bytes-like, each contiguous) written in order by as few system calls as the kernel
    takes them in: a message's lengths and head go out with its arrays, so over TCP the receiver is
    not woken for a short first segment alone and then again for the rest."""
    views = [memoryview(b).cast("B") for b in buffers]
    at = 0
    while at < len(views):
        sent = conn.sendmsg(views[at:at + _IOV_MAX])
        while sent:
            n = views[at].nbytes
            if sent < n:
                views[at] = views[at][sent:]
                break
            sent -= n
            at += 1


def _congestion(sock: socket.socket) -> None:
    """Set the congestion control of a connection between nodes (`CONGESTION`) where the kernel has
    it; else the system's default stays."""
    if CONGESTION:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, CONGESTION.encode())
        except OSError:  # not built into this kernel, or not allowed to this process
            pass


def _peer_credentials(conn: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a Unix socket, as the kernel saw it connect."""
    return struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))


def _peer_name(conn: socket.socket) -> str:
    """Who is at the other end: a process id on a Unix socket, an address over TCP."""
    try:
        if conn.family == socket.AF_UNIX:
            pid, _, _ = _peer_credentials(conn)
            return f"the peer process {pid}"
        host, port = conn.getpeername()[:2]
        return f"the peer at {host}:{port}"
    except (OSError, AttributeError, struct.error):
        return "a peer"


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
