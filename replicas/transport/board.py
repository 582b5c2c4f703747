"""The same-node board: leaders of a collective exchange operands through shared memory, woken by futexes.

Why (a profile of the actors of `bench/collectives.py`'s small all-reduce): over the sockets,
every message of the leaders' round is a pickle, a write, a reader thread's wake-up in the peer, a
mailbox hand-off and the replica thread's wake-up, and each wake-up waits for the GIL behind the
actor's other threads; the replica thread spent most of its time in `sendall` and waiting. On the
board, a leader copies its operand into its own
slot, publishes it by bumping one word and wakes the waiters with one `FUTEX_WAKE`; a reader's
interpreter thread waits on that word itself (`FUTEX_WAIT` through ctypes, which releases the
GIL): one wake-up per peer, no reader thread, no pickling of array bytes, no socket.

Layout: one segment per actor and job (`rpl-<token>-b<first replica>`, sparse, removed with the
job's other segments by `shm.remove_job_segments`), holding a slot per hosted replica; a slot is
a 64-byte counter line (the futex word readers wait on) and two buffers used in turn. A buffer is
a header (its tag, the lengths of what follows, one release word per reader position), the
sender's pickled fingerprint, the payload pickled with its arrays out of band (protocol 5), the
arrays' offsets, and the arrays' bytes. Every word has one writer: the slot's replica writes the
tag, counter and data; reader position q writes only release word q. So no atomic operation is
needed; x86-64 keeps stores in order, so a reader that sees the tag sees the data before it.

Protocol: the writer of round (seq, round) picks its next buffer, waits until every reader of that
buffer's previous use set its release word to the previous tag (a reader releases once it no
longer uses the views it got, at the end of its collective at the latest; the writer's previous
round is complete, so its readers are past waiting and never need the writer to go on), writes
the buffer, then the tag, then bumps the counter and wakes. A reader waits until either buffer
carries the tag it wants (watching the writer's counter for a bounded, adaptive while first when
the job's processes on this node fit its cores: transport/spin.py), compares fingerprints before it
looks at the payload, and gets read-only views of the arrays. A payload too large for the slot
is announced with a flag and travels over the fabric as before, so every leader agrees on where
the bytes are whatever their size, and a fingerprint mismatch is always found on the board first.
"""

from __future__ import annotations

import errno
import math
import os
import pickle
import struct
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from replicas.caching import Cache
from replicas.transport import futex
from replicas.transport.segment import Mapping
from replicas.transport.shm import PREFIX, SHM_DIR

# Payloads up to this many bytes go on the board (per buffer; larger ones announce themselves and
# go through the fabric: the shared-memory arena's single copy wins there). The selector reads these
# as `Thresholds.board_slot_bytes` and `board_readers` (collectives/selector.py).
SLOT_BYTES = 4 << 20
_VIRTUAL_BUDGET = 1 << 30  # per actor: tmpfs backs only the pages written
READERS = 8  # reader positions per buffer: the board serves groups of at most 8 processes
_LINE = 64
_HEADER = 128  # tag, flags, lengths, READERS release words
_TAG, _FLAGS, _FP_LEN, _META_LEN, _NBUF, _WRITER_WAITS = 0, 1, 2, 3, 4, 5
_FIELDS = struct.Struct("<5I")  # tag, flags, fingerprint length, meta length, number of arrays
_RELEASE = 8  # first release word (u32 index in the header)
_FINGERPRINT_ROOM = 4096  # bytes after a header allocated with it (a fingerprint fits, usually)
FABRIC = 1  # flag: the payload was too large, it follows over the fabric
ARRAYS = 2  # flag: the payload is a tuple of arrays, its layout pickled alone

# A reader wakes a writer waiting for its release only when the writer said it waits (a wake-up
# costs a system call per read otherwise): flag and release word are two stores read in the
# opposite order on the other side, which x86 may reorder, so a wake-up can be missed; the
# writer then looks again after this long. Rare (a reader still holds the buffer two rounds
# later) and bounded.
RELEASE_SLICE = 0.002


