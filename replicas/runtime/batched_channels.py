"""Send and Recv between the members of a batched run (`runtime/batched.py`), in lock step.

The members run each instruction together, so a channel whose ends are all members needs no
message: a Send leaves its operand with the run, and the RecvDone of the same number on that
channel (the n-th Recv pairs with the n-th Send, as the replicas' own sequence numbers pair them)
gives each target its source's rows and every other member zeros, what each replica's own run
gives. SendDone needs the matching Recv to have run, RecvDone the matching Send: in lock step
they have when the program orders them so (a ping-pong does); when it does not, the run raises
`Divergent` and each member runs on its own, where a replica may wait for its peer.

Eligible channels: between replicas (not the host), array data of at most `MESSAGE_BYTES`, one
Send and one Recv instruction per channel id, routed by the same pairs, the Send's operand of the
Recv's shape, every pair touching a member with both ends among the members (`within`).

Each member's flight recorder shows the run's channel events as its own run would have recorded
them (`Events`, made only when read), so traces and reports read the same either way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any

import numpy as np

from replicas.channels.send_recv import channel_pairs, context_dtype
from replicas.diagnostics.recorder import clock_anchor
from replicas.hlo.ir import Instruction, Module
from replicas.runtime.stacks import CHANNEL_OPS, Divergent, Stack
from replicas.shapes import TOKEN

if TYPE_CHECKING:
    from replicas.runtime.batched import BatchedContext

# Larger messages run replica by replica: there a message is the sender's array itself (no copy),
# while lock step copies it into the stacked result and zeroes the other members' rows.
MESSAGE_BYTES = 16 << 10

def _routes(module: Module, num_replicas: int) -> dict[int, tuple[tuple[int, int], ...]] | None:
    """Channel id -> its (source, target) pairs when every channel op of `module` is eligible, else None."""
    found: dict[int, dict[str, Instruction]] = {}
    sent: dict[int, Any] = {}  # channel -> the shape of its Send's operand
    for comp in module.computations.values():
        for inst in comp.instructions:
            if inst.opcode not in ("send", "recv"):
                continue
            if inst.attrs.get("is_host_transfer") or inst.attrs.get("channel_id") is None:
                return None
            channel = int(inst.attrs["channel_id"])
            ends = found.setdefault(channel, {})
            if inst.opcode in ends:
                return None  # two Sends (or Recvs) share the channel: which pairs with which is the order's
            ends[inst.opcode] = inst
            if inst.opcode == "send":
                sent[channel] = comp.instruction(inst.operands[0]).shape
    routes = {}
    for channel, ends in found.items():
        send, recv = ends.get("send"), ends.get("recv")
        if send is None or recv is None:
            return None
        data = recv.shape.tuple_shapes[0]
        if not data.is_array or sent[channel] != data or data.numel * data.dtype.itemsize > MESSAGE_BYTES:
            return None
        try:
            pairs = channel_pairs(send, num_replicas)
            if channel_pairs(recv, num_replicas) != pairs:
                return None
        except Exception:  # noqa: BLE001 - a bad routing attribute: the replicas' own runs name it
            return None
        routes[channel] = pairs
    return routes


def has_channels(module: Module) -> bool:
    return any(inst.opcode in CHANNEL_OPS for comp in module.computations.values() for inst in comp.instructions)


def within(module: Module, members: Iterable[int], num_replicas: int) -> bool:
    """Whether every channel pair touching a member has both ends among `members`."""
    routes = _routes(module, num_replicas)
    inside = set(members)
    return routes is not None and all((s in inside) == (t in inside) for pairs in routes.values() for s, t in pairs)


def kernel(inst: Instruction, ctx: BatchedContext, stacks: list[Stack]) -> Callable[..., Any]:
    """The lock-step kernel of channel op `inst` (its run's state: `ctx.channels`)."""
    op = inst.opcode
    channel = int(inst.attrs["channel_id"])
    local = {m: k for k, m in enumerate(ctx.members)}
    pairs = channel_pairs(inst, ctx.num_replicas)
    index = len(ctx.channel_ops)
    ctx.channel_ops.append((inst, channel, pairs))
    log = ctx.channel_log.append
    clock = perf_counter_ns
    if op == "send":
        dtype = context_dtype(inst.shape, 1)
        stacked = bool(stacks[0])

        def send(data: Any, *token: Any) -> Any:
            start = clock()
            sent = _state(ctx, channel)[0]
            sent.append((data, stacked))
            log((index, start, clock(), len(sent) - 1))
            return (data, np.asarray(len(sent) - 1, dtype=dtype), TOKEN)

        return send
    if op == "recv":
        dtype = context_dtype(inst.shape, 1)
        zeros = np.zeros(inst.shape.tuple_shapes[0].dimensions, inst.shape.tuple_shapes[0].dtype)
        zeros.flags.writeable = False

        def recv(*token: Any) -> Any:
            start = clock()
            received = _state(ctx, channel)[1]
            received[0] += 1
            log((index, start, clock(), received[0] - 1))
            return (zeros, np.asarray(received[0] - 1, dtype=dtype), TOKEN)

        return recv
    if op == "send-done":
        def send_done(started: Any) -> Any:
            start = clock()
            k = int(started[1])
            counts = _state(ctx, channel)[1]
            if k >= counts[0]:
                raise Divergent  # its Recv comes later in the program: a replica would wait for it
            counts[2] += 1
            log((index, start, clock(), k))
            return TOKEN

        return send_done
    data = inst.shape.tuple_shapes[0]
    moves = [(local[s], local[t]) for s, t in pairs if t in local]
    size = ctx.size

    def recv_done(started: Any) -> Any:
        start = clock()
        sent, counts = _state(ctx, channel)
        k = int(started[1])
        if k >= len(sent):
            raise Divergent  # its Send comes later in the program: a replica would wait for it
        value, stacked = sent[k]
        out = np.zeros((size, *data.dimensions), data.dtype)
        fabrics = ctx.member_fabrics
        for s, t in moves:
            out[t] = value[s] if stacked else value
            if fabrics:
                fabrics[t].mailbox.state.progress += 1  # a message taken: the monitor sees the run advance
        counts[1] += 1
        log((index, start, clock(), k))
        return (out, TOKEN)

    return recv_done


def _state(ctx: BatchedContext, channel: int) -> tuple[list[tuple[Any, bool]], list[int]]:
    """The run's Sends on `channel` (operand, stacked) and how many Recvs, RecvDones and SendDones ran."""
    found = ctx.channels.get(channel)
    if found is None:
        found = ctx.channels[channel] = ([], [0, 0, 0])
    return found


def check_complete(ctx: BatchedContext) -> None:
    """At the end of a run: every Send received and every Recv done, or `Divergent` (alone, the
    members leave the messages nobody took, which `replicas check` reports)."""
    for sent, (recvs, recv_dones, send_dones) in ctx.channels.values():
        if not len(sent) == recvs == recv_dones == send_dones:
            raise Divergent


class Events:
    """A batched run's channel events as member `k`'s flight recorder shows them (made when read:
    `FlightRecorder.record_deferred`): the `log` of (index in `ops`, start ns, end ns, number on the
    channel), each op's event on the members its own run records it for (a Send and SendDone on
    the sources, a Recv and RecvDone on the targets)."""

    __slots__ = ("ops", "log", "anchor")

    def __init__(self, ops: list[tuple[Instruction, int, tuple[tuple[int, int], ...]]],
                 log: list[tuple[int, int, int, int]]) -> None:
        self.ops, self.log = ops, log
        self.anchor = clock_anchor()

    def counts(self, members: Sequence[int]) -> list[int]:
        """How many events each member gets."""
        per_op = [0] * len(self.ops)
        for entry in self.log:
            per_op[entry[0]] += 1
        out = []
        for m in members:
            out.append(sum(n for (inst, _, pairs), n in zip(self.ops, per_op)
                           if n and _peer(inst.opcode, pairs, m) is not None))
        return out

    def events(self, replica: int, _replica: int) -> list[dict[str, Any]]:
        t0, epoch_us = self.anchor
        out = []
        for index, start, end, k in self.log:
            inst, channel, pairs = self.ops[index]
            op = inst.opcode
            peer = _peer(op, pairs, replica)
            if peer is None:
                continue
            event: dict[str, Any] = {"kind": op, "instruction": inst.name, "opcode": op, "replica": replica,
                                     "start_us": epoch_us + (start - t0) / 1000,
                                     "end_us": epoch_us + (end - t0) / 1000, "channel_id": channel}
            if op == "send":
                event["peers"] = [peer]
            elif op in ("recv", "recv-done"):
                event["peer"] = peer
            event["seq"] = k
            out.append(event)
        return out


def _peer(op: str, pairs: tuple[tuple[int, int], ...], replica: int) -> int | None:
    """`replica`'s peer on a channel op of these pairs: its target for a Send or SendDone, its
    source for a Recv or RecvDone; None when its own run records no event for it."""
    if op in ("send", "send-done"):
        return next((t for s, t in pairs if s == replica), None)
    return next((s for s, t in pairs if t == replica), None)


def record(ctx: BatchedContext, fabrics: Sequence[Any]) -> None:
    """Put the run's channel events on its members' flight recorders."""
    log = list(ctx.channel_log)
    ctx.channel_log.clear()
    if not log:
        return
    events = Events(ctx.channel_ops, log)
    counts = events.counts(ctx.members)
    for fabric, replica, count in zip(fabrics, ctx.members, counts):
        if fabric.recorder is not None and count:
            fabric.recorder.record_deferred(events, replica, count)
