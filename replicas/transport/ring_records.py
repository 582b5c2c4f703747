"""One channel ring's words and records in shared memory (the rings of transport/channel_ring.py).

A ring is a line with `head` (bytes ever written; its writer's) and a line with `tail` (bytes ever
consumed; its reader's), then its records. A record is a header (length, destination, source, form,
channel, sequence number, lengths), its meta (an array's layout pickle, a pickled value or a
shared-memory descriptor) and its bytes, each 8-aligned. A channel's records mostly repeat one
array layout: `Ring.sent` and `Ring.expect` keep what writing and reading one of them needs.
"""

from __future__ import annotations

import struct
import threading

import numpy as np

from replicas.transport import futex, keys
from replicas.transport.segment import Mapping

LINE = 64
# length, destination, source, form, channel, sequence number, meta length, data length
RECORD = struct.Struct("<IIIIqqIQ")
ACK, ARRAY, PICKLED, SHARED, WRAP = 0, 1, 2, 3, 4


def round8(n: int) -> int:
    return (n + 7) // 8 * 8


def bell(words: memoryview, address: int, index: int, always: bool = False) -> None:
    """Bump the doorbell word `index` of a segment (`words`: its u32 words, mapped at `address`), and
    wake its replica if it sleeps there (the word after it says so: a wake-up is a system call, and
    most messages find their receiver awake; the fence orders the bump before the flag's read, see
    `futex.fence`). Memoryviews, not numpy: a numpy scalar read or store costs several times as
    much, and a channel op makes a handful of them."""
    words[index] = (words[index] + 1) & 0xFFFFFFFF
    if not always:
        futex.fence()
    if always or words[index + 1]:
        futex.wake(address + 4 * index)


def views(mapping: Mapping) -> tuple[memoryview, memoryview]:
    """The segment's u32 words (doorbells) and u64 words (ring heads and tails) as memoryviews
    (released by `ChannelRings.close` before the mapping is closed)."""
    return memoryview(mapping.mm).cast("I"), memoryview(mapping.mm).cast("Q")


class Ring:
    """One ring inside a mapped segment: where its words and records are."""

    __slots__ = ("mapping", "mm", "words", "words64", "address", "head", "tail", "start", "capacity", "lock",
                 "refused", "layout", "expect", "acks", "sent", "freed")

    def __init__(self, mapping: Mapping, views: tuple[memoryview, memoryview], offset: int, capacity: int,
                 acks: int) -> None:
        self.mapping = mapping
        self.mm = mapping.mm
        self.words, self.words64 = views  # the segment's doorbells, and this ring's head and tail
        self.address = mapping.address
        self.head = offset // 8  # u64 index
        self.tail = (offset + LINE) // 8
        self.start = offset + 2 * LINE
        self.capacity = capacity
        self.lock = threading.Lock()
        self.refused = False  # a record was refused: the ring is read no more (its actor's replicas fail)
        self.layout: tuple[bytes, tuple] = (b"", ())  # the last array layout read (meta -> (dtype, shape))
        self.expect: tuple | None = None  # a record of that layout, as `ChannelRings._take_first` reads it
        self.acks = acks  # u64 index of its acknowledgement words (-1: none, acknowledgements are records)
        self.sent: tuple = (None, None, b"", 0, 0, 0, None)  # the last array layout written (`sent_layout`)
        self.freed = 0  # its `tail` as the writer last read it (the reader's word: read again only when short)


def sent_layout(ring: Ring, value: np.ndarray, meta: bytes) -> tuple:
    """What writing a record of `value`'s layout again needs (`Ring.sent`): its dtype, shape, meta, the
    record's length, where its bytes start, how many, and the struct of its header and meta (None: a
    record of this layout is too large for the ring, or its type has no buffer format, bfloat16 and
    the like, and is copied by numpy)."""
    data_at = (RECORD.size + len(meta) + 7) & ~7
    length = (data_at + value.nbytes + 7) & ~7
    direct = value.dtype.isbuiltin == 1 and length <= ring.capacity // 2
    head = struct.Struct(f"{RECORD.format}{len(meta)}s") if direct else None
    return (value.dtype, value.shape, meta, length, data_at, value.nbytes, head)


def expected(meta: bytes, dtype: np.dtype, shape: tuple, count: int, data_at: int, data_len: int) -> tuple:
    """What reading a record of a layout again needs (`Ring.expect`): the struct of its header and meta,
    the meta, dtype, shape, element count, where its bytes start, how many, and its length."""
    return (struct.Struct(f"{RECORD.format}{len(meta)}s"), meta, dtype, shape, count, data_at, data_len,
            round8(data_at + data_len))


def write_as_before(ring: Ring, dst: int, src: int, channel: int, seq: int, value: np.ndarray, sent: tuple,
                    doorbell: int) -> bool | None:
    """Write the contiguous array `value` in the layout `sent` the ring wrote last (a ping-pong's every
    record): header and meta in one store, the bytes in one memcpy, then the head and dst's doorbell
    word `doorbell`. False when the ring is full or closed, None when the record would wrap (the
    general path writes the wrap)."""
    _, _, meta, length, data_at, nbytes, head_struct = sent
    capacity = ring.capacity
    with ring.lock:  # (`ChannelRings.close` takes it before it releases the views: then they raise)
        words64 = ring.words64
        try:
            head = words64[ring.head]
        except ValueError:
            return False
        at = head % capacity
        if capacity - at < length:
            return None
        if head + length - ring.freed > capacity:
            ring.freed = words64[ring.tail]  # (a word the other core writes: read when the ring looks full)
            if head + length - ring.freed > capacity:
                return False  # full: the receiver has not read what is there yet
        base = ring.start + at
        mm = ring.mm
        head_struct.pack_into(mm, base, length, dst, src, ARRAY, channel, seq, len(meta), nbytes, meta)
        mm[base + data_at:base + data_at + nbytes] = value
        words64[ring.head] = head + length  # publishes the record (stores stay in order)
        bell(ring.words, ring.address, doorbell)
    return True


def take_first(ring: Ring, replica: int, src: int, key: tuple, bounds: dict[int, int]
               ) -> tuple[np.ndarray, bool] | None:
    """The value of data record (src, key) for `replica` when it is the first record of `ring` and an
    array in the layout the ring last read (`Ring.expect`), its header and meta read and compared in
    one step, and whether more records follow it; None otherwise (and when the ring is closed or
    refused), for `ChannelRings.drain` to read (and judge) it. `bounds`: channel -> the bytes its
    largest Send may carry."""
    expect = ring.expect
    if expect is None or key[0] != keys.CHANNEL:
        return None
    header, meta, dtype, shape, count, data_at, data_len, length = expect
    capacity = ring.capacity
    with ring.lock:
        words64 = ring.words64
        try:
            tail = words64[ring.tail]
            head = words64[ring.head]
        except ValueError:  # closed
            return None
        at = tail % capacity
        if (ring.refused or length > head - tail or length > capacity - at
                or header.unpack_from(ring.mm, ring.start + at)
                != (length, replica, src, ARRAY, key[1], key[2], len(meta), data_len, meta)
                or data_len > bounds.get(key[1], -1)):
            return None
        value = np.frombuffer(ring.mm, dtype, count, ring.start + at + data_at).copy()
        tail += length
        words64[ring.tail] = tail  # the writer may reuse the bytes: the value is out
    return (value if len(shape) == 1 else value.reshape(shape)), tail != head