def tag_of(seq: int, round_: int) -> int:
    """The u32 naming round `round_` of collective #seq (never 0, which marks an unused buffer)."""
    return (((seq & 0x3FFFFFF) << 5) | (round_ & 0x1F)) + 1


def segment_name(token: str, first_replica: int) -> str:
    return f"{PREFIX}{token}-b{first_replica}"


def slot_bytes(hosted: int) -> int:
    """Bytes of one buffer of a slot, for an actor hosting `hosted` replicas."""
    per = _VIRTUAL_BUDGET // max(hosted, 1) // 2 - _HEADER
    return max(min(SLOT_BYTES, per) // 4096 * 4096, 4096)


def _slot_stride(capacity: int) -> int:
    return _LINE + 2 * (_HEADER + capacity)


def _round8(n: int) -> int:
    return (n + 7) // 8 * 8


class Read:
    """One buffer a reader got views of: released (`release`) once nothing uses them any more."""

    __slots__ = ("mapping", "head", "position", "tag", "region")

    def __init__(self, mapping: Mapping, head: int, position: int, tag: int, region: np.ndarray) -> None:
        self.mapping, self.head, self.position, self.tag, self.region = mapping, head, position, tag, region

    def release(self) -> None:
        words = self.mapping.words
        if words.size:
            word = self.head + _RELEASE + self.position
            words[word] = self.tag
            if words[self.head + _WRITER_WAITS]:
                futex.wake(self.mapping.address + 4 * word)


class Board:
    """This actor's board for one job: its hosted replicas' slots, and its mappings of its peers'."""

    def __init__(self, token: str, replica_ids: list[int]) -> None:
        self.token = token
        self.first = min(replica_ids)
        self.rank = {r: k for k, r in enumerate(sorted(replica_ids))}
        self.capacity = slot_bytes(len(replica_ids))
        self.path = os.path.join(SHM_DIR, segment_name(token, self.first))
        self._own = Mapping(self.path, _slot_stride(self.capacity) * len(replica_ids))
        # Each slot's counter line and both buffers' headers (with room for a fingerprint) now; the
        # buffers' data when written (`_reserved`). No room in /dev/shm: no board (OSError).
        header = _HEADER + min(self.capacity, _FINGERPRINT_ROOM)
        for k in range(len(replica_ids)):
            slot = k * _slot_stride(self.capacity)
            if not (self._own.reserve(slot, _LINE + header)
                    and self._own.reserve(slot + _LINE + _HEADER + self.capacity, header)):
                self._own.close()
                os.unlink(self.path)
                raise OSError(errno.ENOSPC, "no room in /dev/shm for the board's slots", self.path)
        self._peers: dict[str, tuple[Mapping, int]] = {}
        self._lock = threading.Lock()
        # Per hosted replica: the next buffer it writes, and per buffer the readers still to release it.
        self._next = dict.fromkeys(replica_ids, 0)
        self._pending: dict[tuple[int, int], tuple[int, tuple[int, ...]]] = {}
        self._fingerprints: Cache[bytes] = Cache("board fingerprints", 4096, by_identity=True)
        self._layouts: Cache[bytes] = Cache("board layouts", 4096)  # arrays' (dtype, shape)s -> their pickle
        self._layouts_read: Cache[tuple] = Cache("board layouts read", 4096)
        self._slots: dict[int, tuple[Mapping, int, int]] = {}  # replica -> `_slot(replica)`
        # Set by the host once the job's placement is known: replica -> (first replica of its actor, rank there).
        self.locations: dict[int, tuple[int, int]] = {}
        self.smallest = self.capacity  # the smallest buffer of any actor's slots (once located)

    def locate(self, placement: list[int]) -> None:
        """Learn where every replica's slot is: actor k's segment is named after its first replica,
        and its slots are in replica order."""
        first: dict[int, int] = {}
        count: dict[int, int] = {}
        locations = {}
        for r, actor in enumerate(placement):
            f = first.setdefault(actor, r)
            k = count.get(actor, 0)
            count[actor] = k + 1
            locations[r] = (f, k)
        self.locations = locations
        self._slots = {}
        self.smallest = min([self.capacity, *(slot_bytes(hosted) for hosted in count.values())])

    # -- where things are --------------------------------------------------------------------------
    def _slot(self, replica: int) -> tuple[Mapping, int, int]:
        """(mapping, byte offset of the replica's slot, buffer capacity)."""
        found = self._slots.get(replica)
        if found is None:
            found = self._slots[replica] = self._locate_slot(replica)
        return found

    def _locate_slot(self, replica: int) -> tuple[Mapping, int, int]:
        rank = self.rank.get(replica)
        if rank is not None:
            return self._own, rank * _slot_stride(self.capacity), self.capacity
        first, rank = self.locations[replica]
        name = segment_name(self.token, first)
        entry = self._peers.get(name)
        if entry is None:
            with self._lock:
                entry = self._peers.get(name)
                if entry is None:
                    mapping = Mapping(os.path.join(SHM_DIR, name))
                    hosted = sum(1 for f, _ in self.locations.values() if f == first)
                    entry = self._peers[name] = (mapping, slot_bytes(hosted))
        mapping, capacity = entry
        return mapping, rank * _slot_stride(capacity), capacity

    def fingerprint_bytes(self, wire: tuple) -> bytes:
        found = self._fingerprints.get(wire)
        if found is None:
            found = self._fingerprints.put(wire, pickle.dumps(wire, protocol=pickle.HIGHEST_PROTOCOL))
        return found

    # -- writing ---------------------------------------------------------------------------------
    def publish(self, replica: int, tag: int, fingerprint: bytes, payload: Any, readers: tuple[int, ...],
                wait: Callable[[Callable[[], bool], int], None], announce_only: bool = False) -> bool:
        """Put `payload` in `replica`'s next buffer under `tag` for reader positions `readers`; False if
        it did not fit or `announce_only` (the buffer then announces that it follows over the fabric;
        readers release it all the same).

        `wait(done, address)` blocks until `done()` while futex-waiting on the word at `address`."""
        if (not announce_only and type(payload) is tuple
                and all(type(a) is np.ndarray and a.flags.c_contiguous for a in payload)):
            # A tuple of arrays (an all-reduce's operands): copied into views of the buffer laid out once.
            views = self.publish_into(replica, tag, fingerprint, tuple((a.dtype, a.shape) for a in payload),
                                      readers, wait)
            if views is not None:
                for view, a in zip(views, payload):
                    np.copyto(view, a)
                self.commit(replica, tag)
                return True
            announce_only = True  # too large for a slot: announced, the bytes go over the fabric
        mapping, base, capacity = self._claim(replica, tag, readers, wait)
        mapping.written.pop(base, None)
        buffers: list[pickle.PickleBuffer] = []
        meta = b"" if announce_only else pickle.dumps(payload, protocol=5, buffer_callback=buffers.append)
        raws = [b.raw() for b in buffers]
        fp_len, meta_len = len(fingerprint), len(meta)
        table = _round8(fp_len + meta_len)
        data = _round8(table + 16 * len(raws))
        offsets = []
        end = data
        for raw in raws:
            offsets.append(end)
            end = (end + raw.nbytes + 63) // 64 * 64
        if not (announce_only or end > capacity or mapping.reserve(base, _HEADER + end)):
            announce_only = True  # no room in /dev/shm for the bytes: they go over the fabric
        if not mapping.reserve(base, _HEADER + fp_len):
            raise OSError(errno.ENOSPC, "no room in /dev/shm for a collective's fingerprint", mapping.path)
        mm = mapping.mm
        start = base + _HEADER
        mm[start:start + fp_len] = fingerprint
        if announce_only or end > capacity:
            end = capacity + 1
            _FIELDS.pack_into(mm, base, 0, FABRIC, fp_len, 0, 0)
        else:
            _FIELDS.pack_into(mm, base, 0, 0, fp_len, meta_len, len(raws))
            mm[start + fp_len:start + fp_len + meta_len] = meta
            if raws:
                struct.pack_into(f"<{2 * len(raws)}Q", mm, start + table,
                                 *[x for off, raw in zip(offsets, raws) for x in (off, raw.nbytes)])
                out = mapping.bytes
                for off, raw in zip(offsets, raws):
                    out[start + off:start + off + raw.nbytes] = np.frombuffer(raw, np.uint8)
        self.commit(replica, tag)
        return end <= capacity

    def publish_into(self, replica: int, tag: int, fingerprint: bytes, layout: tuple,
                     readers: tuple[int, ...], wait: Callable[[Callable[[], bool], int], None]
                     ) -> tuple[np.ndarray, ...] | None:
        """Claim `replica`'s next buffer for a tuple of arrays of `layout` ((dtype, shape) each) under
        `tag`: writable views of its arrays, to be filled (an acting leader sums its members' operands
        straight into them: collectives/exchange.py) before `commit(replica, tag)` publishes them.
        None if they do not fit (nothing claimed). The header, fingerprint and layout are written only
        when they differ from the buffer's last use (a collective in a loop: the arrays' bytes only)."""
        mapping, slot, capacity = self._slot(replica)
        base = slot + _LINE + self._next[replica] * (_HEADER + capacity)
        last = mapping.written.get(base)
        if last is not None and last[0] is fingerprint and last[1] == layout:
            self._claim(replica, tag, readers, wait)
            mapping.words[base // 4 + _TAG] = 0
            return last[2]
        meta = self._layouts.get(layout)
        if meta is None:
            meta = self._layouts.put(layout, pickle.dumps(layout, protocol=pickle.HIGHEST_PROTOCOL))
        fp_len, meta_len = len(fingerprint), len(meta)
        table = _round8(fp_len + meta_len)
        offsets = []
        end = _round8(table + 16 * len(layout))
        sizes = []
        for dtype, shape in layout:
            size = math.prod(shape) * dtype.itemsize
            offsets.append(end)
            sizes.append(size)
            end = (end + size + 63) // 64 * 64
        if end > capacity or not mapping.reserve(base, _HEADER + end):
            return None  # too large for a slot, or no room in /dev/shm: over the fabric
        self._claim(replica, tag, readers, wait)
        mm = mapping.mm
        start = base + _HEADER
        _FIELDS.pack_into(mm, base, 0, ARRAYS, fp_len, meta_len, len(layout))
        mm[start:start + fp_len] = fingerprint
        mm[start + fp_len:start + fp_len + meta_len] = meta
        if layout:
            struct.pack_into(f"<{2 * len(layout)}Q", mm, start + table,
                             *[x for off, size in zip(offsets, sizes) for x in (off, size)])
        views = tuple(np.ndarray(shape, dtype, buffer=mm, offset=start + off)
                      for (dtype, shape), off in zip(layout, offsets))
        mapping.written[base] = (fingerprint, layout, views)
        return views

    def _claim(self, replica: int, tag: int, readers: tuple[int, ...], wait: Callable[[Callable[[], bool], int], None]
               ) -> tuple[Mapping, int, int]:
        """Take `replica`'s next buffer for `tag` once every reader of its previous use released it:
        (mapping, buffer offset, capacity)."""
        mapping, slot, capacity = self._slot(replica)
        k = self._next[replica]
        self._next[replica] = 1 - k
        base = slot + _LINE + k * (_HEADER + capacity)
        words = mapping.words
        head = base // 4
        previous = self._pending.get((replica, k))
        if previous is not None:
            prev_tag, prev_readers = previous
            for q in prev_readers:
                word = head + _RELEASE + q
                if words[word] != prev_tag:
                    words[head + _WRITER_WAITS] = 1
                    wait(lambda w=word: int(words[w]) == prev_tag, mapping.address + 4 * word)
                    words[head + _WRITER_WAITS] = 0
        self._pending[(replica, k)] = (tag, readers)
        return mapping, base, capacity

    def commit(self, replica: int, tag: int) -> None:
        """Publish the buffer claimed last for `replica` (by `publish_into`) under `tag`, and wake its readers."""
        mapping, slot, capacity = self._slot(replica)
        words = mapping.words
        words[(slot + _LINE + (1 - self._next[replica]) * (_HEADER + capacity)) // 4 + _TAG] = tag
        counter = slot // 4
        words[counter] = (int(words[counter]) + 1) & 0xFFFFFFFF
        futex.wake(mapping.address + 4 * counter)

    # -- reading ---------------------------------------------------------------------------------
    def find(self, writer: int, tag: int) -> tuple[Mapping, int, int] | None:
        """(mapping, buffer offset, capacity) of `writer`'s buffer tagged `tag`, if published."""
        mapping, slot, capacity = self._slot(writer)
        words = mapping.words
        for k in (0, 1):
            base = slot + _LINE + k * (_HEADER + capacity)
            if int(words[base // 4 + _TAG]) == tag:
                return mapping, base, capacity
        return None

    def counter(self, writer: int) -> tuple[Mapping, int]:
        """(mapping, u32 index) of the word `writer` bumps on every publication."""
        mapping, slot, _ = self._slot(writer)
        return mapping, slot // 4

    def open(self, found: tuple[Mapping, int, int], tag: int, position: int
             ) -> tuple[bytes, Any, bool, Read]:
        """(the writer's fingerprint bytes, payload views or None, whether it follows over the fabric,
        the read to release)."""
        mapping, base, capacity = found
        _, flags, fp_len, meta_len, nbuf = _FIELDS.unpack_from(mapping.mm, base)
        start = base + _HEADER
        read = Read(mapping, base // 4, position, tag, mapping.region(start, capacity))
        if flags & FABRIC:
            return mapping.mm[start:start + fp_len], None, True, read
        if flags & ARRAYS:
            # The fingerprint, layout and offsets as one string: the same as last time here (a loop), the
            # same views serve (read-only, of the same bytes; nobody keeps them past its release).
            described = mapping.mm[start:start + _round8(fp_len + meta_len) + 16 * nbuf]
            last = mapping.opened.get(base)
            if last is not None and last[0] == described:
                return described[:fp_len], last[1], False, read
        fingerprint = mapping.mm[start:start + fp_len]
        view = mapping.view
        meta = view[start + fp_len:start + fp_len + meta_len]
        buffers = []
        if nbuf:
            entries = struct.unpack_from(f"<{2 * nbuf}Q", mapping.mm, start + _round8(fp_len + meta_len))
            buffers = [view[start + off:start + off + n] for off, n in zip(entries[0::2], entries[1::2])]
        if flags & ARRAYS:
            key = bytes(meta)
            layout = self._layouts_read.get(key)
            if layout is None:
                layout = self._layouts_read.put(key, pickle.loads(key))  # noqa: S301 - see below
            arrays = tuple(np.ndarray(shape, dtype, buffer=b) for (dtype, shape), b in zip(layout, buffers))
            mapping.opened[base] = (described, arrays)
            return fingerprint, arrays, False, read
        mapping.opened.pop(base, None)
        # Only this job's actors write a board (the segment is the job's, mode 0600): see wire.py.
        return fingerprint, pickle.loads(meta, buffers=buffers), False, read  # noqa: S301

    def close(self) -> bool:
        """Unlink and unmap; False if some mapping is still held by a view (the caller collects)."""
        closed = self._own.close()
        for mapping, _ in self._peers.values():
            closed = mapping.close() and closed
        self._peers = {}
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        return closed
