"""The driver's doorbell to the actors of its node: a call of a persistent job without Ray.

A Ray actor call costs a round of scheduling, serialization and gRPC per actor (about a
millisecond each on a loaded machine); a persistent job (runtime/session.py) calls the same actors
thousands of times. The driver instead writes the call's request once into a shared-memory segment
of the job (`rpl-<token>-d`, mode 0600, removed with the job's other segments), bumps the request
word and wakes every actor of its node with one `FUTEX_WAKE`; each actor's call thread, waiting on
that word, reads the request (its replicas' part of it), runs the call and writes its reply into
its own slot, bumps its reply word and wakes the driver. The request holds every replica's host
arguments in one pickle: an array given to every replica is in it once, whichever number of
replicas and actors read it.

Layout: line 0 holds the request word (the driver's), a stop word, the release word and the hold
word (the actors' main threads park on the release word while the hold, a time, has passed:
runtime/ray/parking.py), the CPU the driver rang from and how long it took to ring after its
previous replies; line 1+i the reply word of actor i (its own), actor i's "asleep" flag for the
request word (its own), the driver's "asleep" flag for that reply word (the driver's) and how long
actor i took from the request to its reply; then, each from a page, the request and one reply slot
per actor, each a frame (its bytes, its pickle's, how many buffers), the buffers' sizes, the pickle
and the buffers (arrays kept outside the pickle). Each word but the release word has one writer,
and x86-64 keeps stores in order (transport/futex.py), so a reader that sees a word sees the bytes
written before it; the release word only has to move (anyone may bump it).

Both waits spin first when the driver and the node's actors of the job fit the cores
(transport/spin.py): the driver for the replies of a short call, an actor's call thread for the next
request after it replied (a loop calls again within tens of microseconds). A futex sleep and its
wake-up cost each side a scheduler round, about as much as a small program's whole run. Each side
spins while the other side's recent turns were short (`Spinner.observed`): the driver while the
actors' (request to reply) were, an actor while the driver's (replies to the next request) were, as
each side writes them in its line. A turn excludes the time its side slept before it began, so
neither side's choice feeds the other's: measured from the other side, a sleeper's wake-up would
count, and two sleepers would each find the other too slow to spin for. A side that sleeps says so
first in its flag, and the other wakes it only then (`futex.fence` between the word and the flag): a
`FUTEX_WAKE` is a system call of several microseconds on a virtual machine, paid for nothing while
the waiter still spins. The driver writes the CPU it rings from, and an actor woken by it moves off
that CPU (`tuning.affinity.move_off`): the scheduler queues a woken process beside its waker, and
two spinning processes sharing one core take turns on it while another core idles.
"""

from __future__ import annotations

import mmap
import os
import pickle
import struct
import time
from typing import Any

import numpy as np

from replicas.transport import futex, shm, spin
from replicas.transport.segment import Mapping
from replicas.tuning import affinity

_LINE = 64
_RELEASE, _HOLD = 2, 3  # words of line 0
_ACTOR_ASLEEP, _DRIVER_ASLEEP = 1, 2  # words of actor i's line, after its reply word
_DRIVER_CPU, _UNKNOWN_CPU = 6, 1 << 31  # word of line 0: the CPU the driver rang from (or unknown)
_TURN = 16  # byte offset in line 0 (the driver's turn) and in an actor's line (its turn): f64 seconds
_SECONDS = struct.Struct("<d")
REQUEST_BYTES = int(os.environ.get("REPLICAS_DOORBELL_REQUEST_BYTES", str(256 << 20)))  # virtual: sparse
# Per actor, virtual (sparse): a call's reply carries only small outputs (up to `REPLY_ROOM` bytes); a
# fetch's reply carries kept shards up to `REPLY_BYTES`, the driver allocating their room first
# (`make_room`: a page first touched when /dev/shm is full kills with SIGBUS) and giving back what
# is past `_KEEP` once read.
REPLY_BYTES = int(os.environ.get("REPLICAS_DOORBELL_REPLY_BYTES", str(64 << 20))) // mmap.PAGESIZE * mmap.PAGESIZE
REPLY_ROOM = 1 << 20
CALL_ROOM = REPLY_ROOM - 24  # bytes of a call's reply (after its frame)
_KEEP = 16 << 20  # bytes of a request or reply slot whose pages stay allocated once read
_LENGTH = struct.Struct("<Q")
_FRAME = struct.Struct("<QQQ")  # a request's or reply's bytes (after the frame), its pickle's, its buffers
_OUT_OF_BAND_MIN = 1 << 16  # bytes of an array a request or a fetch's reply carries outside its pickle
SLICE = 0.25  # seconds of one futex wait: stops and the driver's Ctrl-C are noticed within it


