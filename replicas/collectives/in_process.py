"""The in-process level every unit shares, and the `in-process` unit (the group in one process).

The members of a group in one process meet (`Exchange.gather_local`); the one that leads holds
every local member's operands, in group order, by reference. These helpers build a process's
partial and the members' result buffers from them; with one process that is the whole collective
(the threads backend, or a job packed into one actor). Reduction order: the members' operands in
group order, ((x0 + x1) + x2) + ...
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from replicas.collectives.buffers import pool_of, sendable_in_place
from replicas.collectives.exchange import Exchange
from replicas.collectives.reduction import (
    Combine,
    Values,
    chunks_of,
    reduce_into,
    reduce_specs_into,
    slot,
)
from replicas.collectives.selector import THRESHOLDS, Algorithm, Situation, Thresholds, register
from replicas.collectives.topology import Topology


def reduce_pooled(ex: Exchange, parts: Sequence[Values], combine: Combine) -> Values:
    """`parts` reduced in order into a buffer of the pool (the part itself when it is alone)."""
    if len(parts) == 1:
        return parts[0]
    pool = pool_of(ex.fabric)
    out = tuple(pool.empty(v.shape, v.dtype) for v in parts[0])
    block = THRESHOLDS.block_bytes
    if len(parts) > 2 and hasattr(combine, "into") and max(o.nbytes for o in out) > block:
        return reduce_specs_into(out, [list(parts)], combine, block)  # the sum of a block stays in cache
    return reduce_into(out, parts, combine)  # one block: the same operations, without views of every part


def shared(values: Any, topo: Topology) -> Any:
    """`values` made read-only when several local members will hold the very same arrays."""
    if len(topo.local) > 1:
        for v in values if isinstance(values, tuple) else (values,):
            if isinstance(v, np.ndarray):
                v.setflags(write=False)
    return values


class GatherResult:
    """An all-gather's result on one leader, allocated at first use (a unit that declines before it
    writes anything allocates nothing): `place(k, first, count)` is the slot of operand k of the
    group's members first .. first + count - 1; `own()` copies the local members' operands there."""

    __slots__ = ("ex", "parts", "dim", "_out", "widths")

    def __init__(self, ex: Exchange, parts: list[Values], dim: int) -> None:
        self.ex, self.parts, self.dim = ex, parts, dim
        self.widths = [v.shape[dim] for v in parts[0]]
        self._out: Values | None = None

    @property
    def out(self) -> Values:
        if self._out is None:
            pool = pool_of(self.ex.fabric)
            n, dim = len(self.ex.topo.group), self.dim
            arrays = []
            for v in self.parts[0]:
                shape = list(v.shape)
                shape[dim] *= n
                arrays.append(pool.empty(tuple(shape), v.dtype))
            self._out = tuple(arrays)
        return self._out

    def place(self, k: int, first: int, count: int) -> np.ndarray:
        w = self.widths[k]
        return self.out[k][slot(self.dim, first * w, (first + count) * w)]

    def own(self) -> None:
        for i, part in zip(self.ex.topo.local, self.parts):
            for k, x in enumerate(part):
                self.place(k, i, 1)[...] = x


def local_addressed(topo: Topology, parts: list[Any], item: Callable[[Any, int], Any]) -> list[list[Any]]:
    """All-to-all's routing within the process: `out[k][i]` is `item(parts of member i, group index of
    local member k)` for the local members i (the other processes' entries left None)."""
    local = topo.local
    out: list[list[Any]] = [[None] * len(topo.group) for _ in local]
    for k_src, i_src in enumerate(local):
        for k_dst, i_dst in enumerate(local):
            out[k_dst][i_src] = item(parts[k_src], i_dst)
    return out


# Marks (_ASSEMBLE, chunks) from the leader: the chunks a local member copies into its all-to-all
# result itself (a pair, which `Exchange.settle` rebuilds with the marker kept, copying any chunk
# still on the board).
ASSEMBLE = object()


def _unchanging(fabric: Any, part: Values) -> bool:
    """Whether a member's operands stay as they are after it left the collective: read-only, or in
    a leased buffer (never written in place: a loop copies a view before it updates it in place).
    Only then may another member still read them after their owner went on."""
    return all(not x.flags.writeable for x in part) or sendable_in_place(fabric, part)


def hand_out_all_to_all(ex: Exchange, parts: list[Values], received: list[list[Values]], dim: int) -> Values:
    """Each local member's all-to-all result from the chunks it received (by source): assembled
    here, or from `member_assembly_min_bytes` on by each member itself (its own thread: numpy
    copies without the GIL) when the operands outlive their owners' departure."""
    if (len(parts) > 1 and sum(x.nbytes for x in parts[0]) >= THRESHOLDS.member_assembly_min_bytes
            and all(_unchanging(ex.fabric, part) for part in parts)):
        return assembled(ex, ex.scatter_local([(ASSEMBLE, r) for r in received])[1], dim)
    return ex.scatter_local([assembled(ex, chunks_in, dim) for chunks_in in received])


def assembled(ex: Exchange, chunks_in: list[Values], dim: int) -> Values:
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


# -- the unit -------------------------------------------------------------------------------------------

def _one_process(s: Situation, t: Thresholds) -> bool:
    return s.processes == 1


def _free(s: Situation, t: Thresholds) -> float:
    return 0.0


def all_reduce(ex: Exchange, parts: list[Values], combine: Combine) -> Values:
    return ex.scatter_local(None, shared(reduce_pooled(ex, parts, combine), ex.topo))


def all_gather(ex: Exchange, parts: list[Values], result: GatherResult) -> Values:
    result.own()
    return ex.scatter_local(None, shared(result.out, ex.topo))


def reduce_scatter(ex: Exchange, parts: list[Values], dim: int, combine: Combine) -> Values:
    topo = ex.topo
    chunks = chunks_of(reduce_pooled(ex, parts, combine), len(topo.group), dim)
    return ex.scatter_local([chunks[i] for i in topo.local])


def all_to_all(ex: Exchange, parts: list[Values], chunks: list[list[Values]], dim: int) -> Values:
    return hand_out_all_to_all(ex, parts, local_addressed(ex.topo, chunks, lambda c, j: c[j]), dim)


for _collective, _run in (("all-reduce", all_reduce), ("all-gather", all_gather),
                          ("reduce-scatter", reduce_scatter), ("all-to-all", all_to_all)):
    register(_collective, Algorithm("in-process", _one_process, _free, _run))
