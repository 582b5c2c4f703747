"""A batched run's all-reduce whose group spans processes (a packed Ray actor's replicas in a group
of every replica): the process's members reduce their rows as one partial, and only the partials
cross processes.

The unbatched path of such an all-reduce: the members of a process meet, one of them reduces their
operands in group order and runs the leaders' step with the other processes' leaders (as the
group's first member of its process: its mailbox, its slot of the same-node board), then hands
the result down. Here the batched run's leader computes the same partial from its members' rows
(`reduction.reduce_into`, the same operations in the same order) and runs the same leaders' step
as the process's first member, which it is: a spanning run is led by the first member (its
mailbox takes the peers' messages; see `batched.run`). The leaders' unit sees one local member,
so it hands nobody a result; every member of the process gets the total. So the bits, the
messages, their keys and fingerprints are those of the unbatched leader: other processes may run
batched or not.

A spanning collective cannot be taken back: a run that spans processes is attempted only when no
While condition or conditional's predicate can differ between the members (they cannot diverge
after one), and a kernel that raises afterwards fails the run instead of falling back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from replicas.collectives import algorithms
from replicas.collectives.exchange import Exchange
from replicas.collectives.groups import plan_groups, verified_pairs
from replicas.collectives.reduction import reduce_into
from replicas.collectives.topology import Topology, topology
from replicas.hlo.ir import Module
from replicas.records import BlockInfo
from replicas.runtime import batched_live
from replicas.runtime.stacks import COLLECTIVES, Analysis, any_stacked, conditional_branches


def spans(module: Module, members: tuple[int, ...], num_replicas: int) -> bool:
    """Whether every collective that leaves the process's `members` is an all-reduce of one group
    (every replica) in which the first member comes first among them: the batched run can take
    it part by part. Point-to-point pairs and other collectives leaving the process cannot."""
    inside = set(members)
    leaves = False
    for comp in module.computations.values():
        for inst in comp.instructions:
            if inst.opcode == "collective-permute":
                if any((s in inside) != (t in inside) for s, t in verified_pairs(inst)):
                    return False
            elif inst.opcode in COLLECTIVES:
                plan = plan_groups(inst, module, members[0], num_replicas)
                if all(inside.issuperset(g) or inside.isdisjoint(g) for g in plan.groups):
                    continue
                if inst.opcode != "all-reduce" or len(plan.groups) != 1:
                    return False
                first_here = next(r for r in plan.group if r in inside)
                if first_here != members[0]:
                    return False
                leaves = True
    return leaves


def may_diverge(analysis: Analysis, entry: str, stacks: tuple) -> bool:
    """Whether some While condition or conditional predicate of the run is stacked (may differ
    between members) for arguments of `stacks`."""
    analysis.of(entry, stacks)
    seen: set[tuple] = set()
    while True:
        todo = [key for key in list(analysis._memo) if key not in seen]  # noqa: SLF001 - its own memo
        if not todo:
            return False
        for name, params in todo:
            seen.add((name, params))
            values = analysis.of(name, params)
            for inst in analysis.module.computation(name).instructions:
                if inst.opcode == "while":
                    state = analysis.while_state(inst, values[inst.operands[0]])
                    if any_stacked(analysis.root(inst.attrs["condition"], (state,))):
                        return True
                elif inst.opcode == "conditional":
                    if any_stacked(values[inst.operands[0]]):
                        return True
                    for k, branch in enumerate(conditional_branches(inst)):
                        analysis.root(branch, (values[inst.operands[k + 1]],))


def partial_of(rows: Sequence[tuple[np.ndarray, ...]], combine: Any) -> tuple[np.ndarray, ...]:
    """This process's members' operands (`rows`, in group order) reduced as the in-process leader
    reduces them: the same operations in the same order. (A ufunc's `accumulate` over the replica
    axis gives the same bits in one call, but took twice as long as this loop of one call a row.)"""
    if len(rows) == 1:
        return tuple(np.array(v) for v in rows[0])
    return reduce_into(tuple(np.empty(v.shape, v.dtype) for v in rows[0]), rows, combine)


def all_reduce(ctx: Any, inst: Any, group: tuple[int, ...], partial: tuple[np.ndarray, ...],
               combine: Any, fingerprint: Any) -> tuple[np.ndarray, ...]:
    """The total of the spanning all-reduce `inst` over `group`: this process's `partial`
    (`partial_of`) combined with the other processes' by the leaders' step, run as the first member
    (`ctx.fabrics[0]`)."""
    fabric = ctx.fabrics[0]
    # The run can no longer fall back: it goes on the members' flight recorders now (as the unbatched
    # path records each collective when it runs), for a report made while this one waits.
    batched_live.go_live(ctx, ctx.fabrics)
    # Numbered as the replay will number it (`batched_live.replay`): after the run's earlier ones.
    seq = fabric.collectives_started() + len(ctx.log)
    full = topology(group, _index(group, fabric.replica_id), fabric.placement, fabric.nodes)
    alone = Topology(full.layout, full.index, full.position, (full.index,), 0)  # nobody here to hand results to
    block = BlockInfo("collective", inst.name, inst.opcode, needs="group", computation=fingerprint.computation,
                      group=group, seq=seq)
    ex = Exchange(fabric, seq, fingerprint, block, alone)
    ctx.spanned += 1
    try:
        units = ex.plan("all-reduce", sum(v.nbytes for v in partial), hasattr(combine, "into"))
        total = algorithms._lead(ex, units, [partial], combine)  # noqa: SLF001 - the leaders' step alone
        return ex.settle(total)
    finally:
        ex.release()


def _index(group: tuple[int, ...], replica: int) -> int:
    """`group.index(replica)` (a group of every replica is range(N): its index is the replica)."""
    if replica < len(group) and group[replica] == replica:
        return replica
    return group.index(replica)
