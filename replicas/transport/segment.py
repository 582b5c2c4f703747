"""A shared-memory segment mapped into this process: its bytes, its u32 words and their address."""

from __future__ import annotations

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
        finally:
            os.close(fd)
        self.words = np.frombuffer(self.mm, np.uint32)
        self.bytes = np.frombuffer(self.mm, np.uint8)
        self.view = memoryview(self.mm).toreadonly()
        self.address = self.words.ctypes.data
        self.regions: dict[int, np.ndarray] = {}  # buffer offset -> its bytes (to tell views of it)
        # Buffer offset -> what was last written or read there, with the array views onto it (`Board`):
        # a collective in a loop writes the same layout under the same fingerprint every time.
        self.written: dict[int, tuple[bytes, tuple, tuple[np.ndarray, ...]]] = {}
        self.opened: dict[int, tuple[bytes, tuple[np.ndarray, ...]]] = {}

    def region(self, start: int, size: int) -> np.ndarray:
        found = self.regions.get(start)
        if found is None:
            found = self.regions[start] = self.bytes[start:start + size]
        return found

    def close(self) -> bool:
        """Unmap; False if a view handed out is still alive (the collector unmaps it with the view)."""
        self.words = self.bytes = np.empty(0, np.uint32)
        self.regions, self.written, self.opened = {}, {}, {}  # the views hold the mapping
        try:
            self.view.release()
            self.mm.close()
        except BufferError:
            return False
        return True
