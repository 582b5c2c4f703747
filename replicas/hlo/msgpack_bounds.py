"""Reading untrusted msgpack (a `.msgpack` program, a serialized value) within bounds.

Every length the unpacker accepts is bounded by the size of the input, nesting by `MAX_DEPTH`, the
input's size by `MAX_BYTES` and by what decoding it may cost (`DECODE_EXPANSION` times its size
against `replicas.limits`' byte ceiling); msgpack's complaints become `ProgramError`. A module's
map is read along its layout (`ModuleReader`), charging every decoded object to a budget, so a
hostile file is refused before it is decoded into many times its size. `serialize` builds the IR
from what these give.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import msgpack

from replicas import limits
from replicas.errors import ProgramError

MAX_DEPTH = 64  # nesting of containers, tuple shapes and ext payloads together
MAX_BYTES = 1 << 31  # largest input accepted
# Decoding holds at most about this many bytes of Python objects per input byte: the worst is a
# run of empty maps (one byte each, a 64-byte dict and an 8-byte slot each); an input whose worst
# case is over the per-value ceiling (replicas.limits, max_bytes) is refused before decoding.
DECODE_EXPANSION = 80


def too_deep(what: str) -> ProgramError:
    return ProgramError(f"{what} nests deeper than {MAX_DEPTH} levels")


def unpack_bounded(data: bytes | bytearray | memoryview, what: str) -> Any:
    """One msgpack object from exactly `data`; every declared length is bounded by len(data)."""
    return read_bounded(data, what, lambda unpacker: unpacker.unpack())


def read_bounded(data: bytes | bytearray | memoryview, what: str, read: Callable[[msgpack.Unpacker], Any]) -> Any:
    """`read(unpacker)` over exactly `data` (see `unpack_bounded`), msgpack's complaints as ProgramError."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ProgramError(f"expected bytes for the {what}, got {type(data).__name__}")
    size = len(data)
    if size > MAX_BYTES:
        raise ProgramError(f"{what} data of {size} bytes exceeds the limit of {MAX_BYTES}")
    ceiling = limits.current().max_bytes
    if size * DECODE_EXPANSION > ceiling:
        raise ProgramError(f"{what} data of {limits.format_bytes(size)} may take up to "
                           f"{limits.format_bytes(size * DECODE_EXPANSION)} to decode, more than the ceiling of "
                           f"{limits.format_bytes(ceiling)} (replicas.limits.configure(max_bytes=...) or "
                           "REPLICAS_MAX_BYTES)")
    unpacker = _unpacker(size)
    try:
        unpacker.feed(data)
        obj = read(unpacker)
        consumed = unpacker.tell()
    except ProgramError:
        raise
    except msgpack.OutOfData:
        raise ProgramError(f"damaged {what}: the data is truncated") from None
    except msgpack.exceptions.StackError:
        raise ProgramError(f"damaged {what}: containers nest too deeply") from None
    except Exception as e:  # anything msgpack says about hostile bytes (lengths, nesting, utf-8, types)
        raise ProgramError(f"damaged {what}: {type(e).__name__}: {e}") from None
    if consumed != size:
        raise ProgramError(f"damaged {what}: {size - consumed} bytes of extra data after the end")
    return obj


def _options(limit: int) -> dict[str, Any]:
    """msgpack's options for an input of `limit` bytes: no declared length over it."""
    return dict(raw=False, use_list=True, strict_map_key=True, max_str_len=limit, max_bin_len=limit,
                max_array_len=limit, max_map_len=limit, max_ext_len=limit)


def _unpacker(size: int) -> msgpack.Unpacker:
    """An unpacker that accepts no length over `size` (the input's)."""
    limit = max(size, 1)
    return msgpack.Unpacker(None, max_buffer_size=limit, **_options(limit))


