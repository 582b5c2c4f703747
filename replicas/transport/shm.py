"""Same-node shared memory between replica actors: one reusable outbound arena per actor and job.

Why this mechanism (`bench/shm_mechanisms.py` compares them):
- Ray's object store (`ray.put` once, peers `ray.get` zero-copy) costs a raylet round trip to
  create, seal and pin each object, plus the owner's reference counting for a ref handed to
  another actor outside a task (the ref is "borrowed" out of band: Ray keeps it pinned until the
  owner dies unless the owner frees it); a fresh object per message also page-faults its pages.
- Ray's mutable-object channels (`ray.experimental.channel.Channel`) hold one value per
  writer/reader pair: a write blocks until every reader has read the previous one. A fabric send
  must never block (a blocked sender the monitor cannot see would turn a deadlock into a hang),
  and a reader must read values in write order on a thread of its own; values are Ray-serialized.
- A shared-memory arena of the sending actor (sparse, so untouched pages cost nothing), reused
  block by block: a message costs one copy into the arena; the receiver maps the arena once per
  job and gets a read-only view of the block, pinned until the last view of that array is gone.
  No Ray task, no pickling of array bytes, no page faults after the first use.

The arena's memory is an unnamed tmpfs file (`memfd_create`) the actor keeps across its jobs; the
peers of a job open it through `/proc/<pid>/fd/<fd>`. Why: writing a fresh tmpfs page costs
several times rewriting one (the kernel allocates and zero-fills it first), and an arena made per
job paid that again in every job. Unnamed, it leaves nothing under /dev/shm and
dies with its actor; an idle pooled actor keeps at most `KEEP_BYTES` of it (the rest is returned
to the kernel when a job ends).

Layout: the arena is a sequence of blocks; each block is a 64-byte header (one release word per
receiver of the block) followed by the array bytes. The sender allocates first-fit below the
highest block still held (so a quiet arena is reused from offset 0 and touches only the peak
in-flight bytes); a receiver sets its word when the array it was handed is garbage, and the sender
sweeps the words on its next allocation. A sender never writes a block while any of its words is
unset, so a receiver never sees its data change. When the arena is full (receivers hold too
much), the caller falls back to the object store: sends never wait for space.

Leased blocks (`Outbox.lease`): the collectives' result buffers of an actor with peers on its
node live in its arena too (collectives/buffers.py). Such a block belongs to its owner until given
back; an array lying in it is sent as a descriptor of that place (`ShmArray.start`), each
receiver taking one of the block's free words, so a result or partial sum sent to a peer costs no
copy. The owner reuses the block only when nothing of its own refers to it and every word is free.
Numpy arrays over an mmap hold no buffer export, so an arena with a leased block still referred
to at the end of a job is abandoned (unmapped with its last array), never reused or closed.

A job names its arenas `rpl-<job token>-<first replica of the actor>@<pid>.<fd>` in descriptors:
the token is the job's random secret, so a job only opens its own, and the release words a
receiver sets carry the job's stamp (`job_stamp`), so a late release by an earlier job's receiver
never frees a block of the next one. The job's named segments (the boards, transport/board.py) are
removed by name when it ends (`remove_job_segments`), by the actors and by the driver, whatever
happened to the actors.
Plain `memfd_create` + `mmap` (not `multiprocessing.shared_memory`, whose resource tracker unlinks
or warns about segments another process attached to).
"""

from __future__ import annotations

import hashlib
import mmap
import os
import threading
import weakref
from collections.abc import Callable, Hashable, Iterable
from typing import Any, NamedTuple

import numpy as np

