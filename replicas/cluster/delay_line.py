"""A link delay where the kernel has no netem: every packet arriving at a simulated host over its link
is queued by the kernel (iptables' NFQUEUE target, in the host's own network namespace) and this
process, run in that namespace, lets each one through once it has waited `delay` seconds.

Only the packets' metadata reaches this process (NFQNL_COPY_META: an id, never the bytes), and the
kernel queues a segmentation-offloaded packet whole (NFQA_CFG_F_GSO: up to 64 KiB a packet over the
simulated links), so a link of a gigabit is a few thousand verdicts a second. The delay is the same
for every packet, so the queue is a FIFO, and one batch verdict lets through every packet up to the
newest that is due (in the kernel's queue order: nothing is reordered). A packet's wait starts when
this process reads it, never before it was queued: a packet is held at least `delay` (later if the
machine is busy), which is the bound the link promises.

Stdlib only and run as a script (`python delay_line.py QUEUE SECONDS`), so it starts without
importing the package. It prints `ready` once bound to its queue; it ends on SIGTERM or SIGKILL, and
then the kernel drops what it held and every later packet (no listener, no bypass): a link whose delay
line is gone carries nothing, it never carries packets undelayed."""

from __future__ import annotations

import collections
import os
import select
import signal
import socket
import struct
import sys
import time

NETLINK_NETFILTER = 12
SOL_NETLINK = 270
NETLINK_NO_ENOBUFS = 5
NFNL_SUBSYS_QUEUE = 3
MSG_PACKET, MSG_CONFIG, MSG_VERDICT_BATCH = 0, 2, 3
NLMSG_ERROR = 2
NLM_F_REQUEST, NLM_F_ACK = 1, 4
CFG_CMD, CFG_PARAMS, CFG_QUEUE_MAXLEN, CFG_MASK, CFG_FLAGS = 1, 2, 3, 4, 5
CMD_BIND = 1
COPY_META = 1
F_GSO = 4
PACKET_HDR, VERDICT_HDR = 1, 2
NF_ACCEPT = 1
QUEUE_PACKETS = 1 << 15  # more than a gigabit link holds in flight over any delay worth simulating
RECEIVE_BYTES = 8 << 20
READS_PER_PASS = 64  # then what is due goes out: a busy link never starves the verdicts


def attribute(kind: int, payload: bytes) -> bytes:
    size = 4 + len(payload)
    return struct.pack("=HH", size, kind) + payload + b"\0" * (-size % 4)


def message(kind: int, queue: int, attributes: bytes, flags: int = NLM_F_REQUEST, sequence: int = 0) -> bytes:
    body = struct.pack("=BBH", socket.AF_UNSPEC, 0, socket.htons(queue)) + attributes
    return struct.pack("=IHHII", 16 + len(body), (NFNL_SUBSYS_QUEUE << 8) | kind, flags, sequence, 0) + body


def configure(sock: socket.socket, queue: int, attributes: bytes, sequence: int) -> None:
    """One configuration message, acknowledged or an OSError naming what the kernel refused."""
    sock.send(message(MSG_CONFIG, queue, attributes, NLM_F_REQUEST | NLM_F_ACK, sequence))
    reply = sock.recv(65536)
    _, kind, _, _, _ = struct.unpack_from("=IHHII", reply)
    if kind == NLMSG_ERROR:
        (error,) = struct.unpack_from("=i", reply, 16)
        if error:
            raise OSError(-error, f"NFQUEUE {queue}: configuration {sequence} refused: {os.strerror(-error)}")


def bind(queue: int) -> socket.socket:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    sock.setsockopt(socket.SOL_SOCKET, 33, RECEIVE_BYTES)  # SO_RCVBUFFORCE: root may pass rmem_max
    sock.setsockopt(SOL_NETLINK, NETLINK_NO_ENOBUFS, 1)  # a lost notice is let through by the next batch
    sock.bind((0, 0))
    configure(sock, queue, attribute(CFG_CMD, struct.pack("!BxH", CMD_BIND, socket.AF_INET)), 1)
    configure(sock, queue, attribute(CFG_PARAMS, struct.pack("!IBxxx", 0, COPY_META)), 2)
    configure(sock, queue, attribute(CFG_QUEUE_MAXLEN, struct.pack("!I", QUEUE_PACKETS)), 3)
    gso = struct.pack("!I", F_GSO)
    configure(sock, queue, attribute(CFG_MASK, gso) + attribute(CFG_FLAGS, gso), 4)
    return sock


def packet_ids(data: memoryview, size: int) -> list[int]:
    """The ids of the packets announced in one read (usually one message)."""
    ids = []
    at = 0
    while at + 16 <= size:
        length, kind = struct.unpack_from("=IH", data, at)
        if kind == (NFNL_SUBSYS_QUEUE << 8) | MSG_PACKET:
            end = at + length
            a = at + 20
            while a + 4 <= end:
                alen, akind = struct.unpack_from("=HH", data, a)
                if akind & 0x3FFF == PACKET_HDR:
                    ids.append(struct.unpack_from("!I", data, a + 4)[0])
                    break
                a += (alen + 3) & ~3
        at += (length + 3) & ~3
    return ids


def run(queue: int, delay: float) -> None:
    sock = bind(queue)
    verdict = struct.pack("!II", NF_ACCEPT, 0)
    pending: collections.deque[tuple[float, int]] = collections.deque()  # (due, packet id), oldest first
    buffer = bytearray(65536)
    view = memoryview(buffer)
    sock.setblocking(False)
    print("ready", flush=True)
    while True:
        wait = None if not pending else max(0.0, pending[0][0] - time.monotonic())
        if select.select([sock], [], [], wait)[0]:
            for _ in range(READS_PER_PASS):
                try:
                    size = sock.recv_into(buffer)
                except BlockingIOError:
                    break
                due = time.monotonic() + delay
                pending.extend((due, i) for i in packet_ids(view, size))
        now = time.monotonic()
        last = -1
        while pending and pending[0][0] <= now:
            last = pending.popleft()[1]
        if last >= 0:
            body = attribute(VERDICT_HDR, verdict[:4] + struct.pack("!I", last))
            sock.send(message(MSG_VERDICT_BATCH, queue, body))


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    run(int(sys.argv[1]), float(sys.argv[2]))


if __name__ == "__main__":
    main()
