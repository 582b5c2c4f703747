"""The driver's side of a persistent job on Ray actors (runtime/session.py): each call is one
actor call per actor that runs the program again and replies with the outputs small enough to
travel (the others stay on the actors: persistent_host.py). `RayBackend` mixes this in."""

from __future__ import annotations

from typing import Any


class PersistentJob:
    _actors: list[Any]
    _groups: list[list[int]]
    _token: str
    _ray: Any
    num_replicas: int
    poll_interval: float
    calls: Any
    _ensure_launched: Any  # RayBackend's
    _get: Any

    def rerun(self, args: list[list[Any]], seq: int, count: int, fetch_max: int,
              forget: list[tuple[int, int]]) -> None:
        """Run the job's program again as call `seq` (`count` outputs) on each replica's `args`
        (values, or `Kept` outputs of earlier calls), after the actors drop `forget`."""
        self._ensure_launched()
        self.calls["call"] += len(self._actors)
        self._call = (seq, count, fetch_max)
        self._call_refs = [a.call_and_settle.remote(self._token, {r: args[r] for r in ids}, forget,
                                                    self.poll_interval, seq, count, fetch_max)
                           for a, ids in zip(self._actors, self._groups)]

    def finished(self, timeout: float) -> list[list[Any]] | None:
        """Per replica, the call's outputs small enough to come back (None for those kept on the
        actors) once every actor reports its replicas finished within about `timeout` s; None when
        one failed or still runs (the monitor's turn: `settle` after it)."""
        refs, self._call_refs = self._call_refs, None
        ready, _ = self._ray.wait(refs, num_returns=len(refs), timeout=timeout + 1.0)
        if len(ready) < len(refs):
            return None
        merged: dict[int, list[Any]] = {}
        for ref in refs:
            try:
                part = self._ray.get(ref)
            except Exception:  # noqa: BLE001 - a dead actor or a refused call: the monitor's poll names it
                return None
            if part is None:
                return None
            merged.update(part)
        return [merged[r] for r in range(self.num_replicas)]

    def settle(self) -> list[list[Any]]:
        """After a call the monitor saw finish: its outputs kept, as `finished` gives them."""
        seq, count, fetch_max = self._call
        merged: dict[int, list[Any]] = {}
        for part in self._get([a.settle.remote(self._token, seq, count, fetch_max) for a in self._actors]):
            merged.update(part)
        return [merged[r] for r in range(self.num_replicas)]

    def fetch(self, key: tuple[int, int], replicas: list[int]) -> list[Any]:
        """The kept shards of output `key` of `replicas`, in that order."""
        wanted = set(replicas)
        refs, indexes = [], []
        for i, (actor, ids) in enumerate(zip(self._actors, self._groups)):
            mine = [r for r in ids if r in wanted]
            if mine:
                refs.append(actor.fetch.remote(key, mine))
                indexes.append(i)
        merged: dict[int, Any] = {}
        for part in self._get(refs, indexes):
            merged.update(part)
        return [merged[r] for r in replicas]
