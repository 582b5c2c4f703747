"""Joining a Ray cluster, or starting a private local Ray, once per driver process; a local
instance (or a cluster on 127.0.0.1) keeps its listeners on loopback."""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import threading
from typing import Any

from replicas.cluster.address import prepare_to_join
from replicas.cluster.liveness import quiet_ray_messages
from replicas.errors import ReplicaFailure, ResourceExhausted, exhausted_resource

_init_lock = threading.Lock()


_worker: Any = None  # Ray's one worker object of this process (`ray.init` and `shutdown` keep it)


def connection() -> Any:
    """This driver's connection to its Ray session: a new object after each `ray.init` (a job id
    does not tell sessions apart: every session numbers its jobs from 1). Asked before every call."""
    global _worker
    if _worker is None:
        import ray

        _worker = ray._private.worker.global_worker  # noqa: SLF001
    return _worker.node


def ensure_ray(address: str | None = None, timeout: float | None = None) -> None:
    """Join `address` ("auto", "ray://host:port") or start a quiet local Ray once per process. A
    cluster that does not answer within `timeout` s is an error naming it; this driver takes the
    cluster's authentication mode (replicas/cluster/address.py)."""
    import ray

    with _init_lock:
        if ray.is_initialized():
            return
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        os.environ.setdefault("RAY_DEDUP_LOGS", "0")
        # Messages up to 2 MiB travel inline with their task instead of through the object store,
        # which costs a megabyte collective a round trip through the store.
        os.environ.setdefault("RAY_max_direct_call_object_size", str(2 << 20))
        kwargs: dict[str, Any] = dict(logging_level=logging.ERROR, log_to_driver=False,
                                      configure_logging=True, ignore_reinit_error=True)
        if address is None:
            # "local" always starts a private instance: a cluster left behind by `ray start`
            # on this machine must not capture a laptop run.
            address = "local"
            kwargs["include_dashboard"] = False
        else:
            prepare_to_join(address, timeout)
        try:
            with _loopback_node() if _on_loopback(address) else contextlib.nullcontext():
                ray.init(address=address, **kwargs)
            quiet_ray_messages()
            if address == "local":  # this driver's own Ray: its reaper stops what survives a killed driver
                from replicas.runtime.ray import reaper
                from replicas.transport.shm import PREFIX, SHM_DIR

                if reaper.lease(SHM_DIR, PREFIX) is not None:
                    reaper.tell_local_ray(ray._private.worker._global_node)  # noqa: SLF001 - its processes
        except Exception as e:  # noqa: BLE001 - Ray raises many kinds; the user needs one
            message = f"cannot start or join Ray (address={address!r}): {type(e).__name__}: {e}"
            resource = _exhausted(e)
            if resource is not None:  # the machine refused Ray a process, a descriptor, memory: say which
                raise ResourceExhausted(f"{message} (out of {resource})", resource, cause=e) from e
            raise ReplicaFailure(message) from e


def _exhausted(error: BaseException | None) -> str | None:
    """The resource whose exhaustion `error` or what caused it reports (`errors.exhausted_resource`)."""
    seen = 0
    while error is not None and seen < 16:
        resource = exhausted_resource(error)
        if resource is not None:
            return resource
        error, seen = error.__cause__ or error.__context__, seen + 1
    return None


@contextlib.contextmanager
def _loopback_node() -> Any:
    """Ray's addresses kept on loopback while `ray.init` starts a private local instance or joins
    a cluster on 127.0.0.1 (`replicas cluster start --local`): the instance's GCS, raylet, agents and
    workers then listen on loopback only, and this driver finds its node by 127.0.0.1.

    Why: on Linux Ray replaces 127.0.0.1 by the machine's routable address, both for a node it
    starts (even with `_node_ip_address="127.0.0.1"`) and for the address it joins, and a node
    with a routable address listens on every interface. Ray keeps loopback where it takes the
    machine for one that cannot form a cluster (macOS, Windows: `ray_constants.ENABLE_RAY_CLUSTER`).
    That switch is read when an address is chosen, so it is off only during this `ray.init`: a
    later one of this process that joins a real cluster gets the routable address again.
    tests/test_loopback.py checks the listeners, so a Ray that moves the switch shows up there."""
    from ray._private import ray_constants

    if not hasattr(ray_constants, "ENABLE_RAY_CLUSTER"):
        yield
        return
    before = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = before


def _on_loopback(address: str) -> bool:
    """Whether `address` is a private local instance ("local") or ("auto", host:port; not "ray://")
    a cluster on 127.0.0.1."""
    if address == "local":
        return True
    if address.startswith("ray://"):
        return False
    from ray._private import services

    try:
        found = services.get_ray_address_from_environment(address, None) if address == "auto" else address
        host = found.rpartition(":")[0].strip("[]") if found else ""
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except Exception:  # noqa: BLE001 - not an address this can read: Ray chooses, as without this check
        return False
