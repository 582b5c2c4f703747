"""The driver's side of a persistent job on Ray actors (runtime/session.py). A call reaches the
actors of the driver's node through the job's doorbell (transport/doorbell.py: one request in
shared memory, one futex wake, no Ray call) and any other actor by one actor call; each replies
with the outputs small enough to travel (the others stay on the actors: persistent_host.py).
`RayBackend` mixes this in."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from replicas.diagnostics import host_output
from replicas.errors import ReplicaFailure
from replicas.runtime.compile import Executable, has_custom_calls
from replicas.runtime.memory import check_peak
from replicas.runtime.ray.replica_host import STOP_SECONDS
from replicas.transport import doorbell, spin

HOLD_SECONDS = 1.0  # how long the actors stay out of a park after the driver asked (its polls renew it)


class PersistentJob:
    _actors: list[Any]
    _groups: list[list[int]]
    _executable: Executable
    _programs: list[Executable]
    _token: str
    _ray: Any
    num_replicas: int
    poll_interval: float
    calls: Any
    _ensure_launched: Any  # RayBackend's
    _get: Any
    _note: Any  # the actor pool's note on an actor (its wire address)
    _show_printed: Any  # RayBackend's: what the replicas printed, on the driver's stdout
    _prints: bool  # RayBackend's: the program may print (custom calls)
    _bell: doorbell.Doorbell | None = None
    _bell_actors: list[int] = []  # indexes of the actors the doorbell reaches
    _bell_tried = False
    _call_refs: list[Any] | None = None
    _bell_seq: int | None = None
    _bell_spinner: spin.Spinner = spin.NEVER
    # A call rung and its replies not read yet (its actors may still be reading the request: nothing
    # else may be rung meanwhile), and the lock of ringing (`fetch` may come from any thread).
    _bell_pending = False
    _bell_lock: threading.Lock

    def _open_doorbell(self) -> None:
        """The job's doorbell, for the actors on the driver's node (none when shared memory or
        futexes are not available: every call is then an actor call)."""
        self._bell_tried = True
        if not doorbell.available():
            return
        node = self._ray.get_runtime_context().get_node_id()
        here = [i for i, a in enumerate(self._actors) if (self._note(a).get("address") or {}).get("node") == node]
        if not here:
            return
        try:
            bell = doorbell.Doorbell(self._token, len(self._actors), create=True)
        except OSError:  # no room or no rights under /dev/shm: actor calls remain
            return
        self.calls["open_doorbell"] += len(here)
        processes = len(here) + 1  # and this driver: each side's waits spin when they fit the cores
        self._get([self._actors[i].open_doorbell.remote(self._token, i, len(self._actors), processes)
                   for i in here], here)
        self._bell_lock = threading.Lock()
        self._bell, self._bell_actors = bell, here
        self._bell_spinner = spin.Spinner(spin.budget_for(processes, spin.DOORBELL_BUDGET))

    def _wake_actors(self) -> None:
        """Before actor calls: the doorbell's actors keep their main threads, which Ray's calls
        need, out of any park for a while (runtime/ray/parking.py)."""
        bell = self._bell
        if bell is not None:
            bell.hold(HOLD_SECONDS)

    def _close_doorbell(self) -> None:
        bell, self._bell = self._bell, None
        if bell is not None:
            bell.stop()
            bell.close()

    @property
    def single_actor(self) -> bool:
        """Whether one actor hosts every replica (it holds every shard of a kept output)."""
        return len(self._actors) == 1

    def add_program(self, executable: Executable) -> int:
        """Load another program into the job (its actors run it on the same replicas, fabrics and
        kept outputs: persistent_host.py); its number for `rerun`."""
        from replicas.ops.custom_call import registered_custom_calls

        self._ensure_launched()
        check_peak(executable, max(map(len, self._groups)))  # (as the job's first program was)
        self._wake_actors()
        module = self._ray.put(executable.bytes())  # one object for every actor
        custom = registered_custom_calls() or None
        self.calls["add_program"] += len(self._actors)
        numbers = self._get([a.add_program.remote(self._token, module, custom) for a in self._actors])
        self._programs.append(executable)
        if any(number != len(self._programs) - 1 for number in numbers):
            raise ReplicaFailure("the job's actors numbered its programs differently", self._groups[0][0])
        return len(self._programs) - 1

    def drop_program(self, number: int) -> None:
        """The actors let program `number` go (its interpreters and parked threads); not waited
        for: nothing calls it again."""
        self._wake_actors()
        self.calls["drop_program"] += len(self._actors)
        for actor in self._actors:
            actor.drop_program.remote(self._token, number)

    def rerun(self, args: list[list[Any]], seq: int, count: int, fetch_max: int,
              forget: list[tuple[int, int]], program: int = 0) -> None:
        """Run the job's `program` again as call `seq` (`count` outputs) on each replica's `args`
        (values, or `Kept` outputs of earlier calls), after the actors drop `forget`."""
        self._ensure_launched()
        if not self._bell_tried:
            self._open_doorbell()
        self._call = (seq, count, fetch_max)
        executable = self._programs[program]
        if executable is not self._executable:  # (what the monitor's reports name)
            self._executable, self._prints = executable, has_custom_calls(executable)
        self._bell_seq = None
        by_call: Any = range(len(self._actors))
        if self._bell is not None:
            first = args[0]
            if len(args) == 1 or all(a is first or (len(a) == len(first) and all(x is y for x, y in zip(a, first)))
                                     for a in args):
                rung: Any = doorbell.pack(first)  # every replica takes the same values (resident names, ...): once
                arrays = np.ndarray in map(type, rung)
            else:
                rung = {r: doorbell.pack(args[r]) for i in self._bell_actors for r in self._groups[i]}
                arrays = any(type(v) is np.ndarray for values in rung.values() for v in values)
            with self._bell_lock:  # (the arrays `pack` left as they are travel outside the pickle)
                self._bell_seq = self._bell.ring((rung, forget, seq, count, fetch_max, program), out_of_band=arrays)
                self._bell_pending = self._bell_seq is not None
            if self._bell_seq is not None:
                self.calls["doorbell"] += 1
                if len(self._bell_actors) == len(self._actors):  # the doorbell reaches every actor
                    self._call_refs = None
                    return
                by_call = [i for i in by_call if i not in self._bell_actors]
        self.calls["call"] += len(by_call)
        self._call_refs = [self._actors[i].call_and_settle.remote(
            self._token, {r: args[r] for r in self._groups[i]}, forget, self.poll_interval, seq, count, fetch_max,
            program) for i in by_call]

    def finished(self, timeout: float) -> list[list[Any]] | None:
        """Per replica, the call's outputs small enough to come back (None for those kept on the
        actors) once every actor reports its replicas finished within about `timeout` s; None when
        one failed or still runs (the monitor's turn: `settle` after it)."""
        refs, self._call_refs = self._call_refs or [], None
        merged: dict[int, list[Any]] = {}
        asked: Any = range(len(self._actors))  # the actors whose printed lines are asked for
        if self._bell_seq is not None:
            replies = self._bell.replies(self._bell_seq, self._bell_actors, timeout, self._bell_spinner)
            if replies is None:
                return None
            self._bell_pending = False
            failed = False
            printed = []
            for part, lines in replies:  # (a call's replies: each replica's values, or None: failed)
                if part is None:
                    failed = True
                else:
                    for r, values in part.items():
                        merged[r] = doorbell.unpack(values)
                if lines:
                    printed.append(lines)
            if printed:  # (a failed call's, or a too large reply's: asked later)
                host_output.show(printed)
            if failed:
                return None
            if not refs:
                return [merged[r] for r in range(self.num_replicas)]
            asked = [i for i in asked if i not in self._bell_actors]
        if refs:
            ready, _ = self._ray.wait(refs, num_returns=len(refs), timeout=timeout + 1.0)
            if len(ready) < len(refs):
                return None
            for ref in refs:
                try:
                    part = self._ray.get(ref)
                except Exception:  # noqa: BLE001 - a dead actor or a refused call: the monitor's poll names it
                    return None
                if part is None:
                    return None
                merged.update(part)
        if self._prints and asked:
            self.calls["printed"] += len(asked)
            host_output.show(self._get([self._actors[i].printed.remote() for i in asked], list(asked)))
        return [merged[r] for r in range(self.num_replicas)]

    def settle(self) -> list[list[Any]]:
        """After a call the monitor saw finish: its outputs kept, as `finished` gives them."""
        seq, count, fetch_max = self._call
        self._wake_actors()
        self._read_late_replies()
        self._show_printed()
        merged: dict[int, list[Any]] = {}
        for part in self._get([a.settle.remote(self._token, seq, count, fetch_max) for a in self._actors]):
            merged.update(part)
        return [merged[r] for r in range(self.num_replicas)]

    def _read_late_replies(self) -> None:
        """The doorbell's replies to a call the monitor watched to its end, read (their printed
        lines shown: the actors took them off their lists) before anything else is rung."""
        bell = self._bell
        if bell is None or not self._bell_pending or self._bell_seq is None:
            return
        replies = bell.replies(self._bell_seq, self._bell_actors, STOP_SECONDS, self._bell_spinner)
        if replies is not None:
            self._bell_pending = False
            host_output.show([lines for _, lines in _decoded(replies)])

    def fetch(self, key: tuple[int, int], replicas: list[int], until: float | None = None) -> list[Any]:
        """The kept shards of output `key` of `replicas`, in that order: through the doorbell when
        it reaches every actor holding them and no call is in flight on it, else by actor calls
        (answered by `until`, a time.monotonic(), when given; else within the job's deadline)."""
        wanted = set(replicas)
        holders = [i for i, ids in enumerate(self._groups) if any(r in wanted for r in ids)]
        merged: dict[int, Any] | None = None
        if self._bell is not None and not self._bell_pending and all(i in self._bell_actors for i in holders):
            merged = self._fetch_by_bell(tuple(key), replicas)
        if merged is None:
            self._wake_actors()
            self.calls["fetch"] += len(holders)
            refs = [self._actors[i].fetch.remote(key, [r for r in self._groups[i] if r in wanted]) for i in holders]
            merged = {}
            for part in self._get(refs, holders, until):
                merged.update(part)
        return [merged[r] for r in replicas]

    def _fetch_by_bell(self, key: tuple[int, int], replicas: list[int]) -> dict[int, Any] | None:
        """The shards from the doorbell's replies; None when it cannot say (busy, an actor that does
        not answer within a second, shards larger than a reply slot or than /dev/shm has room for,
        an output it no longer holds): the actor calls then fetch them, or name what went wrong."""
        bell = self._bell
        if bell is None or not self._bell_lock.acquire(blocking=False):  # another thread rings
            return None
        try:
            if self._bell_pending:
                return None
            for _attempt in range(2):  # the second after making the room the actors asked for
                seq = bell.ring((key, replicas, [bell.room(i) for i in range(bell.actors)]))
                if seq is None:
                    return None
                self.calls["doorbell_fetch"] += 1
                # (every actor reads the request, the others reply nothing: the next may overwrite it)
                replies = bell.replies(seq, self._bell_actors, max(1.0, self.poll_interval), self._bell_spinner)
                if replies is None:
                    return None
                decoded = _decoded(replies)
                larger = [(i, part) for i, (part, _) in zip(self._bell_actors, decoded) if type(part) is int]
                if not larger:
                    break
                if not all(bell.make_room(i, nbytes) for i, nbytes in larger):
                    return None
            else:
                return None
        finally:
            self._bell_lock.release()
        merged: dict[int, Any] = {}
        for part, _ in decoded:
            if part is None:
                return None
            merged.update((r, values[0]) for r, values in part.items())
        return merged


def _decoded(replies: list[Any]) -> list[tuple[dict[int, list[Any]] | int | None, Any]]:
    """The doorbell's replies as (each replica's values, None or a size; the lines printed, or ())."""
    out = []
    for reply in replies:
        part, lines = reply
        # (None: failed; a number: the bytes a fetch's reply needs, more than the room it had)
        out.append((part if part is None or type(part) is int else {r: doorbell.unpack(v) for r, v in part.items()},
                    lines or ()))
    return out
