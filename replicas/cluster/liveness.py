"""A host that stops answering: a link cut, a host frozen, a node lost without a word. Ray notices
such a node only when its heartbeats have been missed for about a minute; a job across hosts
notices at its next poll: the driver asks every actor for its replicas' states a few times a
second, and an actor on another node that has not answered for LIVENESS_SECONDS while an actor
elsewhere did ends the job, naming the replicas it runs and its host, unless its host shows
another sign of life: another of its actors answered (one more window), or the actors that answered
read bytes from that host meanwhile (alive, only busy: a loaded machine while large transfers
cross; more time for as long as its bytes keep coming).

An actor of the driver's own node is never judged this way (a busy machine delays them all alike;
an actor process that dies there is reported by Ray at once), nor is one when no actor answered
(the driver itself, or the whole machine, was slow)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from replicas.errors import ReplicaFailure
from replicas.records import replicas_text

LIVENESS_SECONDS = float(os.environ.get("REPLICAS_LIVENESS_SECONDS", "3"))


def silent(ray: Any, refs: list[Any], nodes: list[str | None], here: str | None,
           limit: float | None = None,
           heard: Callable[[list[int], list[int]], set[int]] | None = None) -> list[int]:
    """Indexes of the calls `refs` (one per actor, on `nodes`) to actors of another node than
    `here` that did not answer within LIVENESS_SECONDS (or `limit`, the job's time left, when
    shorter) while some other actor did, and whose host shows no other sign of life.

    Signs of life: another actor of the same host answered (a host cut off, frozen or lost silences
    all of its actors at once), which is worth one more LIVENESS_SECONDS; and `heard(quiet,
    answered)`: which of the `quiet` actors' hosts the `answered` actors read bytes from within
    LIVENESS_SECONDS. Such a host is alive, only too busy to answer (on a loaded machine, while large
    transfers cross): its actors get another LIVENESS_SECONDS, and so on while their bytes keep
    coming and the job's time lasts. A frozen host or a cut link sends nothing."""
    end = None if limit is None else time.monotonic() + limit
    pending = list(range(len(refs)))
    spared: set[int] = set()  # given their one more window because an actor of their host answered
    while True:
        wait = LIVENESS_SECONDS if end is None else min(LIVENESS_SECONDS, max(0.0, end - time.monotonic()))
        _, left = ray.wait([refs[i] for i in pending], num_returns=len(pending), timeout=wait)
        waiting = set(left)
        still = [i for i in pending if refs[i] in waiting]
        if not still or len(still) == len(refs):
            return []
        quiet = [i for i in still if nodes[i] is not None and nodes[i] != here]
        if not quiet or (end is not None and time.monotonic() >= end):
            return quiet
        answered = [i for i in range(len(refs)) if refs[i] not in waiting]
        answering_hosts = {nodes[i] for i in answered}
        busy = {i for i in quiet if nodes[i] in answering_hosts and i not in spared}
        spared |= busy
        if heard is not None and len(busy) < len(quiet):
            busy |= heard([i for i in quiet if i not in busy], answered)
        if len(busy) < len(quiet):
            return [i for i in quiet if i not in busy]
        pending = still


def silent_failure(ray: Any, groups: list[list[int]], indexes: list[int], nodes: list[str | None]) -> ReplicaFailure:
    """The error naming every replica of the silent actors and their hosts' addresses."""
    ids = sorted(r for i in indexes for r in groups[i])
    try:
        address = {n["NodeID"]: n.get("NodeManagerAddress") for n in ray.nodes()}
    except Exception:  # noqa: BLE001 - the cluster's table is a courtesy here
        address = {}
    hosts = sorted({str(address.get(nodes[i]) or nodes[i]) for i in indexes})
    where = ", ".join(hosts)
    return ReplicaFailure(f"{replicas_text(ids)} on {'host' if len(hosts) == 1 else 'hosts'} {where} stopped "
                          f"answering: no report for {LIVENESS_SECONDS:g} s while the others reported (a link cut, "
                          "a host frozen or its Ray node lost)", ids[0], cause="unresponsive")


def quiet_ray_messages() -> None:
    """Ray's driver prints what its cluster publishes as errors ("(raylet) The node ... has been
    marked dead ...") to this process's stdout, which is the user's: to stderr instead."""
    try:
        from ray._private import worker
    except ImportError:
        return
    original = worker.print_to_stdstream
    if getattr(original, "_replicas_quiet", False):
        return

    def to_stderr(data: dict[str, Any], ignore_prefix: bool) -> None:
        original(dict(data, is_err=True), ignore_prefix)

    to_stderr._replicas_quiet = True  # type: ignore[attr-defined]
    worker.print_to_stdstream = to_stderr


def host_lost(ray: Any, error: ReplicaFailure, refs: list[Any], nodes: list[str | None], here: str | None,
              dead: set[int], new: set[int], groups: list[list[int]]) -> ReplicaFailure:
    """`error` (Ray reported the actors `new` dead) naming every replica of their hosts when those
    hosts are not the driver's and their other actors do not answer either (a node lost: all its
    actors go at once, and waiting on each in turn would cost seconds). Those actors join `dead`."""
    lost_nodes = {nodes[i] for i in new if nodes[i] is not None and nodes[i] != here}
    others = [j for j, node in enumerate(nodes) if node in lost_nodes and j not in dead]
    if not lost_nodes:
        return error
    _, pending = ray.wait([refs[j] for j in others], num_returns=len(others), timeout=1.0) if others else ([], [])
    waiting = set(pending)
    for j in others:
        if refs[j] in waiting:
            dead.add(j)
            continue
        try:
            ray.get(refs[j], timeout=0)
        except Exception:  # noqa: BLE001 - dead as well
            dead.add(j)
    gone = sorted(i for i in dead if nodes[i] in lost_nodes)
    ids = sorted(r for i in gone for r in groups[i])
    try:
        address = {n["NodeID"]: n.get("NodeManagerAddress") for n in ray.nodes()}
    except Exception:  # noqa: BLE001 - the cluster's table is a courtesy here
        address = {}
    where = ", ".join(sorted(str(address.get(n) or n) for n in lost_nodes))
    failure = ReplicaFailure(f"{replicas_text(ids)} on host {where} lost: {error}", error.replica, error.cause,
                             error.instruction)
    return failure
