"""Tables from names to what decorators register under them (shape rules, kernel factories,
built-in custom-call targets): each name once, a second registration is a bug in the package."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def registrar(table: dict[str, T], what: str) -> Callable[..., Callable[[T], T]]:
    """`registrar(TABLE, "kernel")(*names)` is a decorator entering its argument under every name."""

    def names(*keys: str) -> Callable[[T], T]:
        def register(entry: T) -> T:
            for key in keys:
                if key in table:
                    raise RuntimeError(f"{what} for {key!r} registered twice")
                table[key] = entry
            return entry

        return register

    return names
