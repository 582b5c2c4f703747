"""The `direct` unit: one round in which every process leader sends its part to every other
(`Exchange.among_leaders`: through the same-node board as a published payload where the leaders
share it, else as fabric messages), for all-reduce, all-gather, reduce-scatter and all-to-all;
and all-to-all's routing, which the tuple form and ragged-all-to-all use too.

P (P - 1) messages a round, so it applies up to `direct_max_processes` processes (all-to-all,
whose pairs of processes must all exchange anyway: any number). Reduction order: each process's
partial in group order (`in_process`), the partials in process order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from replicas.collectives.buffers import MIN_BYTES as POOLED_BYTES
from replicas.collectives.buffers import pool_of
from replicas.collectives.exchange import Exchange
from replicas.collectives.in_process import (
    GatherResult,
    hand_out_all_to_all,
    local_addressed,
    reduce_pooled,
    shared,
)
from replicas.collectives.reduction import (
    Combine,
    Values,
    chunks_of,
    index_runs,
    reduce_in_order,
    reduce_into,
    reduce_specs_into,
)
from replicas.collectives.selector import THRESHOLDS, Algorithm, Situation, Thresholds, cost, register
from replicas.collectives.topology import LEADER_ROUND


def leaders_exchange(ex: Exchange, payload_for: Callable[[int], Any]) -> dict[int, Any]:
    """One round in which each leader sends `payload_for(q)` to the leader of process q; the
    payloads received, by process position. (All-to-all's pairs of processes: P * (P - 1).)"""
    topo = ex.topo
    pos = topo.position
    p = len(topo.layout.leaders)
    got = ex.among_leaders(LEADER_ROUND, [None if q == pos else payload_for(q) for q in range(p)],
                           per_destination=True)
    return {q: got[q] for q in range(p) if q != pos}


def addressed(ex: Exchange, parts: list[Any], item: Callable[[Any, int], Any]) -> list[list[Any]]:
    """All-to-all's routing: `out[k][i]` is `item(parts of member i, group index of local member k)`,
    what member i addressed to local member k (from this process, or from another process's leader
    in one round: P * (P - 1) messages)."""
    topo = ex.topo
    layout, local = topo.layout, topo.local
    out = local_addressed(topo, parts, item)
    if len(layout.leaders) > 1:
        got = leaders_exchange(ex, lambda q: [item(p, j) for p in parts for j in layout.processes[q]])
        for q, items in got.items():
            it = iter(items)
            for i_src in layout.processes[q]:
                for k_dst in range(len(local)):
                    out[k_dst][i_src] = next(it)
    return out


def all_reduce(ex: Exchange, parts: list[Values], combine: Combine) -> Values:
    acc = reduce_pooled(ex, parts, combine)
    partials = ex.among_leaders(LEADER_ROUND, acc)
    if sum(x.nbytes for x in acc) < POOLED_BYTES or not hasattr(combine, "into"):
        out = reduce_in_order(partials, combine)
    else:
        out = reduce_pooled(ex, partials, combine)  # a fresh buffer of a few MiB would be fresh pages
    return ex.scatter_local(None, shared(out, ex.topo))


def all_gather(ex: Exchange, parts: list[Values], result: GatherResult) -> Values:
    """The leader copies its local members' operands into their places in the result, then sends
    those places themselves (under Ray, a leased buffer of the arena goes to a peer without another
    copy: collectives/buffers.py), and copies what the other leaders sent into theirs."""
    topo = ex.topo
    result.own()
    # (first member, members, their places): one item for a run of consecutive group indices.
    width = len(parts[0])
    mine = [(first, count, tuple(result.place(k, first, count) for k in range(width)))
            for first, count in index_runs(topo.local)]
    for part in ex.among_leaders(LEADER_ROUND, mine):
        place_items(result, part, topo.local)
    return ex.scatter_local(None, shared(result.out, topo))


def place_items(result: GatherResult, items: list[Any], local: tuple[int, ...]) -> None:
    """Copy another process's (first, count, arrays) items of an all-gather into their places."""
    for first, count, arrays in items:
        if first in local:
            continue
        for k, x in enumerate(arrays):
            result.place(k, first, count)[...] = x


def reduce_scatter(ex: Exchange, parts: list[Values], dim: int, combine: Combine) -> Values:
    """Leader q receives every process's partial of its members' chunks and reduces them in process
    order. Only the chunks other processes need are reduced into buffers of their own (sent from
    there: leased buffers go to a peer without a copy); each local member's chunk is reduced
    straight into its result, which then takes the other processes' partials."""
    topo = ex.topo
    layout, pos = topo.layout, topo.position
    p, n = len(layout.leaders), len(topo.group)
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
                                     for q in range(p)], combine, THRESHOLDS.block_bytes)
        else:
            reduce_into(out, [partial(i) if q == pos else got[q][k] for q in range(p)], combine)
        results.append(out)
    return ex.scatter_local(results)


def all_to_all(ex: Exchange, parts: list[Values], chunks: list[list[Values]], dim: int) -> Values:
    return hand_out_all_to_all(ex, parts, addressed(ex, chunks, lambda c, j: c[j]), dim)


# -- the unit -------------------------------------------------------------------------------------------

def _few(s: Situation, t: Thresholds) -> bool:
    return 1 < s.processes <= t.direct_max_processes


def _one_round(s: Situation, t: Thresholds) -> float:
    return cost(1, (s.processes - 1) * s.nbytes, "messages")


register("all-reduce", Algorithm("direct", lambda s, t: _few(s, t) and s.nbytes < t.small_bytes,
                                 _one_round, all_reduce))
register("all-gather", Algorithm("direct", _few, _one_round, all_gather))
register("reduce-scatter", Algorithm("direct", _few, _one_round, reduce_scatter))
register("all-to-all", Algorithm("direct", lambda s, t: s.processes > 1, _one_round, all_to_all))
