"""Direct actor-to-actor messages: a socket per pair of replica actors, beside Ray.

A Ray actor call costs milliseconds of CPU on a small machine; a message written to a socket
that a reader thread in the peer hands to its mailbox costs tens of microseconds. Small messages
take this path; large ones keep going through Ray's object store (zero-copy on one node).
Connections authenticate with the driver's key (multiprocessing's HMAC handshake), so only
this job's actors can deliver, and a Unix socket is used between actors of one node.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Callable
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

import numpy as np

# Messages with more array bytes than this go through Ray's object store instead.
WIRE_MAX_BYTES = 1 << 20


def payload_bytes(value: Any) -> int:
    """The array bytes in a message (arrays, nested in tuples, lists and dicts)."""
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, (tuple, list)):
        return sum(payload_bytes(v) for v in value)
    if isinstance(value, dict):
        return sum(payload_bytes(v) for v in value.values())
    return 0


class Wire:
    """One actor's end: a listener whose reader threads call `deliver(message)`, and a
    connection (with a lock, shared by the actor's replicas) to each peer it has written to."""

    def __init__(self, deliver: Callable[[Any], None], authkey: bytes, node: str, node_ip: str) -> None:
        self._deliver = deliver
        self._authkey = authkey
        self._dir = tempfile.mkdtemp(prefix="rpw-", dir="/tmp")
        self._unix = Listener(os.path.join(self._dir, "s"), family="AF_UNIX", authkey=authkey)
        self._tcp = Listener((node_ip, 0), family="AF_INET", authkey=authkey)
        self.address = {"node": node, "unix": self._unix.address, "tcp": self._tcp.address}
        self._conns: dict[str, tuple[Connection, threading.Lock]] = {}
        self._lock = threading.Lock()
        for listener in (self._unix, self._tcp):
            threading.Thread(target=self._accept, args=(listener,), daemon=True, name="wire-accept").start()

    def _accept(self, listener: Listener) -> None:
        while True:
            try:
                conn = listener.accept()
            except Exception:  # noqa: BLE001 - a failed handshake (wrong key) or a closed listener
                continue
            threading.Thread(target=self._read, args=(conn,), daemon=True, name="wire-read").start()

    def _read(self, conn: Connection) -> None:
        try:
            while True:
                self._deliver(conn.recv())
        except (EOFError, OSError):
            conn.close()

    def send(self, peer: dict[str, Any], message: Any) -> None:
        key = f"{peer['node']}|{peer['unix']}"
        entry = self._conns.get(key)
        if entry is None:
            with self._lock:
                entry = self._conns.get(key)
                if entry is None:
                    if peer["node"] == self.address["node"]:
                        conn = Client(peer["unix"], family="AF_UNIX", authkey=self._authkey)
                    else:
                        conn = Client(tuple(peer["tcp"]), family="AF_INET", authkey=self._authkey)
                    entry = self._conns[key] = (conn, threading.Lock())
        conn, lock = entry
        with lock:
            conn.send(message)
