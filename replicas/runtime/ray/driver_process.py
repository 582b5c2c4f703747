"""What a driver process keeps across its Ray jobs: the pool of replica actors, the key its
actors authenticate their direct connections with (transport/wire.py), and the tokens of its
jobs, whose shared-memory segments it removes when they end, and its reaper removes if the driver
is killed (runtime/ray/reaper.py)."""

from __future__ import annotations

import atexit
import collections
import secrets
import threading
from typing import Any

from replicas.runtime.ray import reaper
from replicas.runtime.ray.actor_pool import ActorPool
from replicas.runtime.ray.replica_host import ReplicaHost
from replicas.transport.shm import PREFIX, SHM_DIR, remove_orphaned_segments, remove_segments_of

# The key this driver's actors authenticate direct connections with (see wire.py).
AUTHKEY = secrets.token_bytes(32)

_actor_class = None
# Tokens of this driver's jobs that ended (the last ENDED_KEPT). A job's launch may still reach an
# actor after the job ended (it failed or timed out while the call was on its way): the actor then
# creates the job's segments after the driver removed them. Each job's end removes what such jobs
# left, and so does the driver's exit.
ENDED_KEPT = 256
_ended: collections.deque[str] = collections.deque(maxlen=ENDED_KEPT)
_ended_lock = threading.Lock()


def new_job_token() -> str:
    """A new job's token (the random secret its segments are named by), known to the reaper before
    any segment of the job exists."""
    reaper.lease(SHM_DIR, PREFIX)
    token = secrets.token_hex(8)
    reaper.job_started(token)
    return token


def job_ended(*tokens: str) -> None:
    """Remove the segments of `tokens` and of the earlier ended jobs on this node."""
    with _ended_lock:
        _ended.extend(tokens)
        ended = list(_ended)
    remove_segments_of(ended)
    for token in tokens:
        reaper.job_ended(token)


atexit.register(job_ended)


def remote_host_class() -> Any:
    global _actor_class
    if _actor_class is None:
        import ray

        remove_orphaned_segments()  # once per driver: what a killed driver's jobs left on this node
        _actor_class = ray.remote(ReplicaHost)
    return _actor_class


POOL = ActorPool(remote_host_class)
