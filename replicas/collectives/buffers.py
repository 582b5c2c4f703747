"""Result buffers of large collectives, reused within a job instead of allocated fresh.

Why: a fresh large numpy buffer is fresh pages: glibc maps every allocation over 32 MiB anew and
numpy asks for huge pages on those of 4 MiB or more, so each collective of a loop paid the kernel's
zero-filling of its result before writing it (measured in one process: copying 64 MiB into a fresh
buffer took 13-16 ms, into a reused one 6-9 ms; bench/README.md, "Copies per collective").

A buffer is handed out again only when nothing but the pool refers to it (`sys.getrefcount`: no
value of the interpreter, no view, no message holds it), so a result a program keeps is never
overwritten. Each replica's pool lives in its fabric's `kernel_state`, so it goes with its job.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np

# Below this, malloc reuses freed memory by itself and a pool's bookkeeping costs more than it saves.
MIN_BYTES = 256 * 1024
# Buffers kept per (shape, dtype): a loop's results and its previous ones (still the next operands
# while the new ones are written) alternate, one per local member (all-to-all, reduce-scatter).
PER_SHAPE = 8
# Bytes a pool keeps at most; beyond, buffers are allocated as before and left to the allocator.
BUDGET = 1 << 30
_KEY = __name__
# References to a free buffer while `empty` looks at it: the pool's list, the loop variable and
# getrefcount's own argument.
_FREE_REFS = 3


class BufferPool:
    """One replica's reusable buffers, by (shape, dtype)."""

    __slots__ = ("_kept", "_bytes")

    def __init__(self) -> None:
        self._kept: dict[tuple[tuple[int, ...], np.dtype], list[np.ndarray]] = {}
        self._bytes = 0

    def empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """A writable C-contiguous buffer of `shape` and `dtype`, contents undefined."""
        dtype = np.dtype(dtype)
        shape = tuple(shape)
        if math.prod(shape) * dtype.itemsize < MIN_BYTES or dtype.hasobject:
            return np.empty(shape, dtype)
        kept = self._kept.setdefault((shape, dtype), [])
        for buffer in kept:
            if sys.getrefcount(buffer) == _FREE_REFS:
                buffer.flags.writeable = True  # a result several members shared was made read-only
                return buffer
        buffer = np.empty(shape, dtype)
        if len(kept) < PER_SHAPE and self._bytes + buffer.nbytes <= BUDGET:
            kept.append(buffer)
            self._bytes += buffer.nbytes
        return buffer

    def kept_bytes(self) -> int:
        return self._bytes


def pool_of(fabric: Any) -> BufferPool:
    """The pool of `fabric`'s replica for its current job."""
    pool = fabric.kernel_state.get(_KEY)
    if pool is None:
        pool = fabric.kernel_state[_KEY] = BufferPool()
    return pool
