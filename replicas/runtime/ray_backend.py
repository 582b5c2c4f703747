"""Replicas as Ray actors. Each actor hosts one replica (or several, packed) and its mailbox.

Data moves actor to actor: a fabric `send` is a `deliver` call on the peer's actor, whose numpy
payload travels through Ray's object store (zero-copy reads on one node). The driver only starts
actors, polls their states for the monitor and collects results; it is never in a data path.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Hashable
from typing import Any

from replicas.diagnostics.recorder import FlightRecorder
from replicas.diagnostics.state import HOST, ReplicaState
from replicas.errors import ReplicaFailure, ReplicasError
from replicas.runtime.compile import Executable
from replicas.runtime.fabric import Fabric
from replicas.runtime.mailbox import Mailbox

_init_lock = threading.Lock()


def ensure_ray(address: str | None = None) -> None:
    """Join `address` ("auto", "ray://host:port") or start a quiet local Ray once per process."""
    import ray

    with _init_lock:
        if ray.is_initialized():
            return
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        os.environ.setdefault("RAY_DEDUP_LOGS", "0")
        kwargs: dict[str, Any] = dict(logging_level=logging.ERROR, log_to_driver=False,
                                      configure_logging=True, ignore_reinit_error=True)
        if address is None:
            kwargs["include_dashboard"] = False
        try:
            ray.init(address=address, **kwargs)
        except Exception as e:  # noqa: BLE001 - Ray raises many kinds; the user needs one
            raise ReplicaFailure(f"cannot start or join Ray (address={address!r}): {type(e).__name__}: {e}") from e


class RayFabric(Fabric):
    def __init__(self, replica_id: int, num_replicas: int, mailbox: Mailbox,
                 local: dict[int, Mailbox], **kwargs: Any) -> None:
        super().__init__(replica_id, num_replicas, mailbox, **kwargs)
        self._local = local
        self.routes: dict[int, Any] = {}

    def _post(self, dst: int, key: Hashable, value: Any) -> None:
        box = self._local.get(dst)
        if box is not None:
            box.deliver(self.replica_id, key, value)
        else:
            self.routes[dst].deliver.remote(dst, self.replica_id, key, value)


class ReplicaHost:
    """The body of a replica actor: hosts the replicas `replica_ids` of one job."""

    def __init__(self, replica_ids: list[int], num_replicas: int, module_bytes: bytes, strict: bool,
                 record_every_instruction: bool) -> None:
        from replicas.runtime.threads import ReplicaRunner

        executable = Executable.from_bytes(module_bytes)
        self._mailboxes = {r: Mailbox(r) for r in replica_ids}
        self._runners: dict[int, ReplicaRunner] = {}
        self._fabrics: list[RayFabric] = []
        for r in replica_ids:
            recorder = FlightRecorder(r, every_instruction=record_every_instruction)
            fabric = RayFabric(r, num_replicas, self._mailboxes[r], self._mailboxes, strict=strict,
                               recorder=recorder)
            self._fabrics.append(fabric)
            self._runners[r] = ReplicaRunner(executable, fabric, recorder)

    def connect(self, routes: dict[int, Any]) -> None:
        for fabric in self._fabrics:
            fabric.routes = routes

    def start(self, args: dict[int, list[Any]]) -> None:
        for r, a in args.items():
            self._runners[r].start(a)

    def deliver(self, dst: int, src: int, key: Hashable, value: Any) -> None:
        self._mailboxes[dst].deliver(src, key, value)

    def states(self) -> list[ReplicaState]:
        return [runner.state() for runner in self._runners.values()]

    def results(self) -> dict[int, Any]:
        return {r: runner.result for r, runner in self._runners.items()}

    def errors(self) -> dict[int, BaseException]:
        out = {}
        for r, runner in self._runners.items():
            e = runner.own_error()
            if e is not None:
                out[r] = e if _picklable(e) else ReplicaFailure(f"replica {r} failed: {type(e).__name__}: {e}", r,
                                                                repr(e))
        return out

    def abort(self, exc: BaseException) -> None:
        for box in self._mailboxes.values():
            box.abort(exc)

    def outfeed(self, replica: int, timeout: float | None) -> Any:
        return self._mailboxes[replica].get_outfeed(timeout)

    def from_channel(self, replica: int, channel_id: int, timeout: float | None) -> Any:
        return self._mailboxes[replica].get_from_channel(channel_id, timeout)

    def events(self) -> dict[int, list[dict[str, Any]]]:
        return {r: runner.recorder.events() for r, runner in self._runners.items()}

    def wait(self, timeout: float) -> bool:
        """True once every hosted replica has stopped (finished, failed or cancelled)."""
        for runner in self._runners.values():
            if not runner.join(timeout):
                return False
        return True


def _picklable(e: BaseException) -> bool:
    import pickle

    try:
        pickle.dumps(e)
        return True
    except Exception:  # noqa: BLE001
        return False


_actor_class = None


def _remote_host_class() -> Any:
    global _actor_class
    if _actor_class is None:
        import ray

        _actor_class = ray.remote(ReplicaHost)
    return _actor_class


class RayBackend:
    """Runs the replicas in Ray actors (see `Backend` in job.py)."""

    poll_interval = 0.05

    def __init__(self, executable: Executable, args: list[list[Any]], *, address: str | None = None,
                 strict: bool = True, record_every_instruction: bool = False, replicas_per_actor: int = 1,
                 resources: list[dict[str, float]] | None = None, num_cpus: float = 0) -> None:
        import ray

        ensure_ray(address)
        self._ray = ray
        n = len(args)
        self.num_replicas = n
        per = max(1, int(replicas_per_actor))
        groups = [list(range(i, min(i + per, n))) for i in range(0, n, per)]
        module_ref = ray.put(executable.to_bytes())  # shipped once; every actor reads the same object
        cls = _remote_host_class()
        self._actors = []
        self._actor_of: dict[int, Any] = {}
        for ids in groups:
            options: dict[str, Any] = {"num_cpus": num_cpus, "max_concurrency": 8 + 2 * n}
            if resources is not None:
                merged: dict[str, float] = {}
                for r in ids:
                    for k, v in (resources[r] or {}).items():
                        merged[k] = merged.get(k, 0) + v
                if merged:
                    options["resources"] = merged
            actor = cls.options(**options).remote(ids, n, module_ref, strict, record_every_instruction)
            self._actors.append(actor)
            for r in ids:
                self._actor_of[r] = actor
        self._groups = groups
        try:
            ray.get([a.connect.remote(self._actor_of) for a in self._actors])
            ray.get([a.start.remote({r: args[r] for r in ids}) for a, ids in zip(self._actors, groups)])
        except Exception as e:
            self.shutdown()
            raise _unwrap(e) from None
        self._stopped = False

    def _get(self, refs: list[Any]) -> list[Any]:
        try:
            return self._ray.get(refs)
        except Exception as e:
            raise _unwrap(e) from None

    def states(self) -> list[ReplicaState]:
        out: list[ReplicaState] = []
        for states in self._get([a.states.remote() for a in self._actors]):
            out.extend(states)
        return out

    def wait(self, timeout: float) -> None:
        self._ray.wait([a.wait.remote(timeout) for a in self._actors], num_returns=len(self._actors),
                       timeout=timeout + 1)

    def results(self) -> list[Any]:
        merged: dict[int, Any] = {}
        for part in self._get([a.results.remote() for a in self._actors]):
            merged.update(part)
        return [merged[r] for r in range(self.num_replicas)]

    def errors(self) -> dict[int, BaseException]:
        merged: dict[int, BaseException] = {}
        for part in self._get([a.errors.remote() for a in self._actors]):
            merged.update(part)
        return merged

    def abort(self, exc: BaseException) -> None:
        for a in self._actors:
            a.abort.remote(exc)

    def shutdown(self) -> None:
        if getattr(self, "_stopped", False):
            return
        self._stopped = True
        for a in self._actors:
            try:
                self._ray.kill(a, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass

    def deliver_from_host(self, replica: int, key: tuple, value: Any) -> None:
        self._actor_of[replica].deliver.remote(replica, HOST, key, value)

    def outfeed(self, replica: int, timeout: float | None) -> Any:
        return self._get([self._actor_of[replica].outfeed.remote(replica, timeout)])[0]

    def from_channel(self, replica: int, channel_id: int, timeout: float | None) -> Any:
        return self._get([self._actor_of[replica].from_channel.remote(replica, channel_id, timeout)])[0]

    def events(self) -> dict[int, list[dict[str, Any]]]:
        merged: dict[int, list[dict[str, Any]]] = {}
        try:
            for part in self._ray.get([a.events.remote() for a in self._actors], timeout=10):
                merged.update(part)
        except Exception:  # noqa: BLE001 - events are a best-effort addition to a report
            pass
        return merged


def _unwrap(e: BaseException) -> BaseException:
    """Turn Ray's wrappers into the error the replica raised, or a ReplicaFailure naming the actor."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, (ReplicasError, TimeoutError, EOFError)):
        return cause
    if isinstance(e, (ReplicasError, TimeoutError, EOFError)):
        return e
    return ReplicaFailure(f"a replica actor failed: {type(e).__name__}: {e}", None, repr(e))
