"""One gRPC call by hand over HTTP/2 (cleartext, as Ray's GCS serves it), only to learn whether the
GCS wants a token: a GetClusterId without one is answered (no authentication) or refused with
UNAUTHENTICATED (status 16; token authentication). Without the `grpcio` package, which a plain
`pip install ray` lacks, and without Ray's own client, whose authentication mode is fixed per
process and which retries for minutes. Header blocks are read as far as HPACK literals go (what
gRPC sends for its status); anything else reads as "not known"."""

from __future__ import annotations

import socket
import struct
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
UNAUTHENTICATED = b"16"
MAX_FRAME = 1 << 20  # a GCS answer is tens of bytes; more is not a GCS


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def literal(name: str, value: str) -> bytes:
    """An HPACK literal header field without indexing, neither string Huffman-coded."""
    n, v = name.encode(), value.encode()
    return b"\x00" + bytes([len(n)]) + n + bytes([len(v)]) + v


def request(authority: str) -> bytes:
    fields = [(":method", "POST"), (":scheme", "http"), (":path", "/ray.rpc.NodeInfoGcsService/GetClusterId"),
              (":authority", authority), ("content-type", "application/grpc"), ("te", "trailers")]
    block = b"".join(literal(k, v) for k, v in fields)
    empty_message = b"\x00\x00\x00\x00\x00"  # not compressed, 0 bytes: an empty GetClusterIdRequest
    return (PREFACE + frame(SETTINGS, 0, 0) + frame(HEADERS, END_HEADERS, 1, block)
            + frame(DATA, END_STREAM, 1, empty_message))


def authentication(sock: socket.socket, authority: str, deadline: float) -> str | None:
    """"disabled" (the GCS answered), "token" (refused: UNAUTHENTICATED) or None (something else)."""
    sock.sendall(request(authority))
    buffer = bytearray()

    def read(n: int) -> bytes:
        while len(buffer) < n:
            sock.settimeout(max(0.05, deadline - time.monotonic()))
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("the connection closed before the answer")
            buffer.extend(chunk)
        out = bytes(buffer[:n])
        del buffer[:n]
        return out

    while True:
        head = read(9)
        length, kind, flags = int.from_bytes(head[:3], "big"), head[3], head[4]
        stream = int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
        if length > MAX_FRAME:
            return None
        payload = read(length)
        if kind == SETTINGS and not flags & ACK:
            sock.sendall(frame(SETTINGS, ACK, 0))
        elif kind == PING and not flags & ACK:
            sock.sendall(frame(PING, ACK, 0, payload))
        elif kind in (GOAWAY, RST_STREAM) and stream in (0, 1):
            return None
        elif stream == 1 and kind == DATA and length:
            return "disabled"
        elif stream == 1 and kind == HEADERS and flags & END_STREAM:
            status = header_fields(payload).get(b"grpc-status")
            return "token" if status == UNAUTHENTICATED else None


def header_fields(block: bytes) -> dict[bytes, bytes]:
    """The literal fields of an HPACK block whose name and value are not Huffman-coded (indexed
    fields, table updates and Huffman strings are skipped)."""
    fields: dict[bytes, bytes] = {}
    i = 0
    try:
        while i < len(block):
            b = block[i]
            if b & 0x80:  # indexed field
                _, i = integer(block, i, 7)
            elif b & 0xE0 == 0x20:  # dynamic table size update
                _, i = integer(block, i, 5)
            else:
                index, i = integer(block, i, 6 if b & 0x40 else 4)
                name, i = (None, i) if index else string(block, i)
                value, i = string(block, i)
                if name is not None and value is not None:
                    fields[name] = value
    except IndexError:
        pass
    return fields


def integer(block: bytes, i: int, bits: int) -> tuple[int, int]:
    mask = (1 << bits) - 1
    value, i = block[i] & mask, i + 1
    if value < mask:
        return value, i
    shift = 0
    while True:
        b, i = block[i], i + 1
        value += (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def string(block: bytes, i: int) -> tuple[bytes | None, int]:
    huffman = block[i] & 0x80
    length, i = integer(block, i, 7)
    raw = block[i:i + length]
    if len(raw) < length:
        raise IndexError
    return (None if huffman else raw), i + length
