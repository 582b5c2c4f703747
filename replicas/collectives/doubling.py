"""The `recursive doubling` unit: log2(P) rounds of one message per leader, for groups spread over
more than `direct_max_processes` processes (a direct round's P (P - 1) messages grow too fast).

Reduction order: partials combined pairwise, lower process position first, in a binary tree;
processes beyond the largest power of two first fold into process `pos - 2**m`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from replicas.collectives.direct import place_items
from replicas.collectives.exchange import Exchange
from replicas.collectives.in_process import GatherResult, reduce_pooled, shared
from replicas.collectives.reduction import Combine, Values, chunks_of, index_runs
from replicas.collectives.selector import Algorithm, Situation, Thresholds, cost, register
from replicas.collectives.topology import LEADER_ROUND


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


def all_reduce(ex: Exchange, parts: list[Values], combine: Combine) -> Values:
    acc = recursive_doubling(ex, reduce_pooled(ex, parts, combine), combine)
    return ex.scatter_local(None, shared(acc, ex.topo))


def all_gather(ex: Exchange, parts: list[Values], result: GatherResult) -> Values:
    topo = ex.topo
    result.own()
    width = len(parts[0])
    mine = [(first, count, tuple(result.place(k, first, count) for k in range(width)))
            for first, count in index_runs(topo.local)]
    place_items(result, recursive_doubling(ex, mine, lambda a, b: a + b), topo.local)
    return ex.scatter_local(None, shared(result.out, topo))


def reduce_scatter(ex: Exchange, parts: list[Values], dim: int, combine: Combine) -> Values:
    """The whole buffer all-reduced, then each member's chunk cut from it."""
    topo = ex.topo
    acc = recursive_doubling(ex, reduce_pooled(ex, parts, combine), combine)
    chunks = chunks_of(acc, len(topo.group), dim)
    return ex.scatter_local([chunks[i] for i in topo.local])


def _applies(s: Situation, t: Thresholds) -> bool:
    return s.processes > t.direct_max_processes


def _cost(s: Situation, t: Thresholds) -> float:
    rounds = (s.processes - 1).bit_length()
    return cost(rounds, rounds * s.nbytes, "messages")


for _collective, _run in (("all-reduce", all_reduce), ("all-gather", all_gather),
                          ("reduce-scatter", reduce_scatter)):
    register(_collective, Algorithm("recursive doubling", _applies, _cost, _run))