SHM_DIR = "/dev/shm"
PREFIX = "rpl-"
HEADER = 64  # bytes before each block's data: its receivers' release words, and 64-byte alignment
WORDS = HEADER // 8  # receivers one block can be handed to
# Arrays of at least this many bytes travel through the arena; smaller ones inline over the socket
# (the copy into a pickle costs the same as into the arena, and a descriptor is not free).
MIN_BYTES = 64 * 1024
# Virtual size of an arena: tmpfs only backs pages that were written, so this bounds, not costs.
CAPACITY = int(os.environ.get("REPLICAS_SHM_ARENA_BYTES", str(1 << 30)))
# What an idle actor keeps of its arena's written pages between jobs (the rest goes back to the kernel).
# (The collectives' result buffers live in the arena too, collectives/buffers.py: a 64 MiB
# all-gather's two alternating results are 512 MiB, and pages written fresh in every job are what
# keeping the arena avoids.)
KEEP_BYTES = int(os.environ.get("REPLICAS_SHM_KEEP_BYTES", str(768 << 20)))

_HELD = 0


def job_stamp(token: str) -> int:
    """The value a receiver of job `token` writes into a release word (never `_HELD`)."""
    return int.from_bytes(hashlib.blake2b(token.encode(), digest_size=8).digest(), "little") | 1


def segment_name(token: str, owner: int) -> str:
    return f"{PREFIX}{token}-{owner}"


def job_segments(token: str) -> list[str]:
    """Paths of the segments of the job `token` on this node."""
    if not token:
        return []
    # Not glob: fnmatch caches every pattern it compiles (32768 of them), so a pattern per job
    # grows every actor and the driver for as long as they run jobs.
    prefix = f"{PREFIX}{token}-"
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return []
    return [os.path.join(SHM_DIR, name) for name in names if name.startswith(prefix)]


def remove_job_segments(token: str) -> int:
    """Unlink every segment of job `token` on this node (mappings stay valid until dropped)."""
    return remove_segments_of((token,))


def remove_segments_of(tokens: Iterable[str]) -> int:
    """Unlink every segment of the jobs `tokens` on this node, in one listing of the folder."""
    wanted = {f"{PREFIX}{token}-" for token in tokens if token}
    if not wanted:
        return 0
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return 0
    removed = 0
    for name in names:
        cut = name.find("-", len(PREFIX))
        if cut < 0 or name[:cut + 1] not in wanted:
            continue
        try:
            os.unlink(os.path.join(SHM_DIR, name))
            removed += 1
        except FileNotFoundError:
            pass
    return removed


def remove_orphaned_segments(min_age: float = 60.0) -> list[str]:
    """Unlink this user's `rpl-` segments that no process maps and that are older than `min_age`
    seconds: what a job left behind when its driver was killed before it could remove them (its
    actors die with it). A live job's segments stay mapped by their actors until it ends; the age
    covers the moment between creating a segment and mapping it."""
    import time

    try:
        names = [n for n in os.listdir(SHM_DIR) if n.startswith(PREFIX)]
    except OSError:
        return []
    uid, now = os.getuid(), time.time()
    candidates = {}
    for name in names:
        path = os.path.join(SHM_DIR, name)
        try:
            st = os.stat(path)
        except OSError:
            continue
        if st.st_uid == uid and now - st.st_mtime > min_age:
            candidates[path] = st
    if not candidates:
        return []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    if SHM_DIR in line:
                        candidates.pop(line.split(maxsplit=5)[-1].strip(), None)
        except OSError:  # gone, or another user's process (which cannot map our 0600 segments)
            continue
    removed = []
    for path in candidates:
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:
            pass
    return removed


def mapped_segments(token: str) -> int:
    """How many mappings of job `token`'s segments this process holds (for leak checks)."""
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if f"/{PREFIX}{token}-" in line)


def available() -> bool:
    return os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)


class ShmArray(NamedTuple):
    """Where an array of a message lies in its sender's arena (what travels over the socket)."""

    segment: str
    offset: int  # of the block's header
    slot: int  # the header word this receiver sets when it is done with the block
    shape: tuple[int, ...]
    dtype: np.dtype
    start: int = 0  # bytes from the block's data to the array's (a part of a leased block)


