"""Where each replica of an actor process is, in memory that outlives the process: the instruction
its interpreter is executing, published for the driver to read after the actor died.

An actor that dies (os._exit or a segfault in a custom call, SIGKILL, the OOM killer) runs no code
on its way out, and the driver's last poll of its states may be a few instructions old (the
monitor polls a few times a second). So each interpreter of an actor process owns a slot of one
shared page set: its generated code stores the code of each instruction before calling its kernel
(one store into shared memory, beside the `current` attribute the monitor's polls read), and the
driver, which mapped the actor's slots while the actor lived, reads them once it is dead.

The slots are an unnamed tmpfs file (`memfd_create`) of the actor process, as its arena is
(transport/shm.py): the driver maps it through `/proc/<pid>/fd/<fd>` at first contact, so nothing
is ever left in /dev/shm, and the driver's mapping keeps the pages readable after the process
died. The driver's node is not always the actor's: when a job spans nodes, each actor also maps the
slots of the job's other actors on its node (`Watches`), and the driver asks a survivor there what a
dead peer published; only when none survives does the error name what the last poll saw.

A slot is four words: the stamp of the job it runs (`stamp(token)`, so a slot of an earlier job is
never taken for this one's), the replica, the code of the instruction (NOWHERE between runs) and
a spare word. Codes number a module's instructions by computation name and position
(`codes(module)`), the same in the driver and in the actors whatever order a module's
computations were sent in.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import threading
from typing import Any

SLOT_WORDS = 4
STAMP, REPLICA, CODE = 0, 1, 2
NOWHERE = -1  # a slot's code when its interpreter runs nothing (between runs, between jobs)
SLOTS = 1 << 15  # interpreters of one process with a slot; more run unpublished (virtual: sparse)
_COMPUTATION_BITS = 24  # a code is (computation rank << 24) | the instruction's position in it


def stamp(token: str) -> int:
    """A job's stamp in a slot (never 0, the stamp of no job)."""
    return int.from_bytes(hashlib.blake2b(token.encode(), digest_size=7).digest(), "little") | 1


_CODES: dict[bytes, tuple[dict[int, int], dict[int, Any]]] = {}  # by program fingerprint: the last few
_CODES_KEPT = 8


def codes_of(executable: Any) -> tuple[dict[int, int], dict[int, Any]]:
    """`codes(executable.module)`, once per program (its interpreters of a process share it)."""
    key = executable.fingerprint
    found = _CODES.get(key) if key else None
    if found is None:
        found = codes(executable.module)
        if key:
            _CODES[key] = found
            while len(_CODES) > _CODES_KEPT:
                del _CODES[next(iter(_CODES))]
    return found


def codes(module: Any) -> tuple[dict[int, int], dict[int, Any]]:
    """(id of each instruction -> its code, code -> the instruction) for `module`."""
    by_id: dict[int, int] = {}
    by_code: dict[int, Any] = {}
    for rank, name in enumerate(sorted(module.computations)):
        for position, inst in enumerate(module.computations[name].instructions):
            code = (rank << _COMPUTATION_BITS) | position
            by_id[id(inst)] = code
            by_code[code] = inst
    return by_id, by_code


class _Slots:
    """This process's slots: the memfd, its mapping, and which slots are free."""

    def __init__(self) -> None:
        self.fd = os.memfd_create("rpl-where", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, SLOTS * SLOT_WORDS * 8)
        self.map = mmap.mmap(self.fd, 0)
        self.words = memoryview(self.map).cast("q")
        self._free = list(range(SLOTS - 1, -1, -1))
        self._taken: dict[int, int] = {}  # id of a slot handed out -> its index
        # Reentrant: `give_back` runs from an interpreter's finalizer, which the collector may run
        # in this very thread while `take` holds the lock (it allocates).
        self._lock = threading.RLock()

    def take(self) -> memoryview | None:
        with self._lock:
            if not self._free:
                return None
            index = self._free.pop()
            slot = self.words[index * SLOT_WORDS:(index + 1) * SLOT_WORDS]
            self._taken[id(slot)] = index
        slot[STAMP], slot[REPLICA], slot[CODE] = 0, -1, NOWHERE
        return slot

    def give_back(self, slot: memoryview) -> None:
        slot[STAMP], slot[REPLICA], slot[CODE] = 0, -1, NOWHERE
        with self._lock:
            index = self._taken.pop(id(slot), None)
            if index is not None:
                self._free.append(index)


