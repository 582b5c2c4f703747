"""The collective algorithms: in-process first, then among process leaders (see `hierarchy`).

Each collective gathers its process's operands on the leader (by reference), builds the result
there into preallocated buffers (each peer's part written straight into its place, never a
concatenation of fresh shards), runs the cross-process step among leaders when the group spans
processes, and hands every local member its result. Values are tuples of numpy arrays (one per
operand); operands and received arrays are never modified (they may be read-only, or another
replica's); a result shared by several members of a process is made read-only, so no member can
change what the others see.

Reduction order (all-reduce, reduce-scatter), fixed whatever the timing, so every member gets
bitwise the same result on every run of the same placement:
- in a process, the members' operands in group order: ((x0 + x1) + x2) + ...;
- across processes, those partial results in process order (the order of each process's first
  member in the group): p0 + p1 + ... when there are at most `DIRECT_MAX_PROCESSES` processes
  (one round, or reduce-scatter + all-gather when the buffer is at least `SMALL_BYTES`: each
  shard is still reduced in process order); with more processes, recursive doubling: partials
  are combined pairwise, lower process position first, in a binary tree (processes beyond the
  largest power of two first fold into process `pos - 2**m`).
On one process (the threads backend, or a job packed into one actor) this is the group order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from replicas.collectives.board_rounds import (
    board_all_gather,
    board_all_gather_raw,
    board_all_to_all,
    board_reduce_scatter,
)
from replicas.collectives.buffers import MIN_BYTES as POOLED_BYTES
from replicas.collectives.buffers import pool_of, sendable_in_place
from replicas.collectives.hierarchy import LEADER_ROUND, Exchange, Topology
from replicas.collectives.reduction import (
    Combine,
    Values,
    chunks_of,
    index_runs,
    nbytes,
    reduce_in_order,
    reduce_into,
    reduce_specs_into,
    slot,
)

# Below this, leaders reduce in one round of whole partials; from it, reduce-scatter + all-gather.
# Measured on the 2-core machine (bench/README.md, "midsize"): at 1-3 MiB one round took 30-45% less
# CPU per all-reduce than the two rounds of shards, with 2 processes and with 4 (a round among
# processes is a publication, a wake-up and a read per leader: more than the bytes the shards save);
# from 4 MiB a whole partial no longer fits a same-node board slot (runtime/board.SLOT_BYTES) and
# would go through the arena and the sockets. (On the machine of 2026-11-23, 256 KiB.)
SMALL_BYTES = 4 << 20
# Up to this many processes the leaders exchange directly (P * (P - 1) messages per round); beyond,
# recursive doubling keeps messages at O(P log P).
DIRECT_MAX_PROCESSES = 8


def _reduce_pooled(ex: Exchange, parts: Sequence[Values], combine: Combine) -> Values:
    """`parts` reduced in order into a buffer of the pool (the part itself when it is alone)."""
    if len(parts) == 1:
        return parts[0]
    pool = pool_of(ex.fabric)
    out = tuple(pool.empty(v.shape, v.dtype) for v in parts[0])
    if len(parts) > 2 and hasattr(combine, "into") and max(o.nbytes for o in out) > BLOCK_BYTES:
        return reduce_specs_into(out, [list(parts)], combine, BLOCK_BYTES)  # the sum of a block stays in cache
    return reduce_into(out, parts, combine)  # one block: the same operations, without views of every part


def _shared(values: Any, topo: Topology) -> Any:
    """`values` made read-only when several local members will hold the very same arrays."""
    if len(topo.local) > 1:
        for v in values if isinstance(values, tuple) else (values,):
            if isinstance(v, np.ndarray):
                v.setflags(write=False)
    return values


# -- among leaders -----------------------------------------------------------------------------------

def recursive_doubling(ex: Exchange, value: Any, merge: Callable[[Any, Any], Any]) -> Any:
    """Every leader ends with merge over all leaders' values (lower process position first), in
    log2(P) rounds of one message each, plus one fold-in and one fold-out round for the processes
    beyond the largest power of two."""
    topo = ex.topo
    leaders, pos = topo.layout.leaders, topo.position
    m = 1 << (len(leaders).bit_length() - 1)
    extra = len(leaders) - m
    last = LEADER_ROUND + m.bit_length()  # the fold-out round
    if pos >= m:
        partner = leaders[pos - m]
        ex.send(partner, LEADER_ROUND, value)
        return ex.recv([partner], last)[0]
    if pos < extra:
        value = merge(value, ex.recv([leaders[pos + m]], LEADER_ROUND)[0])
    bit, round_ = 1, LEADER_ROUND + 1
    while bit < m:
        partner_pos = pos ^ bit
        partner = leaders[partner_pos]
        ex.send(partner, round_, value)
        other = ex.recv([partner], round_)[0]
        value = merge(value, other) if pos < partner_pos else merge(other, value)
        bit, round_ = bit << 1, round_ + 1
    if pos < extra:
        ex.send(leaders[pos + m], last, value)
    return value


def leaders_all_reduce(ex: Exchange, acc: Values, combine: Combine) -> Values:
    topo = ex.topo
    leaders = topo.layout.leaders
    p = len(leaders)
    if p == 1:
        return acc
    if p > DIRECT_MAX_PROCESSES:
        return recursive_doubling(ex, acc, combine)
    if nbytes(acc) < SMALL_BYTES:
        parts = ex.among_leaders(LEADER_ROUND, acc)
        if nbytes(acc) < POOLED_BYTES or not hasattr(combine, "into"):
            return reduce_in_order(parts, combine)
        return _reduce_pooled(ex, parts, combine)  # a fresh buffer of a few MiB would be fresh pages
    # Reduce-scatter (leader k reduces shard k in process order, straight into its place in the
    # result), then all-gather: each peer's shard is copied into its place.
    pool = pool_of(ex.fabric)
    out = tuple(pool.empty(v.shape, v.dtype) for v in acc)
    shards = list(zip(*(np.array_split(v.reshape(-1), p) for v in acc)))
    places = list(zip(*(np.array_split(o.reshape(-1), p) for o in out)))
    pos = topo.position
    reduce_into(places[pos], ex.among_leaders(LEADER_ROUND, shards, per_destination=True), combine)
    _gather_reduced_shards(ex, places, pos)
    return out


def _gather_reduced_shards(ex: Exchange, places: list[Values], pos: int) -> None:
    """Round two of a sharded all-reduce: every leader sends the shard it reduced (`places[pos]`)
    and copies each peer's into its place."""
    # Released at once: the peers' round-one buffers are free again before round two (a board
    # writer reuses its buffer of round one in its next collective's round one).
    ex.release()
    for q, shard in enumerate(ex.among_leaders(LEADER_ROUND + 1, places[pos])):
        if q != pos:
            for place, part in zip(places[q], shard):
                np.copyto(place, part)


