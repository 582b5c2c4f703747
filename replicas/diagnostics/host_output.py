"""What replicas print (a host callback's `jax.debug.print`), on its way to the driver's stdout.

In the driver's process (the threads backend) a replica's lines are written at once. A Ray actor's
stdout is its worker's log, which the driver does not echo, so an actor collects them instead
(`collect()`, when it starts) and the driver takes them with the outcome of each job or call
(`take()` in the actor, `show()` on the driver): each replica's lines in the order it printed them.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, TextIO

_lock = threading.Lock()
_collected: list[tuple[int, str]] | None = None  # None: write through


def collect() -> None:
    """From now on, keep what replicas of this process print for `take` (a Ray actor)."""
    global _collected
    with _lock:
        if _collected is None:
            _collected = []


def write(replica: int, text: str, stream: TextIO | None = None) -> None:
    """`text` (whole lines, already prefixed with the replica) that `replica` printed."""
    with _lock:
        if _collected is not None:
            _collected.append((replica, text))
            return
        out = stream if stream is not None else sys.stdout
        out.write(text)
        out.flush()


def take() -> list[tuple[int, str]]:
    """What replicas of this process printed since the last `take`, in the order they printed it."""
    global _collected
    if not _collected:  # (the replicas that printed finished before: their appends are seen)
        return []
    with _lock:
        taken, _collected = _collected or [], []
        return taken


def show(parts: list[Any]) -> None:
    """On the driver: write what each actor's `take` gave, replica by replica (each replica's lines
    in order)."""
    printed = sorted((item for part in parts for item in part or ()), key=lambda item: item[0])
    if printed:
        sys.stdout.write("".join(text for _, text in printed))
        sys.stdout.flush()
