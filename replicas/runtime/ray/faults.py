"""Naming faults: which replica, in which instruction, for what cause.

A replica actor that dies (killed, a segfault in a custom call, out of memory) reaches the driver
as a Ray error about an actor; the driver knows which replicas that actor ran, and reads the
instruction each was executing from the slots the process published (transport/where.py; on the
driver's node), else names what each was last seen doing. Placement that can never succeed (a
`resources=` request no node has) is found before any actor is started.
"""

from __future__ import annotations

import copy
from typing import Any

from replicas.errors import ReplicaFailure
from replicas.limits import id_ranges
from replicas.records import ReplicaState
from replicas.transport import where


def is_memory_error(error: BaseException | None) -> bool:
    """`error` is, or was caused by, a MemoryError."""
    seen = 0
    while error is not None and seen < 16:
        if isinstance(error, MemoryError):
            return True
        error = error.__cause__ or error.__context__
        seen += 1
    return False


def doing(state: ReplicaState | None) -> str:
    """What a replica was last seen doing, for an error message."""
    if state is None:
        return "before its first report"
    if state.status == "blocked" and state.block is not None:
        b = state.block
        return f"while blocked in %{b.instruction} ({b.opcode})"
    if state.instruction:
        return f"while running {state.instruction}"
    return f"while {state.status}"


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("The actor") and "Traceback" not in line:
            return line[:300]
    return text.splitlines()[0][:300] if text else type(error).__name__


def actor_failure(replicas: list[int], last: dict[int, ReplicaState], error: BaseException,
                  published: dict[int, str] | None = None) -> ReplicaFailure:
    """The ReplicaFailure for the death of the actor that ran `replicas`: each named with the
    instruction it was executing when the process died (`published`, read from the slots the
    process left, transport/where.py), else with what the last poll saw it doing."""
    published = published or {}
    # Named first: a replica in a custom call (foreign code is where a process dies), else the first.
    r = next((q for q in replicas if "(custom-call" in published.get(q, "")), replicas[0])
    others = ""
    if len(replicas) > 1:
        others = " (with " + ", ".join(f"replica {o} {doing_at(o, published, last)}" for o in replicas if o != r) + \
            " in the same actor)"
    cause = _first_line(error)
    failure = ReplicaFailure(f"replica {r} died {doing_at(r, published, last)}{others}: its actor process exited "
                             f"({type(error).__name__}: {cause})", r, f"{type(error).__name__}: {cause}")
    at = published.get(r)
    failure.instruction = at if at is not None and at is not BETWEEN_RUNS else _instruction(last.get(r))
    return failure


# What `published` says of a replica whose interpreter ran nothing (a persistent job between calls).
BETWEEN_RUNS = "between runs"


def doing_at(r: int, published: dict[int, str], last: dict[int, ReplicaState]) -> str:
    """What replica `r` was doing: its published slot's instruction, else the last poll's state."""
    text = published.get(r)
    if text is None:
        return doing(last.get(r))
    if text is BETWEEN_RUNS:
        return "between runs (it had returned from its last one)"
    state = last.get(r)
    if state is not None and state.status == "blocked" and state.block is not None and \
            text.startswith(f"%{state.block.instruction} ("):
        return f"while blocked in {text}"
    return f"while running {text}"


def published(watch: Any, token: str, replicas: list[int], module: Any) -> dict[int, str]:
    """Per replica of `replicas` (of job `token`): the instruction its slot in `watch` (an actor's
    whereabouts, transport/where.py) says it was executing, as errors name it; replicas between runs
    or without a slot are left out."""
    if watch is None:
        return {}
    try:
        found = watch.codes_of(token, replicas)
    except (OSError, ValueError):
        return {}
    _, by_code = where.codes(module)
    out = {}
    for r, code in found.items():
        inst = by_code.get(code)
        if inst is not None:
            out[r] = f"%{inst.name} ({inst.opcode}" + (f", line {inst.line})" if inst.line is not None else ")")
        elif code == where.NOWHERE:
            out[r] = BETWEEN_RUNS
    return out


def _instruction(state: ReplicaState | None) -> str | None:
    if state is None:
        return None
    if state.block is not None:
        return f"%{state.block.instruction} ({state.block.opcode})"
    return state.instruction


def unplaceable(requests: list[tuple[list[int], dict[str, float]]], nodes: list[dict[str, Any]]) -> str | None:
    """Why some actor can never be placed (no alive node has every resource it asks for), or None.

    `requests` are (replicas, resources) per actor; `nodes` as `ray.nodes()` gives them."""
    totals = [n.get("Resources", {}) for n in nodes if n.get("Alive")]
    for replicas, wanted in requests:
        if not wanted:
            continue
        if any(all(node.get(k, 0) >= v for k, v in wanted.items()) for node in totals):
            continue
        missing = sorted(k for k, v in wanted.items() if not any(node.get(k, 0) >= v for node in totals))
        have = {k: max((node.get(k, 0) for node in totals), default=0) for k in wanted}
        what = ", ".join(f"{k}={wanted[k]:g} (largest on a node: {have[k]:g})" for k in missing) or \
            f"{wanted} together on one node"
        return f"replica{'s' if len(replicas) > 1 else ''} {_ids(replicas)} cannot be placed: no node has {what}"
    return None


def not_started(replicas: list[int], wanted: dict[str, float], free: dict[str, float], total: dict[str, float],
                dead_nodes: int, timeout: float | None) -> str:
    """Why the actors of `replicas` did not start within the timeout: which resource they ask for is
    short now (`free` and `total` over the cluster's alive nodes), or none, and how many nodes died."""
    short = [f"{k}={v:g} ({free.get(k, 0):g} free of {total.get(k, 0):g}: the rest is held by other actors "
             f"or jobs)" for k, v in sorted(wanted.items()) if free.get(k, 0) < v]
    if short:
        why = f"{'replica ' + str(replicas[0]) if len(replicas) == 1 else 'each actor'} asks for " + ", ".join(short)
    elif wanted:
        why = (f"they ask for {', '.join(f'{k}={v:g}' for k, v in sorted(wanted.items()))}, free now on the cluster "
               "but perhaps not together on one node, or their processes were slow to start")
    else:
        why = "they ask for no resources: their processes were slow to start"
    lost = f"; {dead_nodes} node{'s' if dead_nodes > 1 else ''} of the cluster died" if dead_nodes else ""
    # The job's deadline is what is left of the user's `timeout=` once the job was checked: say it
    # as the user wrote it (1.5, not 1.4987978999997722).
    said = "None" if timeout is None else f"{timeout:.3g}"
    return (f"replicas {id_ranges(replicas)} did not start within timeout={said} s: their actors could not be "
            f"placed or started ({why}{lost})")


def _ids(replicas: list[int]) -> str:
    return str(replicas[0]) if len(replicas) == 1 else f"{replicas[0]}-{replicas[-1]}"


__all__ = ["is_memory_error", "doing", "actor_failure", "published", "unplaceable", "not_started"]


def without_report(exc: BaseException) -> BaseException:
    """`exc` without its report (a copy), for the actors: a report holds every replica's state and
    events, pickled once per actor for replicas that only wake with it."""
    if getattr(exc, "report", None) is None:
        return exc
    light = copy.copy(exc)
    light.report = None
    return light