def available() -> bool:
    return futex.available() and shm.available()


_RAW_MAX = 1 << 16  # bytes of an array packed raw; larger ones keep numpy's pickle (no extra copy)


_RAW_DTYPES: dict[np.dtype, str] = {}  # numpy's builtin dtypes (a few dozen) seen so far -> their `str`


def _raw_name(dtype: np.dtype) -> str | None:
    """`dtype.str` when arrays of `dtype` may be packed raw, else None."""
    if dtype.isbuiltin == 1 and not dtype.hasobject:
        name = _RAW_DTYPES[dtype] = dtype.str
        return name
    return None


def pack(values: list[Any]) -> list[Any]:
    """`values` (a call's arguments or outputs) for a request or reply: each small array as
    (dtype, shape, its bytes), pickled as plain bytes (numpy's own pickle of a small array costs a
    few microseconds each way, most of a small call's encoding); a tuple is escaped as (tuple,)."""
    out = []
    for v in values:
        t = type(v)
        if t is np.ndarray:
            dtype = v.dtype
            name = _RAW_DTYPES.get(dtype) or _raw_name(dtype)
            if name is not None and v.nbytes <= _RAW_MAX and v.flags.c_contiguous:
                v = (name, v.shape, pickle.PickleBuffer(v))
        elif t is tuple:
            v = (v,)
        out.append(v)
    return out


def unpack(values: list[Any]) -> list[Any]:
    """The values `pack` packed (arrays writable when they were: backed by the unpickled bytearray)."""
    out = []
    for v in values:
        if type(v) is tuple:
            v = np.ndarray(v[1], v[0], v[2]) if len(v) == 3 else v[0]
        out.append(v)
    return out


def _pages(n: int) -> int:
    """`n` rounded up to whole pages."""
    return -(-n // mmap.PAGESIZE) * mmap.PAGESIZE


def _pickled(value: Any, out_of_band: bool) -> tuple[bytes, list[memoryview], int]:
    """`value`'s pickle, the buffers of its large arrays kept apart when `out_of_band` (each then
    copied once, into the segment), and the bytes they take in a slot (after its size)."""
    large: list[memoryview] = []

    def apart(buffer: pickle.PickleBuffer) -> bool:
        raw = buffer.raw()
        if raw.nbytes < _OUT_OF_BAND_MIN:
            return True  # in the pickle: a small array costs less there
        large.append(raw)
        return False

    header = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL, buffer_callback=apart if out_of_band else None)
    if not large:
        return header, large, len(header)
    return header, large, _LENGTH.size * len(large) + len(header) + sum(b.nbytes for b in large)


def _always() -> bool:
    return True


def _now_ms() -> int:
    """This machine's monotonic clock in milliseconds, modulo 2**32 (every process of a node reads
    the same clock: the hold word compares the driver's time with an actor's)."""
    return int(time.monotonic() * 1000) & 0xFFFFFFFF


def _ahead(a: int, b: int) -> bool:
    """Whether u32 time `a` is after `b` (modulo 2**32)."""
    return 0 < ((a - b) & 0xFFFFFFFF) < 0x80000000


def segment_name(token: str) -> str:
    return f"{shm.PREFIX}{token}-d"


