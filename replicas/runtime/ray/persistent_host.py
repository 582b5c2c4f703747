"""The actor's side of a persistent job (runtime/session.py): its replicas run the job's programs
again for every call, and the outputs stay here, by (call, output), until the driver forgets them.

A call's arguments are values, `Kept` names of outputs of earlier calls this actor holds (nothing
moves), or `Resliced` ones, placed otherwise, which it cuts out of the shards it holds. Its reply
carries the outputs small enough to travel with it (a loss) and the rest stay. `ReplicaHost` mixes
this in; its job state (`_runners`, `_token`, `_job_turn`) is the persistent job's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

from replicas.diagnostics import host_output
from replicas.errors import ReplicaFailure
from replicas.runtime.compile import Executable, runs_bounded_alone
from replicas.runtime.ray import parking
from replicas.runtime.resident import Kept, Resliced
from replicas.transport import spin, where
from replicas.transport.doorbell import CALL_ROOM, REPLY_BYTES, Doorbell, pack, unpack

# Ray wraps every method of an actor class for tracing (ray/util/tracing), calls from the actor's
# own code included: the doorbell's per-call path calls the mixin's functions directly instead.


class PersistentCalls:
    _runners: dict[int, Any]
    _mailboxes: dict[int, Any]
    _token: str
    _job_turn: Any
    _launched: Any
    _faults: dict[int, Any]

    _kept: dict[tuple[int, int], dict[int, Any]]  # (call, output) -> replica -> its shard
    # Per program the job runs (`add_program`): its runners and its `_inline_all`; which one `_runners` is.
    _programs: list[tuple[dict[int, Any], bool]]
    _program: int
    _fabrics: list[Any]
    _bounds: Any
    _bounds_of: Any
    runners_of: Any  # ReplicaHost's
    _doorbell: Doorbell | None = None  # the driver's doorbell, when it is on this node
    _inline_all = False  # the program cannot wait (`runs_bounded_alone`): a call runs every replica itself

    def add_program(self, token: str, module_bytes: bytes, custom_calls: dict[str, Any] | None = None) -> int:
        """Load another program into job `token`: each hosted replica gets an interpreter of it bound
        to the same fabric (mailboxes, collective numbering, shared memory, flight recorder), so the
        job's programs run one after another on the same replicas and take each other's kept outputs
        where they are. Its number in the job (for `call`)."""
        from replicas.ops.custom_call import register_custom_call
        from replicas.transport.message_bounds import MessageBounds

        for name, fn in (custom_calls or {}).items():
            register_custom_call(name, fn)
        executable = Executable.from_bytes(module_bytes)
        with self._job_turn:
            if self._token != token or not self._programs:
                raise ReplicaFailure("actor is not set up for this job", min(self._mailboxes, default=0))
            # Peers' messages are judged by what any of the job's programs may send (in place: the
            # channel rings judge by the same object; the next job computes its own again).
            self._bounds.widen(MessageBounds(executable.module, self._fabrics[0].num_replicas))
            self._bounds_of = None
            self._programs.append((self.runners_of(executable, True), runs_bounded_alone(executable)))
            return len(self._programs) - 1

    def drop_program(self, token: str, number: int) -> None:
        """Let program `number` of job `token` go: its replicas' threads end (it is never called again)."""
        with self._job_turn:
            if self._token != token or not 0 <= number < len(self._programs) or number == self._program:
                return  # (the program last called keeps its runners until the next call or the job's end)
            runners, _ = self._programs[number]
            self._programs[number] = ({}, False)
        for runner in runners.values():
            runner.stop()

    def _switch(self, token: str, program: int) -> None:
        """`program`'s runners become the job's (the monitor's states, `settle`, `reset`); its
        interpreters publish where the replicas are (transport/where.py)."""
        for runner in self._runners.values():
            where.release(runner.interpreter.where)
        self._runners, self._inline_all = self._programs[program]
        self._program = program
        for r, runner in self._runners.items():
            where.claim(runner.interpreter.where, token, r)

    def call(self, token: str, args: dict[int, list[Any]], forget: list[tuple[int, int]], program: int = 0) -> bool:
        """Run the job's `program` again on each hosted replica's `args` (`Kept` names resolved
        here), after dropping the outputs named in `forget`; whether every replica ran in this thread
        (then they have all returned). `settle` collects the outcome."""
        inline = PersistentCalls._start_call(self, token, args, forget, program)
        PersistentCalls._run_inline(inline)
        return len(inline) == len(self._runners)

    def _start_call(self, token: str, args: dict[int, list[Any]], forget: list[tuple[int, int]],
                    program: int) -> list[Any]:
        """`call`'s start: the replicas handed to their parked threads; those the calling thread
        runs itself, with their arguments, returned (each hand-off is a thread's wake-up, tens of
        microseconds on a busy machine: the caller takes the first replica, and every replica of a
        program that cannot wait, `_inline_all`, one after the other)."""
        store = self._kept
        inline: list[Any] = []
        with self._job_turn:
            if self._token != token:
                raise ReplicaFailure(f"actor of replica {min(args)} is not set up for this job", min(args))
            if program != self._program:
                PersistentCalls._switch(self, token, program)
            for key in forget:
                store.pop(key, None)
            assembled: dict[tuple[int, int], Any] = {}  # (an output placed otherwise, once a call)
            for r, values in args.items():
                resolved = [store[(a.call, a.output)][r] if type(a) is Kept
                            else a.take(store[(a.call, a.output)], assembled) if type(a) is Resliced else a
                            for a in values]
                if not inline or self._inline_all:
                    inline.append((self._runners[r], resolved))
                else:
                    self._runners[r].rerun(resolved)
            self._launched = token
        return inline

    @staticmethod
    def _run_inline(inline: list[Any]) -> None:
        for runner, values in inline:
            runner.rerun(values, here=True, in_turn=len(inline) > 1)

    def call_and_settle(self, token: str, args: dict[int, list[Any]], forget: list[tuple[int, int]],
                        finish_within: float, seq: int, count: int, fetch_max: int,
                        program: int = 0) -> dict[int, list[Any]] | None:
        """`call`, then `settle` once every hosted replica finished within `finish_within` s; None
        when one failed or still runs (the driver's monitor takes over)."""
        deadline = time.monotonic() + finish_within
        self.call(token, args, forget, program)
        for runner in self._runners.values():
            if not runner.join(max(0.0, deadline - time.monotonic())) or runner.error is not None:
                return None
        if self._faults:
            return None
        return self.settle(token, seq, count, fetch_max)

    def settle(self, token: str, seq: int, count: int, fetch_max: int, packed: bool = False) -> dict[int, list[Any]]:
        """Keep every hosted replica's outputs of the call just finished as call `seq`; per replica,
        the outputs of at most `fetch_max` bytes (None for the others, which stay here), `packed`
        for a doorbell's reply."""
        store = self._kept
        runners = self._runners
        shards: list[dict[int, Any]] = [{} for _ in range(count)]
        for i, by_replica in enumerate(shards):
            store[(seq, i)] = by_replica
        out: dict[int, list[Any]] = {}
        for r, runner in runners.items():
            leaves = output_leaves(runner.result, count)
            for by_replica, value in zip(shards, leaves):
                by_replica[r] = value
            back = [value if getattr(value, "nbytes", 0) <= fetch_max else None for value in leaves]
            out[r] = pack(back) if packed else back
        return out

    def fetch(self, key: tuple[int, int], replicas: list[int]) -> dict[int, Any]:
        """The kept shards of output `key` of the hosted `replicas`."""
        kept = self._kept.get(tuple(key))
        if kept is None:
            raise ReplicaFailure(f"this actor no longer holds output {key[1]} of call {key[0]}", replicas[0])
        return {r: kept[r] for r in replicas if r in kept}


    # -- calls through the driver's doorbell (transport/doorbell.py) -----------------------------------
    def open_doorbell(self, token: str, index: int, actors: int, processes: int = 0) -> None:
        """Serve the calls of job `token` that the driver rings on its doorbell (this actor is
        number `index` of `actors`; the driver and the actors it rings are `processes` processes)
        in a thread of this actor, until the job ends."""
        bell = Doorbell(token, actors)
        self._doorbell = bell
        spinner = spin.Spinner(spin.budget_for(processes, spin.DOORBELL_BUDGET)) if processes > 1 else spin.NEVER
        # The request word as the driver left it, read before this call returns: the driver may
        # ring as soon as it does, before the thread runs.
        last = bell.request_seq()
        threading.Thread(target=self._serve, args=(bell, index, token, spinner, last), name="replicas-doorbell",
                         daemon=True).start()

    def close_doorbell(self) -> None:
        self._doorbell = None  # its thread ends within a slice

    def _serve(self, bell: Doorbell, index: int, token: str, spinner: spin.Spinner, last: int) -> None:
        try:
            while self._doorbell is bell and self._token == token:
                parking.park(bell)  # (unless parked already, or the driver holds the actors awake)
                seq = bell.wait_request(last, spinner=spinner, actor=index)
                if seq is None:
                    if bell.stopped():
                        return
                    continue
                last = seq
                reply, room, fetch = PersistentCalls._serve_one(self, token, bell, index)
                # What a clean call printed travels with its reply, not by a Ray call (a failed call's
                # lines stay for the driver's monitor, which asks for them).
                printed = host_output.take() if reply is not None else []
                needs = bell.reply(index, seq, (reply, printed), room, out_of_band=fetch)
                if needs:
                    # Too large to travel: the driver settles, and asks for the lines (kept here, in
                    # order); a fetch's driver makes the room it is told and asks again.
                    for replica, text in printed:
                        host_output.write(replica, text)
                    bell.reply(index, seq, (needs if fetch and reply is not None else None, None))
        finally:
            parking.release(bell)
            bell.close()

    def _serve_one(self, token: str, bell: Doorbell, index: int) -> tuple[dict[int, list[Any]] | None, int, bool]:
        """One request rung on the doorbell: a call's outcome as `call_and_settle` gives it, without a
        limit on how long the call runs (None as soon as a replica failed: the driver's monitor names
        it), or the shards a fetch asks for; how many bytes its reply may take; whether a fetch."""
        try:
            request = bell.request()
            if len(request) == 3:  # (output, replicas, reply room per actor): shards kept here, for `np.asarray`
                key, replicas, rooms = request
                shards = PersistentCalls.fetch(self, key, [r for r in replicas if r in self._runners])
                if sum(getattr(v, "nbytes", 0) for v in shards.values()) > REPLY_BYTES:
                    return None, CALL_ROOM, True  # more than a reply holds: the driver asks by an actor call
                return {r: pack([v]) for r, v in shards.items()}, rooms[index], True
            args, forget, seq, count, fetch_max, program = request
            # (a list: the values of every replica; a dict: each replica's own)
            if type(args) is list:
                values = unpack(args)
                mine = {r: values for r in self._runners}
            else:
                mine = {r: unpack(args[r]) for r in self._runners}
            returned = PersistentCalls.call(self, token, mine, forget, program)  # the first replica runs here
            runners = self._runners.values()
            for runner in () if returned else runners:
                while not runner.join(0.05):
                    if self._faults or _failed(runners) or self._token != token:
                        return None, CALL_ROOM, False
            if self._faults or _failed(runners):
                return None, CALL_ROOM, False
            return PersistentCalls.settle(self, token, seq, count, fetch_max, packed=True), CALL_ROOM, False
        except Exception:  # noqa: BLE001 - the driver's monitor finds and names what failed
            return None, CALL_ROOM, False


def _failed(runners: Iterable[Any]) -> bool:
    for runner in runners:  # (a loop: a generator costs a call of one replica more)
        if runner.error is not None:
            return True
    return False


def output_leaves(result: Any, count: int) -> list[Any]:
    """A replica's result as the list of the program's `count` outputs."""
    if count == 1 and not (isinstance(result, tuple) and len(result) == 1):
        return [result]
    return list(result)