class Shared(NamedTuple):
    """A message value whose large arrays were replaced by ShmArray descriptors."""

    value: Any


def _round_up(n: int, k: int = HEADER) -> int:
    return (n + k - 1) // k * k


def _eligible(x: Any) -> bool:
    return isinstance(x, np.ndarray) and x.nbytes >= MIN_BYTES and not x.dtype.hasobject


class _Backing:
    """An actor's arena memory, kept across its jobs: an unnamed tmpfs file, mapped once."""

    _spare: dict[int, _Backing] = {}  # by capacity: the memory of the last closed arena, for the next
    _lock = threading.Lock()

    def __init__(self, capacity: int) -> None:
        fd = os.memfd_create("rpl-arena", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, capacity)
            self.mm = mmap.mmap(fd, capacity)
        except BaseException:
            os.close(fd)
            raise
        self.fd, self.capacity = fd, capacity
        self.high = 0  # bytes from offset 0 that may have been written

    @classmethod
    def take(cls, capacity: int) -> _Backing:
        with cls._lock:
            spare = cls._spare.pop(capacity, None)
        return spare if spare is not None else cls(capacity)

    def give_back(self) -> None:
        """Keep for the next arena (at most `KEEP_BYTES` of written pages), or close if one is kept."""
        if self.high > KEEP_BYTES:
            keep = KEEP_BYTES // mmap.PAGESIZE * mmap.PAGESIZE
            try:
                self.mm.madvise(mmap.MADV_REMOVE, keep, self.high - keep)
                self.high = keep
            except OSError:  # cannot return them: this memory is not kept for the next arena
                self.close()
                return
        with self._lock:
            if self.capacity not in self._spare:
                self._spare[self.capacity] = self
                return
        self.close()

    def abandon(self) -> None:
        """Never reused, and unmapped only when the last array over it is gone (explicitly closing
        the mmap would unmap it under them: `ndarray(buffer=mmap)` holds no export)."""
        os.close(self.fd)
        self.mm = None  # type: ignore[assignment]

    def close(self) -> None:
        try:
            self.mm.close()
        except BufferError:  # a view is still alive: the collector unmaps it with the view
            pass
        os.close(self.fd)


