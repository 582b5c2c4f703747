"""The actor's side of a persistent job (runtime/session.py): its replicas run the job's program
again for every call, and the outputs stay here, by (call, output), until the driver forgets them.

A call's arguments are values, or `Kept` names of outputs of earlier calls this actor holds
(nothing moves). Its reply carries the outputs small enough to travel with it (a loss) and the
rest stay. `ReplicaHost` mixes this in; its job state (`_runners`, `_token`, `_job_turn`) is the
persistent job's.
"""

from __future__ import annotations

import time
from typing import Any

from replicas.errors import ReplicaFailure
from replicas.runtime.resident import Kept


class PersistentCalls:
    _runners: dict[int, Any]
    _token: str
    _job_turn: Any
    _launched: Any
    _faults: dict[int, Any]

    _kept: dict[tuple[int, int], dict[int, Any]]  # (call, output) -> replica -> its shard

    def call(self, token: str, args: dict[int, list[Any]], forget: list[tuple[int, int]]) -> None:
        """Run the program again on each hosted replica's `args` (`Kept` names resolved here), after
        dropping the outputs named in `forget`. Returns nothing: `settle` collects the outcome."""
        store = self._kept
        with self._job_turn:
            if self._token != token:
                raise ReplicaFailure(f"actor of replica {min(args)} is not set up for this job", min(args))
            for key in forget:
                store.pop(key, None)
            for r, values in args.items():
                resolved = [store[(a.call, a.output)][r] if type(a) is Kept else a for a in values]
                self._runners[r].rerun(resolved)
            self._launched = token

    def call_and_settle(self, token: str, args: dict[int, list[Any]], forget: list[tuple[int, int]],
                        finish_within: float, seq: int, count: int, fetch_max: int) -> dict[int, list[Any]] | None:
        """`call`, then `settle` once every hosted replica finished within `finish_within` s; None
        when one failed or still runs (the driver's monitor takes over)."""
        self.call(token, args, forget)
        deadline = time.monotonic() + finish_within
        for runner in self._runners.values():
            if not runner.join(max(0.0, deadline - time.monotonic())) or runner.error is not None:
                return None
        if self._faults:
            return None
        return self.settle(token, seq, count, fetch_max)

    def settle(self, token: str, seq: int, count: int, fetch_max: int) -> dict[int, list[Any]]:
        """Keep every hosted replica's outputs of the call just finished as call `seq`; per replica,
        the outputs of at most `fetch_max` bytes (None for the others, which stay here)."""
        store = self._kept
        out: dict[int, list[Any]] = {}
        for r, runner in self._runners.items():
            leaves = output_leaves(runner.result, count)
            for i, value in enumerate(leaves):
                store.setdefault((seq, i), {})[r] = value
            out[r] = [v if getattr(v, "nbytes", 0) <= fetch_max else None for v in leaves]
        return out

    def fetch(self, key: tuple[int, int], replicas: list[int]) -> dict[int, Any]:
        """The kept shards of output `key` of the hosted `replicas`."""
        kept = self._kept.get(tuple(key))
        if kept is None:
            raise ReplicaFailure(f"this actor no longer holds output {key[1]} of call {key[0]}", replicas[0])
        return {r: kept[r] for r in replicas if r in kept}


def output_leaves(result: Any, count: int) -> list[Any]:
    """A replica's result as the list of the program's `count` outputs."""
    if count == 1 and not (isinstance(result, tuple) and len(result) == 1):
        return [result]
    return list(result)
