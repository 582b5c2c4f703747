"""Result buffers of large collectives, reused within a job instead of allocated fresh.

Why: a fresh large numpy buffer is fresh pages: glibc maps every allocation over 32 MiB anew and
numpy asks for huge pages on those of 4 MiB or more, so each collective of a loop paid the kernel's
zero-filling of its result before writing it: a copy into a fresh buffer costs that zero-filling
on top of the copy.

A buffer is handed out again only when nothing but the pool refers to it (`sys.getrefcount`: no
value of the interpreter, no view, no message holds it), so a result a program keeps is never
overwritten. Each replica's pool lives in its fabric's `kernel_state`, so it goes with its job.

A replica actor with same-node peers also keeps its pools' free buffers across its jobs (at most
`KEEP_BYTES` per process, handed to the next job's pools): a fresh large buffer is not only
zero-filled, numpy asks for huge pages, and with the kernel's `defrag=madvise` the first touch may
compact memory synchronously: under load a fresh large buffer costs many times a reused one, and
short jobs paid their page faults again from one job to the next. The actor's arena
(transport/shm.py) is kept across jobs for the same reason; the buffers are handed over when it
closes at the end of the job.
"""

from __future__ import annotations

import math
import os
import sys
import threading
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from replicas.transport.fabric import Fabric

# Below this, malloc reuses freed memory by itself and a pool's bookkeeping costs more than it saves.
MIN_BYTES = 256 * 1024
# Buffers kept per (shape, dtype): a loop's results and its previous ones (still the next operands
# while the new ones are written) alternate, one per local member (all-to-all, reduce-scatter),
# and under Ray partial sums a peer still reads (a reduce-scatter's chunks share their results' shape).
PER_SHAPE = 16
# Bytes a pool keeps at most; beyond, buffers are allocated as before and left to the allocator.
BUDGET = 1 << 30
_KEY = __name__
# Bytes of free buffers a process keeps between jobs (replica actors with same-node peers only).
KEEP_BYTES = int(os.environ.get("REPLICAS_POOL_KEEP_BYTES", str(256 << 20)))
# References to a free buffer while `empty` looks at it: the pool's list, the loop variable and
# getrefcount's own argument.
_FREE_REFS = 3


Key = tuple[tuple[int, ...], np.dtype]


class _Spare:
    """A process's free buffers between jobs, by (shape, dtype), at most `KEEP_BYTES` in all."""

    def __init__(self) -> None:
        self.kept: dict[Key, list[np.ndarray]] = {}
        self.bytes = 0
        self.lock = threading.Lock()

    def take(self, key: Key) -> np.ndarray | None:
        with self.lock:
            found = self.kept.get(key)
            if not found:
                return None
            buffer = found.pop()
            self.bytes -= buffer.nbytes
            return buffer

    def give(self, key: Key, buffer: np.ndarray) -> None:
        with self.lock:
            if self.bytes + buffer.nbytes <= KEEP_BYTES:
                self.kept.setdefault(key, []).append(buffer)
                self.bytes += buffer.nbytes

    def clear(self) -> None:
        with self.lock:
            self.kept.clear()
            self.bytes = 0


SPARE = _Spare()


