"""Which algorithm runs a collective's step among processes: the units, their cost rules, the
thresholds, and the one selector.

A collective runs in two levels (`collectives/topology.py`): its members in one process meet and
one of them leads; the leaders of the processes then run one *algorithm* among themselves, and
each leader hands its members their results. An `Algorithm` is one way to run that step for one
collective: a name, where it applies, what it costs, and its implementation. Units:

- `in-process` (`in_process.py`; all four): one process (P = 1), the meeting is the whole collective.
- `board round` (`board_round.py`; all four): every leader an actor of this node, at most
  `board_readers` of them; declines at run time when the layout does not fit a buffer.
- `direct` (`direct.py`; all four): one round, P <= `direct_max_processes` (P (P - 1) messages a
  round; all-to-all, whose pairs must all exchange anyway: any P).
- `reduce-scatter + all-gather` (`sharded.py`; all-reduce): 1 < P <= `direct_max_processes`,
  buffers of `small_bytes` or more.
- `recursive doubling` (`doubling.py`; all-reduce, all-gather, reduce-scatter): P >
  `direct_max_processes`.
- `node leaders` (`nodes.py`; all four): the group spans 2 to `direct_max_processes` nodes
  (hosts); a node's processes meet its node leader, node leaders exchange one transfer per pair of
  nodes, large buffers as a stream of `stream_chunk_bytes` chunks. Across nodes it is always the
  cheapest: the network's bytes, which the other units' rules leave out, are fewest with it.

(Ring and tree are not implemented: a new unit registers with `register` and states its cost rule;
see "Adding a collective algorithm" in docs/architecture.md.)

The selector (`plan`) orders the units that apply by their cost; the collective runs the first,
and a unit that finds at run time that it cannot take this call (the board's buffer is too small
for the layout, a result cannot be leased) returns `DECLINED` having done nothing, and the next
runs. The last candidate never declines. Every member of a process computes the same plan, so the
choice does not depend on who leads. The choice is recorded: `Exchange.algorithm` names the unit
that ran, and a recorded collective's event (flight recorder, Chrome trace) carries it as
`algorithm`.

Cost rules are a simple model, rounds among processes times a round's fixed cost on the
transport plus the bytes each leader moves times a byte's cost there, used to order the units
that apply. Where the model and measurement disagree, a threshold in `Thresholds` bounds where a
unit applies, and it is the only place that number lives.

The reduction order does not depend on the unit (docs/architecture.md, "Reduction order"): every
unit reduces the members' operands in group order within a process and the partials in process
order (recursive doubling: pairwise, lower position first).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from replicas.transport import board

DECLINED = object()  # what a unit returns, having done nothing, when it cannot take this call


@dataclass(frozen=True)
class Thresholds:
    """Every number that decides which unit runs a collective, in one place."""

    # From this size of a member's buffer, an all-reduce among 2-8 processes reduces shards
    # (reduce-scatter + all-gather) instead of whole partials in one round. Below it one round
    # costs less CPU: a round among processes is a publication, a wake-up and a read per leader,
    # more than the bytes the shards save; from it a whole partial no longer fits a same-node board
    # slot and would go through the arena and the sockets.
    small_bytes: int = 4 << 20
    # Up to this many processes the leaders exchange directly (P (P - 1) messages a round); beyond,
    # recursive doubling keeps messages at O(P log P).
    direct_max_processes: int = 8
    # The same-node board's geometry (transport/board.py sizes its shared memory by these): a
    # round goes on the board only among at most `board_readers` processes, and a payload over a
    # slot is announced there and sent as a message.
    board_slot_bytes: int = board.SLOT_BYTES
    board_readers: int = board.READERS
    # Blocks in which a leader sums its own shard, so a partial sum of a block stays in cache
    # between being summed and being added (twice the L2 of a core of the development machine).
    block_bytes: int = 1 << 20
    # From this many bytes of a process's members' operands, a sharded all-reduce sends the members'
    # shards in place (leased arena buffers) instead of a partial it would write first; below, a
    # round's payloads may fit the board's slots, which copy them: sending the members' shards
    # there would copy more.
    in_place_min_bytes: int = 8 << 20
    # From this size each local member copies its own all-to-all result together (in its own
    # thread, on another core if there is one: numpy copies without the GIL) instead of its leader
    # copying all of them; below, the all-to-all goes on the board when it can.
    member_assembly_min_bytes: int = 8 << 20
    # An all-gather's result is shared by the node only up to an arena's capacity divided by this
    # (the other processes' members keep a result until their next iteration, so the first process
    # may need a third while they do; more would exceed the pool's lease budget).
    shared_results: int = 16
    # Across nodes, a node leader sends a buffer larger than this as a stream of chunks of this size
    # from a thread of its own, and reduces each chunk it receives while the next ones travel.
    stream_chunk_bytes: int = 2 << 20
    # Across nodes, two processes of a node that are not its leader exchange their all-to-all
    # chunks directly from this size of a chunk (below, through the node leader, which copies them:
    # a direct message is one more wake-up of each, which costs more than the copy of a small chunk).
    local_direct_min_bytes: int = 1 << 20


THRESHOLDS = Thresholds()  # tests replace it (`dataclasses.replace`) to reach a unit at small sizes


@dataclass(frozen=True)
class Situation:
    """What the selector knows of a call: the same on every member of a process."""

    processes: int  # P: processes hosting the group's members
    nbytes: int  # a member's operands, in bytes
    board: bool  # every leader is an actor of this node with the board (`Exchange.leaders_share_board`)
    ufunc: bool  # the reduction is a numpy ufunc (`combine.into`): it can sum into a buffer in place
    nodes: int = 1  # nodes (hosts) hosting those processes (`Layout.nodes`)


# A round's fixed cost and a byte's cost, per transport, in one unit (roughly: the bytes one could
# copy in the time a round's publication and wake-up take). Only the order they give matters.
_ROUND = {"in-process": 0.0, "board": 64 << 10, "messages": 256 << 10}
_BYTE = {"in-process": 0.0, "board": 1.0, "messages": 2.0}


def cost(rounds: float, nbytes: float, transport: str) -> float:
    """The model's cost of `rounds` rounds in which each leader moves `nbytes` bytes in all."""
    return rounds * _ROUND[transport] + nbytes * _BYTE[transport]


@dataclass(frozen=True)
class Algorithm:
    """One unit for one collective. `run(ex, parts, *args)` takes the leader's local members'
    operands (group order) and returns this member's result, having handed the others theirs (or
    `DECLINED`, having done nothing)."""

    name: str
    applies: Callable[[Situation, Thresholds], bool]
    cost: Callable[[Situation, Thresholds], float]
    run: Callable[..., Any]


_UNITS: dict[str, list[Algorithm]] = {}


def register(collective: str, algorithm: Algorithm) -> Algorithm:
    """Make `algorithm` a candidate for `collective` ("all-reduce", "all-gather", "reduce-scatter",
    "all-to-all")."""
    _UNITS.setdefault(collective, []).append(algorithm)
    return algorithm


def plan(collective: str, situation: Situation) -> tuple[Algorithm, ...]:
    """The units that apply to `situation`, cheapest first (ties: in order of registration)."""
    t = THRESHOLDS
    fits = [a for a in _UNITS[collective] if a.applies(situation, t)]
    if not fits:
        raise AssertionError(f"no algorithm applies to {collective} in {situation}")
    return tuple(sorted(fits, key=lambda a: a.cost(situation, t)))


def units(collective: str) -> tuple[Algorithm, ...]:
    """Every registered unit for `collective` (for tests and documentation)."""
    return tuple(_UNITS.get(collective, ()))
