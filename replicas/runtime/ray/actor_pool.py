"""The pool of idle replica actors of this process's Ray session, reused by the next job.

Starting an actor starts a Python process (the slow part of a job's start). A finished job hands
its actors back; one that died, never started, would not stop within the deadline, or hosted a
replica that ran out of memory is killed instead and the next job starts a fresh one.

A job that ended with an error releases its actors without waiting for their resets (`later`): the
error reaches the caller while thousands of replica threads still unwind in the actors, and the
pool settles those resets (reused or killed, as for a waited release) before it next hands out or
counts an actor.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class ActorPool:
    """Idle replica actors of this process's Ray session, by their options, for the next job.

    Starting an actor starts a Python process (the slow part of a job's start); a finished job
    hands its actors back, and one whose replicas would not stop is killed instead."""

    def __init__(self, actor_class: Callable[[], Any]) -> None:
        self._actor_class = actor_class  # -> the Ray actor class to start (ray.remote(ReplicaHost))
        self._ready: dict[tuple, list[Any]] = {}  # idle actors, by options (`_idle`: once settled)
        # Released actors whose reset is still running: (actor, options, the reset's ref, deadline).
        self._pending: list[tuple[Any, dict[str, Any], Any, float]] = []
        self._session: Any = None
        self._notes: dict[Any, dict[str, Any]] = {}  # by actor id: see `note`

    @property
    def _idle(self) -> dict[tuple, list[Any]]:
        """The idle actors by options, once the pending resets are settled (tests read it)."""
        self.settle()
        return self._ready

    def _check_session(self) -> None:
        from replicas.runtime.ray.startup import connection

        session = connection()
        if session is not self._session:
            self._ready.clear()
            self._notes.clear()
            self._pending.clear()
            self._session = session
        self.settle()

    def settle(self) -> None:
        """Wait for the resets of actors released `later` (each until its deadline at most): pool those
        that reset cleanly, kill the others."""
        import ray

        pending, self._pending = self._pending, []
        if not pending or not ray.is_initialized():
            return  # (Ray was shut down: its actors went with it; asking would start a new Ray)
        refs = [ref for _, _, ref, _ in pending]
        left = max(0.0, max(deadline for _, _, _, deadline in pending) - time.monotonic())
        try:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=left)
        except Exception:  # noqa: BLE001 - refs of a session that ended meanwhile: none is reused
            ready = []
        self._sort_out([(actor, options) for actor, options, _, _ in pending], refs, set(ready))

    def note(self, actor: Any) -> dict[str, Any]:
        """What a backend remembers of `actor` from job to job (its wire address, the digest of the
        program it holds): forgotten when the actor is discarded."""
        return self._notes.setdefault(actor._actor_id, {})

    def acquire(self, options: dict[str, Any]) -> tuple[Any, bool]:
        """An actor for `options` and whether it came from the pool (an idle actor may have died
        since it was released: the caller replaces it with `fresh` at first contact)."""
        self._check_session()
        idle = self._ready.get(_options_key(options))
        if idle:
            return idle.pop(), True
        return self.fresh(options), False

    def can_serve(self, options_of_actors: list[dict[str, Any]]) -> bool:
        """True when the pool holds an idle actor for each of these options."""
        from collections import Counter

        self._check_session()
        wanted = Counter(_options_key(o) for o in options_of_actors)
        return all(len(self._ready.get(key, ())) >= count for key, count in wanted.items())

    def hand_back(self, actors_with_options: list[tuple[Any, dict[str, Any]]]) -> None:
        """Pool actors known to be reusable without a reset call (every replica of their job
        finished and the actor reset itself)."""
        for actor, options in actors_with_options:
            self._ready.setdefault(_options_key(options), []).append(actor)

    def fresh(self, options: dict[str, Any]) -> Any:
        return self._actor_class().options(**options).remote()

    def release(self, actors_with_options: list[tuple[Any, dict[str, Any]]], stop_timeout: float = 2.0,
                within: float | None = None, later: bool = False) -> None:
        """Reset the actors for the next job; those that do not answer within `stop_timeout` plus a
        margin (or `within`, what is left of the job's deadline, when sooner) are killed. `later`:
        return at once; the pool waits for the resets when it next needs its actors (`settle`)."""
        import ray

        self._check_session()
        resets = [a.reset.remote(stop_timeout) for a, _ in actors_with_options]
        # One deadline for all: a stuck actor costs the job's end at most this, however many there are.
        wait = stop_timeout + 5 if within is None else min(stop_timeout + 5, within)
        if later:
            deadline = time.monotonic() + wait
            self._pending.extend((a, o, ref, deadline) for (a, o), ref in zip(actors_with_options, resets))
            return
        ready, _ = ray.wait(resets, num_returns=len(resets), timeout=wait) if resets else ([], [])
        self._sort_out(actors_with_options, resets, set(ready))

    def _sort_out(self, actors_with_options: list[tuple[Any, dict[str, Any]]], resets: list[Any],
                  ready_set: set[Any]) -> None:
        """Pool each actor whose reset answered that it is clean; kill the others."""
        import ray

        stale = []
        for (actor, options), ref in zip(actors_with_options, resets):
            try:
                clean = ref in ready_set and ray.get(ref, timeout=0) is True
            except Exception:  # noqa: BLE001 - dead or stuck: never reuse it
                clean = False
            if clean:
                self._ready.setdefault(_options_key(options), []).append(actor)
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
        self.settle()
        return {"idle": sum(len(v) for v in self._ready.values()), "remembered": len(self._notes)}

    def clear(self) -> None:
        import ray

        self.settle()
        for actors in self._ready.values():
            for a in actors:
                try:
                    ray.kill(a, no_restart=True)
                except Exception:  # noqa: BLE001 - already gone
                    pass
        self._ready.clear()
        self._notes.clear()


def _options_key(options: dict[str, Any]) -> tuple:
    return tuple(sorted((k, tuple(sorted(v.items())) if isinstance(v, dict) else v) for k, v in options.items()))
