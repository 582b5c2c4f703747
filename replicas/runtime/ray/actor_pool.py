"""The pool of idle replica actors of this process's Ray session, reused by the next job.

Starting an actor starts a Python process (the slow part of a job's start). A finished job hands
its actors back; one that died, never started, would not stop within the deadline, or hosted a
replica that ran out of memory is killed instead and the next job starts a fresh one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class ActorPool:
    """Idle replica actors of this process's Ray session, by their options, for the next job.

    Starting an actor starts a Python process (the slow part of a job's start); a finished job
    hands its actors back, and one whose replicas would not stop is killed instead."""

    def __init__(self, actor_class: Callable[[], Any]) -> None:
        self._actor_class = actor_class  # -> the Ray actor class to start (ray.remote(ReplicaHost))
        self._idle: dict[tuple, list[Any]] = {}
        self._session: Any = None
        self._notes: dict[Any, dict[str, Any]] = {}  # by actor id: see `note`

    def _check_session(self) -> None:
        import ray

        session = ray.get_runtime_context().get_job_id()
        if session != self._session:
            self._idle.clear()
            self._notes.clear()
            self._session = session

    def note(self, actor: Any) -> dict[str, Any]:
        """What a backend remembers of `actor` from job to job (its wire address, the digest of the
        program it holds): forgotten when the actor is discarded."""
        return self._notes.setdefault(actor._actor_id, {})

    def acquire(self, options: dict[str, Any]) -> tuple[Any, bool]:
        """An actor for `options` and whether it came from the pool (an idle actor may have died
        since it was released: the caller replaces it with `fresh` at first contact)."""
        self._check_session()
        idle = self._idle.get(_options_key(options))
        if idle:
            return idle.pop(), True
        return self.fresh(options), False

    def can_serve(self, options_of_actors: list[dict[str, Any]]) -> bool:
        """True when the pool holds an idle actor for each of these options."""
        from collections import Counter

        self._check_session()
        wanted = Counter(_options_key(o) for o in options_of_actors)
        return all(len(self._idle.get(key, ())) >= count for key, count in wanted.items())

    def hand_back(self, actors_with_options: list[tuple[Any, dict[str, Any]]]) -> None:
        """Pool actors known to be reusable without a reset call (every replica of their job
        finished and the actor reset itself)."""
        for actor, options in actors_with_options:
            self._idle.setdefault(_options_key(options), []).append(actor)

    def fresh(self, options: dict[str, Any]) -> Any:
        return self._actor_class().options(**options).remote()

    def release(self, actors_with_options: list[tuple[Any, dict[str, Any]]], stop_timeout: float = 2.0,
                within: float | None = None) -> None:
        """Reset the actors for the next job; those that do not answer within `stop_timeout` plus a
        margin (or `within`, what is left of the job's deadline, when sooner) are killed."""
        import ray

        self._check_session()
        resets = [a.reset.remote(stop_timeout) for a, _ in actors_with_options]
        # One deadline for all: a stuck actor costs the job's end at most this, however many there are.
        wait = stop_timeout + 5 if within is None else min(stop_timeout + 5, within)
        ready, _ = ray.wait(resets, num_returns=len(resets), timeout=wait) if resets else ([], [])
        ready_set = set(ready)
        stale = []
        for (actor, options), ref in zip(actors_with_options, resets):
            try:
                clean = ref in ready_set and ray.get(ref, timeout=0) is True
            except Exception:  # noqa: BLE001 - dead or stuck: never reuse it
                clean = False
            if clean:
                self._idle.setdefault(_options_key(options), []).append(actor)
            else:
                stale.append(actor)
        self.discard(stale)

    def discard(self, actors: list[Any]) -> None:
        """Kill actors that died, never started, or would not stop (never reused)."""
        import ray

        for actor in actors:
            self._notes.pop(actor._actor_id, None)
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass

    def stats(self) -> dict[str, int]:
        return {"idle": sum(len(v) for v in self._idle.values()), "remembered": len(self._notes)}

    def clear(self) -> None:
        import ray

        for actors in self._idle.values():
            for a in actors:
                try:
                    ray.kill(a, no_restart=True)
                except Exception:  # noqa: BLE001 - already gone
                    pass
        self._idle.clear()
        self._notes.clear()


def _options_key(options: dict[str, Any]) -> tuple:
    return tuple(sorted((k, tuple(sorted(v.items())) if isinstance(v, dict) else v) for k, v in options.items()))
