"""One policy for the process-wide caches: bounded, least recently used out first, and one
`clear_all` for tests.

A cache keyed `by_identity` looks a key up by `id(key)` and keeps a reference to the key, so the id
cannot be reused by another object while the entry lives, and a hit is the very same object
(IR nodes, interned tuples and shapes are unhashable or costly to hash; they are compared by
identity). Other caches key by value.

Caches live as long as their process: a pooled Ray actor runs job after job, and each job brings
new placements, programs and instructions, so every cache has a bound. `get` is a dict lookup and
a move to the end of the order, cheap enough for a collective's per-call path; `put` evicts the
least recently used entries beyond the bound. Thread-safe: a lock guards every change of the
order (replica threads of one process share these caches).
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

V = TypeVar("V")

_ALL: weakref.WeakSet[Cache[Any]] = weakref.WeakSet()
_MISSING = object()


class Cache(Generic[V]):
    """A bounded LRU map from keys (by value, or `by_identity`) to values."""

    __slots__ = ("name", "size", "by_identity", "on_evict", "_data", "_lock", "__weakref__")

    def __init__(self, name: str, size: int, *, by_identity: bool = False,
                 on_evict: Callable[[V], None] | None = None) -> None:
        """`on_evict(value)` releases what an entry holds when it leaves (evicted or cleared),
        called outside the lock."""
        if size < 1:
            raise ValueError(f"cache {name}: size must be at least 1, got {size}")
        self.name = name
        self.size = size
        self.by_identity = by_identity
        self.on_evict = on_evict
        self._data: OrderedDict[Hashable, tuple[Any, V]] = OrderedDict()
        self._lock = threading.Lock()
        _ALL.add(self)

    def get(self, key: Any, default: Any = None) -> Any:
        """The value stored for `key` (the very same object, `by_identity`), else `default`."""
        k = id(key) if self.by_identity else key
        found = self._data.get(k)
        if found is None or (self.by_identity and found[0] is not key):
            return default
        try:
            self._data.move_to_end(k)
        except KeyError:  # evicted by another thread meanwhile: still a valid answer
            pass
        return found[1]

    def put(self, key: Any, value: V) -> V:
        """Store `value` for `key` and return it, evicting the least recently used beyond the bound."""
        k = id(key) if self.by_identity else key
        evicted = []
        with self._lock:
            self._data[k] = (key, value)
            self._data.move_to_end(k)
            while len(self._data) > self.size:
                evicted.append(self._data.popitem(last=False)[1][1])
        self._evicted(evicted)
        return value

    def pop(self, key: Any, default: Any = None) -> Any:
        """Take the value stored for `key` out of the cache (one taker wins), else `default`."""
        k = id(key) if self.by_identity else key
        with self._lock:
            found = self._data.get(k)
            if found is None or (self.by_identity and found[0] is not key):
                return default
            del self._data[k]
        return found[1]

    def get_or_make(self, key: Any, make: Callable[[], V]) -> V:
        """The value for `key`, made by `make()` and stored when absent (two threads may both make it;
        the last one stored wins, so `make` must give equal answers)."""
        value = self.get(key, _MISSING)
        if value is _MISSING:
            value = self.put(key, make())
        return value

    def values(self) -> list[V]:
        with self._lock:
            return [value for _, value in self._data.values()]

    def clear(self) -> None:
        with self._lock:
            evicted = [value for _, value in self._data.values()] if self.on_evict else []
            self._data.clear()
        self._evicted(evicted)

    def _evicted(self, values: list[V]) -> None:
        if self.on_evict is not None:
            for value in values:
                self.on_evict(value)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"Cache({self.name!r}, {len(self._data)}/{self.size}{', by identity' if self.by_identity else ''})"


def clear_all() -> None:
    """Empty every cache of the process (tests that must see a cold start)."""
    for cache in list(_ALL):
        cache.clear()


def caches() -> list[Cache[Any]]:
    """Every cache of the process (for tests and reports)."""
    return sorted(_ALL, key=lambda c: c.name)