def leaders_gather(ex: Exchange, mine: list[Any]) -> list[Any]:
    """Concatenated lists of every process's items (their order is not significant)."""
    topo = ex.topo
    p = len(topo.layout.leaders)
    if p == 1:
        return mine
    if p > DIRECT_MAX_PROCESSES:
        return recursive_doubling(ex, mine, lambda a, b: a + b)
    return [item for part in ex.among_leaders(LEADER_ROUND, mine) for item in part]


def leaders_exchange(ex: Exchange, payload_for: Callable[[int], Any]) -> dict[int, Any]:
    """One round in which each leader sends `payload_for(q)` to the leader of process q; the
    payloads received, by process position. (All-to-all's pairs of processes: P * (P - 1).)"""
    topo = ex.topo
    pos = topo.position
    p = len(topo.layout.leaders)
    got = ex.among_leaders(LEADER_ROUND, [None if q == pos else payload_for(q) for q in range(p)],
                           per_destination=True)
    return {q: got[q] for q in range(p) if q != pos}


# -- all-reduce ------------------------------------------------------------------------------------

def all_reduce(ex: Exchange, values: Values, combine: Combine) -> Values:
    topo = ex.topo
    if len(topo.group) == 1:
        return values
    parts = ex.gather_local(values)
    if parts is None:
        return ex.result()
    p = len(topo.layout.leaders)
    if 1 < p <= DIRECT_MAX_PROCESSES and nbytes(values) >= SMALL_BYTES and hasattr(combine, "into"):
        acc = _sharded_all_reduce(ex, parts, combine)
    else:
        acc = _board_all_reduce(ex, parts, combine) if p > 1 and hasattr(combine, "into") else None
        if acc is None:
            acc = leaders_all_reduce(ex, _reduce_pooled(ex, parts, combine), combine)
    return ex.scatter_local(None, _shared(acc, topo))


