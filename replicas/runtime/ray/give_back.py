"""Give a pooled actor's memory back to the machine after a job of many replicas.

A job of thousands of replicas in one actor leaves garbage in reference cycles (the interpreters
the pool evicts, the kernels' state) that the cycle collector's oldest generation reaches only
rarely, and what its thousands of threads freed stays in glibc's per-thread arenas: an idle
actor's resident memory grew with every such job until the next one no longer fit. Both are
handed back when the job ends: the cycles collected, then every arena trimmed (`malloc_trim`
returns free pages from the middle of a heap too, not only from its top)."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import threading

# Replicas an actor hosts from which a job's end pays for a full collection and a trim: below,
# the next job of the same program reuses most of what the last one allocated anyway.
MANY_REPLICAS = 64

_libc = None
_busy = threading.Lock()  # one give-back at a time (jobs may end faster than a collection)


def _trim() -> None:
    global _libc
    if _libc is None:
        name = ctypes.util.find_library("c")
        try:
            _libc = ctypes.CDLL(name) if name else False
        except OSError:
            _libc = False
    trim = getattr(_libc, "malloc_trim", None) if _libc else None
    if trim is not None:  # glibc only: other C libraries keep their own policies
        trim(0)


def after_job(replicas: int) -> None:
    """Collect the job's cycles and return free heap pages, when it hosted `replicas` (>= MANY_REPLICAS),
    in a thread of its own: the reset that calls it answers at once (the collection holds the GIL
    for as long as it takes, so the actor's next call waits for it, but the driver does not)."""
    if replicas < MANY_REPLICAS or not _busy.acquire(blocking=False):
        return
    threading.Thread(target=_give_back, name="give back memory", daemon=True).start()


def _give_back() -> None:
    try:
        gc.collect()
        _trim()
    finally:
        _busy.release()