class BufferPool:
    """One replica's reusable buffers, by (shape, dtype). A pool that `keeps` takes buffers from
    the process's spare ones before it allocates, and gives its free ones back in `retire`.

    With an `outbox` (the actor's shared-memory arena, transport/shm.py), buffers are leased blocks
    of the arena when it has room: a result or partial sum sent to a peer of the node then goes
    as a descriptor of where it already is, without a copy into the arena, and such a block is
    reused only once both nothing here refers to it and every peer that read it released it."""

    __slots__ = ("_kept", "_bytes", "_keeps", "_outbox")

    def __init__(self, keeps: bool = False, outbox: Any = None) -> None:
        # (owner, leased block offset or None): the owner is the buffer, or for a leased block the
        # array every handed-out view refers to (so its reference count sees them all).
        self._kept: dict[Key, list[tuple[np.ndarray, int | None]]] = {}
        self._bytes = 0
        self._keeps = keeps
        self._outbox = outbox

    def empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """A writable C-contiguous buffer of `shape` and `dtype`, contents undefined."""
        dtype = np.dtype(dtype)
        shape = tuple(shape)
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes < MIN_BYTES or dtype.hasobject:
            return np.empty(shape, dtype)
        found = self.reused_or_leased(shape, dtype)
        if found is not None:
            return found
        key = (shape, dtype)
        room = len(self._kept[key]) < PER_SHAPE and self._bytes + nbytes <= BUDGET
        buffer = SPARE.take(key) if self._keeps else None
        if buffer is None:
            buffer = np.empty(shape, dtype)
        else:
            buffer.flags.writeable = True
        if room:
            self._kept[key].append((buffer, None))
            self._bytes += nbytes
        return buffer

    def reused_or_leased(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray | None:
        """A free kept buffer of `shape` and `dtype`, else a newly leased block of the outbox where
        there is room; None when neither (`empty` then allocates)."""
        nbytes = math.prod(shape) * dtype.itemsize
        key = (shape, dtype)
        kept = self._kept.setdefault(key, [])
        outbox = self._outbox
        for owner, offset in kept:
            if sys.getrefcount(owner) == _FREE_REFS:
                if offset is None:
                    owner.flags.writeable = True  # a result several members shared was made read-only
                    return owner
                if not outbox.lent(offset):
                    return owner.view(np.ndarray)
        room = len(kept) < PER_SHAPE and self._bytes + nbytes <= BUDGET
        offset = outbox.lease(nbytes) if room and outbox is not None else None
        if offset is not None:
            owner = outbox.leased_array(offset, shape, dtype)
            kept.append((owner, offset))
            self._bytes += nbytes
            return owner.view(np.ndarray)
        return None

    def retire(self) -> bool:
        """The job is over: its free buffers go to the process's spare ones (a pool that keeps),
        the pool forgets every buffer (one still held elsewhere stays its holder's). False if a
        leased block of the arena is still referred to (the arena must not serve another job)."""
        kept, self._kept, self._bytes = self._kept, {}, 0
        reusable = True
        for key, entries in kept.items():
            while entries:
                owner, offset = entries.pop()
                free = sys.getrefcount(owner) == _FREE_REFS - 1  # the local name and getrefcount's argument
                if offset is not None:
                    # A peer may still hold a view of it (a node leader's wire writes results in
                    # place, collectives/landing.py): then the arena must not serve another job.
                    reusable = reusable and free and not (self._outbox is not None and self._outbox.lent(offset))
                elif free and self._keeps:
                    SPARE.give(key, owner)
                del owner
        return reusable


def pool_of(fabric: Fabric) -> BufferPool:
    """The pool of `fabric`'s replica for its current job. Under an actor's shared-memory arena
    (transport/shm.py; the actor has peers on its node), the pool keeps its buffers across the
    actor's jobs: the arena retires it when it closes at the end of the job."""
    pool = fabric.kernel_state.get(_KEY)
    if pool is None:
        shared = fabric.shared
        outbox = shared.outbox if shared is not None else None
        pool = fabric.kernel_state[_KEY] = BufferPool(keeps=outbox is not None, outbox=outbox)
        if outbox is not None:
            outbox.on_close(pool.retire)
    return pool


def sendable_in_place(fabric: Fabric, values: Any) -> bool:
    """Whether every array of `values` lies in a leased buffer of `fabric`'s shared-memory arena
    (sent to a peer of the node as a descriptor of where it is, without a copy)."""
    shared = fabric.shared
    outbox = shared.outbox if shared is not None else None
    return outbox is not None and all(outbox.leases(v) for v in values)