_slots: _Slots | None = None
_slots_lock = threading.Lock()


def publish_here() -> None:
    """Interpreters made in this process from now on publish where they are (an actor process)."""
    global _slots
    with _slots_lock:
        if _slots is None and hasattr(os, "memfd_create"):
            try:
                _slots = _Slots()
            except OSError:  # no memfd: the driver names what its last poll saw
                _slots = None


def take() -> memoryview | None:
    """A slot for a new interpreter of this process, or None (not an actor process, or all taken)."""
    slots = _slots
    return None if slots is None else slots.take()


def give_back(slot: memoryview) -> None:
    """The interpreter owning `slot` is gone."""
    slots = _slots
    if slots is not None:
        slots.give_back(slot)


def claim(slot: memoryview | None, token: str, replica: int) -> None:
    """`slot`'s interpreter runs `replica` of job `token` from now on."""
    if slot is not None:
        slot[CODE], slot[STAMP], slot[REPLICA] = NOWHERE, stamp(token), replica


def release(slot: memoryview | None) -> None:
    """`slot`'s interpreter runs no replica of any job (another program's runs them now)."""
    if slot is not None:
        slot[CODE], slot[STAMP] = NOWHERE, 0


def address() -> tuple[int, int] | None:
    """(pid, fd) through which the driver maps this process's slots."""
    slots = _slots
    return None if slots is None else (os.getpid(), slots.fd)


class Watch:
    """The driver's read-only mapping of one actor process's slots (kept after it died)."""

    def __init__(self, pid: int, fd: int) -> None:
        path = f"/proc/{pid}/fd/{fd}"
        if not os.readlink(path).startswith("/memfd:rpl-where"):
            raise OSError(f"{path} is not an actor's slots")  # another process took the pid
        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        self._words = memoryview(self._map).cast("q")

    def codes_of(self, token: str, replicas: list[int]) -> dict[int, int]:
        """Each of `replicas`' published code in job `token` (NOWHERE: between runs)."""
        import numpy as np

        slots = np.frombuffer(self._map, np.int64).reshape(-1, SLOT_WORDS)
        mine = slots[(slots[:, STAMP] == stamp(token)) & np.isin(slots[:, REPLICA], list(replicas))]
        return {int(r): int(code) for r, code in zip(mine[:, REPLICA], mine[:, CODE])}


class Answered:
    """Codes another process read from its watches (`Watches.codes_of`), as a Watch gives them."""

    def __init__(self, codes: dict[int, int]) -> None:
        self._codes = codes

    def codes_of(self, token: str, replicas: list[int]) -> dict[int, int]:
        return {r: self._codes[r] for r in replicas if r in self._codes}


class Watches:
    """An actor's watches of the slots of its job's other actors on its node (by their addresses)."""

    def __init__(self, addresses: list[Any]) -> None:
        self._watches = [w for w in map(watch, dict.fromkeys(tuple(a) for a in addresses if a)) if w is not None]

    def codes_of(self, token: str, replicas: list[int]) -> dict[int, int]:
        found: dict[int, int] = {}
        for w in self._watches:
            found.update(w.codes_of(token, replicas))
        return found


def watch(where: Any) -> Watch | None:
    """The driver's watch of the slots at `where` (an actor's (pid, fd) on this node), or None."""
    if not where:
        return None
    try:
        return Watch(int(where[0]), int(where[1]))
    except (OSError, ValueError, TypeError):  # gone already, or not this node's, or no rights
        return None
