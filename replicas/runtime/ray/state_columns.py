"""The states an actor's replicas publish to the driver's monitor, sent as columns.

The driver polls every actor several times a second; an actor of thousands of replicas sent one
pickled `ReplicaState` (and `BlockInfo`) per replica, which cost more to pickle and unpickle than
to make. As columns, the counters are lists of ints, the statuses bytes, the blocks a table of the
distinct ones (the members of one collective or batched run are blocked alike: one entry) indexed
per replica, and what few replicas have (the instruction a running one executes, a failure's text)
a sparse map. `decode` gives the driver the very `ReplicaState`s `encode` was given (blocks alike
shared between them: nothing changes a published block)."""

from __future__ import annotations

from typing import Any

from replicas.records import BlockInfo, ReplicaState

STATUSES = ("running", "blocked", "finished", "failed", "cancelled")
_CODE = {status: code for code, status in enumerate(STATUSES)}


def encode(states: list[ReplicaState]) -> tuple:
    """`states` (of one actor) as columns, for `decode`."""
    replicas, progress, sent, received, started = [], [], [], [], []
    codes = bytearray()
    blocks: list[int] = []
    table: list[BlockInfo] = []
    seen: dict[tuple, int] = {}
    sparse: dict[int, tuple[Any, ...]] = {}
    node = states[0].node if states else None
    for i, s in enumerate(states):
        replicas.append(s.replica)
        progress.append(s.progress)
        sent.append(s.sent)
        received.append(s.received)
        started.append(s.collectives_started)
        code = _CODE.get(s.status)
        codes.append(len(STATUSES) if code is None else code)
        b = s.block
        if b is None:
            blocks.append(-1)
        else:
            # Alike by value, the group by identity (one interned tuple per group in a process).
            key = tuple(id(v) if name == "group" else v for name, v in b.__dict__.items())
            k = seen.get(key)
            if k is None:
                k = seen[key] = len(table)
                table.append(b)
            blocks.append(k)
        if code is None or s.instruction is not None or s.error is not None or s.node != node:
            sparse[i] = (s.status, s.instruction, s.error, s.node)
    return (replicas, bytes(codes), progress, sent, received, started, blocks, table, sparse, node)


def decode(columns: tuple) -> list[ReplicaState]:
    """The `ReplicaState`s `encode` was given."""
    replicas, codes, progress, sent, received, started, blocks, table, sparse, node = columns
    out = []
    new = ReplicaState.__new__
    for i, r in enumerate(replicas):
        code = codes[i]
        k = blocks[i]
        s = new(ReplicaState)
        s.__dict__ = {"replica": r, "status": STATUSES[code] if code < len(STATUSES) else None,
                      "block": table[k] if k >= 0 else None, "instruction": None, "progress": progress[i],
                      "sent": sent[i], "received": received[i], "error": None, "collectives_started": started[i],
                      "node": node}
        extra = sparse.get(i)
        if extra is not None:
            s.status, s.instruction, s.error, s.node = extra
        out.append(s)
    return out
