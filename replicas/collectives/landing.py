"""An all-to-all's small chunks across nodes landed where they end (`collectives/nodes.py`,
`_route_packed`): each process's result is written once, in place, and nobody assembles it.

Why: with every chunk handed on through its node leader, each byte was written three times on its
way into a result (the socket's read into the leader's arena, the leader's packing of the node's
chunks, the process's assembly of its result), and two cores were the bound. Here:
- each of the node's other processes takes its result buffers from its pool (leased blocks of its
  arena) before the collective and publishes where they lie on the same-node board beside its
  operands (`published_whole`), so its node leader maps them writable;
- the node leader tells its wire where each array of the other node leaders' transfers goes
  (`Placer.expect(seq, targets=...)`, its own results' places first, the others' as it reads them):
  the socket reads each chunk straight into its slot of the result it belongs to (a chunk along the
  leading dimension is one run of bytes there);
- while the transfers travel, the node leader copies the node's own chunks into every result of the
  node, from the operands it reads in place (one copy each, the only one);
- then it publishes `LANDED` for the node's processes: their results are ready.

A transfer, or a chunk, that came before the leader announced its place was read into the reader's
own buffers: it is copied into its slot afterwards (the same bits, later). A process whose results
could not be leased publishes none, and the node takes the packed route.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from replicas.collectives.buffers import pool_of
from replicas.collectives.reduction import Values, slot

LANDED = None  # what a node leader hands its node's processes once their results are written


def leading(values: Values, dim: int) -> bool:
    """Whether each chunk of `values` along `dim` is one run of bytes (no dimension before `dim`
    larger than one): then the socket can read it straight into its slot."""
    return all(v.flags.c_contiguous and math.prod(v.shape[:dim]) == 1 and v.dtype.itemsize for v in values)


def result_buffers(ex: Any, parts: list[Values], dim: int) -> list[Values] | None:
    """This process's results, one tuple per local member, in leased blocks of its arena (so its
    node leader can map them); None where that is not possible (then nothing lands)."""
    if not leading(parts[0], dim):
        return None
    pool = pool_of(ex.fabric)
    out = []
    for part in parts:
        row = []
        for v in part:
            found = None if v.dtype.hasobject else pool.reused_or_leased(v.shape, v.dtype)
            if found is None:
                return None
            row.append(found)
        out.append(tuple(row))
    return out


def _slot(result: np.ndarray, source: int, n: int, dim: int) -> np.ndarray:
    width = result.shape[dim] // n
    return result[slot(dim, source * width, (source + 1) * width)]


def empty_places(layout: Any, senders: list[int], receivers: list[int], operands: int) -> list[np.ndarray | None]:
    """Where each array of the transfer from the node of `senders` (its processes) to this node's
    `receivers` goes, none known yet: the node leader fills them in (`fill`) as it learns where
    each process's results lie, while its wire may already be reading the transfer (an array whose
    place is not known when its turn comes is read into the wire's own buffer, `settle_arrived`)."""
    sources = sum(len(layout.processes[p]) for p in senders)
    return [None] * (sources * sum(len(layout.processes[q]) for q in receivers) * operands)


def fill(places: list[np.ndarray | None], layout: Any, senders: list[int], receivers: list[int], q: int,
         result: list[Values], n: int, dim: int) -> None:
    """The places of process q's results (one tuple per member) in `places`: the transfer holds, for
    each receiving process in turn and each sending process p, p's members' chunks for q's members,
    member by member, operand by operand (`_route_packed`); each goes to the bytes of its slot."""
    sources = [i for p in senders for i in layout.processes[p]]
    at = sum(len(sources) * len(layout.processes[r]) * len(result[0]) for r in receivers[:receivers.index(q)])
    for i in sources:
        for values in result:
            for r in values:
                places[at] = _slot(r, i, n, dim).reshape(-1).view(np.uint8)
                at += 1


def copy_local(layout: Any, processes: list[int], cut: dict[int, list[list[Values]]],
               results: dict[int, list[Values]], n: int, dim: int) -> None:
    """The node's own chunks copied into every result of the node: `cut[p][member][destination]`
    holds process p's members' chunks."""
    for q in processes:
        for j, result in zip(layout.processes[q], results[q]):
            for p in processes:
                for i, chunks in zip(layout.processes[p], cut[p]):
                    for r, c in zip(result, chunks[j]):
                        np.copyto(_slot(r, i, n, dim), c, casting="no")


def settle_arrived(bundle: list[tuple[int, int, list[Values]]], places: list[Any]) -> None:
    """A received transfer's chunks that did not land in their slots (it came before it was
    announced) copied there. Its layout is the one `places` follows: the fingerprint, compared before
    the transfer was handed over, names the same collective of the same shapes on both sides."""
    arrays = [a for _, _, items in bundle for v in items for a in v]
    for a, place in zip(arrays, places):
        if a.ctypes.data != place.ctypes.data:
            np.copyto(place, a.reshape(-1).view(np.uint8), casting="no")
