"""Send, send-done, recv, recv-done: point-to-point channels between replicas, or with the host.

Protocol (per channel id, per peer pair, numbered `seq` 0, 1, 2, ... on both sides, so a
Send/Recv pair in a While loop pairs iteration by iteration):
- Send posts the data at once, `("chan", channel, seq)`, and returns its context;
- Recv posts an acknowledgement to its source, `("chan-ack", channel, seq)`, and returns its context;
- SendDone waits for the acknowledgement (the peer's matching Recv has been posted);
- RecvDone waits for the data.
So every order the document allows (Recv before Send, Send before RecvDone and SendDone) runs,
and a program that waits in a cycle is a deadlock the monitor sees.

Routing follows the frontend attribute `_xla_send_recv_source_target_pairs="{{0,1},{1,2}}"`: a
Send on a replica that is no source does nothing (its SendDone returns at once); a Recv on a
replica that is no target yields zeros. Without the attribute only a one-replica job can route
(to itself). `is_host_transfer=true` makes the host the peer.

The u32 context carries the number of the Send (Recv) on its channel on this replica; the
pending peers and sequence numbers behind it stay in this replica's channel state.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from replicas.channels.feeds import host_value_checker, reject_nested_tuple
from replicas.collectives.groups import parse_pairs
from replicas.collectives.kernels import computation_of
from replicas.errors import ProgramError
from replicas.hlo.ir import Instruction
from replicas.ops.registry import KernelContext, kernel
from replicas.records import BlockInfo
from replicas.shapes import TOKEN, Shape
from replicas.transport import keys
from replicas.transport.fabric import FabricSlot

if TYPE_CHECKING:
    from replicas.transport.fabric import Fabric

PAIRS_ATTRIBUTE = "_xla_send_recv_source_target_pairs"
_PAIR_RE = re.compile(r"\{\s*(-?\d+)\s*,\s*(-?\d+)\s*\}")

def channel_state(fabric: Fabric) -> dict[tuple, Any]:
    """This replica's pending sends and receives, by (direction, channel, context)."""
    return fabric.kernel_state.setdefault(__name__, {})


def channel_id(inst: Instruction) -> int:
    value = inst.attrs.get("channel_id")
    if value is None:
        raise inst.error(f"{inst.opcode} needs a channel_id")
    return int(value)


def routing(inst: Instruction, ctx: KernelContext) -> tuple[tuple[int, int], ...]:
    return channel_pairs(inst, ctx.num_replicas)


def channel_pairs(inst: Instruction, num_replicas: int) -> tuple[tuple[int, int], ...]:
    """The (source, target) pairs a Send or Recv routes by, for a job of `num_replicas`."""
    text = (inst.attrs.get("frontend_attributes") or {}).get(PAIRS_ATTRIBUTE)
    if text is None:
        if num_replicas == 1:
            return ((0, 0),)
        raise inst.error(f"{inst.opcode} between replicas needs the frontend attribute {PAIRS_ATTRIBUTE}="
                         f"\"{{{{source,target}},...}}\" to know its peers ({num_replicas} replicas)")
    inner = str(text).strip()
    pairs = _PAIR_RE.findall(inner)
    leftover = _PAIR_RE.sub("", inner).replace(",", "").replace("{", "").replace("}", "").strip()
    if leftover:
        raise inst.error(f"cannot parse {PAIRS_ATTRIBUTE}={text!r}: expected \"{{{{0,1}},{{1,2}}}}\"")
    return parse_pairs(inst, pairs, num_replicas, PAIRS_ATTRIBUTE)


def context_dtype(shape: Shape, index: int) -> np.dtype:
    if shape.is_tuple and len(shape.tuple_shapes) > index and shape.tuple_shapes[index].is_array:
        return shape.tuple_shapes[index].dtype
    return np.dtype(np.uint32)


