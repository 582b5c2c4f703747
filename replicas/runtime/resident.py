"""Arrays that stay on the replicas: `Array` holds each replica's shard where it was computed (in
its thread, or in its Ray actor) and gathers the global array only when asked (`np.asarray`).

A shard's place in the global array is its *index* (a tuple of slices per replica, as JAX's
`Sharding.devices_indices_map` gives): replicas with equal indices hold equal copies (a
replicated output), and the gather reads one of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from replicas.errors import ProgramError


@dataclass(frozen=True, slots=True)
class Kept:
    """An argument that is output `output` of call `call` of the same persistent job, where its
    replica's shard already is."""

    call: int
    output: int

    def __reduce__(self) -> tuple[type, tuple[int, int]]:
        # Rebuilt by its constructor: a frozen dataclass's own pickle state goes through Python-level
        # setstate, several microseconds of every doorbell request.
        return Kept, (self.call, self.output)


@dataclass(frozen=True, slots=True)
class Resliced:
    """An argument that is output `output` of call `call` of the same persistent job placed
    otherwise: the actor, which holds every shard (`sources`: the distinct shards' replicas and
    places in the global array of `shape`), cuts this replica's `place` out of them."""

    call: int
    output: int
    shape: tuple[int, ...]
    sources: tuple[tuple[int, tuple[slice, ...]], ...]
    place: tuple[slice, ...]

    def __reduce__(self) -> tuple[type, tuple]:
        return Resliced, (self.call, self.output, self.shape, self.sources, self.place)

    def take(self, shards: dict[int, Any], assembled: dict[tuple[int, int], np.ndarray]) -> np.ndarray:
        """This replica's part, from the kept `shards` (replica -> shard) of the output; the
        global array is assembled once per call (`assembled`: by (call, output))."""
        key = (self.call, self.output)
        whole = assembled.get(key)
        if whole is None:
            first = np.asarray(shards[self.sources[0][0]])
            if first.shape == self.shape:  # a replicated output: any replica's copy is the whole
                whole = first
            else:
                whole = np.empty(self.shape, first.dtype)
                for replica, place in self.sources:
                    whole[place] = shards[replica]
            assembled[key] = whole
        return np.ascontiguousarray(whole[self.place])  # (a view when the part is contiguous)


class Home(Protocol):
    """Where the shards of resident arrays live (a persistent job: runtime/session.py)."""

    def fetch(self, key: Any, replicas: Sequence[int]) -> list[np.ndarray]: ...
    def forget(self, key: Any) -> None: ...


