"""The process-wide pool of interpreters whose job ended, by program: the next job of the same
program binds no kernels and generates no code."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from replicas.runtime.compile import Executable
from replicas.runtime.interpreter import Interpreter

# Interpreters whose job ended, by (program fingerprint, replica id, number of replicas): the next
# job of the same program binds no kernels and generates no code. Bounded (least recent dropped).
_POOL: OrderedDict[tuple[bytes, int, int], list[Interpreter]] = OrderedDict()
_POOL_LIMIT = 512
_POOL_LOCK = threading.Lock()
_pooled = [0]  # interpreters in _POOL


def checkout(executable: Executable, replica_id: int, fabric: Any, num_replicas: int) -> Interpreter:
    """An interpreter of `executable` for `replica_id` over `fabric`: a pooled one when there is one."""
    key = (executable.fingerprint, replica_id, num_replicas)
    if executable.fingerprint:
        with _POOL_LOCK:
            free = _POOL.get(key)
            interp = free.pop() if free else None
            if interp is not None:
                _pooled[0] -= 1
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
    key = (fingerprint, interp.replica_id, interp.num_replicas)
    with _POOL_LOCK:
        _POOL.setdefault(key, []).append(interp)
        _POOL.move_to_end(key)
        _pooled[0] += 1
        while _pooled[0] > _POOL_LIMIT:
            _pooled[0] -= len(_POOL.popitem(last=False)[1])
