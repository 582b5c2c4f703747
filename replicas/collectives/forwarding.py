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

A block is received into again only when nothing refers to its array any more and every process it
was forwarded to released it (`BufferPool`'s rule); the blocks go back with the arena at the end of
the job.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from replicas.collectives.buffers import BufferPool
from replicas.transport import keys, shm

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
        self.expected: set[int] = set()  # sequence numbers of the collectives whose transfers land here
        self.blocks = BufferPool(outbox=outbox)
        self.lock = threading.Lock()

    def expect(self, seq: int) -> None:
        with self.lock:
            self.expected.add(seq)

    def done(self, seq: int) -> None:
        with self.lock:
            self.expected.discard(seq)

    def __call__(self, head: tuple, nbytes: int) -> np.ndarray | None:
        """A writable uint8 buffer of `nbytes` in a leased block for an array of a message whose head
        (token, destination, source, key) names an announced collective's transfer; else None."""
        key = head[3] if len(head) > 3 else None
        if type(key) is not tuple or len(key) != 3 or key[0] != keys.COLLECTIVE:
            return None
        with self.lock:
            # Smaller arrays are inlined when forwarded: no copy to save.
            if key[2] != self.round or key[1] not in self.expected or nbytes < shm.MIN_BYTES:
                return None
            return self.blocks.reused_or_leased((nbytes,), _BYTES)

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