class Array:
    """A global array of `shape` and `dtype` whose shards stay on the replicas that computed them.

    Passed to the next call of the program that made it (or any program of the same job expecting
    the same shards) it moves nothing; `np.asarray(a)`, `float(a)` or `a.item()` gather it once.
    """

    __slots__ = ("shape", "dtype", "index", "home", "key", "sharding", "_shards", "_value", "_deleted",
                 "_gather", "__weakref__")
    __array_priority__ = 100

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype, index: Sequence[tuple[slice, ...]],
                 shards: Sequence[Any] | None = None, home: Home | None = None, key: Any = None,
                 sharding: Any = None, gather: tuple[int, ...] | None = None) -> None:
        """`gather`: `gather_replicas(index)`, when the caller has it (a call's outputs: once per program)."""
        self.shape = shape if type(shape) is tuple else tuple(shape)
        self.dtype = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
        self.index = index if type(index) is list else list(index)  # per replica: its shard's place
        self.home = home
        self.key = key  # the shards' name in `home` when they are not held here
        self.sharding = sharding  # the JAX sharding it has, when a JAX program made it
        self._shards = shards  # per replica, when they live in this process (threads)
        self._value: np.ndarray | None = None
        self._deleted = False
        self._gather = gather

    @classmethod
    def made(cls, shape: tuple[int, ...], dtype: np.dtype, index: list[tuple[slice, ...]], shards: list[Any] | None,
             home: Home, key: Any, sharding: Any, gather: tuple[int, ...]) -> Array:
        """A call's output, from parts of the right types (`__init__` without its conversions):
        its shards held in this process (threads; `key` None), or kept where `key` names them."""
        a = cls.__new__(cls)
        a.shape, a.dtype, a.index, a.home, a.key, a.sharding = shape, dtype, index, home, key, sharding
        a._shards, a._value, a._deleted, a._gather = shards, None, False, gather
        return a

    # -- what a numpy user expects ------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def num_replicas(self) -> int:
        return len(self.index)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        value = self._value
        if value is None:
            value = self.value()
        if dtype is not None and np.dtype(dtype) != value.dtype:
            return value.astype(dtype)
        return value.copy() if copy else value

    def __float__(self) -> float:
        return float(self.value())

    def __int__(self) -> int:
        return int(self.value())

    def __bool__(self) -> bool:
        return bool(self.value())

    def item(self) -> Any:
        return self.value().item()

    def __getitem__(self, index: Any) -> Any:
        return self.value()[index]

    def block_until_ready(self) -> Array:
        """Itself, as JAX's: the call that made it had finished when it returned (loops written for
        JAX's asynchronous dispatch wait on it)."""
        self.check_alive()
        return self

    def __repr__(self) -> str:
        if self._deleted:
            return f"rp.Array(<deleted>, shape={self.shape}, dtype={self.dtype})"
        return f"rp.Array({np.array2string(self.value(), threshold=20)}, dtype={self.dtype})"

    # -- shards -------------------------------------------------------------------------------------
    def is_deleted(self) -> bool:
        return self._deleted

    def delete(self) -> None:
        """Free the shards on the replicas (a donated argument is deleted by its call)."""
        if not self._deleted:
            self._deleted = True
            self._shards = self._value = None
            if self.key is not None and self.home is not None:
                self.home.forget(self.key)

    def check_alive(self, what: str = "the array") -> None:
        if self._deleted:
            raise ProgramError(f"{what} has been deleted (donated to an earlier call, or deleted): "
                               "it can no longer be read or passed")

    def shards(self, replicas: Sequence[int] | None = None) -> list[Any]:
        """The shards of `replicas` (default all), fetched from where they live when needed."""
        self.check_alive()
        wanted = range(self.num_replicas) if replicas is None else replicas
        if self._shards is not None:
            return [self._shards[r] for r in wanted]
        return self.home.fetch(self.key, list(wanted))

    def local_shards(self) -> list[Any] | None:
        """The shards when they live in this process (threads), else None; no copy."""
        self.check_alive()
        return self._shards

    def value(self) -> np.ndarray:
        """The global array (gathered once, then kept: read-only)."""
        out = self._value
        if out is not None:  # (deleting clears it)
            return out
        self.check_alive()
        replicas = self._gather
        if replicas is None:
            replicas = self._gather = gather_replicas(self.index)
        held = self._shards
        # (shards fetched, or that came back with the call's reply, are this array's own: no copy of
        # them; shards held here without a key are the replicas' own, in this process)
        shards = [held[r] for r in replicas] if held is not None else self.home.fetch(self.key, list(replicas))
        first = shards[0]
        if len(replicas) == 1 and type(first) is np.ndarray and first.shape == self.shape:
            if first.dtype != self.dtype:
                out = first.astype(self.dtype)
            else:
                out = first.copy() if held is not None and self.key is None else first
        elif len(replicas) == 1 and np.shape(first) == self.shape:
            out = np.array(first, dtype=self.dtype)
        else:
            out = np.empty(self.shape, self.dtype)
            for r, shard in zip(replicas, shards):
                out[self.index[r]] = shard
        out.setflags(write=False)
        self._value = out
        return out

    def __del__(self) -> None:
        try:
            if not self._deleted and self.key is not None and self.home is not None:
                self.home.forget(self.key)
        except Exception:  # noqa: BLE001 - interpreter shutdown: nothing to free any more
            pass


def holders(index: Sequence[tuple[slice, ...]]) -> tuple[int, ...]:
    """For each replica, the first replica whose shard has the same place (an equal copy)."""
    first: dict[tuple, int] = {}
    return tuple(first.setdefault(_key(place), r) for r, place in enumerate(index))


def gather_replicas(index: Sequence[tuple[slice, ...]]) -> tuple[int, ...]:
    """The replicas a gather reads: the first of those holding each distinct shard."""
    return tuple(dict.fromkeys(holders(index)))


def _key(index: tuple[slice, ...]) -> tuple:
    return tuple((s.start, s.stop, s.step) if isinstance(s, slice) else s for s in index)


def same_index(a: Sequence[tuple[slice, ...]], b: Sequence[tuple[slice, ...]]) -> bool:
    return len(a) == len(b) and all(_key(x) == _key(y) for x, y in zip(a, b))
