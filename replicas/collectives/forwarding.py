"""Arrays from another node received straight into this actor's shared-memory arena, where a node
leader forwards them to the processes of its node (`collectives/nodes.py`, all-to-all).

Why: a node leader receives one transfer per other node holding what its node's processes are
sent; the part for another process of the node went on as a message, which copied it into the arena
(`transport/shm.py`). Received into leased blocks of the arena instead, that part goes on as a
descriptor of where it already is: no copy on the leader's critical path.

Only the arrays of the transfers a collective announced (`expect(seq)`, before it sends its own
part across) are placed in the arena. The others keep the reader's own buffers and leave the arena's
room to the result buffers: an all-reduce's stream is reduced where it lands, and an all-gather's
pieces are copied into its result (read from the socket straight into the result's shared-memory
pages, they took longer than into the reader's buffers plus the copy). A transfer that arrives
before it was announced is received as before and copied: the same bytes, later.

A transfer announced `whole` (small chunks) lands in one block, its arrays one after the other, so
what one process is sent from another node goes on as one part of that block (`packed_in_place`):
one descriptor for all of them. Each descriptor costs the leader a lend and the receiver a
mapping, a finalizer and its share of the message's unpickling, far more than its bytes at 128 KiB.

A block is received into again only when nothing refers to its array any more and every process it
was forwarded to released it (`BufferPool`'s rule); the blocks go back with the arena at the end of
the job.
"""

from __future__ import annotations

import math
import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from replicas.collectives.buffers import BufferPool
from replicas.transport import board, keys, shm

if TYPE_CHECKING:
    from replicas.transport.fabric import Fabric

_INSTALL = threading.Lock()  # two node leaders of one actor (packed replicas) may install at once
_BYTES = np.dtype(np.uint8)


class Placer:
    """Where one actor's wire receives the announced transfers of one job (`Wire.placer` while the
    job runs): blocks of its arena, kept and reused by a `BufferPool` of the arena."""

    def __init__(self, outbox: Any, round_: int) -> None:
        self.outbox = outbox
        self.round = round_
        # Sequence numbers of the collectives whose transfers land here: whether each lands whole.
        self.expected: dict[int, bool] = {}
        # Per sequence number, per sending replica: where each array of its transfer goes
        # (collectives/landing.py).
        self.targets: dict[int, dict[int, list[np.ndarray | None]]] = {}
        self.placed: dict[int, list[np.ndarray]] = {}  # the whole blocks received, by sequence number
        self.blocks = BufferPool(outbox=outbox)
        self.lock = threading.Lock()

    def expect(self, seq: int, whole: bool = False,
               targets: dict[int, list[np.ndarray | None]] | None = None) -> None:
        """Announce collective `seq`'s transfers: into leased blocks (`whole`: one per transfer), or
        each array straight into its place, `targets[source replica]` in the transfer's order (the
        wire reads each place as the array's turn comes: None there, into its own buffer)."""
        with self.lock:
            self.expected[seq] = whole
            if targets is not None:
                self.targets[seq] = targets

    def done(self, seq: int) -> None:
        with self.lock:
            self.expected.pop(seq, None)
            self.placed.pop(seq, None)
            self.targets.pop(seq, None)

    def __call__(self, head: tuple, sizes: list[int]) -> list[np.ndarray | None] | None:
        """Writable uint8 buffers, one per array of `sizes` (None where the reader keeps its own), for
        a message whose head (token, destination, source, key) names an announced collective's
        transfer; else None. A transfer announced `whole` lands in one block, its arrays in order."""
        key = head[3] if len(head) > 3 else None
        if type(key) is not tuple or len(key) != 3 or key[0] != keys.COLLECTIVE:
            return None
        with self.lock:
            whole = self.expected.get(key[1]) if key[2] == self.round else None
            if whole is None:
                return None
            places = self.targets.get(key[1])
            if places is not None:
                found = places.get(head[2])
                if found is None or len(found) != len(sizes):
                    return None  # read into the reader's buffers, copied into place afterwards
                return found  # the leader's own list: a place it fills in later still serves
            if not whole:  # smaller arrays are inlined when forwarded: no copy to save
                return [self.blocks.reused_or_leased((n,), _BYTES) if n >= shm.MIN_BYTES else None for n in sizes]
            starts = _starts(sizes)
            if starts[-1] < shm.MIN_BYTES:
                return None
            block = self.blocks.reused_or_leased((starts[-1],), _BYTES)
            if block is None:
                return None
            self.placed.setdefault(key[1], []).append(block)
            return [block[a:a + n] for a, n in zip(starts, sizes)]

    def take(self, seq: int) -> list[np.ndarray]:
        """The blocks the announced transfers of collective `seq` were received into, whole."""
        with self.lock:
            return self.placed.pop(seq, [])

    def retire(self, wire: Any) -> bool:
        """The job's arena closes: stop placing; False if a block is still referred to."""
        if getattr(wire, "placer", None) is self:
            wire.placer = None
        with self.lock:
            return self.blocks.retire()


