"""Where a job's replicas go on Ray: how many share an actor, what each actor asks of the
cluster, and whether placed actors can reach each other."""

from __future__ import annotations

import math
from typing import Any


def reachable(addresses: list[dict[str, Any] | None]) -> bool:
    """Every address known, and the actors can reach each other with what they opened (one
    node: Unix sockets; several: TCP listeners)."""
    if not all(addresses):
        return False
    return len({a["node"] for a in addresses}) == 1 or all(a.get("tcp") for a in addresses)


def default_packing(num_replicas: int, persistent: bool = False) -> int:
    """Replicas an actor when resources do not place them (`actor_groups`): one up to the cluster's
    CPUs, then two (about one process per CPU: two replicas of one actor meet in-process, faster
    than two processes competing for one core); beyond twice the CPUs, enough per actor for at most
    twice as many actors as CPUs.

    A persistent job (`rp.jax.jit`'s) puts every replica in one actor: a training step is many
    small collectives between short stretches of interpreted work, and a collective between
    processes costs each a wake-up that a collective between threads of one process does not,
    while the replicas' large numpy and BLAS calls run in parallel outside the GIL in one process
    as well (bench/LOG-2026.md "packing": the 100-step MLP loop at N=4 2.8 ms a step in one actor
    against 5.2 ms in two, N=8 4.1 against 12.3 ms in four; gpt_dp 98 against 109 ms)."""
    import ray

    if persistent:
        return max(1, num_replicas)
    if num_replicas <= 2:
        return 1  # one actor each on any cluster
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    if num_replicas <= cpus:
        return 1
    return max(2, math.ceil(num_replicas / (2 * cpus)))


def actor_groups(num_replicas: int, resources: list[dict[str, float]] | None, replicas_per_actor: int,
                 persistent: bool, nodes: list[dict[str, Any]] | None) -> list[list[int]]:
    """The replicas of each actor. Without `resources`: `replicas_per_actor` consecutive replicas an
    actor (0: `default_packing`'s count). With them, only replicas asking for the same resources
    share an actor (those of one host, when the resources name hosts: a collective's members there
    then meet in one process, as JAX's devices of one host do), `replicas_per_actor` of them. By
    default, on the one alive node of `nodes` offering those resources: all of them in one actor
    for a persistent job (as `default_packing`), else in as many actors as that node has CPUs (a
    collective's members in processes of their own cost each a wake-up and its share of a core,
    and a host's leader process reaches the other hosts for all of them); never more in an actor
    than the node can hold (an actor asks for the sum of its replicas'); one each where several
    nodes offer them or none does."""
    if resources is None:
        per = replicas_per_actor or default_packing(num_replicas, persistent)
        return [list(range(i, min(i + per, num_replicas))) for i in range(0, num_replicas, per)]
    alike: dict[tuple, list[int]] = {}
    for r, wants in enumerate(resources):
        alike.setdefault(tuple(sorted((wants or {}).items())), []).append(r)
    groups = []
    for wants, ids in alike.items():
        per = replicas_per_actor or _packing_on_node(len(ids), dict(wants), persistent, nodes or [])
        groups.extend(ids[i:i + per] for i in range(0, len(ids), per))
    return sorted(groups)


def _packing_on_node(count: int, wants: dict[str, float], persistent: bool, nodes: list[dict[str, Any]]) -> int:
    """Replicas an actor of `count` replicas asking for `wants` each (see `actor_groups`)."""
    named = {k: v for k, v in wants.items() if k not in ("CPU", "GPU") and v > 0}
    offering = [node for node in nodes if node.get("Alive")
                and all(k in node.get("Resources", {}) for k in named)] if named else []
    if len(offering) != 1:
        return 1
    total = offering[0].get("Resources", {})
    per = count if persistent else math.ceil(count / max(1, int(total.get("CPU", 1))))
    for k, v in wants.items():
        if v > 0:
            per = min(per, int(total.get(k, 0) // v))
    return max(1, per)


def cluster_resources(ray: Any) -> tuple[dict[str, float], dict[str, float], int]:
    """Free and total resources of the cluster's alive nodes, and how many nodes died (for a message)."""
    try:
        nodes = ray.nodes()
        free = dict(ray.available_resources())
    except Exception:  # noqa: BLE001 - only for the message
        return {}, {}, 0
    total: dict[str, float] = {}
    for node in nodes:
        if node.get("Alive"):
            for k, v in node.get("Resources", {}).items():
                total[k] = total.get(k, 0) + v
    return free, total, sum(1 for node in nodes if not node.get("Alive"))


def wanted(options: dict[str, Any]) -> dict[str, float]:
    """The resources an actor's options ask for, by Ray's names."""
    wanted = dict(options.get("resources", {}))
    for name, option in (("CPU", "num_cpus"), ("GPU", "num_gpus")):
        if options.get(option):
            wanted[name] = options[option]
    return wanted


def actor_options(replica_ids: list[int], resources: list[dict[str, float]] | None, num_cpus: float) -> dict[str, Any]:
    """The Ray options of the actor hosting `replica_ids`: their `resources` summed (CPUs and GPUs
    as Ray's options of their own, others by name)."""
    options: dict[str, Any] = {"num_cpus": num_cpus, "max_concurrency": 64}
    if resources is not None:
        merged: dict[str, float] = {}
        for r in replica_ids:
            for k, v in (resources[r] or {}).items():
                merged[k] = merged.get(k, 0) + v
        for name, option in (("CPU", "num_cpus"), ("GPU", "num_gpus")):
            if name in merged:
                options[option] = merged.pop(name)
        if merged:
            options["resources"] = merged
    return options
