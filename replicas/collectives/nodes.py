"""The `node leaders` unit: the leaders' step of a group spread over several nodes (hosts), in two
levels, so that each pair of nodes exchanges one transfer per step, never one per pair of
processes (all-reduce, all-gather, reduce-scatter, all-to-all).

The process leaders of a node hand their part to the node's leader (the leader of its first
process, `Layout.nodes`) as messages on the node (through the shared-memory arena: a descriptor
over the Unix socket); the node leaders exchange one message per pair of nodes over the network;
each node leader hands its node's other process leaders what they need. A buffer larger than
`Thresholds.stream_chunk_bytes` goes between node leaders as a stream of chunks sent by a thread
of their own (`Exchange.send_stream`) while the receiver reduces each chunk that arrived: the
reduction overlaps the transfer.

Rounds: `IN` (process leader -> node leader), `ACROSS` (node leader -> node leader; a stream's
first chunk, so every unit's first message across nodes is compared on the same key), `OUT`
(node leader -> process leaders), `LOCAL` (all-to-all: process leader -> process leader of the
same node, neither the node leader), `STREAM + k` (a stream's chunk k > 0).

Reduction order: in a process, group order; in a node, the processes' partials in process order;
across nodes, the nodes' partials in node order (the order of each node's first process). It
depends on the placement only, and every member gets the same bits.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replicas.collectives import landing
from replicas.collectives.buffers import pool_of
from replicas.collectives.direct import place_items
from replicas.collectives.exchange import Exchange
from replicas.collectives.forwarding import (
    handed_from,
    handed_on_board,
    on_board,
    packed_in_place,
    packed_into,
    packed_size,
    placer_of,
    published_whole,
    read_handed,
    read_whole,
    unpacked,
)
from replicas.collectives.in_process import (
    GatherResult,
    hand_out_all_to_all,
    local_addressed,
    reduce_pooled,
    shared,
)
from replicas.collectives.reduction import Combine, Values, chunks_of, reduce_into
from replicas.collectives.selector import THRESHOLDS, Algorithm, Situation, Thresholds, register
from replicas.collectives.topology import LEADER_ROUND, Topology
from replicas.transport.board import tag_of as board_tag

IN = LEADER_ROUND
ACROSS = LEADER_ROUND + 1
OUT = LEADER_ROUND + 2
LOCAL = LEADER_ROUND + 3
STREAM = LEADER_ROUND + 4
MAX_PIECES = 4096  # a stream's chunks at most (their rounds stay below `topology.RESULT`)


class _Node:
    """This process's place among the nodes: its node's processes, their leaders, the node leaders."""

    __slots__ = ("topo", "node", "processes", "is_leader", "leader", "peers", "others", "leaders")

    def __init__(self, topo: Topology) -> None:
        layout = topo.layout
        self.topo = topo
        self.node = layout.node_of_process[topo.position]
        self.processes = layout.nodes[self.node]  # positions, in process order (the first leads)
        self.is_leader = self.processes[0] == topo.position
        self.leader = layout.leaders[self.processes[0]]  # replica id of this node's leader
        self.peers = [layout.leaders[q] for q in self.processes[1:]]  # the node's other process leaders
        # Per node, in node order: its leader's replica id.
        self.leaders = [layout.leaders[procs[0]] for procs in layout.nodes]
        self.others = [m for m in range(len(layout.nodes)) if m != self.node]


def _frozen(values: Values, peers: list[int]) -> list[int]:
    """`peers`, with `values` made read-only first when there are any: every process of the node
    then holds the very same arrays (by reference on threads, in place in the arena under Ray)."""
    if peers:
        for v in values:
            v.setflags(write=False)
    return peers


def _members(topo: Topology, node: int) -> list[int]:
    """Group indices of `node`'s members, process by process in process order."""
    layout = topo.layout
    return [i for q in layout.nodes[node] for i in layout.processes[q]]


# -- all-reduce ------------------------------------------------------------------------------------

def _pieces(values: Values, count: int) -> list[Values]:
    """`values` cut into `count` pieces of about equal bytes (flat views of contiguous arrays; the
    values themselves when one piece)."""
    if count == 1:
        return [values]
    flat = [np.ascontiguousarray(v).reshape(-1) for v in values]
    cut = [np.array_split(f, count) for f in flat]
    return [tuple(c[k] for c in cut) for k in range(count)]


def _rounds(count: int) -> list[int]:
    return [_round(k) for k in range(count)]