def _frozen_zeros(shape: Shape) -> Any:
    if shape.is_tuple:
        return tuple(_frozen_zeros(s) for s in shape.tuple_shapes)
    if shape.is_token:
        return TOKEN
    arr = np.zeros(shape.dimensions, dtype=shape.dtype)
    arr.setflags(write=False)
    return arr


def _record(fabric: Fabric, kind: str, inst: Instruction, **info: Any) -> None:
    recorder = fabric.recorder
    if recorder is not None:
        recorder.end(recorder.begin(kind, inst.name, inst.opcode, **info))


class _Span:
    """Record a step as an event that begins before it and ends after it (a blocking wait, or a
    message posted: a peer's reply can then never seem to end before the post began), when the
    fabric has a recorder."""

    __slots__ = ("recorder", "event")

    def __init__(self, fabric: Fabric, kind: str, inst: Instruction, **info: Any) -> None:
        self.recorder = fabric.recorder
        self.event = self.recorder.begin(kind, inst.name, inst.opcode, **info) if self.recorder is not None else None

    def done(self, **info: Any) -> None:
        if self.event is not None:
            self.recorder.end(self.event, **info)


# -- send / send-done ------------------------------------------------------------------------------

_new = object.__new__


def _event(kind: str, inst: Instruction, replica: int, **info: Any) -> dict[str, Any]:
    """A kernel's flight-recorder event, for `recorder.begin_collective(template, seq)` (a copy of a
    dict and two stores, where `begin` builds the event from keywords; the fields in `begin`'s order)."""
    return {"kind": kind, "instruction": inst.name, "opcode": inst.opcode, "replica": replica, "start_us": None,
            "end_us": None, **info}


def _block(kind: str, inst: Instruction, computation: str, **fields: Any) -> dict[str, Any]:
    """A kernel's `BlockInfo` fields, copied per call into a bare instance (as collectives do)."""
    return BlockInfo(kind, inst.name, inst.opcode, computation=computation, **fields).__dict__.copy()


@kernel("send")
def make_send(inst: Instruction, ctx: KernelContext) -> Callable[..., Any]:
    channel = channel_id(inst)
    fabric = ctx.fabric
    ctx_dtype = context_dtype(inst.shape, 1)
    if inst.attrs.get("is_host_transfer"):
        def send_to_host(data: Any, *token: Any) -> Any:
            _record(fabric, "send", inst, channel_id=channel, peer="host")
            fabric.to_host(channel, data)
            return (data, np.asarray(0, dtype=ctx_dtype), TOKEN)

        return send_to_host
    me = ctx.replica_id
    targets = [t for s, t in routing(inst, ctx) if s == me]
    state = channel_state(fabric)
    context_counter = ("send-context", channel)
    counters = [(t, ("chan-send", channel, t)) for t in targets]  # made once: a Send runs every iteration
    name, opcode = inst.name, inst.opcode
    if len(targets) == 1:  # most Sends: no lists per call
        (target, counter), = counters
        template = _event("send", inst, me, channel_id=channel, peers=None, seq=None)

        def send_one(data: Any, *token: Any) -> Any:
            f = fabric.current if type(fabric) is FabricSlot else fabric  # one forwarding read, not one per use
            seq = f.next_seq(counter)
            recorder = f.recorder
            if recorder is None:
                f.send(target, (keys.CHANNEL, channel, seq), data)
            else:
                event = recorder.begin_collective(template, seq)
                event["peers"] = [target]
                f.send(target, (keys.CHANNEL, channel, seq), data)
                recorder.ended(event)
            k = f.next_seq(context_counter)  # (after the post: the peer may be waiting for it)
            state[("send", channel, k)] = (target, seq)
            return (data, np.array(k, ctx_dtype), TOKEN)

        return send_one

    if not targets:  # a replica that is no source: only the context's number
        def send_none(data: Any, *token: Any) -> Any:
            f = fabric.current if type(fabric) is FabricSlot else fabric
            return (data, np.array(f.next_seq(context_counter), ctx_dtype), TOKEN)

        return send_none

    def send(data: Any, *token: Any) -> Any:
        f = fabric.current if type(fabric) is FabricSlot else fabric
        k = f.next_seq(context_counter)
        if counters:
            recorder = f.recorder
            event = recorder.begin("send", name, opcode, channel_id=channel) if recorder is not None else None
            posted = []
            for t, counter in counters:
                seq = f.next_seq(counter)
                f.send(t, keys.channel(channel, seq), data)
                posted.append((t, seq))
            state[("send", channel, k)] = posted
            if event is not None:
                recorder.end(event, peers=[t for t, _ in posted], seq=posted[0][1])
        return (data, np.array(k, ctx_dtype), TOKEN)

    return send


