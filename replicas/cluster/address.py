"""Before a driver joins a Ray cluster: is it there, and which authentication does it use?

Why: `ray.init(address=...)` retries an unreachable address for minutes, printing Ray's "Failed to
get cluster ID from GCS" to stdout, and joins a cluster whose authentication differs from its own
only to have every actor die later (a driver in token mode refuses its token-less workers, a
token-less driver is refused by a token cluster). One gRPC call to the cluster's GCS without a
token, bounded by the job's timeout, tells both: no answer (unreachable), UNAUTHENTICATED (token
authentication) or an answer (none)."""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass

from replicas.cluster import grpc_h2
from replicas.errors import ReplicaFailure

AUTH_MODE = "RAY_AUTH_MODE"
# Without a job timeout a cluster that does not answer is given this long.
DEFAULT_CONNECT_SECONDS = 60.0
WORDS = {"token": "token authentication", "disabled": "no authentication"}


@dataclass(frozen=True)
class ClusterProbe:
    address: str  # host:port of the cluster's GCS
    auth: str | None  # "token", "disabled", or None: not known


def gcs_address(address: str) -> str | None:
    """host:port of the GCS `address` names ("auto": Ray's own search; RAY_ADDRESS first), None for
    a Ray Client address (ray://) or when "auto" finds nothing (Ray reports that itself)."""
    if address.startswith("ray://"):
        return None
    from ray._private import services

    try:
        found = services.get_ray_address_from_environment(address, None) if address == "auto" else address
    except Exception:  # noqa: BLE001 - no cluster found: ray.init says so
        return None
    return found or None


def probe(address: str, timeout: float | None) -> ClusterProbe:
    """The cluster at `address` (host:port), asked once within `timeout` s (default
    DEFAULT_CONNECT_SECONDS). ReplicaFailure, one line naming the address, if it does not answer;
    None for the authentication when the answer is not one this understands (Ray then decides)."""
    seconds = DEFAULT_CONNECT_SECONDS if timeout is None else max(0.1, timeout)
    deadline = time.monotonic() + seconds
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ReplicaFailure(f"{address!r} is not a Ray cluster address (host:port)")
    while True:
        try:
            left = max(0.05, deadline - time.monotonic())
            with socket.create_connection((host.strip("[]"), int(port)), timeout=left) as s:
                return ClusterProbe(address, grpc_h2.authentication(s, address, deadline))
        except (TimeoutError, ConnectionError, OSError) as e:
            if time.monotonic() + 0.5 >= deadline:
                # What is left of the job's timeout by now, as a person would write it.
                raise ReplicaFailure(f"no Ray cluster answered at {address} within {round(seconds, 1):g} s "
                                     f"({type(e).__name__}: {e})") from None
            time.sleep(0.5)  # a cluster still starting: Ray's own join retries the same way


def match_authentication(found: ClusterProbe) -> None:
    """This driver's Ray authentication set to the cluster's, unless the user chose one: then a
    mismatch is an error now (joining would let every actor die later). Token mode needs a token
    where Ray looks for one (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token)."""
    chosen = os.environ.get(AUTH_MODE) or None
    if found.auth is None:
        return
    if chosen is not None and chosen.lower() != found.auth:
        raise ReplicaFailure(f"the Ray cluster at {found.address} uses {WORDS[found.auth]} but "
                             f"{AUTH_MODE}={chosen} here: unset it or set {AUTH_MODE}={found.auth}")
    if found.auth == "token" and not has_token():
        raise ReplicaFailure(f"the Ray cluster at {found.address} uses token authentication and no token "
                             "was found (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token): copy the "
                             "cluster's token (`ray get-auth-token` on its head node)")
    if chosen is None:
        os.environ[AUTH_MODE] = found.auth
        try:  # Ray caches its configuration, authentication mode included, in its C++ layer
            from ray._raylet import Config

            Config.initialize("")
        except Exception:  # noqa: BLE001 - a Ray without the cache reads the environment at init
            pass


def has_token() -> bool:
    if os.environ.get("RAY_AUTH_TOKEN"):
        return True
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.expanduser("~/.ray/auth_token")
    try:
        with open(path) as f:
            return bool(f.read().strip())
    except OSError:
        return False


def prepare_to_join(address: str, timeout: float | None) -> None:
    """Check the cluster at `address` ("auto", host:port; ray:// is left to Ray) answers within
    `timeout` and make this driver's authentication the cluster's."""
    where = gcs_address(address)
    if where is not None:
        match_authentication(probe(where, timeout))