def _summed_into(parts: list[Values], combine: Combine) -> Callable[[Values], None]:
    """What fills a board buffer's views with this process's partial: its one member's operands
    copied, or every member's reduced in group order."""

    def fill(views: Values) -> None:
        if len(parts) == 1:
            for view, a in zip(views, parts[0]):
                np.copyto(view, a)
        else:
            reduce_into(views, parts, combine)

    return fill


def _board_all_reduce(ex: Exchange, parts: list[Values], combine: Combine) -> Values | None:
    """The leaders' one round on the same-node board, this process's partial summed straight into its
    board buffer (`Exchange.board_round`), then the partials summed in process order into a result
    of this process's own, and the board's buffers released at once (nothing keeps a view of them).
    The same operations in the same order as `_reduce_pooled` then `leaders_all_reduce`'s one round:
    the same bits. None when the round does not go on the board."""

    partials = ex.board_round(parts[0], _summed_into(parts, combine))
    if partials is None:
        return None
    if nbytes(parts[0]) < POOLED_BYTES:
        out = reduce_in_order(partials, combine)
    else:
        pool = pool_of(ex.fabric)
        out = reduce_into(tuple(pool.empty(v.shape, v.dtype) for v in parts[0]), partials, combine)
    ex.release()
    return out


# Blocks of the sharded all-reduce's own shard: a process's partial sum of a block stays in cache
# between being summed and being added (1 MiB: twice the L2 of the development machine's cores,
# ~30 blocks for a 64 MiB buffer on 2 processes, each a few numpy calls).
BLOCK_BYTES = 1 << 20
# Below this, a round's payloads may fit the same-node board's slots (transport/board.py, 4 MiB), which
# copy them: sending the members' shards there instead of their partial would copy more.
IN_PLACE_MIN_BYTES = 8 << 20


def _sharded_all_reduce(ex: Exchange, parts: list[Values], combine: Combine) -> Values:
    """Reduce-scatter then all-gather among the process leaders, shard q reduced by leader q in
    process order, each process's partial of it in group order.

    What leader q gets from another process is that process's partial of shard q, or, when the
    process's operands already lie in its shared-memory arena (earlier results: leased buffers,
    collectives/buffers.py), the members' shards themselves, sent in place: leader q then sums them
    in group order itself, block by block, with no partial written anywhere. The own shard's
    partial is summed the same way, straight into the result; only its place there is written.
    Same additions in the same order either way: the bits do not depend on what was sent."""
    topo = ex.topo
    p, pos = len(topo.layout.leaders), topo.position
    pool = pool_of(ex.fabric)
    out = tuple(pool.empty(v.shape, v.dtype) for v in parts[0])
    places = list(zip(*(np.array_split(o.reshape(-1), p) for o in out)))
    # member_shards[m][q]: local member m's shard q (a view of its operand).
    member_shards = [list(zip(*(np.array_split(v.reshape(-1), p) for v in part))) for part in parts]
    # (Members' shards rather than a partial: more bytes, so only where no board slot copies them.)
    in_place = (len(parts) > 1 and nbytes(parts[0]) * len(parts) > IN_PLACE_MIN_BYTES
                and all(sendable_in_place(ex.fabric, part) for part in parts))

    def payload(q: int) -> list[Values]:
        shards = [ms[q] for ms in member_shards]
        if len(shards) == 1 or in_place:
            return shards
        return [reduce_into(tuple(pool.empty(x.shape, x.dtype) for x in shards[0]), shards, combine)]

    got = ex.among_leaders(LEADER_ROUND, [None if q == pos else payload(q) for q in range(p)],
                           per_destination=True)
    got[pos] = [ms[pos] for ms in member_shards]
    reduce_specs_into(places[pos], got, combine, BLOCK_BYTES)
    del got
    _gather_reduced_shards(ex, places, pos)
    return out


# -- all-gather, reduce-scatter, all-to-all ----------------------------------------------------------

