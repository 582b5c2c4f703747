"""Send/Recv between replica actors of one node: a shared-memory ring per ordered pair of actors.

Why: over the sockets, each of a ping-pong's four messages per round trip (data and the channel's
acknowledgement, each way) was a pickle, a write, a reader thread's wake-up in the peer, a mailbox
hand-off and the replica thread's wake-up, each waiting for the GIL. Through a ring, the sending replica's thread writes
the record into the receiver's shared memory, bumps the receiving replica's doorbell word and
wakes it with one `FUTEX_WAKE`; the receiving replica's own thread, waiting on that word
(`FUTEX_WAIT` through ctypes, GIL released, in slices so aborts and timeouts keep working), reads
the record itself: no socket, no reader thread, no pickling of array bytes. When the job's
processes on this node fit its cores, the receiver first watches its doorbell for a bounded,
adaptive while (transport/spin.py): a peer that is running then writes without a `FUTEX_WAKE` and
the receiver goes on without a wake-up.

Why not the board (transport/board.py): a board writer waits until its readers released its
previous buffer, but a channel value may be received long after it was sent while the sender goes
on sending, and a Send must never block (the monitor could not tell a blocked Send from a hang).
A ring holds any number of values in flight up to its size; when it is full, or a value cannot
travel through it, the sender posts the message through the fabric's other paths instead. Order
needs nothing more: every channel message has its own key (channel, sequence number) and the
receiver takes exactly the key it waits for, whichever path brought it.

Layout: each actor of a multi-actor job on this node owns one segment (`rpl-<token>-c<first
replica>`, sparse, mode 0600, removed with the job's other segments by `shm.remove_job_segments`):
a 64-byte doorbell line per hosted replica, then one inbound ring per other actor of the node
(in actor order). A ring is a line with `head` (bytes ever written; its writer's) and a line with
`tail` (bytes ever consumed; its reader's), then `RING_BYTES` of records. Each word has one
writer process (a lock orders the threads of that process), and x86-64 keeps stores in order, so
a reader that sees `head` sees the record before it.

An acknowledgement (a Recv is posted: its Send's SendDone may return) is mostly no record but a
word: each ring's reader segment also holds a table of u64 words, one per (channel, acknowledging
replica, acknowledged replica) of the pair of actors, and the acknowledging replica stores its Recv's
sequence number + 1 there and rings the doorbell (a channel's Recvs from one peer are posted in
order, so the word says every earlier one is posted too). The waiting SendDone reads the word: no
record to write, read, deliver and take. A pair of actors whose table would be large (many packed
replicas and channels), or a channel the table has no word for (a later program of a persistent job),
sends its acknowledgements as records.

A record is a header (length, destination, source, form, channel, sequence number, lengths) and
its bytes: an acknowledgement has none; an array smaller than `shm.MIN_BYTES` is its layout and
raw bytes (copied in by the sender and out by the receiver); any other small value is a pickle;
a larger value goes into the sender's shared-memory arena (transport/shm.py, copied once, read in
place) and the record carries its descriptor. The receiver judges every record by its key and
size before it reads the value (transport/message_bounds.py), like a socket frame.

Accounting: a record is counted sent by the sender's fabric before it is written and received
when a reader delivers it to the destination's mailbox, or takes it from the ring itself (`take`:
the record the replica waits for, first in its ring, skips the mailbox). Readers are the waiting
replicas themselves, and `ReplicaHost.states` drains the rings before every snapshot, so a value
that sits in a ring is in flight for the monitor until the next poll delivers it (no false alarm),
and a replica blocked elsewhere never keeps a delivered value in flight (the deadlock is still
found). An acknowledgement word is never in flight: it is counted neither sent nor received, and
the waiting SendDone's readiness, which the monitor's snapshot asks, reads the word itself.
"""

from __future__ import annotations

import math
import os
import pickle
import threading
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np

