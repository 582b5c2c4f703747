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
    copy_all,
    flat_layout,
    reduce_into,
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


def board_reduce_scatter(ex: Exchange, parts: list[Values], combine: Combine, n: int, dim: int
                         ) -> list[Values] | None:
    """Each leader publishes its process's whole partial, summed straight into its board buffer (in
    group order), and sums only its local members' chunks of the partials, in process order, into
    their results. Chunk i of a partial is the partial of the chunks i (elementwise): the same
    operations in the same order as the messages' path, so the same bits. (Publishing only the
    chunks the other processes need writes half the bytes at 2 processes, but costs ~60 us more
    Python per call in `np.split` and the block-wise sums than the bytes save at 1 MiB, and ~60 us
    at 4 KiB: measured 2026-11-26, bench/README.md "rounds".)"""

    def fill(views: Values) -> None:
        if len(parts) == 1:
            copy_all(views, parts[0])
        else:
            reduce_into(views, parts, combine)

    partials = ex.board_round(parts[0], fill)
    if partials is None:
        return None
    pool = pool_of(ex.fabric)
    widths = [v.shape[dim] // n for v in parts[0]]
    results = []
    for i in ex.topo.local:
        cuts = [slot(dim, i * w, (i + 1) * w) for w in widths]
        chunks = [tuple(x[c] for x, c in zip(partial, cuts)) for partial in partials]
        results.append(reduce_into(tuple(pool.empty(c.shape, c.dtype) for c in chunks[0]), chunks, combine))
    ex.release()  # the results are this process's own: the peers may reuse their buffers
    return results
