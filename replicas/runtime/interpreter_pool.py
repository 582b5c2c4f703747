"""The process-wide pool of interpreters whose job ended, by program: the next job of the same
program binds no kernels and generates no code."""

from __future__ import annotations

from typing import Any

from replicas.caching import Cache
from replicas.runtime.compile import Executable
from replicas.runtime.interpreter import Interpreter

# Interpreters whose job ended, by (program fingerprint, replica id, number of replicas): the next
# job of the same program binds no kernels and generates no code. Bounded: the least recently used
# go first. One per key: of two jobs of one program that ran at once (threads), the second to end
# replaces the first's interpreter.
_POOL: Cache[Interpreter] = Cache("pooled interpreters", 512)


def checkout(executable: Executable, replica_id: int, fabric: Any, num_replicas: int) -> Interpreter:
    """An interpreter of `executable` for `replica_id` over `fabric`: a pooled one when there is one."""
    if executable.fingerprint:
        interp = _POOL.pop((executable.fingerprint, replica_id, num_replicas))
        if interp is not None:
            interp.attach(fabric)
            return interp
    return Interpreter(executable, replica_id, fabric, num_replicas)


def checkin(interp: Interpreter) -> None:
    """Return an interpreter whose execution has ended (finished or failed) to the pool, holding
    nothing of its job (the fabric, and through it the job's mailbox and shared memory, are let go)."""
    fingerprint = interp.executable.fingerprint
    if not fingerprint:
        return
    interp.slot.attach(None)
    interp.mailbox = interp.every_instruction_recorder = interp.current = None
    _POOL.put((fingerprint, interp.replica_id, interp.num_replicas), interp)