@kernel("send-done")
def make_send_done(inst: Instruction, ctx: KernelContext) -> Callable[..., Any]:
    channel = channel_id(inst)
    if inst.attrs.get("is_host_transfer"):
        return lambda started: TOKEN
    fabric = ctx.fabric
    state = channel_state(fabric)
    name, opcode = inst.name, inst.opcode
    computation = computation_of(ctx, inst)
    template = _event("send-done", inst, ctx.replica_id, channel_id=channel, seq=None)
    fields = _block("send-done", inst, computation, needs="one", channel_id=channel)

    def send_done(started: Any) -> Any:
        posted = state.pop(("send", channel, int(started[1])), None)
        if type(posted) is tuple:  # one target (see `make_send`): most Sends
            target, seq = posted
            f = fabric.current if type(fabric) is FabricSlot else fabric
            block = _new(BlockInfo)
            block.__dict__ = fields.copy()
            block.waits_for, block.seq = (target,), seq
            recorder = f.recorder
            if recorder is None:
                f.recv(target, (keys.CHANNEL_ACK, channel, seq), block)
            else:
                event = recorder.begin_collective(template, seq)
                f.recv(target, (keys.CHANNEL_ACK, channel, seq), block)
                recorder.ended(event)
        elif posted:
            f = fabric.current if type(fabric) is FabricSlot else fabric
            seq = posted[0][1]
            block = BlockInfo("send-done", name, opcode, tuple(t for t, _ in posted), needs="one", seq=seq,
                              channel_id=channel, computation=computation)
            recorder = f.recorder
            event = (recorder.begin("send-done", name, opcode, channel_id=channel, seq=seq)
                     if recorder is not None else None)
            f.recv_all([(t, keys.channel_ack(channel, s)) for t, s in posted], block)
            if event is not None:
                recorder.end(event)
        return TOKEN

    return send_done


# -- recv / recv-done ------------------------------------------------------------------------------

def _recv_data_shape(inst: Instruction) -> Shape:
    return inst.shape.tuple_shapes[0]  # the verifier checked: (data, u32[], token[])


@kernel("recv")
def make_recv(inst: Instruction, ctx: KernelContext) -> Callable[..., Any]:
    channel = channel_id(inst)
    fabric = ctx.fabric
    data_shape = _recv_data_shape(inst)
    zeros = _frozen_zeros(data_shape)
    ctx_dtype = context_dtype(inst.shape, 1)
    if inst.attrs.get("is_host_transfer"):
        reject_nested_tuple(inst, data_shape)
        return lambda *token: (zeros, np.asarray(0, dtype=ctx_dtype), TOKEN)
    me = ctx.replica_id
    sources = [s for s, t in routing(inst, ctx) if t == me]
    source = sources[0] if sources else None
    state = channel_state(fabric)

    context_counter = ("recv-context", channel)
    counter = ("chan-recv", channel, source)
    template = _event("recv", inst, me, channel_id=channel, peer=source, seq=None)

    if source is None:  # a replica that is no target: only the context's number
        def recv_none(*token: Any) -> Any:
            f = fabric.current if type(fabric) is FabricSlot else fabric
            return (zeros, np.array(f.next_seq(context_counter), ctx_dtype), TOKEN)

        return recv_none

    def recv(*token: Any) -> Any:
        f = fabric.current if type(fabric) is FabricSlot else fabric
        k = f.next_seq(context_counter)
        seq = f.next_seq(counter)
        recorder = f.recorder
        if recorder is None:
            f.send(source, (keys.CHANNEL_ACK, channel, seq), True)
        else:
            event = recorder.begin_collective(template, seq)
            f.send(source, (keys.CHANNEL_ACK, channel, seq), True)
            recorder.ended(event)
        state[("recv", channel, k)] = (source, seq)
        return (zeros, np.array(k, ctx_dtype), TOKEN)

    return recv