def placer_of(fabric: Fabric, round_: int) -> Placer | None:
    """This actor's placer for the fabric's job, installed on its wire at first use; None where
    nothing is received from other nodes into an arena (no wire, no arena: threads, one node)."""
    wire = getattr(fabric, "wire", None)
    shared = fabric.shared
    outbox = shared.outbox if shared is not None else None
    if wire is None or outbox is None:
        return None
    with _INSTALL:
        placer = wire.placer
        if isinstance(placer, Placer) and placer.outbox is outbox:
            return placer
        placer = Placer(outbox, round_)
        wire.placer = placer
    outbox.on_close(lambda: placer.retire(wire))
    return placer


ALIGN = 64  # bytes: where each array of a packed buffer starts (a multiple of every dtype's alignment)


def _starts(sizes: list[int]) -> list[int]:
    """Where each of arrays of `sizes` bytes starts in one packed buffer, then its length."""
    starts = [0]
    for n in sizes:
        starts.append(starts[-1] + -(-n // ALIGN) * ALIGN)
    return starts


Packed = tuple  # (a uint8 buffer, ((start, dtype, shape), ...)): arrays in one buffer, one descriptor


def packed_into(buffer: np.ndarray, arrays: list[np.ndarray]) -> Packed:
    """`arrays` copied into `buffer` (uint8, at least `_starts`' length of their sizes), packed."""
    starts = _starts([a.nbytes for a in arrays])
    for a, at in zip(arrays, starts):
        np.copyto(buffer[at:at + a.nbytes].view(a.dtype).reshape(a.shape), a, casting="no")
    return buffer[:starts[-1]], tuple((at, a.dtype, a.shape) for a, at in zip(arrays, starts))


def packed_size(arrays: list[np.ndarray]) -> int:
    return _starts([a.nbytes for a in arrays])[-1]


def packed_in_place(arrays: list[np.ndarray], blocks: list[np.ndarray]) -> Packed | None:
    """`arrays` packed as the part of one of `blocks` they lie in (a placer's, received whole), or
    None when they do not all lie in one."""
    if not arrays:
        return None
    for block in blocks:
        base = block.ctypes.data
        starts = []
        for a in arrays:
            at = a.ctypes.data - base
            if not (a.flags.c_contiguous and a.nbytes and 0 <= at and at + a.nbytes <= block.nbytes):
                break
            starts.append(at)
        else:
            low = min(starts)
            high = max(at + a.nbytes for at, a in zip(starts, arrays))
            return block[low:high], tuple((at - low, a.dtype, a.shape) for a, at in zip(arrays, starts))
    return None


def unpacked(pack: Packed) -> list[np.ndarray]:
    """The arrays of a pack: views of its buffer."""
    buffer, layout = pack
    return [buffer[at:at + dtype.itemsize * math.prod(shape)].view(dtype).reshape(shape)
            for at, dtype, shape in layout]


def on_board(fabric: Fabric, readers: list[int]) -> bool:
    """Whether a node leader hands its node's processes at `readers` (process positions) their parts
    on the same-node board, as places in its arena (`handed_on_board`): a board, an arena and its
    mappings here, and a reader position on the board for each."""
    shared = fabric.shared
    return (shared is not None and shared.board is not None and shared.outbox is not None
            and shared.inbox is not None and bool(readers) and max(readers) < board.READERS)


def handed_on_board(ex: Any, round_: int, readers: list[int], payloads: dict[int, tuple]) -> bool:
    """Publish `payloads[q]` (sources, [arrays or packs]) for each reader q in one buffer of the
    board, every array that lies in a leased block of the arena as the place it was lent at (plain
    numbers), the others as themselves (copied into the board). Readers wait on the board word
    itself: no message, no reader thread's wake-up, no descriptor to unpickle. False, with nothing
    lent, when the board announced that the parts follow as messages (the caller sends them)."""
    shared = ex.fabric.shared
    outbox = shared.outbox
    taken: list[Any] = []

    def piece(x: np.ndarray) -> Any:
        ref = outbox.lend(x) if x.flags.c_contiguous and x.nbytes else None
        if ref is None:
            return x
        taken.append(ref)
        return ref, x.dtype.str, x.shape

    def pieces(pack: Any) -> Any:
        return (piece(pack[0]), pack[1]) if type(pack) is tuple else [piece(a) for a in pack]

    per: list[Any] = [None] * (max(readers) + 1)
    for q in readers:
        sources, packs = payloads[q]
        per[q] = (sources, [pieces(p) for p in packs])
    b = shared.board
    if b.publish(ex.topo.leader, board.tag_of(ex.seq, round_), b.fingerprint_bytes(ex.fingerprint.wire),
                 (outbox.name, per), tuple(readers), ex._wait_released):
        return True
    for ref in taken:
        outbox.give_back(ref)
    return False


def read_handed(ex: Any, writer: int, round_: int) -> tuple:
    """What the node leader at process position `writer` handed this process (`handed_on_board`, or
    as a message where the board announced one): (sources, [arrays or packs])."""
    return handed_from(ex, ex.read_board(writer, round_))


def handed_from(ex: Any, value: Any) -> tuple:
    """`read_handed` of a value already read."""
    if type(value[0]) is not str:
        return value
    segment, per = value
    inbox = ex.fabric.shared.inbox

    def array(p: Any) -> np.ndarray:
        return inbox.lent(segment, p[0], p[2], np.dtype(p[1])) if type(p) is tuple else p

    sources, packs = per[ex.topo.position]
    return sources, [(array(p[0]), p[1]) if type(p) is tuple else [array(a) for a in p] for p in packs]


def published_whole(ex: Any, round_: int, reader: int, parts: list[tuple],
                    results: list[tuple] | None = None) -> bool:
    """A process's operands (`parts`, a tuple of arrays per member) for its node leader at process
    position `reader`, published on the board as `handed_on_board` does, with `results` (leased
    buffers the leader writes the results into, collectives/landing.py) if given; False, with
    nothing lent, when the board announced that they follow as a message (the caller sends it, and
    no result lands)."""
    shared = ex.fabric.shared
    outbox = shared.outbox
    taken: list[Any] = []

    def lent(rows: list[tuple]) -> list[tuple]:
        pieces = []
        for values in rows:
            row = []
            for x in values:
                ref = outbox.lend(x) if x.flags.c_contiguous and x.nbytes else None
                if ref is not None:
                    taken.append(ref)
                row.append(x if ref is None else (ref, x.dtype.str, x.shape))
            pieces.append(tuple(row))
        return pieces

    payload: tuple = (outbox.name, lent(parts))
    if results is not None:
        places = lent(results)
        if all(type(p) is tuple for row in places for p in row):  # every result where the leader can map it
            payload += (places,)
    b = shared.board
    if b.publish(ex.topo.leader, board.tag_of(ex.seq, round_), b.fingerprint_bytes(ex.fingerprint.wire),
                 payload, (reader,), ex._wait_released):
        return True
    for ref in taken:
        outbox.give_back(ref)
    return False


def read_whole(ex: Any, writer: int, round_: int, results: list | None = None) -> list[tuple]:
    """What the process at position `writer` published by `published_whole` (or sent, where the board
    announced a message): its operands, a tuple of arrays per member. Its result buffers, writable,
    are appended to `results` if it published them (else None is)."""
    value = ex.read_board(writer, round_)
    if not (type(value) is tuple and len(value) in (2, 3) and type(value[0]) is str):
        if results is not None:
            results.append(None)
        return value
    segment, pieces = value[:2]
    inbox = ex.fabric.shared.inbox

    def mapped(rows: list[tuple], writable: bool) -> list[tuple]:
        return [tuple(inbox.lent(segment, p[0], p[2], np.dtype(p[1]), writable) if type(p) is tuple else p
                      for p in row) for row in rows]

    if results is not None:
        results.append(mapped(value[2], True) if len(value) == 3 else None)
    return mapped(pieces, False)