from replicas.caching import Cache
from replicas.transport import futex, keys, shm
from replicas.transport.mailbox import Mailbox
from replicas.transport.message_bounds import MessageBounds
from replicas.transport.ring_records import (
    ACK,
    ARRAY,
    PICKLED,
    SHARED,
    WRAP,
    Ring,
    bell,
    expected,
    round8,
    sent_layout,
    take_first,
    write_as_before,
)
from replicas.transport.ring_records import LINE as _LINE
from replicas.transport.ring_records import RECORD as _RECORD
from replicas.transport.ring_records import views as _views
from replicas.transport.segment import Mapping
from replicas.transport.spin import NEVER, Spinner
from replicas.transport.wire import RefusedMessage, WireError, payload_bytes

RING_BYTES = int(os.environ.get("REPLICAS_CHANNEL_RING_BYTES", str(1 << 20)))  # per ordered pair of actors
CHANNEL_KINDS = (keys.CHANNEL, keys.CHANNEL_ACK)
ACK_WORDS_MOST = 4096  # acknowledgement words per ordered pair of actors; beyond it, acknowledgements are records
_NONE = object()  # no record taken


def available() -> bool:
    return futex.available()


def segment_name(token: str, first_replica: int) -> str:
    return f"{shm.PREFIX}{token}-c{first_replica}"


def is_channel_key(key: Hashable) -> bool:
    return type(key) is tuple and len(key) == 3 and key[0] in CHANNEL_KINDS


