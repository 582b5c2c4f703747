"""Futexes on words of shared memory: a thread sleeps while a u32 keeps a value, another wakes it.

Only Linux on x86-64 (whose stores are seen in order by other cores) uses them; elsewhere
`available()` is False and the callers keep to the sockets: the same-node path of Linux on ARM and
of macOS. REPLICAS_NO_FUTEX=1 takes that path here too (read when a job starts, in every actor:
set it before Ray starts), so it is tested and measured where futexes work (.ci/run, bench/README.md).
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
import threading

from replicas.transport.shm import SHM_DIR

_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
_SYS_FUTEX = {"x86_64": 202}.get(platform.machine())  # other machines need fences: the sockets remain
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None
if _libc is not None:
    _syscall = _libc.syscall
    _syscall.argtypes = [ctypes.c_long, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p,
                         ctypes.c_void_p, ctypes.c_int]


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def wait(address: int, expected: int, timeout: float) -> None:
    """Sleep while the u32 at `address` equals `expected`, at most `timeout` s (the GIL is released)."""
    ts = _Timespec(int(timeout), int(timeout % 1 * 1e9))
    _syscall(_SYS_FUTEX, address, _FUTEX_WAIT, expected, ctypes.addressof(ts), None, 0)


def u32_at(address: int) -> ctypes.c_uint32:
    return ctypes.c_uint32.from_address(address)


def wake(address: int) -> None:
    _syscall(_SYS_FUTEX, address, _FUTEX_WAKE, 0x7FFFFFFF, None, None, 0)


_BARRIER = threading.Lock()


def fence() -> None:
    """A full memory barrier: a store before it is seen by every core before a load after it is
    made. On x86-64 stores may pass later loads (through the store buffer), so a writer that bumps a
    word and then reads its reader's "asleep" flag could read a stale 0 while the reader, which set
    the flag and then (in `FUTEX_WAIT`) read the stale word, sleeps: a lost wake-up. A lock's
    acquire and release are atomic read-modify-writes, locked instructions, which x86 orders with
    every load and store (the reader's side needs nothing: the kernel takes a lock before it reads
    the word)."""
    _BARRIER.acquire()
    _BARRIER.release()


def available() -> bool:
    """True when futexes work here and the node has a writable shared-memory folder to put words in."""
    if os.environ.get("REPLICAS_NO_FUTEX", "") not in ("", "0"):
        return False
    return _SYS_FUTEX is not None and _libc is not None and os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)