def all_gather(ex: Exchange, values: Values, dim: int) -> Values:
    """The leader copies its local members' operands into their places in the result, then sends
    those places themselves (under Ray, a leased buffer of the arena goes to a peer without another
    copy: collectives/buffers.py), and copies what the other leaders sent into theirs. On the
    same-node board, the node's members share one result (`board_all_gather`)."""
    topo = ex.topo
    n = len(topo.group)
    if n == 1:
        return values
    parts = ex.gather_local(values)
    if parts is None:
        return ex.result()
    if len(topo.layout.leaders) > 1:
        shared = board_all_gather(ex, parts, dim)
        if shared is not None:
            return ex.scatter_local(None, shared)
    pool = pool_of(ex.fabric)
    out = []
    for v in values:
        shape = list(v.shape)
        shape[dim] *= n
        out.append(pool.empty(tuple(shape), v.dtype))
    widths = [v.shape[dim] for v in values]

    def place(k: int, first: int, count: int) -> np.ndarray:
        return out[k][slot(dim, first * widths[k], (first + count) * widths[k])]

    def own() -> None:
        for i, part in zip(topo.local, parts):
            for k, x in enumerate(part):
                place(k, i, 1)[...] = x

    if len(topo.layout.leaders) > 1 and board_all_gather_raw(ex, parts, place, own):
        return ex.scatter_local(None, _shared(tuple(out), topo))
    own()
    # (first member, members, their places): one item for a run of consecutive group indices.
    mine = []
    for first, count in index_runs(topo.local):
        mine.append((first, count, tuple(place(k, first, count) for k in range(len(out)))))
    for first, count, arrays in leaders_gather(ex, mine):
        if first in topo.local:
            continue
        for k, x in enumerate(arrays):
            place(k, first, count)[...] = x
    return ex.scatter_local(None, _shared(tuple(out), topo))


def reduce_scatter(ex: Exchange, values: Values, dim: int, combine: Combine) -> Values:
    topo = ex.topo
    n = len(topo.group)
    if n == 1:
        return values
    parts = ex.gather_local(values)
    if parts is None:
        return ex.result()
    layout, pos = topo.layout, topo.position
    p = len(layout.leaders)
    if p == 1 or p > DIRECT_MAX_PROCESSES:
        acc = _reduce_pooled(ex, parts, combine)
        if p > 1:
            acc = leaders_all_reduce(ex, acc, combine)
        chunks = chunks_of(acc, n, dim)
        return ex.scatter_local([chunks[i] for i in topo.local])
    if hasattr(combine, "into"):
        mine = board_reduce_scatter(ex, parts, combine, n, dim)
        if mine is not None:
            return mine
    # Leader q receives every process's partial of its members' chunks and reduces them in process
    # order. Only the chunks other processes need are reduced into buffers of their own (sent from
    # there: leased buffers go to a peer without a copy); each local member's chunk is reduced
    # straight into its result, which then takes the other processes' partials.
    pool = pool_of(ex.fabric)
    member_chunks = [chunks_of(v, n, dim) for v in parts]

    def partial(i: int) -> Values:
        cs = [mc[i] for mc in member_chunks]
        if len(cs) == 1:
            return cs[0]
        return reduce_into(tuple(pool.empty(c.shape, c.dtype) for c in cs[0]), cs, combine)

    got = leaders_exchange(ex, lambda q: [partial(i) for i in layout.processes[q]])
    into = getattr(combine, "into", None)
    results = []
    for k, i in enumerate(topo.local):
        out = tuple(pool.empty(c.shape, c.dtype) for c in member_chunks[0][i])
        if into is not None:
            # This process's partial summed block by block on its way into the result.
            reduce_specs_into(out, [[mc[i] for mc in member_chunks] if q == pos else [got[q][k]]
                                     for q in range(p)], combine, BLOCK_BYTES)
        else:
            reduce_into(out, [partial(i) if q == pos else got[q][k] for q in range(p)], combine)
        results.append(out)
    return ex.scatter_local(results)


def _addressed(ex: Exchange, parts: list[Any], item: Callable[[Any, int], Any]) -> list[list[Any]]:
    """All-to-all's routing: `out[k][i]` is `item(parts of member i, group index of local member k)`,
    what member i addressed to local member k (from this process, or from another process's leader
    in one round: P * (P - 1) messages)."""
    topo = ex.topo
    layout, local = topo.layout, topo.local
    out: list[list[Any]] = [[None] * len(topo.group) for _ in local]
    for k_src, i_src in enumerate(local):
        for k_dst, i_dst in enumerate(local):
            out[k_dst][i_src] = item(parts[k_src], i_dst)
    if len(layout.leaders) > 1:
        got = leaders_exchange(ex, lambda q: [item(p, j) for p in parts for j in layout.processes[q]])
        for q, items in got.items():
            it = iter(items)
            for i_src in layout.processes[q]:
                for k_dst in range(len(local)):
                    out[k_dst][i_src] = next(it)
    return out


