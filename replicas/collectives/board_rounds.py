"""The leaders' rounds of all-gather, all-to-all and reduce-scatter on the same-node board
(`Exchange.board_round`): each leader writes its process's part straight into its board buffer as
raw arrays (no pickled list), builds its members' results in buffers of its pool straight from its
operands and the peers' buffers, and releases the board at once (no result keeps a view of it, so
nothing is settled). Each returns None (or False), with nothing done, when the round does not go on
the board; the caller then takes the messages' path, which gives the same bits."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from replicas.collectives.buffers import pool_of
from replicas.collectives.hierarchy import Exchange
from replicas.collectives.reduction import (
    Combine,
    Values,
    chunks_of,
    copy_all,
    flat_layout,
    reduce_into,
    reduce_specs_into,
    slot,
)


def board_all_gather(ex: Exchange, parts: list[Values], place: Callable[[int, int, int], np.ndarray],
                     own: Callable[[], None]) -> bool:
    """The leaders' round on the same-node board: each leader copies its members' operands (group
    order, operands in order) into its board buffer, its own members' into their places in the
    result while the peers write theirs (`own`), then each peer's straight from the peer's buffer
    into their places, and releases the board at once (the result keeps no view of it). No list is
    pickled, nothing is settled. False, with nothing done, when the round does not go on the board."""
    topo = ex.topo
    processes = topo.layout.processes
    flat = [x for part in parts for x in part]
    got = ex.board_round(None, lambda views: copy_all(views, flat), layout=flat_layout(parts), meanwhile=own)
    if got is None:
        return False
    width = len(parts[0])
    for q, views in enumerate(got):
        if q == topo.position:
            continue
        for j, i in enumerate(processes[q]):
            for k in range(width):
                np.copyto(place(k, i, 1), views[j * width + k])
    ex.release()
    return True


def board_all_to_all(ex: Exchange, chunks: list[list[Values]], dim: int) -> list[Values] | None:
    """The leaders' round on the same-node board, each chunk written once on its way and the results
    assembled in place: each leader copies, for every other process q in process order, each local
    member's chunks addressed to q's members (source in group order, then destination, then operand)
    into its board buffer; then builds each local member's result in a buffer of its pool, the local
    sources' chunks copied from their operands while the peers write theirs (`meanwhile`), the other
    processes' straight from their board buffers; and releases the board at once (no view kept, no
    list pickled, nothing settled). None, with nothing done, when the round does not go on the board."""
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
    for q, views in enumerate(got):
        if q == pos:
            continue
        # Process q wrote its blocks for the other processes in process order, the block for process
        # r of len(processes[q]) x len(processes[r]) x width arrays: ours follows those before it.
        at = sum(len(processes[r]) for r in range(pos) if r != q) * len(processes[q]) * width
        for i_src in processes[q]:
            for k_dst in range(len(local)):
                for o in range(width):
                    np.copyto(place(k_dst, i_src, o), views[at])
                    at += 1
    ex.release()
    return outs


def board_reduce_scatter(ex: Exchange, parts: list[Values], combine: Combine, n: int, dim: int,
                         block_bytes: int) -> list[Values] | None:
    """On the same-node board: each leader sums its members' chunks that the other processes' members
    get (in group order) straight into its board buffer (for every other process in process order,
    its members' chunks in group order: nothing else is written there), then sums each local
    member's result in process order (its own process's partial of the chunk in group order, block
    by block in cache) into a buffer of its pool, and releases the board at once (no settle copy).
    The same operations in the same order as the messages' path below: the same bits. None when the
    round does not go on the board (it does not fit a buffer)."""
    topo = ex.topo
    processes, pos, local = topo.layout.processes, topo.position, topo.local
    p = len(processes)
    member_chunks = [chunks_of(v, n, dim) for v in parts]
    width = len(parts[0])
    sent = [i for q in range(p) if q != pos for i in processes[q]]
    shapes = tuple((c.dtype, c.shape) for i in sent for c in member_chunks[0][i])

    def fill(views: Values) -> None:
        for m, i in enumerate(sent):
            place = views[m * width:(m + 1) * width]
            cs = [mc[i] for mc in member_chunks]
            if len(cs) == 1:
                copy_all(place, cs[0])
            else:
                reduce_into(place, cs, combine)

    partials = ex.board_round(None, fill, layout=shapes)
    if partials is None:
        return None
    # Process q's block for this process follows its blocks for the processes before it.
    at = [sum(len(processes[r]) for r in range(pos) if r != q) * width for q in range(p)]
    pool = pool_of(ex.fabric)
    results = []
    for k, i in enumerate(local):
        out = tuple(pool.empty(c.shape, c.dtype) for c in member_chunks[0][i])
        specs = [[mc[i] for mc in member_chunks] if q == pos else
                 [tuple(partials[q][at[q] + k * width:at[q] + (k + 1) * width])] for q in range(p)]
        results.append(reduce_specs_into(out, specs, combine, block_bytes))
    ex.release()  # the results are this process's own: the peers may reuse their buffers
    return results
