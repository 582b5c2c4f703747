"""The `reduce-scatter + all-gather` unit of all-reduce: leader q reduces shard q of the buffer,
then every leader copies each peer's reduced shard into its place.

Two rounds among processes, each leader moving 2 (P - 1) / P of a buffer: from `small_bytes` on
(a whole partial no longer fits a board slot) this costs less than one round of whole partials.
Reduction order: shard q is reduced by leader q in process order, each process's partial of it
in group order, so the bits are those of the one-round units.
"""

from __future__ import annotations

import numpy as np

from replicas.collectives.buffers import pool_of, sendable_in_place
from replicas.collectives.exchange import Exchange
from replicas.collectives.in_process import shared
from replicas.collectives.reduction import Combine, Values, reduce_in_order, reduce_into, reduce_specs_into
from replicas.collectives.selector import THRESHOLDS, Algorithm, Situation, Thresholds, cost, register
from replicas.collectives.topology import LEADER_ROUND


def all_reduce(ex: Exchange, parts: list[Values], combine: Combine) -> Values:
    """What leader q gets from another process is that process's partial of shard q, or, when the
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
    ufunc = hasattr(combine, "into")
    # (Members' shards rather than a partial: more bytes, so only where no board slot copies them.)
    in_place = (ufunc and len(parts) > 1
                and sum(x.nbytes for x in parts[0]) * len(parts) > THRESHOLDS.in_place_min_bytes
                and all(sendable_in_place(ex.fabric, part) for part in parts))

    def payload(q: int) -> list[Values]:
        shards = [ms[q] for ms in member_shards]
        if len(shards) == 1 or in_place:
            return shards
        return [reduce_into(tuple(pool.empty(x.shape, x.dtype) for x in shards[0]), shards, combine)]

    got = ex.among_leaders(LEADER_ROUND, [None if q == pos else payload(q) for q in range(p)],
                           per_destination=True)
    got[pos] = [ms[pos] for ms in member_shards]
    if ufunc:
        reduce_specs_into(places[pos], got, combine, THRESHOLDS.block_bytes)
    else:
        reduce_into(places[pos], [reduce_in_order(spec, combine) for spec in got], combine)
    del got
    # Released at once: the peers' round-one buffers are free again before round two (a board
    # writer reuses its buffer of round one in its next collective's round one).
    ex.release()
    for q, shard in enumerate(ex.among_leaders(LEADER_ROUND + 1, places[pos])):
        if q != pos:
            for place, part in zip(places[q], shard):
                np.copyto(place, part)
    return ex.scatter_local(None, shared(out, topo))


def _applies(s: Situation, t: Thresholds) -> bool:
    return 1 < s.processes <= t.direct_max_processes and s.nbytes >= t.small_bytes


def _cost(s: Situation, t: Thresholds) -> float:
    return cost(2, 2 * (s.processes - 1) * s.nbytes / s.processes, "messages")


register("all-reduce", Algorithm("reduce-scatter + all-gather", _applies, _cost, all_reduce))
