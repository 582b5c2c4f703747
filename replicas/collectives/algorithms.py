"""The collectives over an `Exchange`: the process's members meet, the one that leads runs the unit
the selector chose for the leaders' step (`collectives/selector.py`), and hands every local member
its result.

Values are tuples of numpy arrays (one per operand); operands and received arrays are never
modified (they may be read-only, or another replica's); a result shared by several members of a
process is made read-only, so no member can change what the others see.

Reduction order (all-reduce, reduce-scatter), fixed whatever the timing or the unit, so every
member gets bitwise the same result on every run of the same placement:
- in a process, the members' operands in group order: ((x0 + x1) + x2) + ...;
- across processes, those partial results in process order (the order of each process's first
  member in the group): p0 + p1 + ... when there are at most `Thresholds.direct_max_processes`
  processes (one round, or reduce-scatter + all-gather: each shard is still reduced in process
  order); with more processes, recursive doubling: partials are combined pairwise, lower process
  position first, in a binary tree (processes beyond the largest power of two first fold into
  process `pos - 2**m`);
- across nodes (hosts, `Fabric.nodes`; 2 to `direct_max_processes` of them), the partials of one
  node's processes in process order, then those of the nodes in node order (`nodes.py`).
On one process (the threads backend, or a job packed into one actor) this is the group order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

# The units register themselves with the selector when imported (the order breaks cost ties).
from replicas.collectives import board_round, doubling, in_process, nodes, sharded  # noqa: F401
from replicas.collectives.direct import addressed
from replicas.collectives.exchange import Exchange
from replicas.collectives.in_process import ASSEMBLE, GatherResult, assembled
from replicas.collectives.reduction import Combine, Values, chunks_of
from replicas.collectives.selector import DECLINED
from replicas.collectives.topology import LEADER_ROUND

__all__ = ["Combine", "Values", "all_gather", "all_reduce", "all_to_all_split", "all_to_all_tuple",
           "collective_broadcast", "collective_permute", "reduce_scatter"]


def _lead(ex: Exchange, units: tuple, parts: list[Any], *args: Any) -> Any:
    """Run the first of `units` that takes the call; its name becomes `ex.algorithm`."""
    for unit in units:
        out = unit.run(ex, parts, *args)
        if out is not DECLINED:
            ex.algorithm = unit.name
            return out
    raise AssertionError(f"every unit declined: {[u.name for u in units]}")


def _nbytes(values: Values) -> int:
    return sum(v.nbytes for v in values)


def all_reduce(ex: Exchange, values: Values, combine: Combine) -> Values:
    if len(ex.topo.group) == 1:
        return values
    units = ex.plan("all-reduce", _nbytes(values), hasattr(combine, "into"))
    parts = ex.gather_local(values)
    if parts is None:
        return ex.result()
    return _lead(ex, units, parts, combine)


def all_gather(ex: Exchange, values: Values, dim: int) -> Values:
    """On the same-node board the node's members may share one result (`board_round`)."""
    if len(ex.topo.group) == 1:
        return values
    units = ex.plan("all-gather", _nbytes(values), False)
    parts = ex.gather_local(values)
    if parts is None:
        return ex.result()
    return _lead(ex, units, parts, GatherResult(ex, parts, dim))


def reduce_scatter(ex: Exchange, values: Values, dim: int, combine: Combine) -> Values:
    if len(ex.topo.group) == 1:
        return values
    units = ex.plan("reduce-scatter", _nbytes(values), hasattr(combine, "into"))
    parts = ex.gather_local(values)
    if parts is None:
        return ex.result()
    return _lead(ex, units, parts, dim, combine)


def all_to_all_split(ex: Exchange, values: Values, dim: int) -> Values:
    """Array form: split along `dim` into group-size chunks, chunk j to member j, written into
    each receiver's result at the sender's position."""
    n = len(ex.topo.group)
    if n == 1:
        return values
    units = ex.plan("all-to-all", _nbytes(values), False)
    parts = ex.gather_local(values)
    if parts is None:
        got = ex.result()
        return assembled(ex, got[1], dim) if got[0] is ASSEMBLE else got
    return _lead(ex, units, parts, [chunks_of(p, n, dim) for p in parts], dim)


def all_to_all_tuple(ex: Exchange, values: Values) -> Values:
    """Tuple form: operand j goes to member j; result j is what member j sent here."""
    if len(ex.topo.group) == 1:
        return values
    ex.algorithm = "direct"
    parts = ex.gather_local(values)
    if parts is None:
        return ex.result()
    return ex.scatter_local([tuple(r) for r in addressed(ex, parts, lambda operands, j: operands[j])])


def collective_broadcast(ex: Exchange, value: Any) -> Any:
    """The first member of the group sends its operand to the others. It leads the first process,
    so it sends once per other process; their leaders hand the value on."""
    topo = ex.topo
    if len(topo.group) == 1:
        return value
    ex.algorithm = "direct"
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
    ex.algorithm = "pairwise"
    ex.send_pairwise(targets, value)
    if source is None:
        return zeros()
    return ex.settle(ex.recv_pairwise(source, type(value) is np.ndarray))
