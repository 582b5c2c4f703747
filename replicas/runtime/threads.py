"""Replicas as threads of one process: the same interpreter and fabric protocol, no Ray.

Used by `replicas check` and by tests that want many replicas fast. The monitor in the calling
thread turns deadlocks and mismatches into errors.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Sequence
from typing import Any

from replicas.diagnostics.recorder import FlightRecorder
from replicas.diagnostics.state import HOST, ReplicaState
from replicas.errors import ReplicaFailure, ReplicasError
from replicas.runtime.compile import Executable
from replicas.runtime.fabric import Fabric
from replicas.runtime.interpreter import Interpreter
from replicas.runtime.mailbox import Mailbox


class ThreadFabric(Fabric):
    def __init__(self, replica_id: int, mailboxes: list[Mailbox], **kwargs: Any) -> None:
        super().__init__(replica_id, len(mailboxes), mailboxes[replica_id], **kwargs)
        self._peers = mailboxes

    def _post(self, dst: int, key: Hashable, value: Any) -> None:
        self._peers[dst].deliver(self.replica_id, key, value)


class ReplicaRunner:
    """One replica's interpreter running in its own thread (under threads or inside a Ray actor)."""

    def __init__(self, executable: Executable, fabric: Fabric, recorder: FlightRecorder) -> None:
        self.replica_id = fabric.replica_id
        self.fabric = fabric
        self.mailbox = fabric.mailbox
        self.recorder = recorder
        self.interpreter = Interpreter(executable, fabric.replica_id, fabric, fabric.num_replicas)
        self.result: Any = None
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def start(self, args: Sequence[Any]) -> None:
        self._thread = threading.Thread(target=self._run, args=(list(args),), daemon=True,
                                        name=f"replica-{self.replica_id}")
        self._thread.start()

    def _run(self, args: list[Any]) -> None:
        try:
            self.result = self.interpreter.run(args)
            self.mailbox.set_status("finished")
        except BaseException as e:  # noqa: BLE001 - reported to the driver, never swallowed
            self.error = e
            status = "cancelled" if self.mailbox.aborted is e else "failed"
            self.mailbox.set_status(status, f"{type(e).__name__}: {e}")

    def join(self, timeout: float | None = None) -> bool:
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def state(self) -> ReplicaState:
        s = self.mailbox.snapshot()
        s.collectives_done = self.fabric.collectives_started()
        if s.status == "running":
            inst = self.interpreter.current
            s.instruction = None if inst is None else f"%{inst.name} ({inst.opcode})"
        return s

    def own_error(self) -> BaseException | None:
        """The replica's error unless it was only woken by an abort."""
        e = self.error
        return None if e is None or self.mailbox.aborted is e else e


def replica_error(replica: int, error: BaseException) -> ReplicasError:
    if isinstance(error, ReplicasError):
        return error
    return ReplicaFailure(f"replica {replica} failed: {type(error).__name__}: {error}", replica, error)


class ThreadBackend:
    """Runs the replicas as threads of this process (see `Backend` in job.py)."""

    poll_interval = 0.02

    def __init__(self, executable: Executable, args: list[list[Any]], *, strict: bool = True,
                 record_every_instruction: bool = False) -> None:
        n = len(args)
        self.num_replicas = n
        self._mailboxes = [Mailbox(r) for r in range(n)]
        self._replicas = []
        for r in range(n):
            recorder = FlightRecorder(r, every_instruction=record_every_instruction)
            fabric = ThreadFabric(r, self._mailboxes, strict=strict, recorder=recorder)
            self._replicas.append(ReplicaRunner(executable, fabric, recorder))
        for replica, a in zip(self._replicas, args):
            replica.start(a)

    def states(self) -> list[ReplicaState]:
        return [rep.state() for rep in self._replicas]

    def wait(self, timeout: float) -> None:
        for rep in self._replicas:
            if not rep.join(0):
                rep.join(timeout)
                return

    def results(self) -> list[Any]:
        return [rep.result for rep in self._replicas]

    def errors(self) -> dict[int, BaseException]:
        return {rep.replica_id: e for rep in self._replicas if (e := rep.own_error()) is not None}

    def abort(self, exc: BaseException) -> None:
        for mb in self._mailboxes:
            mb.abort(exc)

    def shutdown(self) -> None:
        self.abort(ReplicasError("job stopped"))

    def deliver_from_host(self, replica: int, key: tuple, value: Any) -> None:
        self._mailboxes[replica].deliver(HOST, key, value)

    def outfeed(self, replica: int, timeout: float | None) -> Any:
        return self._mailboxes[replica].get_outfeed(timeout)

    def from_channel(self, replica: int, channel_id: int, timeout: float | None) -> Any:
        return self._mailboxes[replica].get_from_channel(channel_id, timeout)

    def events(self) -> dict[int, list[dict[str, Any]]]:
        return {rep.replica_id: rep.recorder.events() for rep in self._replicas}