class ChannelRings:
    """This actor's channel rings for one job: its inbound rings and doorbells (its own segment) and
    its mappings of the other actors' segments of this node (to write to them).

    `placement[r]` is the actor index hosting replica r; `same_node` the replicas on this node."""

    def __init__(self, token: str, hosted: list[int], placement: list[int], same_node: frozenset[int],
                 bounds: MessageBounds, mailboxes: dict[int, Mailbox],
                 on_fault: Callable[[BaseException], None], inbox: shm.Inbox | None = None,
                 capacity: int = RING_BYTES) -> None:
        self.token = token
        self.capacity = capacity // 8 * 8
        self.me = placement[hosted[0]]
        self._bounds = bounds
        self._mailboxes = mailboxes
        self._on_fault = on_fault
        first: dict[int, int] = {}
        rank: dict[int, int] = {}  # replica -> its position among its actor's replicas
        count: dict[int, int] = {}
        for r, actor in enumerate(placement):
            first.setdefault(actor, r)
            rank[r] = count.get(actor, 0)
            count[actor] = rank[r] + 1
        self._first, self._rank, self._count = first, rank, count
        self._placement = placement
        self.actors = sorted({placement[r] for r in same_node} | {self.me})  # this node's actors
        # Channel -> its row of the acknowledgement tables (every actor of the job reads one program).
        self._ack_rows = {c: k for k, c in enumerate(sorted(bounds.acknowledged))}
        self._ack_words: dict[tuple[int, int, int], tuple[Ring, int] | None] = {}  # (acker, acked, channel) ->
        # The replicas whose messages may come through a ring: the node's, in other actors.
        self.peers = frozenset(r for r in same_node if placement[r] != self.me)
        self._own = Mapping(os.path.join(shm.SHM_DIR, segment_name(token, first[self.me])),
                             self._segment_bytes(self.me))
        self._own_views = _views(self._own)
        self._inbound_from = {writer: self._ring(self._own, self._own_views, self.me, writer)
                              for writer in self.actors if writer != self.me}
        self._inbound = list(self._inbound_from.values())
        self._outbound: dict[int, Ring] = {}  # receiving actor -> my ring in its segment
        self._peer_maps: list[Mapping] = []
        self._map_lock = threading.Lock()
        self._layouts: Cache[bytes] = Cache("ring layouts", 4096)  # (dtype, shape) -> its pickle
        self._layouts_read: Cache[tuple] = Cache("ring layouts read", 4096)
        self._inbox = inbox  # maps the peers' arenas: large values come as their descriptors
        self.closed = False

    # -- where things are --------------------------------------------------------------------------
    def _segment_bytes(self, actor: int) -> int:
        rings = _LINE * self._count[actor] + (len(self.actors) - 1) * (2 * _LINE + self.capacity)
        return rings + sum(self._ack_table_bytes(actor, w) for w in self.actors if w != actor)

    def _ack_table_words(self, reader: int, writer: int) -> int:
        """Acknowledgement words of the ring writer -> reader: one per (channel, writer's replica, reader's)."""
        words = len(self._ack_rows) * self._count[writer] * self._count[reader]
        return words if words <= ACK_WORDS_MOST else 0

    def _ack_table_bytes(self, reader: int, writer: int) -> int:
        return (8 * self._ack_table_words(reader, writer) + _LINE - 1) // _LINE * _LINE

    def _ring(self, mapping: Mapping, views: tuple[memoryview, memoryview], reader: int, writer: int) -> Ring:
        writers = [a for a in self.actors if a != reader]
        k = writers.index(writer)
        tables = _LINE * self._count[reader] + len(writers) * (2 * _LINE + self.capacity)
        table = tables + sum(self._ack_table_bytes(reader, w) for w in writers[:k])
        acks = table // 8 if self._ack_table_words(reader, writer) else -1
        return Ring(mapping, views, _LINE * self._count[reader] + k * (2 * _LINE + self.capacity), self.capacity,
                    acks)

    def _ack_word(self, acker: int, acked: int, channel: int) -> tuple[Ring, int] | None:
        """The ring whose table holds the word `acker` acknowledges `acked`'s Sends on `channel` with, and
        the word's u64 index (None: those acknowledgements are records). The acker writes it through its
        outbound ring to acked's actor; acked reads it in its own segment."""
        found = self._ack_words.get((acker, acked, channel), _NONE)
        if found is _NONE:
            writer, reader = self._placement[acker], self._placement[acked]
            row = self._ack_rows.get(channel)
            ring = (self._inbound_from.get(writer) if reader == self.me
                    else self._outbound.get(reader) or self._outbound_ring(reader))
            if row is None or ring is None or ring.acks < 0:
                found = None
            else:
                found = (ring, ring.acks + (row * self._count[writer] + self._rank[acker]) * self._count[reader]
                         + self._rank[acked])
            if ring is not None or reader == self.me:  # (no outbound ring yet: asked again next time)
                self._ack_words[(acker, acked, channel)] = found
        return found

    def _outbound_ring(self, actor: int) -> Ring | None:
        ring = self._outbound.get(actor)
        if ring is None:
            with self._map_lock:
                ring = self._outbound.get(actor)
                if ring is None and not self.closed:
                    try:
                        mapping = Mapping(os.path.join(shm.SHM_DIR, segment_name(self.token, self._first[actor])))
                    except OSError:  # not created (yet), or gone with its actor: the fabric's other paths
                        return None
                    if len(mapping.mm) != self._segment_bytes(actor):  # laid out otherwise (another ring size)
                        mapping.close()
                        return None
                    self._peer_maps.append(mapping)
                    ring = self._outbound[actor] = self._ring(mapping, _views(mapping), actor, self.me)
        return ring

    # -- doorbells -------------------------------------------------------------------------------
    def ring_doorbell(self, replica: int, always: bool = False) -> None:
        """Wake `replica` (hosted here) if it sleeps on its doorbell: something was delivered to it."""
        if not self.closed:
            try:
                bell(self._own_views[0], self._own.address, _LINE // 4 * self._rank[replica], always)
            except ValueError:  # closed meanwhile (its views released): nobody waits on it any more
                pass

    # -- sending -----------------------------------------------------------------------------------
    def send(self, dst: int, src: int, key: tuple, value: Any, outbox: shm.Outbox | None) -> bool:
        """Write the channel message (src -> dst, `key`) into the ring to dst's actor; False when it
        cannot go this way (a full ring, a value the arena cannot take, no segment): the caller
        posts it by the fabric's other paths. Never waits."""
        actor = self._placement[dst]
        ring = self._outbound.get(actor) or self._outbound_ring(actor)
        if ring is None:
            return False
        kind, channel, seq = key
        meta = None
        if type(value) is np.ndarray and kind == keys.CHANNEL:
            sent = ring.sent  # a channel's records mostly repeat one layout
            if value.dtype is sent[0] and value.shape == sent[1]:
                if value.flags.c_contiguous and sent[6] is not None:
                    written = write_as_before(ring, dst, src, channel, seq, value, sent, _LINE // 4 * self._rank[dst])
                    if written is not None:
                        return written
                meta = sent[2]
            elif value.nbytes < shm.MIN_BYTES:
                meta = self._array_meta(value)
                if meta is not None:
                    ring.sent = sent_layout(ring, value, meta)
        if meta is not None:
            raw, form = value, ARRAY
        elif kind == keys.CHANNEL_ACK and value is True:  # no bytes but the header
            meta, raw, form = b"", None, ACK
        else:
            meta, raw, form = self._encode(kind, value, key, outbox)
            if form is None:
                return False
        return self._send_record(ring, dst, src, channel, seq, meta, raw, form)

    def _send_record(self, ring: Ring, dst: int, src: int, channel: int, seq: int, meta: bytes,
                     raw: np.ndarray | None, form: int) -> bool:
        """Write one record (its header, `meta` and `raw`'s bytes) into `ring`; False when it is full."""
        meta_len = len(meta)
        data_at = (_RECORD.size + meta_len + 7) & ~7
        data_len = 0 if raw is None else raw.nbytes
        length = (data_at + data_len + 7) & ~7
        capacity = ring.capacity
        if length > capacity // 2:
            return False
        with ring.lock:  # (`close` takes it before it releases the views)
            if self.closed:
                return False
            words64 = ring.words64
            head = words64[ring.head]
            at = head % capacity
            skip = capacity - at if capacity - at < length else 0
            if head + skip + length - ring.freed > capacity:
                ring.freed = words64[ring.tail]  # (a word the other core writes: read when it matters)
                if head + skip + length - ring.freed > capacity:
                    return False  # full: the receiver has not read what is there yet
            mm = ring.mm
            if skip:
                if skip >= _RECORD.size:
                    _RECORD.pack_into(mm, ring.start + at, skip, 0, 0, WRAP, 0, 0, 0, 0)
                at = 0
            base = ring.start + at
            _RECORD.pack_into(mm, base, length, dst, src, form, channel, seq, meta_len, data_len)
            if meta_len:
                mm[base + _RECORD.size:base + _RECORD.size + meta_len] = meta
            if data_len:
                if raw.flags.c_contiguous and raw.dtype.isbuiltin == 1:  # (bfloat16 and the like have no buffer format)
                    # One memcpy, where a numpy view of the ring and copyto are three calls.
                    mm[base + data_at:base + data_at + data_len] = raw
                else:
                    np.copyto(np.ndarray(raw.shape, raw.dtype, buffer=mm, offset=base + data_at), raw, casting="no")
            words64[ring.head] = head + skip + length  # publishes the record (stores stay in order)
            bell(ring.words, ring.address, _LINE // 4 * self._rank[dst])
        return True

    def post_ack(self, dst: int, src: int, key: tuple, value: Any) -> bool:
        """Acknowledge by its word (see the module doc) when `key` is an acknowledgement that has one:
        src's Recv number key[2] on channel key[1] is posted, for dst's SendDone. False otherwise (or
        when the rings are closed): the caller sends it as a message."""
        if key[0] != keys.CHANNEL_ACK or value is not True:
            return False
        found = self._ack_word(src, dst, key[1])
        if found is None:
            return False
        ring, word = found
        with ring.lock:  # (`close` takes it before it releases the views)
            if self.closed:
                return False
            ring.words64[word] = key[2] + 1  # this channel's Recvs from dst are posted in order
            bell(ring.words, ring.address, _LINE // 4 * self._rank[dst])
        return True

    def _encode(self, kind: str, value: Any, key: tuple, outbox: shm.Outbox | None
                ) -> tuple[bytes, np.ndarray | None, int | None]:
        """(meta bytes, array to copy or None, form) of what `send` does not lay out itself (small
        arrays, acknowledgements), form None when the value cannot go by the ring."""
        if kind == keys.CHANNEL_ACK:
            return b"", None, ACK if value is True else None
        if payload_bytes(value) >= shm.MIN_BYTES:
            shared = outbox.encode(value, key) if outbox is not None else None
            if shared is None:  # no arena, or it is full: the fabric's other paths
                return b"", None, None
            return pickle.dumps(shared, protocol=pickle.HIGHEST_PROTOCOL), None, SHARED
        try:
            return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL), None, PICKLED
        except (pickle.PicklingError, TypeError, AttributeError):
            return b"", None, None

    def _array_meta(self, value: np.ndarray) -> bytes | None:
        """An array record's layout bytes (None: an object array, which is pickled)."""
        if value.dtype.hasobject:
            return None
        layout = (value.dtype, value.shape)
        meta = self._layouts.get(layout)
        if meta is None:
            meta = self._layouts.put(layout, pickle.dumps(layout, protocol=pickle.HIGHEST_PROTOCOL))
        return meta

    # -- receiving ---------------------------------------------------------------------------------
    def drain(self, reader: int | None = None, wanted: tuple[int, tuple] | None = None) -> Any:
        """Deliver every record waiting in this actor's inbound rings to its replica's mailbox (and
        wake that replica, unless it is `reader`, the one draining), except `wanted` (a (source, key)
        of `reader`'s), which is taken instead: its value is returned (_NONE if no ring held it). A
        record refused by the message bounds fails this actor's replicas."""
        taken = _NONE
        for ring in self._inbound:
            if self.closed:
                return taken
            words64 = ring.words64
            if ring.refused or words64[ring.head] == words64[ring.tail]:
                continue
            try:
                with ring.lock:
                    if not (ring.refused or self.closed):
                        value = self._drain_ring(ring, reader, wanted)
                        if value is not _NONE:
                            taken, wanted = value, None
            except (WireError, ValueError, TypeError, RuntimeError, pickle.UnpicklingError, EOFError) as e:
                ring.refused = True
                self._on_fault(RefusedMessage("a peer actor of this node (through a channel ring)", e))
        return taken

    def _drain_ring(self, ring: Ring, reader: int | None, wanted: tuple[int, tuple] | None) -> Any:
        capacity, mm, words64 = ring.capacity, ring.mm, ring.words64
        tail = words64[ring.tail]
        head = words64[ring.head]
        taken = _NONE
        while tail < head:
            at = tail % capacity
            if capacity - at < _RECORD.size:  # too little room for a header: the writer wrapped
                tail += capacity - at
                continue
            base = ring.start + at
            length, dst, src, form, channel, seq, meta_len, data_len = _RECORD.unpack_from(mm, base)
            if form == WRAP:
                if length != capacity - at:
                    raise WireError(f"a channel ring record wraps by {length} bytes at {at} of {capacity}")
                tail += length
                continue
            data_at = (_RECORD.size + meta_len + 7) & ~7
            if length % 8 or length > capacity - at or length < round8(data_at + data_len) or length > head - tail:
                raise WireError(f"a malformed channel ring record ({length} bytes, meta {meta_len}, data {data_len})")
            box = self._mailboxes.get(dst)
            if box is None:
                raise WireError(f"replica {src} sent a channel message for replica {dst}, which this actor "
                                "does not run")
            if form == ACK:
                key = (keys.CHANNEL_ACK, channel, seq)
                if channel not in self._bounds.acknowledged:
                    self._bounds.check_frame(src, key, 0)
                value = True
            else:
                key = (keys.CHANNEL, channel, seq)
                value = self._decode(ring, form, src, key, base, meta_len, data_at, data_len)
            tail += length
            words64[ring.tail] = tail  # the writer may reuse the bytes: the value is out
            if wanted is not None and dst == reader and src == wanted[0] and key == wanted[1]:
                box.count_taken(src)  # delivered and taken at once: no mailbox hand-off
                taken, wanted = value, None
                continue
            box.deliver(src, key, value)
            if dst != reader:
                self.ring_doorbell(dst)
        return taken

    def _decode(self, ring: Ring, form: int, src: int, key: tuple, base: int, meta_len: int, data_at: int,
                data_len: int) -> Any:
        """The value of a data record, judged by its key and size first (transport/message_bounds.py)."""
        bounds = self._bounds
        mm = ring.mm
        meta_at = base + _RECORD.size
        if form == ARRAY:
            if data_len > bounds.channels.get(key[1], -1):
                bounds.check_frame(src, key, data_len)  # raises: over the channel's bound, or no such channel
            meta = mm[meta_at:meta_at + meta_len]
            if meta == ring.layout[0]:  # a channel's records mostly repeat one layout
                dtype, shape, count = ring.layout[1]
            else:
                found = self._layout(meta)
                ring.layout = (meta, found)
                dtype, shape, count = found
                ring.expect = None
            if count * dtype.itemsize != data_len:
                raise WireError(f"a channel ring record of {data_len} bytes for {dtype}{list(shape)}")
            if ring.expect is None:  # this layout's records, as `_take_first` expects them
                ring.expect = expected(meta, dtype, shape, count, data_at, data_len)
            value = np.frombuffer(mm, dtype, count, base + data_at).copy()
            return value if len(shape) == 1 else value.reshape(shape)
        if form == PICKLED:
            bounds.check_frame(src, key, meta_len)
            return pickle.loads(mm[meta_at:meta_at + meta_len])  # noqa: S301 - this job's actors only
        if form == SHARED:
            shared = pickle.loads(mm[meta_at:meta_at + meta_len])  # noqa: S301 - this job's actors only
            if type(shared) is not shm.Shared:
                raise WireError(f"a channel ring record of form {form} holding {type(shared).__name__}")
            bounds.check_shared(src, key, shared)  # before any block is mapped
            if self._inbox is None:
                raise WireError("a shared-memory descriptor through a channel ring, but this actor has no inbox")
            return self._inbox.decode(shared)
        raise WireError(f"a channel ring record of unknown form {form}")

    def _layout(self, meta: bytes) -> tuple:
        """(dtype, shape, element count) of an array record's layout pickle."""
        layout = self._layouts_read.get(meta)
        if layout is None:
            layout = pickle.loads(meta)  # noqa: S301 - this job's actors only (see the module doc)
            if not (type(layout) is tuple and len(layout) == 2 and isinstance(layout[0], np.dtype)
                    and not layout[0].hasobject and type(layout[1]) is tuple):
                raise WireError(f"a channel ring record with the layout {layout!r}")
            dtype = layout[0]
            if dtype.isbuiltin == 0 and dtype.fields is None and dtype.isnative:
                # An unpickled dtype is a copy that numpy no longer knows as built in: its arrays, sent
                # on, would be copied into a ring by numpy rather than by one memcpy. Numpy's own is equal.
                canonical = np.dtype(dtype.str)
                dtype = canonical if canonical == dtype else dtype
            layout = self._layouts_read.put(meta, (dtype, layout[1], math.prod(layout[1])))
        return layout

    def take(self, replica: int, src: int, key: tuple, box: Mailbox, block: Any, spinner: Spinner = NEVER) -> Any:
        """The value of channel message (src, key) for `replica` (hosted here), waiting on its doorbell:
        an acknowledgement read from its word, a record taken from its ring when a read finds it
        (no mailbox hand-off), else taken from the mailbox the rings are drained into."""
        if key[0] == keys.CHANNEL_ACK:
            found = self._ack_word(src, replica, key[1])
            if found is not None:
                if not self._acked(found[1], key[2]):
                    self.wait(replica, box, [(src, key)], block, spinner)
                    if not self._acked(found[1], key[2]):  # it came as a message (or the rings closed)
                        return box.take(src, key, block)
                return True
        wanted = (src, key)
        ring = self._inbound_from.get(self._placement[src])
        value = self._take_first(ring, replica, src, key, box) if ring is not None else _NONE
        if value is _NONE:
            value = self.drain(replica, wanted)
        if value is not _NONE:
            return value
        if not box.poll(src, key):
            got = [_NONE]

            def arrived() -> bool:
                value = self._take_first(ring, replica, src, key, box) if ring is not None else _NONE
                got[0] = value if value is not _NONE else self.drain(replica, wanted)
                return got[0] is not _NONE or box.poll(src, key)

            if spinner.watch_words(self._own_views[0], _LINE // 4 * self._rank[replica], arrived) \
                    and got[0] is not _NONE:
                return got[0]
            self.wait(replica, box, [wanted], block)  # what comes meanwhile is drained into the mailbox
        return box.take(src, key, block)

    def _take_first(self, ring: Ring, replica: int, src: int, key: tuple, box: Mailbox) -> Any:
        """`take_first`'s value (_NONE: `drain` reads the ring), counted received; what came after it is
        drained as usual."""
        taken = take_first(ring, replica, src, key, self._bounds.channels)
        if taken is None:
            return _NONE
        value, more = taken
        box.count_taken(src)  # delivered and taken at once: no mailbox hand-off
        if more:
            self.drain(replica)
        return value

    def take_all(self, replica: int, wanted: list[tuple[int, tuple]], box: Mailbox, block: Any,
                 spinner: Spinner = NEVER) -> list[Any]:
        """`take` of every (src, key) of `wanted` (a SendDone's acknowledgements from its targets)."""
        self.wait(replica, box, wanted, block, spinner)
        out = []
        for src, key in wanted:
            found = self._ack_word(src, replica, key[1]) if key[0] == keys.CHANNEL_ACK else None
            out.append(True if found is not None and self._acked(found[1], key[2]) else box.take(src, key, block))
        return out

    def _acked(self, word: int, seq: int) -> bool:
        """Is Send number `seq` acknowledged by the word `word` of this actor's segment."""
        try:
            return self._own_views[1][word] > seq
        except ValueError:  # closed (its views released): the caller's wait sees the abort
            return False

    def wait(self, replica: int, box: Mailbox, wanted: list[tuple[int, Hashable]], block: Any,
             spinner: Spinner = NEVER) -> None:
        """Wait (on `replica`'s doorbell) until every (src, key) of `wanted` is in `box` (or, an
        acknowledgement with a word, acknowledged there), delivering what the rings hold meanwhile;
        `block` is published while waiting (as a mailbox wait would). With a `spinner`, the doorbell
        is watched for a while before the replica sleeps (transport/spin.py)."""
        self.drain(replica)
        acked = self._acked
        words = [found[1] if key[0] == keys.CHANNEL_ACK and (found := self._ack_word(src, replica, key[1])) else -1
                 for src, key in wanted]

        def there(src: int, key: Any, word: int) -> bool:
            return (word >= 0 and acked(word, key[2])) or box.poll(src, key)

        if len(wanted) == 1:
            (src, key), = wanted
            word = words[0]
            if there(src, key, word):  # mostly there already: no closure built
                return

            def ready() -> bool:  # also the monitor's question, under the mailbox's lock: never drains
                return there(src, key, word)
        else:
            def ready() -> bool:
                return all(there(src, key, word) for (src, key), word in zip(wanted, words))

            if ready():
                return
        index = _LINE // 4 * self._rank[replica]
        doorbells = self._own_views[0]

        def drained_and_ready() -> bool:
            self.drain(replica)
            return ready()

        if spinner.watch_words(doorbells, index, drained_and_ready) and ready():
            return
        address = self._own.address + 4 * index
        if block is not None and block.needs != "group":
            block.waits_for = tuple(dict.fromkeys(src for (src, key), word in zip(wanted, words)
                                                  if not there(src, key, word)))

        def sleep(timeout: float) -> None:
            try:
                doorbells[index + 1] = 1  # "asleep": writers wake it (see `_bell`)
                seen = doorbells[index]
            except ValueError:  # closed (its views released): the caller's wait sees the abort
                return
            self.drain(replica)
            if not ready():
                futex.wait(address, seen, timeout)
                self.drain(replica)  # what woke it, read before the caller asks again
            try:
                doorbells[index + 1] = 0
            except ValueError:
                pass

        box.wait_external(block, ready, sleep, lambda: self.ring_doorbell(replica, always=True))

    # -- closing -----------------------------------------------------------------------------------
    def close(self) -> None:
        """Unlink this actor's segment and unmap every mapping (values read were copied out)."""
        with self._map_lock:
            self.closed = True
            maps, self._peer_maps, outbound, self._outbound = self._peer_maps, [], self._outbound, {}
        for ring in [*self._inbound, *outbound.values()]:
            with ring.lock:  # a drain or send in progress finishes before the views go
                ring.words.release()
                ring.words64.release()
        for view in self._own_views:
            view.release()
        for mapping in [self._own, *maps]:
            mapping.close()
        try:
            os.unlink(os.path.join(shm.SHM_DIR, segment_name(self.token, self._first[self.me])))
        except FileNotFoundError:
            pass