# From this size on, each local member copies its own all-to-all result together (in its own thread,
# on another core if there is one: numpy copies without the GIL) instead of its leader copying all
# of them; below, a round's payloads may still be on the board, whose views the leader then has to
# copy out before handing them on (`Exchange.settle`).
MEMBER_ASSEMBLY_MIN_BYTES = 8 << 20


# Marks (_ASSEMBLE, chunks) from the leader: the chunks a local member copies into its all-to-all
# result itself (a pair, which `Exchange.settle` rebuilds with the marker kept, copying any chunk
# still on the board).
_ASSEMBLE = object()


def _unchanging(fabric: Any, part: Values) -> bool:
    """Whether a member's operands stay as they are after it left the collective: read-only, or in
    a leased buffer (never written in place: a loop copies a view before it updates it in place).
    Only then may another member still read them after their owner went on."""
    return all(not x.flags.writeable for x in part) or sendable_in_place(fabric, part)


def all_to_all_split(ex: Exchange, values: Values, dim: int) -> Values:
    """Array form: split along `dim` into group-size chunks, chunk j to member j, written into
    each receiver's result at the sender's position."""
    topo = ex.topo
    n = len(topo.group)
    if n == 1:
        return values
    parts = ex.gather_local(values)
    if parts is None:
        got = ex.result()
        return _assembled(ex, got[1], dim) if got[0] is _ASSEMBLE else got
    chunks = [chunks_of(p, n, dim) for p in parts]
    if len(topo.layout.leaders) > 1 and nbytes(values) < MEMBER_ASSEMBLY_MIN_BYTES:
        mine = board_all_to_all(ex, chunks, dim)
        if mine is not None:
            return mine
    received = _addressed(ex, chunks, lambda chunks, j: chunks[j])
    if (len(parts) > 1 and nbytes(values) >= MEMBER_ASSEMBLY_MIN_BYTES
            and all(_unchanging(ex.fabric, part) for part in parts)):
        return _assembled(ex, ex.scatter_local([(_ASSEMBLE, r) for r in received])[1], dim)
    return ex.scatter_local([_assembled(ex, chunks_in, dim) for chunks_in in received])


def _assembled(ex: Exchange, chunks_in: list[Values], dim: int) -> Values:
    """One member's all-to-all result: the chunk from each source at its position, in a buffer of
    its pool (a leased one under Ray: sent on without a copy)."""
    pool = pool_of(ex.fabric)
    out = []
    for k, first in enumerate(chunks_in[0]):
        shape = list(first.shape)
        width = shape[dim]
        shape[dim] = width * len(chunks_in)
        o = pool.empty(tuple(shape), first.dtype)
        for source, chunk in enumerate(chunks_in):
            o[slot(dim, source * width, (source + 1) * width)] = chunk[k]
        out.append(o)
    return tuple(out)


def all_to_all_tuple(ex: Exchange, values: Values) -> Values:
    """Tuple form: operand j goes to member j; result j is what member j sent here."""
    topo = ex.topo
    if len(topo.group) == 1:
        return values
    parts = ex.gather_local(values)
    if parts is None:
        return ex.result()
    return ex.scatter_local([tuple(r) for r in _addressed(ex, parts, lambda operands, j: operands[j])])


# -- broadcast, permute ------------------------------------------------------------------------------

def collective_broadcast(ex: Exchange, value: Any) -> Any:
    """The first member of the group sends its operand to the others. It leads the first process,
    so it sends once per other process; their leaders hand the value on."""
    topo = ex.topo
    if len(topo.group) == 1:
        return value
    parts = ex.gather_local(value)
    if parts is None:
        return ex.result()
    leaders = topo.layout.leaders
    if topo.position == 0:
        result = parts[0]
        for r in leaders[1:]:
            ex.send(r, LEADER_ROUND, result)
    else:
        result = ex.recv([leaders[0]], LEADER_ROUND)[0]
    return ex.scatter_local(None, result)


def collective_permute(ex: Exchange, targets: Sequence[int], source: int | None, value: Any,
                       zeros: Callable[[], Any]) -> Any:
    """Point to point: one message per (source, target) pair, whatever the placement (through the
    same-node board to another actor of this node)."""
    ex.send_pairwise(targets, value)
    if source is None:
        return zeros()
    return ex.settle(ex.recv_pairwise(source, type(value) is np.ndarray))
