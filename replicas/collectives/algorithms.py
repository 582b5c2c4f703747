"""The collective algorithms, written against the fabric's send / recv_all.

Every collective a replica executes gets the next number `seq = fabric.next_collective()`; its
messages are keyed `keys.collective(seq, round)`, one message per (sender, receiver, round). The first
round carries the sender's fingerprint next to the data, so a receiver always compares before
it uses anything (`Exchange`). Keys do not depend on the kind of collective: a replica that
reached a different collective still sends under the same key, and the receiver reports the
mismatch instead of waiting forever.

Determinism: every element of a reduced result is reduced by exactly one computation order, the
group order, so results are bitwise identical on every member. Small buffers go in one round
(everyone sends everything to everyone and everyone reduces); large ones are reduce-scattered
(member i owns shard i and reduces it in group order) and then all-gathered.

Values are tuples of numpy arrays (one per operand). Received arrays may be read-only views and
are never modified; splitting uses views, not copies.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from replicas.collectives.fingerprint import Fingerprint, diff, mismatch_error
from replicas.collectives.groups import Group
from replicas.records import BlockInfo
from replicas.runtime import keys

if TYPE_CHECKING:
    from replicas.runtime.fabric import Fabric

SMALL_BYTES = 256 * 1024  # below this, an all-reduce takes the one-round path

Values = tuple[np.ndarray, ...]
Combine = Callable[[Values, Values], Values]


class Exchange:
    """The messages of one collective on one replica."""

    __slots__ = ("fabric", "seq", "me", "fingerprint", "block", "_fp_checked")

    def __init__(self, fabric: Fabric, seq: int, fingerprint: Fingerprint, block: BlockInfo) -> None:
        self.fabric = fabric
        self.seq = seq
        self.me = fabric.replica_id
        self.fingerprint = fingerprint
        self.block = block
        self._fp_checked: set[int] = set()

    def send(self, dst: int, round_: int, payload: Any) -> None:
        value = (self.fingerprint.wire, payload) if round_ == 0 else payload
        self.fabric.send(dst, keys.collective(self.seq, round_), value)

    def recv(self, sources: Sequence[int], round_: int) -> list[Any]:
        """The payloads `sources` sent in `round_`, in that order (fingerprints checked in round 0)."""
        if not sources:
            return []
        key = keys.collective(self.seq, round_)
        values = self.fabric.recv_all([(s, key) for s in sources], self.block)
        if round_ != 0:
            return values
        own = self.fingerprint.wire
        strict = self.fabric.strict
        payloads = []
        for src, value in zip(sources, values):
            theirs, payload = value
            if theirs != own:
                differences = diff(own, theirs, strict=strict)
                if differences:
                    raise mismatch_error(self.seq, self.me, self.fingerprint, src, theirs, differences)
            payloads.append(payload)
        return payloads


def reduce_in_order(parts: Sequence[Values], combine: Combine) -> Values:
    """parts[0] + parts[1] + ... in this order (the same order on every member: bitwise-equal
    results). A fast-path reduction accumulates into the first sum's fresh buffers."""
    acc = parts[0]
    if len(parts) == 1:
        return acc
    acc = combine(acc, parts[1])
    accumulate = getattr(combine, "accumulate", None)
    for p in parts[2:]:
        if accumulate is not None and all(isinstance(x, np.ndarray) and x.ndim for x in acc):
            accumulate(acc, p)
        else:
            acc = combine(acc, p)
    return acc


def nbytes(values: Values) -> int:
    return sum(v.nbytes for v in values)


# -- all-reduce ------------------------------------------------------------------------------------

def all_reduce(ex: Exchange, group: Group, index: int, values: Values, combine: Combine) -> Values:
    n = len(group)
    if n == 1:
        return values
    if nbytes(values) < SMALL_BYTES:
        return _all_reduce_one_round(ex, group, index, values, combine)
    return _all_reduce_sharded(ex, group, index, values, combine)


def _all_reduce_one_round(ex: Exchange, group: Group, index: int, values: Values, combine: Combine) -> Values:
    peers = [r for i, r in enumerate(group) if i != index]
    for r in peers:
        ex.send(r, 0, values)
    received = ex.recv(peers, 0)
    parts = list(received)
    parts.insert(index, values)
    return reduce_in_order(parts, combine)