def _across_reduced(ex: Exchange, node: _Node, partial: Values, combine: Combine) -> Values:
    """On a node leader: every node's partial reduced in node order, streamed in pieces where large
    (piece k of the others' partials is reduced while the next ones travel)."""
    pool = pool_of(ex.fabric)
    out = tuple(pool.empty(v.shape, v.dtype) for v in partial)
    total = sum(v.nbytes for v in partial)
    count = 1
    if hasattr(combine, "into"):  # an elementwise ufunc: any cut gives the same bits
        count = max(1, min(MAX_PIECES, -(-total // THRESHOLDS.stream_chunk_bytes)))
    mine = _pieces(partial, count)
    outs = _pieces(out, count)
    rounds = _rounds(count)
    peers = [node.leaders[m] for m in node.others]
    finish = ex.send_stream(peers, rounds, mine)
    for k in range(count):
        got = ex.recv(peers, rounds[k])
        got.insert(node.node, mine[k])
        reduce_into(outs[k], got, combine)
    finish()
    return out


def all_reduce(ex: Exchange, parts: list[Values], combine: Combine) -> Values:
    topo = ex.topo
    node = _Node(topo)
    acc = reduce_pooled(ex, parts, combine)
    if not node.is_leader:
        ex.send(node.leader, IN, acc)
        return ex.scatter_local(None, shared(ex.recv_one(node.leader, OUT), topo))
    partial = reduce_pooled(ex, [acc, *ex.recv(node.peers, IN)], combine) if node.peers else acc
    out = _across_reduced(ex, node, partial, combine)
    for r in _frozen(out, node.peers):
        ex.send(r, OUT, out)
    return ex.scatter_local(None, shared(out, topo))


# -- all-gather ------------------------------------------------------------------------------------

def all_gather(ex: Exchange, parts: list[Values], result: GatherResult) -> Values:
    """The node leader sends the other node leaders its node's operands as they are, one piece per
    process of the node, from a thread of its own while it copies them into its result, then copies
    the other nodes' pieces there as they arrive; then it hands its node's other processes the whole
    result (a leased buffer goes as a descriptor of where it is: the node shares one result).

    (The pieces are not received straight into the result: into its shared-memory pages the
    socket's reads ran slower than into the reader's own buffers plus a copy.)"""
    topo = ex.topo
    layout = topo.layout
    node = _Node(topo)
    if not node.is_leader:
        ex.send(node.leader, IN, [(i, 1, part) for i, part in zip(topo.local, parts)])
        return ex.scatter_local(None, shared(ex.recv_one(node.leader, OUT), topo))
    peers = [node.leaders[m] for m in node.others]
    pieces = [[(i, 1, part) for i, part in zip(topo.local, parts)], *ex.recv(node.peers, IN)]
    finish = ex.send_stream(peers, _rounds(len(pieces)), pieces)
    result.own()
    for items in pieces[1:]:
        place_items(result, items, topo.local)
    for m, r in zip(node.others, peers):
        for k in range(len(layout.nodes[m])):
            place_items(result, ex.recv_one(r, _round(k)), ())
    finish()
    out = result.out
    for r in _frozen(out, node.peers):
        ex.send(r, OUT, out)
    return ex.scatter_local(None, shared(out, topo))


def _round(k: int) -> int:
    return ACROSS if k == 0 else STREAM + k


# -- reduce-scatter --------------------------------------------------------------------------------

def reduce_scatter(ex: Exchange, parts: list[Values], dim: int, combine: Combine) -> Values:
    """The node leader reduces, chunk by chunk, the node's partial of the other nodes' members'
    chunks first and sends each other node leader its members' chunks; while they travel it reduces
    its own members' chunks, then adds the other nodes' partials in node order and hands each of its
    node's processes its members' results as soon as they are done (the leader's own last)."""
    topo = ex.topo
    layout = topo.layout
    node = _Node(topo)
    acc = reduce_pooled(ex, parts, combine)
    # Where the node's processes may, their partials and results go on the same-node board (as
    # `_route_packed`'s do): no message, no reader thread's wake-up.
    board_in, board_out = on_board(ex.fabric, node.processes), on_board(ex.fabric, node.processes[1:])
    if not node.is_leader:
        if not board_in:
            ex.send(node.leader, IN, acc)
        elif not published_whole(ex, IN, node.processes[0], [acc]):  # too large for the board
            ex.send(node.leader, IN, [acc])
        if not board_out:
            return ex.scatter_local(ex.recv_one(node.leader, OUT))
        it = iter(read_handed(ex, node.processes[0], OUT)[1][0])
        return ex.scatter_local([tuple(next(it) for _ in acc) for _ in topo.local])
    if board_in:
        partials = [acc, *(read_whole(ex, q, IN)[0] for q in node.processes[1:])]
    else:
        partials = [acc, *ex.recv(node.peers, IN)]  # the node's processes' partials, in process order
    count = len(topo.group)
    cut = [chunks_of(p, count, dim) for p in partials]
    pool = pool_of(ex.fabric)

    def node_partial(i: int) -> Values:
        return reduce_pooled(ex, [c[i] for c in cut], combine)

    peers = [node.leaders[m] for m in node.others]
    for m, r in zip(node.others, peers):
        ex.send(r, ACROSS, [node_partial(i) for i in _members(topo, m)])
    members = _members(topo, node.node)
    own = [node_partial(i) for i in members]
    got = ex.recv(peers, ACROSS)
    index = {i: j for j, i in enumerate(members)}

    def result(i: int, lent: bool = False) -> Values:
        """Member i's result; `lent`: it goes to another process of the node, so where the arena has
        room it is written into a leased block, whence it is lent in place (never copied there)."""
        j = index[i]
        specs = [g[j] for g in got]
        specs.insert(node.node, own[j])
        out = tuple(_leased(pool, c) if lent else pool.empty(c.shape, c.dtype) for c in own[j])
        return reduce_into(out, specs, combine)

    if board_out:
        handed = {q: (None, [[x for i in layout.processes[q] for x in result(i, True)]]) for q in node.processes[1:]}
        if not handed_on_board(ex, OUT, node.processes[1:], handed):
            for q, r in zip(node.processes[1:], node.peers):
                ex.send(r, OUT, handed[q])
    else:
        for q, r in zip(node.processes[1:], node.peers):
            ex.send(r, OUT, [result(i, True) for i in layout.processes[q]])
    return ex.scatter_local([result(i) for i in topo.local])


def _leased(pool: Any, like: np.ndarray) -> np.ndarray:
    """A buffer like `like` in a leased block of the arena where it has room (else the pool's)."""
    found = None if like.dtype.hasobject else pool.reused_or_leased(like.shape, like.dtype)
    return pool.empty(like.shape, like.dtype) if found is None else found


# -- all-to-all ------------------------------------------------------------------------------------

def all_to_all(ex: Exchange, parts: list[Values], chunks: list[list[Values]], dim: int) -> Values:
    """Every process's chunks for other nodes go through the node leaders: the node's processes
    hand theirs to their node leader, which sends each other node leader one bundle (what its node
    sends that node) and hands each of its processes what the others sent it. Between two processes
    of one node that are not its leader, chunks of `Thresholds.local_direct_min_bytes` or more go
    directly (a leader would copy them once more: what it forwards from another process's arena is
    not in its own); smaller ones go through the leader too, packed (`_route_packed`)."""
    topo = ex.topo
    layout = topo.layout
    node = _Node(topo)
    pos = topo.position
    local_direct = sum(c.nbytes for c in chunks[0][0]) >= THRESHOLDS.local_direct_min_bytes
    if not local_direct:
        got = _route_packed(ex, node, parts, chunks, dim)
        if type(got) is _Landed:
            return ex.scatter_local(got.results)
    elif not node.is_leader:
        # To process q: this process's members' chunks for q's members, member by member. (Lists and
        # tuples, never dicts: a message's arrays go through the node's shared memory only inside those.)
        direct = [q for q in node.processes[1:] if q != pos]
        outgoing = [None if q == pos or q in direct else _items(chunks, layout, q) for q in range(len(layout.leaders))]
        ex.send(node.leader, IN, outgoing)
        for q in direct:
            ex.send(layout.leaders[q], LOCAL, _items(chunks, layout, q))
        got = list(zip(direct, ex.recv([layout.leaders[q] for q in direct], LOCAL)))
        got.extend(ex.recv_one(node.leader, OUT))
    else:
        outgoing = [None if q == pos else _items(chunks, layout, q) for q in range(len(layout.leaders))]
        # What the other nodes send this node's other processes lands in the arena, whence it goes on
        # without a copy (collectives/forwarding.py).
        placer = placer_of(ex.fabric, ACROSS) if node.peers else None
        if placer is not None:
            placer.expect(ex.seq)
        try:
            got = _route_across(ex, node, outgoing)
        finally:
            if placer is not None:
                placer.done(ex.seq)
    out = local_addressed(topo, chunks, lambda c, j: c[j])
    for q, items in got:
        it = iter(items)
        for i_src in layout.processes[q]:
            for k_dst in range(len(topo.local)):
                out[k_dst][i_src] = next(it)
    return hand_out_all_to_all(ex, parts, out, dim)


def _items(chunks: list[list[Values]], layout: Any, q: int) -> list[Values]:
    """A process's members' chunks (`chunks`, by member then destination) for process q's members,
    member by member."""
    return [c[j] for c in chunks for j in layout.processes[q]]


def _route_packed(ex: Exchange, node: _Node, parts: list[Values], chunks: list[list[Values]],
                  dim: int) -> list[tuple[int, Any]] | _Landed:
    """Small chunks: a process hands its node leader its operands whole (one descriptor each, where
    they lie in its arena), and the leader hands each of the node's other processes what it is sent
    in three parts: its own chunks, the node's other processes' copied into one buffer of its pool,
    the other nodes' as the part of the block their bundle was received into
    (collectives/forwarding.py): a few descriptors a message instead of one per chunk, each of which
    costs both processes. What this process was sent, by source process."""
    topo = ex.topo
    layout = topo.layout
    pos = topo.position
    n = len(topo.group)
    readers = node.processes[1:]
    if not node.is_leader:
        # Its results, where its node leader can write them (collectives/landing.py).
        results = landing.result_buffers(ex, parts, dim) if on_board(ex.fabric, readers) else None
        if not (on_board(ex.fabric, node.processes)
                and published_whole(ex, IN, node.processes[0], parts, results)):
            ex.send(node.leader, IN, list(parts))
        if on_board(ex.fabric, readers):
            value = ex.read_board(node.processes[0], OUT)
        else:
            value = ex.recv_one(node.leader, OUT)
        if value is landing.LANDED:
            assert results is not None
            return _Landed(results)
        sources, packs = handed_from(ex, value)
        arrays = [a for pack in packs for a in (unpacked(pack) if type(pack) is tuple else pack)]
        return _regrouped(layout, sources, arrays, len(topo.local), len(parts[0]))
    cut = {pos: chunks}
    placer = placer_of(ex.fabric, ACROSS) if node.peers else None
    peers = [node.leaders[m] for m in node.others]
    # Where the node may land its results in place, the wire learns their places from now on: this
    # process's own first, each other's once read (collectives/landing.py).
    places: dict[int, list[Any]] = {}
    results: dict[int, Any] = {}
    if placer is not None and on_board(ex.fabric, node.processes) and landing.leading(parts[0], dim):
        pool = pool_of(ex.fabric)
        results[pos] = [tuple(pool.empty(v.shape, v.dtype) for v in part) for part in parts]
        places = {r: landing.empty_places(layout, layout.nodes[m], node.processes, len(parts[0]))
                  for m, r in zip(node.others, peers)}
        for m, r in zip(node.others, peers):
            landing.fill(places[r], layout, layout.nodes[m], node.processes, pos, results[pos], n, dim)
        placer.expect(ex.seq, targets=places)
    elif placer is not None:
        placer.expect(ex.seq, whole=True)
    try:
        if on_board(ex.fabric, node.processes):
            operands = []
            for q in readers:
                found: list[Any] = []
                operands.append(read_whole(ex, q, IN, found))
                results[q] = found[0]
                if places and found[0]:
                    for m, r in zip(node.others, peers):
                        landing.fill(places[r], layout, layout.nodes[m], node.processes, q, found[0], n, dim)
        else:
            operands = ex.recv(node.peers, IN)
        for q, theirs in zip(readers, operands):
            cut[q] = [chunks_of(v, n, dim) for v in theirs]
        if not all(results.get(q) for q in readers):
            places = {}  # a process's results are not where this one can write: the packed route
    except BaseException:
        if placer is not None:
            placer.done(ex.seq)
        raise
    try:
        # Destination by destination: each one's chunks from this node lie together where they land.
        for m, r in zip(node.others, peers):
            ex.send(r, ACROSS, [(p, q, _items(cut[p], layout, q)) for q in layout.nodes[m] for p in node.processes])
        if places:
            # The node's own chunks into every result while the transfers travel; then theirs.
            landing.copy_local(layout, node.processes, cut, results, n, dim)
            for r, bundle in zip(peers, ex.recv(peers, ACROSS)):
                landing.settle_arrived(bundle, places[r])
        else:
            arrived, local, blocks = _packed_locally(ex, node, cut, peers, placer)
    finally:
        if placer is not None:
            placer.done(ex.seq)
    if places:
        del places, cut, operands  # views of the node's arenas: their blocks serve again once released
        b = ex.fabric.shared.board
        if not b.publish(ex.topo.leader, board_tag(ex.seq, OUT), b.fingerprint_bytes(ex.fingerprint.wire),
                         landing.LANDED, tuple(readers), ex._wait_released):
            for r in node.peers:
                ex.send(r, OUT, landing.LANDED)
        return _Landed(results[pos])
    handed = {}
    for q in node.processes[1:]:
        own = [a for v in _items(chunks, layout, q) for a in v]  # lent where they lie in its arena
        remote = [a for _, items in arrived[q] for v in items for a in v]
        sources = [p for p in node.processes if p != q] + [p for p, _ in arrived[q]]
        handed[q] = (sources, [own, local[q], packed_in_place(remote, blocks) or remote])
    if not (on_board(ex.fabric, readers) and handed_on_board(ex, OUT, readers, handed)):
        for q, r in zip(readers, node.peers):
            ex.send(r, OUT, handed[q])
    return [(p, _items(cut[p], layout, pos)) for p in node.processes[1:]] + arrived[pos]


def _packed_locally(ex: Exchange, node: _Node, cut: dict[int, Any], peers: list[int], placer: Any) -> tuple:
    """On a node leader, the packed route: the node's other processes' chunks for each other one
    packed into one buffer (they lie in their arenas, not this one's), then the other nodes'
    transfers received. (what arrived, by destination process; the packs; the placer's blocks)"""
    layout = ex.topo.layout
    pool = pool_of(ex.fabric)
    local = {}
    for q in node.processes[1:]:
        arrays = [a for p in node.processes[1:] if p != q for v in _items(cut[p], layout, q) for a in v]
        local[q] = packed_into(pool.empty((packed_size(arrays),), np.dtype(np.uint8)), arrays) if arrays else []
    arrived: dict[int, list[tuple[int, list[Values]]]] = {q: [] for q in node.processes}
    for bundle in ex.recv(peers, ACROSS):
        for p, q, items in bundle:
            arrived[q].append((p, items))
    blocks = placer.take(ex.seq) if placer is not None else []
    return arrived, local, blocks


class _Landed:
    """What `_route_packed` returns where the results were written in place (collectives/landing.py):
    this process's, one tuple per local member."""

    __slots__ = ("results",)

    def __init__(self, results: list[Values]) -> None:
        self.results = results


def _regrouped(layout: Any, sources: list[int], arrays: list[np.ndarray], members: int,
               operands: int) -> list[tuple[int, list[Values]]]:
    """`_items` of each source process for this one, from their arrays in order."""
    it = iter(arrays)
    return [(p, [tuple(next(it) for _ in range(operands)) for _ in range(len(layout.processes[p]) * members)])
            for p in sources]


def _route_across(ex: Exchange, node: _Node, outgoing: list[Any]) -> list[tuple[int, Any]]:
    """On a node leader: the node's processes' chunks exchanged with the other node leaders and
    handed to the node's other processes (which exchanged their chunks among themselves); what this
    process was sent, by source process."""
    layout = ex.topo.layout
    pos = ex.topo.position
    sent = {pos: outgoing}
    for q, items in zip(node.processes[1:], ex.recv(node.peers, IN)):
        sent[q] = items
    peers = [node.leaders[m] for m in node.others]
    for m, r in zip(node.others, peers):
        ex.send(r, ACROSS, [(p, q, sent[p][q]) for p in node.processes for q in layout.nodes[m]])
    # Within the node what this process sends or is sent.
    arrived = [(p, q, sent[p][q]) for p in node.processes for q in node.processes if p != q and pos in (p, q)]
    for bundle in ex.recv(peers, ACROSS):
        arrived.extend(bundle)
    for q, r in zip(node.processes[1:], node.peers):
        ex.send(r, OUT, [(p, items) for p, q2, items in arrived if q2 == q])
    return [(p, items) for p, q2, items in arrived if q2 == pos]


# -- the unit ------------------------------------------------------------------------------------------

def _applies(s: Situation, t: Thresholds) -> bool:
    return 1 < s.nodes <= t.direct_max_processes


def _cost(s: Situation, t: Thresholds) -> float:
    return -1.0  # across nodes, always first (see the selector's docstring)


for _collective, _run in (("all-reduce", all_reduce), ("all-gather", all_gather),
                          ("reduce-scatter", reduce_scatter), ("all-to-all", all_to_all)):
    register(_collective, Algorithm("node leaders", _applies, _cost, _run))