class Doorbell:
    """The segment of a job's doorbell, for `actors` actors (the driver creates it; actors map it)."""

    def __init__(self, token: str, actors: int, create: bool = False) -> None:
        self.actors = actors
        # (the request and the reply slots start on pages: those past `_KEEP` of a large one are given back)
        self._request_at = _pages(_LINE * (1 + actors))
        self._replies_at = _pages(self._request_at + _FRAME.size + REQUEST_BYTES)
        size = self._replies_at + actors * REPLY_BYTES
        self.map = Mapping(os.path.join(shm.SHM_DIR, segment_name(token)), size if create else 0)
        self.words = self.map.words
        self.base = self.map.address
        self._actor_flags = [(1 + i) * (_LINE // 4) + _ACTOR_ASLEEP for i in range(actors)]
        self._requested = 0  # bytes of request allocated (the largest since those past `_KEEP` were given back)
        self._seen_at = 0.0  # when this side saw the other's latest request or replies (0: never)
        self._room = [REPLY_ROOM] * actors  # bytes each reply slot may take (the driver's allocation)
        self.reply_max = REPLY_BYTES  # bytes a fetch's reply may take (less in a test of the actor calls)
        if create:
            self.words[_HOLD] = _now_ms()  # held until now: the actors may park

    # -- the driver's side --------------------------------------------------------------------------
    def ring(self, request: Any, out_of_band: bool = True) -> int | None:
        """Post `request` to every actor (pickled; `out_of_band`: the bytes of its large arrays
        apart, each copied once, into the segment); its number, or None if it does not fit (or
        /dev/shm has no room for it)."""
        at = self._request_at
        header, large, size = _pickled(request, out_of_band)
        if size > REQUEST_BYTES:
            return None
        if _FRAME.size + size > self._requested:
            if not self.map.reserve(at, _FRAME.size + size):
                return None
            self._requested = _FRAME.size + size
        self._put(at, header, large, size)
        mm = self.map.mm
        words = self.words
        seq = (int(words[0]) + 1) & 0xFFFFFFFF
        _SECONDS.pack_into(mm, _TURN, time.monotonic() - self._seen_at if self._seen_at else 1.0)
        words[0] = seq
        futex.fence()
        for flag in self._actor_flags:
            if words[flag]:  # an actor sleeps on the request word
                # (read by an actor only once woken; one woken otherwise, by its wait's end, may
                # read the previous call's: a hint, moving it off a core at worst)
                cpu = affinity.current_cpu()
                words[_DRIVER_CPU] = _UNKNOWN_CPU if cpu is None else cpu
                futex.wake(self.base)
                break
        return seq

    def replies(self, seq: int, actors: list[int], timeout: float,
                spinner: spin.Spinner = spin.NEVER) -> list[Any] | None:
        """Each of `actors`' reply (the value) to request `seq` once all replied within `timeout` s,
        else None (`spinner`: how long to watch a reply word before sleeping on it). `actors` are
        every actor of the doorbell: each reads the request, and the next may overwrite it."""
        deadline = None
        words = self.words
        for i in actors:
            word = (1 + i) * (_LINE // 4)
            if words[word] == seq:
                continue
            spinner.watch(self.map, word, lambda word=word: words[word] == seq)
            while words[word] != seq:
                now = time.monotonic()
                if deadline is None:
                    deadline = now + timeout
                left = deadline - now
                if left <= 0:
                    return None
                words[word + _DRIVER_ASLEEP] = 1
                futex.wait(self.base + word * 4, int(words[word]), min(left, SLICE))
                words[word + _DRIVER_ASLEEP] = 0
        self._seen_at = time.monotonic()
        mm = self.map.mm
        turn = 0.0
        for i in actors:
            turn = max(turn, _SECONDS.unpack_from(mm, (1 + i) * _LINE + _TURN)[0])
        spinner.observed(turn)
        if self._requested > _KEEP:  # (every actor has read the request: it replied)
            self._give_back(self._request_at, self._requested)
            self._requested = _KEEP
        return [self._read(i) for i in actors]

    def make_room(self, actor: int, nbytes: int) -> bool:
        """Allocate `nbytes` of reply in actor `actor`'s slot (before a fetch of that much); False
        when /dev/shm has no room for them or the slot cannot hold them."""
        size = _FRAME.size + nbytes
        if size > self.reply_max:
            return False
        if self._room[actor] < size:
            if not self.map.reserve(self._slot(actor), size):
                return False
            self._room[actor] = size
        return True

    def room(self, actor: int) -> int:
        """Bytes of payload actor `actor`'s next reply may have (what the driver allocated)."""
        return min(self._room[actor], self.reply_max) - _FRAME.size

    def stop(self) -> None:
        """Every actor's call thread ends (the job ends), and their main threads leave any park."""
        self.words[1] = 1
        self.words[0] = (int(self.words[0]) + 1) & 0xFFFFFFFF
        futex.wake(self.base)
        self.wake_main()

    def hold(self, seconds: float) -> None:
        """The actors' main threads run Ray's loop for the next `seconds` at least (the driver is
        about to make actor calls): any parked one leaves its park now."""
        words = self.words
        if words is None:  # closed meanwhile (the job ended in another thread): nothing parks any more
            return
        until = (_now_ms() + int(seconds * 1000)) & 0xFFFFFFFF
        if _ahead(until, int(words[_HOLD])):
            words[_HOLD] = until
        self.wake_main()

    def wake_main(self) -> None:
        words = self.words
        if words is not None:
            words[_RELEASE] = (int(words[_RELEASE]) + 1) & 0xFFFFFFFF
            futex.wake(self.base + _RELEASE * 4)

    # -- an actor's side ------------------------------------------------------------------------------
    def wait_request(self, last: int, timeout: float = SLICE, spinner: spin.Spinner = spin.NEVER,
                     actor: int = 0) -> int | None:
        """The request number once it differs from `last` (None after `timeout` s, or once stopped;
        `spinner`: how long to watch the request word before sleeping on it; `actor`: this actor's
        index, whose flag says it sleeps)."""
        if int(self.words[0]) == last and not spinner.watch(self.map, 0, _always):
            flag = (1 + actor) * (_LINE // 4) + _ACTOR_ASLEEP
            self.words[flag] = 1
            futex.wait(self.base, last, timeout)
            self.words[flag] = 0
            if int(self.words[0]) != last:  # woken by the driver: off its core (see `affinity.move_off`)
                affinity.move_off(int(self.words[_DRIVER_CPU]) if self.words[_DRIVER_CPU] < _UNKNOWN_CPU else -1)
        if self.words[1]:
            return None
        seq = int(self.words[0])
        if seq == last:
            return None
        self._seen_at = time.monotonic()
        spinner.observed(_SECONDS.unpack_from(self.map.mm, _TURN)[0])
        return seq

    def stopped(self) -> bool:
        return bool(self.words[1])

    def held(self) -> bool:
        """Whether the driver holds the actors' main threads awake (its hold has not passed)."""
        return _ahead(int(self.words[_HOLD]), _now_ms())

    def release_word(self) -> int:
        return int(self.words[_RELEASE])

    def wait_release(self, seen: int, timeout: float) -> None:
        """Sleep while the release word is `seen`, at most `timeout` s (a parked main thread)."""
        futex.wait(self.base + _RELEASE * 4, seen, timeout)

    def request_seq(self) -> int:
        return int(self.words[0])

    def request(self) -> Any:
        """The request just rung (its arrays are copies)."""
        return self._take(self._request_at)

    def reply(self, actor: int, seq: int, value: Any, room: int = CALL_ROOM, out_of_band: bool = False) -> int:
        """Write actor `actor`'s reply `value` to request `seq`, pickled (`out_of_band`: the bytes of
        its large arrays apart, each copied once, into the slot); 0, or (nothing written) the bytes
        it needs when that is over `room` (the driver's allocation: `room` of its request)."""
        header, large, size = _pickled(value, out_of_band)
        if size > room:
            return size
        mm, slot = self.map.mm, self._slot(actor)
        self._put(slot, header, large, size)
        word = (1 + actor) * (_LINE // 4)
        words = self.words
        _SECONDS.pack_into(mm, (1 + actor) * _LINE + _TURN, time.monotonic() - self._seen_at)
        words[word] = seq
        futex.fence()
        if words[word + _DRIVER_ASLEEP]:
            futex.wake(self.base + word * 4)
        return 0

    def _slot(self, actor: int) -> int:
        return self._replies_at + actor * REPLY_BYTES

    def _put(self, at: int, header: bytes, large: list[memoryview], size: int) -> None:
        """Write a pickled value (`_pickled`) at `at`: its frame, the sizes of its buffers, its
        pickle, its buffers."""
        mm = self.map.mm
        _FRAME.pack_into(mm, at, size, len(header), len(large))
        at += _FRAME.size
        if large:
            struct.pack_into(f"<{len(large)}Q", mm, at, *(b.nbytes for b in large))
            at += _LENGTH.size * len(large)
        mm[at:at + len(header)] = header
        at += len(header)
        for b in large:
            mm[at:at + b.nbytes] = b
            at += b.nbytes

    def _take(self, at: int) -> Any:
        """The value `_put` wrote at `at` (its arrays copied out of the segment)."""
        mm = self.map.mm
        _, header_bytes, count = _FRAME.unpack_from(mm, at)
        at += _FRAME.size
        if not count:
            return pickle.loads(mm[at:at + header_bytes])  # noqa: S301 - our own processes' bytes
        sizes = struct.unpack_from(f"<{count}Q", mm, at)
        at += _LENGTH.size * count
        view = self.map.view
        header = view[at:at + header_bytes]
        at += header_bytes
        buffers = []
        for n in sizes:
            buffers.append(bytearray(view[at:at + n]))
            at += n
        try:
            return pickle.loads(header, buffers=buffers)  # noqa: S301 - our own processes' bytes
        finally:
            header.release()

    def _give_back(self, at: int, size: int) -> None:
        """Return the pages of bytes [at + `_KEEP`, at + size) to /dev/shm (they were read)."""
        self.map.mm.madvise(mmap.MADV_REMOVE, at + _KEEP, size - _KEEP)
        self.map.forget_reserved(at, _KEEP)

    def _read(self, actor: int) -> Any:
        """Actor `actor`'s reply; the pages of a large one past `_KEEP` go back to /dev/shm."""
        value = self._take(self._slot(actor))
        if self._room[actor] > _KEEP:
            self._give_back(self._slot(actor), self._room[actor])
            self._room[actor] = _KEEP
        return value

    def close(self) -> None:
        self.words = None  # type: ignore[assignment]
        self.map.close()
