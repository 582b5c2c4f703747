"""Where a collective's members live, and who leads them (the messages: `collectives/exchange.py`).

A collective runs in levels that match placement (`Fabric.placement[r]` = the process hosting
replica r). The members of a group hosted by one process meet in-process; if the group spans
processes, one member per process (its *leader*, in *process order*: the order of each process's
first member in the group) runs the cross-process step with the other processes' leaders, then
hands the result to its local members. Messages per collective: at most 2 per local member plus
the leaders' step (O(P) to O(P log P) for the reductions, P = processes), never one per pair.

Who leads a process's members:
- **The last to arrive** (`Mailbox.meet`), when the members can meet on a mailbox of their process
  and the leaders' step cannot need a fixed leader's mailbox (one process; or a round on the
  same-node board whose payloads surely fit its slots: see `kernels.Collective`). Each member
  leaves its operand at the meeting (held by the mailbox of the group's first local member, by
  reference) and the last one takes them all, leads and hands each member its result: one
  hand-off between threads per member and collective. The members that arrived first wait for
  their results and never wake in between (with a fixed leader, the leader woke for the last
  deposit, and the member again for its result: two wake-ups of a packed actor's threads per
  collective, each a futex wake-up and a wait for the GIL). On the board the acting leader
  writes the slot of the group's first local member, as that member (`Board.publish`), so the
  peers read the same slot whichever thread wrote it. Who acted never changes a result: the
  operands are reduced in group order whoever holds them.
- **The first local member** (a fixed leader) otherwise: each member hands its operand to it as a
  message delivered by reference; leaders' rounds addressed to a leader's mailbox (other nodes,
  more than `Thresholds.board_readers` processes, payloads larger than a board slot, recursive doubling) need it.

Across nodes (hosts: `Fabric.nodes`), the processes of one node form a third level: their
leaders meet the node's first process's leader (its *node leader*, in *node order*: the order of
each node's first process in process order), and only node leaders talk across the network, one
transfer per pair of nodes and step (`collectives/nodes.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from replicas.caching import Cache
from replicas.collectives.groups import Group

DEPOSIT = 0  # member -> its fixed leader: the member's operand
LEADER_ROUND = 1  # first round among leaders; the cross-process algorithms number up from here
RESULT = 1 << 20  # down the chains of local members: their results (a round no leader algorithm reaches)
RESULT_LANES = 16  # chains the leader starts (see `scatter_local`)


@dataclass(frozen=True)
class Layout:
    """A group under a placement, shared by every member hosted in one process."""

    group: Group
    processes: tuple[tuple[int, ...], ...]  # per process, in process order: its members' group indices
    leaders: tuple[int, ...]  # per process, in process order: its leader's replica id
    process_of_index: tuple[int, ...]  # group index -> position of its process in `processes`
    rank_of_index: tuple[int, ...]  # group index -> its position among its process's members
    # Per node, in node order: its processes' positions (in process order). One node when the
    # fabric knows no nodes (threads, one machine).
    nodes: tuple[tuple[int, ...], ...] = ()
    node_of_process: tuple[int, ...] = ()  # process position -> position of its node in `nodes`


class Topology:
    """One member's view of a `Layout`, with what its in-process level uses every call precomputed
    (computed once per member and placement: a collective reads these, it never derives them)."""

    __slots__ = ("layout", "index", "position", "local", "rank", "group", "leader", "is_leader",
                 "local_others", "result_from", "result_to", "other_positions")

    def __init__(self, layout: Layout, index: int, position: int, local: tuple[int, ...], rank: int) -> None:
        self.layout = layout
        self.index = index  # this member's position in the group
        self.position = position  # its process's position in process order
        self.local = local  # its process's members' group indices, in group order
        self.rank = rank  # its position in `local` (0: the leader)
        group = self.group = layout.group
        self.leader = layout.leaders[position]
        self.other_positions = tuple(q for q in range(len(layout.leaders)) if q != position)
        self.is_leader = rank == 0
        # The leader's: the other local members' replica ids, in group order (their deposits).
        self.local_others = tuple(group[i] for i in local[1:]) if rank == 0 else ()
        # The chains of results (`Exchange.scatter_local`): who hands this member its result, and the
        # members it hands the result on to.
        previous = rank - RESULT_LANES if rank > RESULT_LANES else 0
        self.result_from = group[local[previous]] if rank else None
        if rank == 0:
            to = [group[local[k]] for k in range(1, min(1 + RESULT_LANES, len(local)))]
        else:
            to = [group[local[rank + RESULT_LANES]]] if rank + RESULT_LANES < len(local) else []
        self.result_to = tuple(to)


# Per group and placement (each job brings a new placement, so a pooled actor adds entries job after
# job: the bound keeps that growth small; bench/soak.py watches it).
_layouts: Cache[tuple[Sequence[int], Sequence[int] | None, Layout]] = Cache("layouts", 512, by_identity=True)


def layout_of(group: Group, placement: Sequence[int], nodes: Sequence[int] | None = None) -> Layout:
    """The layout of `group` under `placement` (and `nodes`: replica -> its node, None for one node),
    computed once per process (O(group) the first time)."""
    found = _layouts.get(group)
    if found is not None and found[0] is placement and found[1] is nodes:
        return found[2]
    position: dict[int, int] = {}
    processes: list[list[int]] = []
    leaders: list[int] = []
    process_of_index = []
    rank_of_index = []
    for i, r in enumerate(group):
        p = placement[r]
        k = position.get(p)
        if k is None:
            k = position[p] = len(processes)
            processes.append([])
            leaders.append(r)
        rank_of_index.append(len(processes[k]))
        processes[k].append(i)
        process_of_index.append(k)
    node_position: dict[int, int] = {}
    by_node: list[list[int]] = []
    node_of_process = []
    for k, r in enumerate(leaders):
        node = nodes[r] if nodes is not None else 0
        j = node_position.get(node)
        if j is None:
            j = node_position[node] = len(by_node)
            by_node.append([])
        by_node[j].append(k)
        node_of_process.append(j)
    layout = Layout(group, tuple(tuple(p) for p in processes), tuple(leaders), tuple(process_of_index),
                    tuple(rank_of_index), tuple(tuple(n) for n in by_node), tuple(node_of_process))
    _layouts.put(group, (placement, nodes, layout))
    return layout


def topology(group: Group, index: int, placement: Sequence[int], nodes: Sequence[int] | None = None) -> Topology:
    layout = layout_of(group, placement, nodes)
    position = layout.process_of_index[index]
    return Topology(layout, index, position, layout.processes[position], layout.rank_of_index[index])

