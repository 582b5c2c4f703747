"""The `board round` unit: the leaders' one round on the same-node board (`Exchange.board_round`),
for all-reduce, all-gather, reduce-scatter and all-to-all.

Each leader writes its process's part straight into its board buffer as raw arrays (no pickled
list): an all-reduce's partial is summed there, an all-gather's operands, an all-to-all's chunks
and a reduce-scatter's partials for the other processes are copied there and nowhere else. It
builds its members' results in buffers of its pool straight from its operands and the peers'
buffers, and releases the board at once (no result keeps a view of it, so nothing is settled); an
all-gather of results leased from the actors' arenas writes one result the node's members share
instead. Applies where every leader is an actor of this node (at most `board_readers` of them);
declines, with nothing done, when the layout does not fit a buffer (or an all-gather's result
cannot be leased and is too large for the board), and the next unit (`direct`) runs: the same
operations in the same order, so the same bits.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replicas.caching import Cache
from replicas.collectives.buffers import MIN_BYTES as POOLED_BYTES
from replicas.collectives.buffers import pool_of
from replicas.collectives.exchange import Exchange
from replicas.collectives.in_process import GatherResult, shared
from replicas.collectives.reduction import (
    Combine,
    Values,
    copy_all,
    index_runs,
    reduce_in_order,
    reduce_into,
    slot,
)
from replicas.collectives.selector import (
    DECLINED,
    THRESHOLDS,
    Algorithm,
    Situation,
    Thresholds,
    cost,
    register,
)
from replicas.collectives.topology import Topology


def board_all_gather(ex: Exchange, parts: list[Values], dim: int) -> Values | None:
    """The leaders' round on the same-node board, into one result the whole node shares (read-only):
    the leader of the first process copies its members' operands (group order, operands in order)
    into their places in a result of its pool and, when that lies in leased blocks of its arena
    (collectives/buffers.py), publishes where, one release word per reader; every other leader
    copies its members' operands straight into their places there and publishes that it did; each
    leader hands the result on once every leader published. A reader's views of the result release
    its words when they are garbage (`Inbox.array`), and the block serves again only then. When the
    first process's result is not in its arena, every leader publishes its parts themselves and
    copies the others' into a result of its own.

    Per node at 1 MiB on 2 processes of 2: 4 MiB written once (it was 12 MiB: the board, then each
    process's own result), the second half while the first process waits. None, with nothing done,
    when the round does not go on the board or the results would not be leased (results under
    `buffers.MIN_BYTES`: `board_all_gather_raw`; or over `Thresholds.shared_results`' bound)."""
    topo = ex.topo
    fabric = ex.fabric
    pos, n = topo.position, len(topo.group)
    first = parts[0]
    # Results the pools lease from the arenas (every actor on the node has one or none), and a few at a
    # time (`Thresholds.shared_results`): the same decision on every leader, the shapes agree.
    shared = fabric.shared
    outbox = shared.outbox if shared is not None else None
    if (outbox is None or shared.inbox is None
            or any(x.nbytes * n < POOLED_BYTES or x.dtype.hasobject for x in first)
            or sum(x.nbytes for x in first) * n > outbox.capacity // THRESHOLDS.shared_results
            or not ex.leaders_share_board()):
        return None
    widths = [x.shape[dim] for x in first]
    shapes = [(tuple(n * s if d == dim else s for d, s in enumerate(x.shape)), x.dtype) for x in first]
    runs = index_runs(topo.local)

    def runs_of(arrays: Values, runs: list[tuple[int, int]]) -> list[Values]:
        return [tuple(x[slot(dim, f * w, (f + c) * w)] for x, w in zip(arrays, widths)) for f, c in runs]

    def write_own(out: Values) -> None:
        for i, part in zip(topo.local, parts):
            for x, w, v in zip(out, widths, part):
                np.copyto(x[slot(dim, i * w, (i + 1) * w)], v)

    def own_result() -> Values:
        pool = pool_of(fabric)
        out = tuple(pool.empty(shape, dtype) for shape, dtype in shapes)
        write_own(out)
        return out

    def copy_in(out: Values, their_runs: list[tuple[int, int]], items: list[Values]) -> None:
        copy_all([x for here in runs_of(out, their_runs) for x in here], [x for part in items for x in part])

    others = topo.other_positions
    if pos == 0:
        out = own_result()
        lent = _lent(outbox, out, others, len(topo.layout.leaders))
        # Plain numbers (a descriptor's pickle costs far more), or the parts themselves.
        ex.publish_on_board((runs, outbox.name, lent) if lent is not None else (runs, None, runs_of(out, runs)))
        for q in others:
            their_runs, _, items = ex.read_board(q)
            if lent is None:
                copy_in(out, their_runs, items)
    else:
        their_runs, segment, items = ex.read_board(0)
        if segment is not None:  # the first process's result: this process's parts go there
            out = tuple(shared.inbox.lent(segment, where[pos], shape, dtype, writable=True)
                        for where, (shape, dtype) in zip(items, shapes))
            write_own(out)
            ex.publish_on_board((runs, None, None))
            for q in others:
                if q:
                    ex.read_board(q)  # its parts are in the result too
        else:
            out = own_result()
            copy_in(out, their_runs, items)
            ex.publish_on_board((runs, None, runs_of(out, runs)))
            for q in others:
                if q:
                    their_runs, _, items = ex.read_board(q)
                    copy_in(out, their_runs, items)
        del items
    ex.release()
    for x in out:
        x.flags.writeable = False  # the node's members share it
    return out


def board_all_gather_raw(ex: Exchange, parts: list[Values], result: GatherResult) -> bool:
    """The leaders' round on the same-node board for results too small to lease: each leader copies
    its members' operands (group order, operands in order) into its board buffer, its own members'
    into their places in the result while the peers write theirs (`result.own`), then each peer's
    straight from the peer's buffer into their places, and releases the board at once (the result
    keeps no view of it). No list is pickled, nothing is settled. False, with nothing done, when the
    round does not go on the board."""
    topo = ex.topo
    processes = topo.layout.processes
    flat = [x for part in parts for x in part]
    layout = tuple((x.dtype, x.shape) for x in flat)
    got = ex.board_round(None, lambda views: copy_all(views, flat), layout=layout, meanwhile=result.own)
    if got is None:
        return False
    width = len(parts[0])
    place = result.place
    for q, views in enumerate(got):
        if q == topo.position:
            continue
        for j, i in enumerate(processes[q]):
            for k in range(width):
                np.copyto(place(k, i, 1), views[j * width + k])
    ex.release()
    return True


def _lent(outbox: Any, out: Values, readers: tuple[int, ...], p: int) -> list[list[Any]] | None:
    """Per result array, per process position, where the array lies in this actor's arena, lent to
    that reader ((offset, slot, start), None at the others); None, with nothing lent, unless every
    one could be."""
    refs: list[list[Any]] = []
    for x in out:
        per: list[Any] = [None] * p
        for q in readers:
            ref = outbox.lend(x)
            if ref is None:
                for taken in (r for row in [*refs, per] for r in row if r is not None):
                    outbox.give_back(taken)
                return None
            per[q] = ref
        refs.append(per)
    return refs


def board_all_to_all(ex: Exchange, chunks: list[list[Values]], dim: int) -> Values | None:
    """The leaders' round on the same-node board, each chunk written once on its way and the results
    assembled in place: each leader copies, for every other process q in process order, each local
    member's chunks addressed to q's members (source in group order, then destination, then operand)
    into its board buffer; then builds each local member's result in a buffer of its pool, the local
    sources' chunks copied from their operands while the peers write theirs (`meanwhile`), the other
    processes' straight from their board buffers (the other local members' results first, handed on
    by `Exchange.scatter_local` before this one's is complete); and releases the board at once (no
    view kept, no list pickled, nothing settled). This member's result; None, with nothing done, when
    the round does not go on the board."""
    topo = ex.topo
    layout, pos, local = topo.layout, topo.position, topo.local
    processes = layout.processes
    p = len(processes)
    sent = [x for q in range(p) if q != pos for c in chunks for j in processes[q] for x in c[j]]
    first = chunks[0][0]
    width = len(first)
    pool = pool_of(ex.fabric)
    n = len(topo.group)
    outs: list[tuple[np.ndarray, ...]] = []
    for _ in local:
        member = []
        for x in first:
            shape = list(x.shape)
            shape[dim] *= n
            member.append(pool.empty(tuple(shape), x.dtype))
        outs.append(tuple(member))
    widths = [x.shape[dim] for x in first]

    def place(k_dst: int, i_src: int, o: int) -> np.ndarray:
        return outs[k_dst][o][slot(dim, i_src * widths[o], (i_src + 1) * widths[o])]

    def own() -> None:
        for k_src, i_src in enumerate(local):
            for k_dst, i_dst in enumerate(local):
                for o, x in enumerate(chunks[k_src][i_dst]):
                    np.copyto(place(k_dst, i_src, o), x)

    got = ex.board_round(None, lambda views: copy_all(views, sent),
                         layout=tuple((x.dtype, x.shape) for x in sent), meanwhile=own)
    if got is None:
        return None
    # Process q wrote its blocks for the other processes in process order, the block for process r
    # of len(processes[q]) x len(processes[r]) x width arrays (source, then destination, then
    # operand): ours follows those before it.
    starts = {q: sum(len(processes[r]) for r in range(pos) if r != q) * len(processes[q]) * width
              for q in range(p) if q != pos}
    m = len(local)

    def receive(k_dst: int) -> None:
        for q, at in starts.items():
            views = got[q]
            for s, i_src in enumerate(processes[q]):
                for o in range(width):
                    np.copyto(place(k_dst, i_src, o), views[at + (s * m + k_dst) * width + o])

    # The other local members' results first, handed on at once: a woken member takes the GIL while
    # this thread copies its own part (numpy releases it), instead of after.
    rank = topo.rank
    for k in range(m):
        if k != rank:
            receive(k)
    mine = ex.scatter_local(outs, settled=True)
    receive(rank)
    ex.release()
    return mine


class _ScatterPlan:
    """What a reduce-scatter's board round needs that depends only on the member's topology and
    the operands' layout: computed once, not per call (Python work a leader would otherwise repeat
    on every call)."""

    __slots__ = ("wanted", "cuts", "shapes", "layout", "reads")

    def __init__(self, topo: Topology, first: Values, n: int, dim: int) -> None:
        pos, local, processes = topo.position, topo.local, topo.layout.processes
        width = len(first)
        widths = [v.shape[dim] // n for v in first]
        # Chunk i of every operand: its slices.
        self.cuts = [tuple(slot(dim, i * w, (i + 1) * w) for w in widths) for i in range(n)]
        shapes = []
        for v, w in zip(first, widths):
            shape = list(v.shape)
            shape[dim] = w
            shapes.append((tuple(shape), v.dtype))
        self.shapes = tuple(shapes)
        # The chunks the other processes' members get, in the board buffer's order: per other
        # process in process order, its members in group order.
        self.wanted = tuple(i for q in range(len(processes)) if q != pos for i in processes[q])
        self.layout = tuple((dtype, shape) for shape, dtype in shapes) * len(self.wanted)
        # Per local member k, per process q: where process q's partial of k's chunk is in q's buffer
        # (None for this process). Process q wrote its partials for the other processes' members in
        # process order: the ones for this process's members follow those before it, in local order.
        self.reads = tuple(tuple(None if q == pos else
                                 (sum(len(processes[r]) for r in range(pos) if r != q) + k) * width
                                 for q in range(len(processes)))
                           for k in range(len(local)))


# A topology per member and placement: a pooled actor sees new ones per job.
_plans: Cache[_ScatterPlan] = Cache("reduce-scatter board plans", 256)


def _plan(topo: Topology, first: Values, n: int, dim: int) -> _ScatterPlan:
    key = (topo, n, dim, *((v.dtype, v.shape) for v in first))
    plan = _plans.get(key)
    if plan is None:
        plan = _plans.put(key, _ScatterPlan(topo, first, n, dim))
    return plan


def board_reduce_scatter(ex: Exchange, parts: list[Values], combine: Combine, n: int, dim: int) -> Values | None:
    """Each leader publishes, for every other process q in process order, the partial (its members'
    chunks reduced in group order) of each of q's members' chunks, and nothing else; while the peers
    write theirs, it sums its own members' chunks straight into their results (`meanwhile`), then
    adds the peers' partials in process order. Chunk i of a partial is the partial of the chunks i
    (elementwise): the same operations in the same order as the messages' path, so the same bits.
    Hands the other local members their results (`Exchange.scatter_local`) and returns this one's.

    Per leader and call at 1 MiB on 2 processes of 2: 1 MiB of operands read and 512 KiB written for
    the peer, the results written once (it used to publish its whole partial: 2 MiB read and 1 MiB
    written into the board, then the results summed from it again). A handful of numpy calls per
    chunk of another process's member and per local member, no split of the operands."""
    topo = ex.topo
    pos = topo.position
    first = parts[0]
    width = len(first)
    plan = _plan(topo, first, n, dim)
    cuts = plan.cuts

    def fill(views: Values) -> None:
        for j, i in enumerate(plan.wanted):
            out = views[j * width:(j + 1) * width]
            cut = cuts[i]
            if len(parts) == 1:
                copy_all(out, [x[c] for x, c in zip(first, cut)])
            else:
                reduce_into(out, [tuple(x[c] for x, c in zip(part, cut)) for part in parts], combine)

    pool = pool_of(ex.fabric)
    results = [tuple(pool.empty(shape, dtype) for shape, dtype in plan.shapes) for _ in topo.local]
    # This process's partial of each local member's chunk: in its result where the result's first
    # sum may overwrite it (process position 0 or 1), else in a scratch buffer; a lone member's
    # chunk is its operand's view (nothing to sum).
    partials: list[Values] = []

    def own() -> None:
        for i, out in zip(topo.local, results):
            cut = cuts[i]
            mine = [tuple(x[c] for x, c in zip(part, cut)) for part in parts]
            if len(mine) == 1:
                partials.append(mine[0])
                continue
            into = out if pos <= 1 else tuple(pool.empty(shape, dtype) for shape, dtype in plan.shapes)
            partials.append(reduce_into(into, mine, combine))

    got = ex.board_round(None, fill, layout=plan.layout, meanwhile=own)
    if got is None:
        return None
    into_, accumulate = combine.into, combine.accumulate  # type: ignore[attr-defined]

    def finish(k: int) -> None:
        out = results[k]
        terms = [partials[k] if at is None else got[q][at:at + width] for q, at in enumerate(plan.reads[k])]
        if terms[0] is not out:
            into_(out, terms[0], terms[1])  # out may be terms[1] (position 1): elementwise, in place
        else:
            accumulate(out, terms[1])
        for term in terms[2:]:
            accumulate(out, term)

    # The other members' results first, handed on at once: a woken member takes the GIL while this
    # thread sums its own result (numpy releases it), instead of after.
    rank = topo.rank
    for k in range(len(results)):
        if k != rank:
            finish(k)
    mine = ex.scatter_local(results, settled=True)
    finish(rank)
    ex.release()  # the results are this process's own: the peers may reuse their buffers
    return mine


def _summed_into(parts: list[Values], combine: Combine) -> Any:
    """What fills a board buffer's views with this process's partial: its one member's operands
    copied, or every member's reduced in group order."""

    def fill(views: Values) -> None:
        if len(parts) == 1:
            for view, a in zip(views, parts[0]):
                np.copyto(view, a)
        else:
            reduce_into(views, parts, combine)

    return fill


def board_all_reduce(ex: Exchange, parts: list[Values], combine: Combine) -> Values | None:
    """This process's partial summed straight into its board buffer (`Exchange.board_round`), then
    the partials summed in process order into a result of this process's own, and the board's
    buffers released at once (nothing keeps a view of them). The same operations in the same order
    as the `direct` unit's: the same bits. None when the round does not go on the board."""
    partials = ex.board_round(parts[0], _summed_into(parts, combine))
    if partials is None:
        return None
    if sum(x.nbytes for x in parts[0]) < POOLED_BYTES:
        out = reduce_in_order(partials, combine)
    else:
        pool = pool_of(ex.fabric)
        out = reduce_into(tuple(pool.empty(v.shape, v.dtype) for v in parts[0]), partials, combine)
    ex.release()
    return out


# -- the unit -------------------------------------------------------------------------------------------

def _all_reduce(ex: Exchange, parts: list[Values], combine: Combine) -> Any:
    acc = board_all_reduce(ex, parts, combine)
    return DECLINED if acc is None else ex.scatter_local(None, shared(acc, ex.topo))


def _all_gather(ex: Exchange, parts: list[Values], result: GatherResult) -> Any:
    one = board_all_gather(ex, parts, result.dim)
    if one is not None:
        return ex.scatter_local(None, one)
    if board_all_gather_raw(ex, parts, result):
        return ex.scatter_local(None, shared(result.out, ex.topo))
    return DECLINED


def _reduce_scatter(ex: Exchange, parts: list[Values], dim: int, combine: Combine) -> Any:
    mine = board_reduce_scatter(ex, parts, combine, len(ex.topo.group), dim)
    return DECLINED if mine is None else mine


def _all_to_all(ex: Exchange, parts: list[Values], chunks: list[list[Values]], dim: int) -> Any:
    mine = board_all_to_all(ex, chunks, dim)
    return DECLINED if mine is None else mine


def _on_board(s: Situation, t: Thresholds) -> bool:
    return s.processes > 1 and s.board


def _one_round(s: Situation, t: Thresholds) -> float:
    return cost(1, (s.processes - 1) * s.nbytes, "board")


register("all-reduce", Algorithm(
    "board round", lambda s, t: _on_board(s, t) and s.ufunc and s.nbytes < t.small_bytes, _one_round, _all_reduce))
register("all-gather", Algorithm("board round", _on_board, _one_round, _all_gather))
register("reduce-scatter", Algorithm(
    "board round", lambda s, t: _on_board(s, t) and s.ufunc and s.processes <= t.direct_max_processes,
    _one_round, _reduce_scatter))
register("all-to-all", Algorithm(
    "board round", lambda s, t: _on_board(s, t) and s.nbytes < t.member_assembly_min_bytes, _one_round, _all_to_all))
