"""What a peer's message may hold, from the program: judged before its bytes are allocated.

Every message between replicas has a key (transport/keys.py), and the receiving actor has the
program, so it knows what a message under each key can hold at most:

- `("coll", seq, round)`: a piece of one of the program's collectives. Which collective number
  `seq` will be depends on the data (loops, conditionals), so the bound is the largest the
  program has: a collective's operands and result times its group size (a leader forwards its
  members' pieces together), plus the fingerprint and pickle's framing. A program without
  collectives expects none.
- `("chan", channel, seq)`: the data of a Send on `channel`; a channel no Send of the program
  uses expects nothing.
- `("chan-ack", channel, seq)`: an acknowledgement (no array) on a channel a Send or a Recv of the
  program uses (a Recv acknowledges even when no Send matches it: that is a deadlock to report, not
  a message to refuse).

Anything else (the host's keys, which never come from a peer; an unknown protocol; a key that is
not a tuple of a name and two ints) is refused, as is a body over its key's bound: the wire
asks before reading the body (`check_frame`), shared-memory descriptors are judged by the bytes
they describe before they are mapped (`check_shared`), and object-store messages by their arrays
(`check_payload`). Every refusal raises `WireError` naming the source, key and sizes.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import Any

import numpy as np

from replicas.hlo.ir import Module
from replicas.hlo.opcodes import OPCODES
from replicas.limits import format_bytes, shape_bytes, short_text
from replicas.transport import keys
from replicas.transport.shm import Shared, ShmArray
from replicas.transport.wire import WireError, payload_bytes

# Framing beyond the arrays: pickle's per-array headers, the fingerprint (its groups list every
# member) and the key; per replica of the job because gathered lists hold one array per member.
SLACK_BYTES = 64 << 10
SLACK_PER_REPLICA = 256
ACK_BYTES = 4 << 10  # an acknowledgement carries no array


class MessageBounds:
    """The most bytes a peer's message under each key may hold in `module` run on `num_replicas`."""

    def __init__(self, module: Module, num_replicas: int) -> None:
        slack = SLACK_BYTES + SLACK_PER_REPLICA * num_replicas
        self.collective = 0  # bytes of the largest collective message (0: the program has none)
        self.channels: dict[int, int] = {}  # channel id -> bytes of its largest Send
        self.acknowledged: set[int] = set()  # channels a Send or a Recv uses
        for comp, inst in module.instructions():
            opcode = OPCODES.get(inst.opcode)
            if opcode is not None and opcode.collective:
                by_name = comp.by_name
                operands = sum(shape_bytes(by_name[o].shape) for o in inst.operands if o in by_name)
                members = max((len(g) for g in inst.attrs.get("replica_groups") or ()), default=num_replicas)
                if inst.opcode == "ragged-all-to-all" and all(o in by_name for o in inst.operands[:3]):
                    # Its updates to one member may repeat rows: at most every update the whole input.
                    operands += shape_bytes(by_name[inst.operands[0]].shape) * by_name[inst.operands[2]].shape.numel
                self.collective = max(self.collective, max(members, 1) * (operands + shape_bytes(inst.shape)) + slack)
            elif inst.opcode in ("send", "recv") and not inst.attrs.get("is_host_transfer"):
                channel = _int(inst.attrs.get("channel_id"))
                if channel is None:
                    continue
                self.acknowledged.add(channel)
                data = comp.by_name.get(inst.operands[0]) if inst.opcode == "send" and inst.operands else None
                if data is not None:
                    self.channels[channel] = max(self.channels.get(channel, 0), shape_bytes(data.shape) + slack)

    def widen(self, other: MessageBounds) -> None:
        """Also admit what `other`'s program may send (a job that runs several programs)."""
        self.collective = max(self.collective, other.collective)
        for channel, size in other.channels.items():
            self.channels[channel] = max(self.channels.get(channel, 0), size)
        self.acknowledged |= other.acknowledged

    def limit(self, src: Any, key: Hashable) -> int:
        """The most bytes a message under `key` may hold; WireError if no message may have it."""
        if isinstance(key, tuple) and len(key) == 3 and all(isinstance(k, int) for k in key[1:]):
            kind, channel = key[0], key[1]
            if kind == keys.COLLECTIVE:
                if self.collective:
                    return self.collective
                raise WireError(f"replica {src!r} sent {short_text(key)}, but the program has no collective")
            if kind == keys.CHANNEL_ACK and channel in self.acknowledged:
                return ACK_BYTES
            if kind == keys.CHANNEL and channel in self.channels:
                return self.channels[channel]
            if kind in (keys.CHANNEL, keys.CHANNEL_ACK):
                raise WireError(f"replica {src!r} sent {short_text(key)}, but the program "
                                f"{'sends' if kind == keys.CHANNEL else 'sends or receives'} nothing on "
                                f"channel {channel}")
        raise WireError(f"replica {src!r} sent a message under {short_text(key)}, which names no collective or "
                        "channel of the program")

    def check_frame(self, src: Any, key: Hashable, size: int) -> None:
        """Refuse a message of `size` bytes under `key` over what the key's collective or channel holds."""
        limit = self.limit(src, key)
        if size > limit:
            raise WireError(f"replica {src!r} sent {format_bytes(size)} under {short_text(key)}, where the "
                            f"program expects at most {format_bytes(limit)}")

    def check_payload(self, src: Any, key: Hashable, value: Any) -> None:
        """The same for a message that arrived whole (through the object store): its array bytes."""
        self.check_frame(src, key, payload_bytes(value))

    def check_shared(self, src: Any, key: Hashable, shared: Shared) -> None:
        """The same for the arrays a shared-memory descriptor names, before any is mapped."""
        self.check_frame(src, key, described_bytes(shared.value))


def described_bytes(value: Any) -> int:
    """Bytes of the ShmArray descriptors in `value` (nested in tuples and lists), checked as data:
    WireError for a descriptor whose shape or dtype is not one an array can have."""
    total = 0
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, ShmArray):
            shape, dtype = v.shape, v.dtype
            if not (isinstance(dtype, np.dtype) and not dtype.hasobject and isinstance(shape, tuple)
                    and all(isinstance(d, int) and d >= 0 for d in shape)):
                raise WireError(f"a shared-memory descriptor with shape {short_text(shape)} and dtype "
                                f"{short_text(dtype)}")
            total += math.prod(shape) * dtype.itemsize
        elif isinstance(v, (tuple, list)):
            stack.extend(v)
    return total


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