class Outbox:
    """The sending actor's arena for one job. Thread-safe: the actor's replicas share it.

    The same array sent to several peers in a row under one message key (one round of one
    collective: an all-gather, a broadcast, a sharded all-reduce's second round) is copied once:
    each receiver gets its own release word in the block's header, and the block is free once
    every word is set. The key is part of the match because an algorithm may update an array in
    place between rounds: the same object under another key is copied again."""

    def __init__(self, token: str, owner: int, capacity: int = CAPACITY) -> None:
        self._backing: _Backing | None = _Backing.take(capacity)
        self.name = f"{segment_name(token, owner)}@{os.getpid()}.{self._backing.fd}"
        self.capacity = capacity
        self._mm = self._backing.mm
        self._stamp = job_stamp(token)
        # Every word of a block's header stamped (free): compared as bytes, far cheaper than numpy's
        # compare of a slice (a pool asks this of each candidate result buffer: collectives/buffers.py).
        self._free_header = self._stamp.to_bytes(8, "little") * WORDS
        self._words = np.frombuffer(self._mm, np.uint64)  # block header words
        # offset -> [size, readers, leased] of blocks not yet free. A leased block belongs to the
        # actor's result buffers (`lease`): its words are all free to lend it out (`put` of an
        # array that lies in it costs no copy) and it is free only once given back.
        self._blocks: dict[int, list[int]] = {}
        self._base = self._words.ctypes.data  # the arena's address in this process
        self._leased_bytes = 0
        self._last: tuple[Any, Hashable, int] | None = None  # (weakref to the last array placed, key, block)
        self._lock = threading.Lock()
        self._used = False
        self._on_close: list[Callable[[], bool]] = []

    def on_close(self, hook: Callable[[], bool]) -> None:
        """Call `hook` when the job's arena closes (the job is over): the collectives' result
        buffers (collectives/buffers.py) retire; a hook returning False still has a leased block
        in use, so the arena's memory is not handed to the next job."""
        with self._lock:
            self._on_close.append(hook)

    def _held(self, offset: int, readers: int) -> bool:
        if self._backing is None:  # closed: its memory may be another arena's now, nothing is held here
            return False
        return self._mm[offset:offset + 8 * readers] != self._free_header[:8 * readers]

    # -- leased blocks: result buffers in shared memory ----------------------------------------
    def lease(self, nbytes: int) -> int | None:
        """A block of `nbytes` the caller owns until the arena closes (None when the arena has no room
        for it, or leased blocks would take more than 3/4 of it: sends need the rest)."""
        size = HEADER + _round_up(nbytes)
        with self._lock:
            if self._backing is None or self._leased_bytes + size > self.capacity // 4 * 3:
                return None
            offset = self._allocate(size)
            if offset is None:
                return None
            self._blocks[offset] = [size, WORDS, 1]
            self._words[offset // 8:offset // 8 + WORDS] = self._stamp
            self._leased_bytes += size
            return offset

    def leased_array(self, offset: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """The owner of a leased block's data, as `shape` and `dtype` (views of it keep it alive).
        Its base is the mmap object itself, which numpy's views do not collapse past (so its
        reference count sees every view), but which holds no buffer export: an arena whose leased
        block is still referred to is abandoned at close, never closed (`_Backing.abandon`)."""
        return _Pinned(shape, dtype, buffer=self._mm, offset=offset + HEADER)

    def lent(self, offset: int) -> bool:
        """Whether some receiver still reads (a part of) the leased block at `offset`."""
        return self._held(offset, WORDS)

    def leases(self, x: np.ndarray) -> bool:
        """Whether `x` (C-contiguous) lies in a leased block: `put` would send it in place."""
        if not (isinstance(x, np.ndarray) and self._leased_bytes):
            return False
        with self._lock:
            return self._leased_block_of(x) is not None

    def lend(self, x: np.ndarray) -> tuple[int, int, int] | None:
        """Where `x` lies, (block offset, word, bytes from the block's data to x's), if in a leased
        block with a free word, which is taken: the block is not reused before the receiver releases
        it (`Inbox.lent`). Else None."""
        if not self._leased_bytes:
            return None
        with self._lock:
            ref = self._lend(x)
        return None if ref is None else (ref.offset, ref.slot, ref.start)

    def give_back(self, lent: tuple[int, int, int]) -> None:
        """Free the word `lend` took (what it described never reached its receiver)."""
        offset, slot, _ = lent
        with self._lock:
            if self._backing is not None:
                self._words[offset // 8 + slot] = self._stamp

    def _leased_block_of(self, x: np.ndarray) -> tuple[int, int] | None:
        """(block offset, bytes from the block's data to x's) of the leased block `x` lies in, if
        `x` is C-contiguous (caller holds the lock)."""
        if not x.flags.c_contiguous or not x.nbytes:
            return None
        at = x.ctypes.data - self._base
        if not 0 <= at < self.capacity:
            return None
        for offset, (size, _, leased) in self._blocks.items():
            if leased and offset + HEADER <= at and at + x.nbytes <= offset + size:
                return offset, at - offset - HEADER
        return None

    def _lend(self, x: np.ndarray) -> ShmArray | None:
        """A descriptor of `x` in place, if it lies in a leased block with a free word (caller holds
        the lock)."""
        found = self._leased_block_of(x)
        if found is None:
            return None
        offset, start = found
        # The first free word (stamped), found in the header's bytes (cheaper than a numpy compare).
        header = self._mm[offset:offset + HEADER]
        at = header.find(self._free_header[:8])
        while at > 0 and at % 8:  # a match across two words
            at = header.find(self._free_header[:8], at + 1)
        if at < 0:
            return None
        slot = at // 8
        self._words[offset // 8 + slot] = _HELD
        return ShmArray(self.name, offset, slot, x.shape, x.dtype, start)

    def _allocate(self, size: int) -> int | None:
        backing = self._backing
        if backing is None:  # closed: the job is over
            return None
        blocks = self._blocks
        for off in [o for o, (_, readers, leased) in blocks.items() if not leased and not self._held(o, readers)]:
            del blocks[off]
            if self._last is not None and self._last[2] == off:
                self._last = None
        pos = 0
        for off in sorted(blocks):
            if off - pos >= size:
                break
            pos = off + blocks[off][0]
        if pos + size > self.capacity:
            return None
        blocks[pos] = [size, 1, 0]
        self._words[pos // 8] = _HELD
        self._used = True
        backing.high = max(backing.high, pos + size)
        return pos

    def _free(self, ref: ShmArray) -> None:
        self._words[ref.offset // 8 + ref.slot] = self._stamp

    def put(self, x: np.ndarray, key: Hashable = None) -> ShmArray | None:
        """`x` in a block (copied unless it lies in a leased block or was placed last, under `key`);
        None when there is no room."""
        with self._lock:
            if self._leased_bytes:
                lent = self._lend(x)
                if lent is not None:
                    return lent
            last = self._last
            if last is not None and key is not None and last[0]() is x and last[1] == key:
                offset = last[2]
                block = self._blocks.get(offset)
                if block is not None and block[1] < WORDS and not block[2]:
                    slot = block[1]
                    block[1] += 1
                    self._words[offset // 8 + slot] = _HELD
                    return ShmArray(self.name, offset, slot, x.shape, x.dtype)
            offset = self._allocate(HEADER + _round_up(x.nbytes))
            if offset is None:
                return None
        np.copyto(np.ndarray(x.shape, x.dtype, buffer=self._mm, offset=offset + HEADER), x, casting="no")
        with self._lock:
            if offset in self._blocks:
                self._last = (weakref.ref(x), key, offset)
        return ShmArray(self.name, offset, 0, x.shape, x.dtype)

    def encode(self, value: Any, key: Hashable = None) -> Shared | None:
        """`value` (a message sent under `key`) with its large arrays moved into the arena; None if it
        has none or they do not fit."""
        placed: list[ShmArray] = []

        def walk(v: Any) -> Any:
            if _eligible(v):
                ref = self.put(v, key)
                if ref is None:
                    raise _Full
                placed.append(ref)
                return ref
            if isinstance(v, tuple) and not isinstance(v, ShmArray):
                return tuple(walk(x) for x in v)
            if isinstance(v, list):
                return [walk(x) for x in v]
            return v

        try:
            encoded = walk(value)
        except _Full:
            for ref in placed:
                self._free(ref)
            return None
        return Shared(encoded) if placed else None

    def in_use(self) -> int:
        """Bytes of blocks some receiver still holds."""
        with self._lock:
            return sum(size for off, (size, readers, leased) in self._blocks.items()
                       if not leased and self._held(off, readers))

    def close(self) -> bool:
        """End of the job: every block is free again (its receivers were reset or died with
        their actors) and the memory goes to this process's next arena; True if anything was
        ever placed in it."""
        with self._lock:
            used = self._used
            hooks, self._on_close = self._on_close, []
        reusable = all([hook() for hook in hooks])
        with self._lock:
            self._blocks.clear()
            self._last = None
            self._leased_bytes = 0
            self._words = np.empty(0, np.uint64)
            backing, self._backing = self._backing, None
        if backing is not None:
            if reusable:
                backing.give_back()
            else:  # a result still refers to it: the next job must not write there
                backing.abandon()
        return used


class _Full(Exception):
    pass


class _Pinned(np.ndarray):
    """Owner of a received block: every array handed out is a view of it, so it lives (and the
    block stays unreleased) until the last of them is gone. Being a subclass stops numpy from
    collapsing the views' `base` past it onto the mmap."""


class Inbox:
    """The receiving actor's mappings of its peers' arenas for one job."""

    def __init__(self, token: str) -> None:
        self._prefix = f"{PREFIX}{token}-"
        self._stamp = job_stamp(token)
        self._maps: dict[str, tuple[mmap.mmap, np.ndarray]] = {}
        self._lock = threading.Lock()

    def _map(self, name: str) -> tuple[mmap.mmap, np.ndarray]:
        entry = self._maps.get(name)
        if entry is None:
            if not name.startswith(self._prefix) or "/" in name:
                raise ValueError(f"segment {name!r} is not this job's")
            with self._lock:
                entry = self._maps.get(name)
                if entry is None:
                    fd = os.open(_arena_path(name), os.O_RDWR)
                    try:
                        mm = mmap.mmap(fd, 0)
                    finally:
                        os.close(fd)
                    entry = self._maps[name] = (mm, np.frombuffer(mm, np.uint64))
        return entry

    def lent(self, segment: str, lent: tuple[int, int, int], shape: tuple[int, ...], dtype: np.dtype,
             writable: bool = False) -> np.ndarray:
        """`array` of what `Outbox.lend` described as (offset, slot, start) in `segment`."""
        offset, slot, start = lent
        return self.array(ShmArray(segment, offset, slot, shape, dtype, start), writable)

    def array(self, ref: ShmArray, writable: bool = False) -> np.ndarray:
        """A view of the block, read-only unless `writable` (a collective's result several actors share,
        collectives/board_round.py); the block is released when the view is garbage."""
        if not (0 <= ref.slot < WORDS and ref.offset >= 0 and ref.offset % HEADER == 0 and ref.start >= 0):
            raise ValueError(f"bad shared-memory descriptor {ref!r}")
        mm, flags = self._map(ref.segment)
        pinned = _Pinned(ref.shape, ref.dtype, buffer=mm, offset=ref.offset + HEADER + ref.start)
        weakref.finalize(pinned, _release, flags, ref.offset // 8 + ref.slot, self._stamp)
        out = pinned.view(np.ndarray)
        out.flags.writeable = writable
        return out

    def decode(self, shared: Shared) -> Any:
        def walk(v: Any) -> Any:
            if isinstance(v, ShmArray):
                return self.array(v)
            if isinstance(v, tuple):
                return tuple(walk(x) for x in v)
            if isinstance(v, list):
                return [walk(x) for x in v]
            return v

        return walk(shared.value)

    def release_unread(self, shared: Shared) -> None:
        """A message that will not be delivered (its job is over): free its blocks now."""
        def walk(v: Any) -> None:
            if isinstance(v, ShmArray):
                try:
                    _release(self._map(v.segment)[1], v.offset // 8 + v.slot, self._stamp)
                except (OSError, ValueError):
                    pass
            elif isinstance(v, (tuple, list)):
                for x in v:
                    walk(x)

        walk(shared.value)

    def close(self) -> bool:
        """Drop the mappings (arrays still held keep theirs until they go); True if any was made."""
        used = bool(self._maps)
        self._maps = {}
        return used


def _release(flags: np.ndarray, word: int, stamp: int) -> None:
    flags[word] = stamp


def _arena_path(name: str) -> str:
    """Where the arena a descriptor names is: its actor's unnamed file (`...@<pid>.<fd>`)."""
    _, at, where = name.rpartition("@")
    pid, dot, fd = where.partition(".")
    if not (at and dot and pid.isdigit() and fd.isdigit()):
        raise ValueError(f"segment {name!r} names no arena")
    return f"/proc/{int(pid)}/fd/{int(fd)}"
