"""Replica groups: who takes part in a collective with whom, and in which order.

`replica_groups=[]` is one group of every replica; explicit groups must cover each replica exactly
once. The order inside a group is meaningful: it decides the concatenation order of all-gather and
all-to-all, which member receives which shard of reduce-scatter, and the reduction order of
all-reduce.

SPMD programs (`num_partitions` P > 1, `replica_count` 1) run each partition as one replica, so
the runtime id of a replica is its partition id. A collective with a channel id (cross-partition,
cross-replica-and-partition or flattened-id mode, which all coincide when there is one replica)
names partitions in its groups; one without a channel id is cross-replica, and with one replica
every partition is alone in its group, as in XLA.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from replicas.caching import Cache
from replicas.hlo.ir import Instruction
from replicas.limits import missing_ids, short_text

Group = tuple[int, ...]


@dataclass(frozen=True)
class GroupPlan:
    groups: tuple[Group, ...]  # every group, as the program states them (normalized)
    group: Group  # this replica's group, in group order
    index: int  # this replica's position in `group`

    @property
    def size(self) -> int:
        return len(self.group)

    def peers(self) -> Group:
        """The other members, in group order."""
        return tuple(r for r in self.group if r != self.group[self.index])


def is_spmd(module: Any) -> bool:
    return int(module.attrs.get("num_partitions", 1)) > 1 and int(module.attrs.get("replica_count", 1) or 1) == 1


# One tuple object per distinct group (and list of groups) in the process: every member's kernel,
# fingerprint and published BlockInfo share it, so N members of a 1024-group hold one copy, and a
# batch of states pickles it once.
_interned: Cache[Any] = Cache("interned groups", 4096)


def intern(value: Any) -> Any:
    return _interned.get_or_make(value, lambda: value)


# Per instruction and per list of groups, what every replica of a process would compute alike:
# binding N replicas stays O(N) instead of each re-reading all N ids (O(N^2) at 1024: ~10 s).
_normalized: Cache[tuple[Group, ...]] = Cache("normalized groups", 4096, by_identity=True)
_membership: Cache[tuple[int, dict[int, int]]] = Cache("group membership", 4096, by_identity=True)


def normalized_groups(inst: Instruction) -> tuple[Group, ...]:
    return _normalized.get_or_make(inst, lambda: intern(tuple(intern(tuple(int(r) for r in g))
                                                              for g in inst.attrs.get("replica_groups") or [])))


def plan_groups(inst: Instruction, module: Any, replica_id: int, num_replicas: int) -> GroupPlan:
    """This replica's group for `inst`; ProgramError unless the groups partition the replicas."""
    groups = normalized_groups(inst)
    if is_spmd(module) and inst.attrs.get("channel_id") is None:
        # Cross-replica mode with a single replica: each partition reduces with itself alone.
        for g in groups:
            if any(r != 0 for r in g):
                raise inst.error(f"replica_groups {_text(groups)} name replicas other than 0, but the SPMD "
                                 f"module has one replica (a collective without channel_id is cross-replica)")
        return GroupPlan(intern(tuple((r,) for r in range(num_replicas))), (replica_id,), 0)
    if not groups:
        everyone = intern(tuple(range(num_replicas)))
        return GroupPlan(intern((everyone,)), everyone, replica_id)
    seen = _group_of_replica(inst, groups, num_replicas)
    group = groups[seen[replica_id]]
    return GroupPlan(groups, group, group.index(replica_id))


def _group_of_replica(inst: Instruction, groups: tuple[Group, ...], num_replicas: int) -> dict[int, int]:
    """replica -> the index of its group; ProgramError unless the groups partition this job's replicas
    (the verifier checked that no group is empty or names a replica twice)."""
    found = _membership.get(groups)
    if found is not None and found[0] == num_replicas:
        return found[1]
    seen: dict[int, int] = {}
    for gi, g in enumerate(groups):
        for r in g:
            if not 0 <= r < num_replicas:
                raise inst.error(f"replica_groups {short_text(_text(groups))} name replica {r}, but the job has "
                                 f"{num_replicas} replicas")
            seen[r] = gi
    if len(seen) != num_replicas:
        raise inst.error(f"replica_groups {short_text(_text(groups))} leave out replicas "
                         f"{missing_ids(seen, num_replicas)}: groups must cover every replica exactly once")
    _membership.put(groups, (num_replicas, seen))
    return seen


def _text(groups: tuple[Group, ...]) -> str:
    return "{" + ",".join("{" + ",".join(map(str, g)) + "}" for g in groups) + "}"


def parse_pairs(inst: Instruction, raw: Any, num_replicas: int, what: str = "source_target_pairs"
                ) -> tuple[tuple[int, int], ...]:
    """Validated (source, target) pairs: ids in range, no source or target twice."""
    try:
        pairs = tuple((int(s), int(t)) for s, t in raw)
    except (TypeError, ValueError):
        raise inst.error(f"{what} must be a list of (source, target) pairs, got {raw!r}") from None
    sources: set[int] = set()
    targets: set[int] = set()
    for s, t in pairs:
        for r in (s, t):
            if not 0 <= r < num_replicas:
                raise inst.error(f"{what} name replica {r}, but the job has {num_replicas} replicas")
        if s in sources:
            raise inst.error(f"{what}: replica {s} is the source of more than one pair")
        if t in targets:
            raise inst.error(f"{what}: replica {t} is the target of more than one pair")
        sources.add(s)
        targets.add(t)
    return pairs
