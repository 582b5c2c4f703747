"""A shared-memory segment mapped into this process: its bytes, its u32 words and their address.

Segments are sparse: /dev/shm backs only the pages written. A page first touched when /dev/shm is
full kills the process with SIGBUS, so the segment's maker allocates what it is about to write
first (`reserve`), where a full /dev/shm is an ordinary error."""

from __future__ import annotations

import errno
import mmap
import os

import numpy as np


class Mapping:
    """A board segment mapped here: its bytes, its u32 words, and their base address."""

    def __init__(self, path: str, create_size: int = 0) -> None:
        if create_size:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        else:
            fd = os.open(path, os.O_RDWR)
        try:
            if create_size:
                os.ftruncate(fd, create_size)
            self.mm = mmap.mmap(fd, 0)
        except BaseException:
            os.close(fd)
            raise
        self.path = path
        self._fd: int | None = fd  # the maker keeps it to allocate pages (`reserve`)
        self._reserved: dict[int, int] = {}  # start -> bytes allocated from there
        if not create_size:
            os.close(fd)
            self._fd = None
        self.words = np.frombuffer(self.mm, np.uint32)
        self.bytes = np.frombuffer(self.mm, np.uint8)
        self.view = memoryview(self.mm).toreadonly()
        self.address = self.words.ctypes.data
        self.regions: dict[int, np.ndarray] = {}  # buffer offset -> its bytes (to tell views of it)
        # Buffer offset -> what was last written or read there, with the array views onto it (`Board`):
        # a collective in a loop writes the same layout under the same fingerprint every time.
        self.written: dict[int, tuple[bytes, tuple, tuple[np.ndarray, ...]]] = {}
        self.opened: dict[int, tuple[bytes, tuple[np.ndarray, ...]]] = {}

    def reserve(self, start: int, size: int) -> bool:
        """Allocate the pages of bytes [start, start + size) before they are written (the segment's
        maker only; True for a peer's mapping); False when /dev/shm has no room for them."""
        if self._fd is None or self._reserved.get(start, 0) >= size:
            return True
        try:
            os.posix_fallocate(self._fd, start, size)
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
                return False
            # A file system that cannot allocate ahead: its pages are allocated when written, as before.
            os.close(self._fd)
            self._fd = None
            return True
        self._reserved[start] = size
        return True

    def forget_reserved(self, start: int, size: int) -> None:
        """Only bytes [start, start + size) stay allocated (the caller gave the rest back)."""
        if self._reserved.get(start, 0) > size:
            self._reserved[start] = size

    def region(self, start: int, size: int) -> np.ndarray:
        found = self.regions.get(start)
        if found is None:
            found = self.regions[start] = self.bytes[start:start + size]
        return found

    def close(self) -> bool:
        """Unmap; False if a view handed out is still alive (the collector unmaps it with the view)."""
        self.words = self.bytes = np.empty(0, np.uint32)
        self.regions, self.written, self.opened = {}, {}, {}  # the views hold the mapping
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        try:
            self.view.release()
            self.mm.close()
        except BufferError:
            return False
        return True