@kernel("recv-done")
def make_recv_done(inst: Instruction, ctx: KernelContext) -> Callable[..., Any]:
    channel = channel_id(inst)
    fabric = ctx.fabric
    data_shape = _recv_data_shape(inst)
    name, opcode = inst.name, inst.opcode
    computation = computation_of(ctx, inst)
    if inst.attrs.get("is_host_transfer"):
        reject_nested_tuple(inst, data_shape)
        check = host_value_checker(inst, ctx.replica_id, data_shape, f"host transfer on channel {channel}")

        def recv_done_from_host(started: Any) -> Any:
            block = BlockInfo("recv-done", name, opcode, needs="one", channel_id=channel, computation=computation)
            wait = _Span(fabric, "recv-done", inst, channel_id=channel, peer="host")
            value = fabric.from_host(channel, block)
            wait.done()
            return (check(value), TOKEN)

        return recv_done_from_host
    state = channel_state(fabric)
    check = _received_checker(inst, ctx.replica_id, data_shape)
    # Read-only, made once: a fresh buffer per call costs a replica that is no target a real share
    # of a small ping-pong's time (and fresh pages of the whole buffer per call when it is large).
    zeros = _frozen_zeros(data_shape)
    template = _event("recv-done", inst, ctx.replica_id, channel_id=channel, peer=None, seq=None)
    fields = _block("recv-done", inst, computation, needs="one", channel_id=channel)

    def recv_done(started: Any) -> Any:
        pending = state.pop(("recv", channel, int(started[1])), None)
        if pending is None:  # this replica is no target of the channel
            return (zeros, TOKEN)
        f = fabric.current if type(fabric) is FabricSlot else fabric
        source, seq = pending
        block = _new(BlockInfo)
        block.__dict__ = fields.copy()
        block.waits_for, block.seq = (source,), seq
        recorder = f.recorder
        if recorder is None:
            data = f.recv(source, (keys.CHANNEL, channel, seq), block)
        else:
            event = recorder.begin_collective(template, seq)
            event["peer"] = source
            data = f.recv(source, (keys.CHANNEL, channel, seq), block)
            recorder.ended(event)
        check(data, source)
        return (data, TOKEN)

    return recv_done


def _received_checker(inst: Instruction, replica: int, shape: Shape) -> Callable[[Any, int], None]:
    """The data a peer sent must have the shape this RecvDone promises."""
    if not shape.is_array:
        def check_any(data: Any, source: int) -> None:
            try:
                ok = Shape.of(data).compatible(shape)
            except (ProgramError, TypeError, ValueError):
                ok = False
            if not ok:
                raise inst.error(f"replica {replica} expects {shape} on channel {channel_id(inst)} "
                                 f"but replica {source} sent {type(data).__name__}")

        return check_any
    dims, dtype = shape.dimensions, shape.dtype

    def check(data: Any, source: int) -> None:
        if not isinstance(data, np.ndarray) or data.shape != dims or data.dtype != dtype:
            got = f"{data.dtype}{list(data.shape)}" if isinstance(data, np.ndarray) else type(data).__name__
            raise inst.error(f"replica {replica} expects {shape} on channel {channel_id(inst)} "
                             f"but replica {source} sent {got}")

    return check