def _flat_shards(values: Values, n: int) -> list[Values]:
    """Shard j of every operand: np.array_split of the flattened operand (views when contiguous)."""
    per_operand = [np.array_split(v.reshape(-1), n) for v in values]
    return [tuple(splits[j] for splits in per_operand) for j in range(n)]


def _all_reduce_sharded(ex: Exchange, group: Group, index: int, values: Values, combine: Combine) -> Values:
    n = len(group)
    shards = _flat_shards(values, n)
    peers = [r for i, r in enumerate(group) if i != index]
    for j, r in enumerate(group):
        if j != index:
            ex.send(r, 0, shards[j])
    received = ex.recv(peers, 0)
    parts = list(received)
    parts.insert(index, shards[index])
    mine = reduce_in_order(parts, combine)
    for r in peers:
        ex.send(r, 1, mine)
    reduced = ex.recv(peers, 1)
    reduced.insert(index, mine)
    out = []
    for k, v in enumerate(values):
        flat = np.concatenate([np.asarray(shard[k]).reshape(-1) for shard in reduced])
        out.append(flat.reshape(v.shape))
    return tuple(out)


# -- all-gather, reduce-scatter, all-to-all ----------------------------------------------------------

def all_gather(ex: Exchange, group: Group, index: int, values: Values, dim: int) -> Values:
    if len(group) == 1:
        return values
    peers = [r for i, r in enumerate(group) if i != index]
    for r in peers:
        ex.send(r, 0, values)
    parts = ex.recv(peers, 0)
    parts.insert(index, values)
    return tuple(np.concatenate([p[k] for p in parts], axis=dim) for k in range(len(values)))


def reduce_scatter(ex: Exchange, group: Group, index: int, values: Values, dim: int, combine: Combine) -> Values:
    n = len(group)
    chunks_per_operand = [np.split(v, n, axis=dim) for v in values]
    chunks = [tuple(c[j] for c in chunks_per_operand) for j in range(n)]
    if n == 1:
        return chunks[0]
    peers = [r for i, r in enumerate(group) if i != index]
    for j, r in enumerate(group):
        if j != index:
            ex.send(r, 0, chunks[j])
    parts = ex.recv(peers, 0)
    parts.insert(index, chunks[index])
    return reduce_in_order(parts, combine)


def all_to_all_split(ex: Exchange, group: Group, index: int, values: Values, dim: int) -> Values:
    """Array form: split along `dim` into group-size chunks, chunk j to member j, concatenate."""
    n = len(group)
    chunks_per_operand = [np.split(v, n, axis=dim) for v in values]
    chunks = [tuple(c[j] for c in chunks_per_operand) for j in range(n)]
    if n == 1:
        return values
    peers = [r for i, r in enumerate(group) if i != index]
    for j, r in enumerate(group):
        if j != index:
            ex.send(r, 0, chunks[j])
    parts = ex.recv(peers, 0)
    parts.insert(index, chunks[index])
    return tuple(np.concatenate([p[k] for p in parts], axis=dim) for k in range(len(values)))


def all_to_all_tuple(ex: Exchange, group: Group, index: int, values: Values) -> Values:
    """Tuple form: operand j goes to member j; result j is what member j sent here."""
    peers = [r for i, r in enumerate(group) if i != index]
    for j, r in enumerate(group):
        if j != index:
            ex.send(r, 0, values[j])
    parts = ex.recv(peers, 0)
    parts.insert(index, values[index])
    return tuple(parts)


# -- point to point ------------------------------------------------------------------------------

def collective_permute(ex: Exchange, targets: Sequence[int], source: int | None, value: Any,
                       zeros: Callable[[], Any]) -> Any:
    for t in targets:
        ex.send(t, 0, value)
    if source is None:
        return zeros()
    return ex.recv([source], 0)[0]


def collective_broadcast(ex: Exchange, group: Group, index: int, value: Any) -> Any:
    """The first member of the group sends its operand to the others."""
    if index == 0:
        for r in group[1:]:
            ex.send(r, 0, value)
        return value
    return ex.recv([group[0]], 0)[0]