class ModuleReader:
    """The module's map read along its layout (module -> computations -> instructions), so that a
    field that must be a string, a bool, an int or null is never decoded when it holds a list or a
    map: those are skipped undecoded and stand in as an empty one (the checks in `serialize._decode_module`
    refuse them as they would the whole value). A hostile file's nested lists in an instruction's
    `line` would otherwise be decoded into many times their size of Python lists first; skipping
    them costs next to nothing. An instruction of at most `WHOLE` bytes (all but hostile ones) is
    decoded whole after a skip that finds its end (reading every instruction field by field made
    loading a large program noticeably slower).

    Every decoded value is charged its Python size against a budget of `BUDGET_PER_BYTE` times the
    input plus `BUDGET_FLOOR`: a run of one-byte empty lists is 64 bytes of Python per input byte,
    so without the budget a file of them holds ~80 times its size. A program of many small
    instructions decodes to ~12 times its size (its IR to ~11), so the budget is above that."""

    WHOLE = 4096  # bytes: such an instruction decodes to at most DECODE_EXPANSION times as many
    BUDGET_PER_BYTE = 16
    BUDGET_FLOOR = 64 << 20

    def __init__(self, unpacker: msgpack.Unpacker, data: memoryview, budget: list[int] | None = None) -> None:
        self.unpacker, self.data, self.limit = unpacker, data, max(len(data), 1)
        self.options = _options(self.limit)  # for each instruction decoded whole
        # Bytes of Python objects still allowed, shared with the readers of parts of the input.
        self.budget = [self.BUDGET_PER_BYTE * len(data) + self.BUDGET_FLOOR] if budget is None else budget

    def module(self) -> Any:
        try:
            def computation() -> Any:
                return self._map(("name", "root", "is_fusion"), "instructions", lambda: self._items(self._instruction))

            return self._map(("name", "entry"), "computations", lambda: self._items(computation))
        except IndexError:  # a peek past the end
            raise msgpack.OutOfData from None

    def _instruction(self) -> Any:
        unpacker = self.unpacker
        start = unpacker.tell()
        unpacker.skip()  # checks the structure and finds the end, decoding nothing
        data = self.data[start:unpacker.tell()]
        if len(data) <= self.WHOLE:
            return self._charged(msgpack.unpackb(data, **self.options))
        reader = ModuleReader(_unpacker_of(data, self.limit), data, self.budget)
        return reader._map(("name", "opcode", "line"), "operands", reader._names)

    def _map(self, scalars: tuple[str, ...], nested: str = "", item: Callable[[], Any] | None = None) -> Any:
        """A map whose `scalars` fields are read with `_scalar` and whose `nested` field is a list
        of `item()`; anything else (not a map, say) is read by `_value`, for `_decode_module` to judge."""
        unpacker, data = self.unpacker, self.data
        if _CONTAINER[data[unpacker.tell()]] != _MAP:
            return self._value()
        out = {}
        for _ in range(self._length(unpacker.read_map_header(), "map")):
            key = self._scalar()  # a container key is not decoded either
            if type(key) is not str and type(key) is not bytes:
                raise ValueError(f"{type(key).__name__} is not allowed for map key when strict_map_key=True")
            if key in scalars:
                out[key] = self._scalar()
            elif key == nested and item is not None and _CONTAINER[data[unpacker.tell()]] == _ARRAY:
                out[key] = item()
            else:
                out[key] = self._value()
        return out

    def _items(self, item: Callable[[], Any]) -> list[Any]:
        count = self._length(self.unpacker.read_array_header(), "array")
        self._charge(56 + 8 * count)
        return [item() for _ in range(count)]

    def _names(self) -> list[Any]:
        """A list that must hold strings: read up to its first non-string (the rest is skipped, and
        the list stands in as [that one] for `_decode_module` to refuse)."""
        unpacker = self.unpacker
        count = self._length(unpacker.read_array_header(), "array")
        self._charge(56 + 8 * count)
        names = []
        for k in range(count):
            name = self._scalar()
            if type(name) is not str:
                for _ in range(count - k - 1):
                    unpacker.skip()
                return [name]
            names.append(self._charged(name))
        return names

    def _value(self, depth: int = 0) -> Any:
        """One value of a large instruction (a shape, its attributes): a container of more than
        `WHOLE` bytes is read an element at a time, so each part is charged as it is decoded."""
        if depth > MAX_DEPTH:
            raise too_deep("a serialized value")
        unpacker, data = self.unpacker, self.data
        kind = _CONTAINER[data[unpacker.tell()]]
        if not kind:
            return self._charged(unpacker.unpack())
        start = unpacker.tell()
        unpacker.skip()
        part = data[start:unpacker.tell()]
        if len(part) <= self.WHOLE:
            return self._charged(msgpack.unpackb(part, **self.options))
        reader = ModuleReader(_unpacker_of(part, self.limit), part, self.budget)
        if kind == _ARRAY:
            count = reader._length(reader.unpacker.read_array_header(), "array")
            self._charge(56 + 8 * count)
            return [reader._value(depth + 1) for _ in range(count)]
        count = reader._length(reader.unpacker.read_map_header(), "map")
        self._charge(64 + 100 * count)
        out = {}
        for _ in range(count):
            key = reader._scalar()
            if type(key) is not str:
                raise ValueError(f"{type(key).__name__} is not allowed for map key when strict_map_key=True")
            out[key] = reader._value(depth + 1)
        return out

    def _charged(self, value: Any) -> Any:
        """`value`, its Python size charged against the budget (objects CPython shares, such as
        None, small integers and one-character strings, cost nothing)."""
        size = 0
        stack = [value]
        while stack:
            obj = stack.pop()
            kind = type(obj)
            if kind is list:
                stack.extend(obj)
            elif kind is dict:
                stack.extend(obj.values())
            elif obj is None or kind is bool or (kind is int and -5 <= obj <= 256) or (kind is str and len(obj) < 2):
                continue
            size += sys.getsizeof(obj)
        self._charge(size)
        return value

    def _charge(self, size: int) -> None:
        self.budget[0] -= size
        if self.budget[0] < 0:
            raise ProgramError(f"the module decodes to more than {self.BUDGET_PER_BYTE} times its "
                               f"{limits.format_bytes(len(self.data))} plus "
                               f"{limits.format_bytes(self.BUDGET_FLOOR)} of Python objects: refused as hostile")

    def _scalar(self) -> Any:
        kind = _CONTAINER[self.data[self.unpacker.tell()]]
        if kind:
            self.unpacker.skip()
            return {} if kind == _MAP else []
        return self.unpacker.unpack()

    def _length(self, count: int, kind: str) -> int:
        if count > self.limit:  # as msgpack's own limit on a decoded container
            raise ValueError(f"{count} exceeds max_{kind}_len({self.limit})")
        return count


def _unpacker_of(data: memoryview, limit: int) -> msgpack.Unpacker:
    """An unpacker over a part of the input, with the whole input's limits."""
    unpacker = _unpacker(limit)
    unpacker.feed(data)
    return unpacker


# msgpack's type byte -> _MAP (fixmap, map 16, map 32), _ARRAY (fixarray, array 16, array 32) or 0.
_MAP, _ARRAY = 1, 2
_CONTAINER = bytes(_MAP if 0x80 <= b <= 0x8F or b in (0xDE, 0xDF) else _ARRAY if 0x90 <= b <= 0x9F or b in (0xDC, 0xDD)
                   else 0 for b in range(256))
