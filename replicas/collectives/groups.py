"""Replica groups: who takes part in a collective with whom, and in which order.

`replica_groups=[]` is one group of every replica; explicit groups cover each replica exactly
once (the verifier checks it for the job's replicas). The order inside a group is meaningful: it
decides the concatenation order of all-gather and all-to-all, which member receives which shard of
reduce-scatter, and the reduction order of all-reduce.

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
# binding N replicas stays O(N) instead of each re-reading all N ids (O(N^2): seconds at N=1024).
_normalized: Cache[tuple[Group, ...]] = Cache("normalized groups", 4096, by_identity=True)
_membership: Cache[dict[int, int]] = Cache("group membership", 4096, by_identity=True)


def normalized_groups(inst: Instruction) -> tuple[Group, ...]:
    return _normalized.get_or_make(inst, lambda: intern(tuple(intern(tuple(int(r) for r in g))
                                                              for g in inst.attrs.get("replica_groups") or [])))


def plan_groups(inst: Instruction, module: Any, replica_id: int, num_replicas: int) -> GroupPlan:
    """This replica's group for `inst`. The verifier, run for this job's `num_replicas`, made sure the
    groups partition the replicas (in an SPMD job, that groups without a channel id name replica 0
    only): nothing is checked again here."""
    groups = normalized_groups(inst)
    if is_spmd(module) and inst.attrs.get("channel_id") is None:
        # Cross-replica mode with a single replica: each partition reduces with itself alone.
        return GroupPlan(intern(tuple((r,) for r in range(num_replicas))), (replica_id,), 0)
    if not groups:
        group, alone = everyone(num_replicas)
        return GroupPlan(alone, group, replica_id)
    group = groups[_group_of_replica(groups)[replica_id]]
    return GroupPlan(groups, group, group.index(replica_id))


_everyone: Cache[tuple[Group, tuple[Group, ...]]] = Cache("every replica", 64)


def everyone(num_replicas: int) -> tuple[Group, tuple[Group, ...]]:
    """The group of every replica and the list of that one group, interned: made once per count
    (each is O(N) to build and to hash, and every replica of a job asks)."""
    found = _everyone.get(num_replicas)
    if found is None:
        group = intern(tuple(range(num_replicas)))
        found = _everyone.put(num_replicas, (group, intern((group,))))
    return found


def _group_of_replica(groups: tuple[Group, ...]) -> dict[int, int]:
    """replica -> the index of its group, computed once per list of groups in the process."""
    return _membership.get_or_make(groups, lambda: {r: gi for gi, g in enumerate(groups) for r in g})


def verified_pairs(inst: Instruction) -> tuple[tuple[int, int], ...]:
    """A collective-permute's `source_target_pairs` as ints (the verifier checked them for the job)."""
    return tuple((int(s), int(t)) for s, t in inst.attrs.get("source_target_pairs") or [])


def parse_pairs(inst: Instruction, raw: Any, num_replicas: int, what: str) -> tuple[tuple[int, int], ...]:
    """Validated (source, target) pairs: ids in range, no source or target twice (pairs the verifier
    does not see: Send/Recv's routing, a frontend attribute)."""
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
