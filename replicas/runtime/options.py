"""`LaunchOptions`: every option of a job but its program, arguments and infeed, checked once.

`rp.run`, `rp.launch`, `rp.check`, the command line and `rp.jax.jit` build one; it travels
unchanged to the backend that starts the replicas.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from replicas.caching import Cache
from replicas.diagnostics.recorder import DEFAULT_CAPACITY
from replicas.errors import ProgramError
from replicas.runtime.arguments import check_launch_options, check_timeout

BACKENDS = ("ray", "threads")
DEFAULT_TIMEOUT = 60.0  # seconds of work before ExecutionTimeout (run, launch, check and jit alike)


@dataclass(frozen=True)
class LaunchOptions:
    """How a job runs (see `rp.launch` for each option)."""

    timeout: float | None = DEFAULT_TIMEOUT
    address: str | None = None
    trace: str | None = None
    strict: bool = True
    backend: str = "ray"
    replicas_per_actor: int | None = None
    resources: tuple[Mapping[str, float] | None, ...] | None = None
    record_every_instruction: bool = False
    trace_events: int = DEFAULT_CAPACITY
    progress: bool = False

    @staticmethod
    def of(**options: Any) -> LaunchOptions:
        """The options given by keyword (`rp.run`'s names); ProgramError for an unknown one."""
        try:  # (by value and type: `strict=1` is not `strict=True`, which `checked` tells apart)
            given: Any = (tuple(options.items()), tuple(map(type, options.values())))
            made = _MADE.get(given)
        except TypeError:  # an unhashable value (per-replica resource dicts): made every time
            given = made = None
        if made is not None:
            return made
        unknown = sorted(set(options) - set(LaunchOptions.__dataclass_fields__))
        if unknown:
            raise ProgramError(f"unknown option(s) {', '.join(unknown)}; the options are "
                               f"{', '.join(LaunchOptions.__dataclass_fields__)}")
        resources = options.get("resources")
        if resources is not None and not isinstance(resources, (str, bytes, Mapping)) and hasattr(resources, "__len__"):
            options["resources"] = tuple(resources)
        made = LaunchOptions(**options)
        return made if given is None else _MADE.put(given, made)

    def deadline(self, begun: float | None = None) -> float | None:
        """The `time.monotonic()` by which a job begun at `begun` (default: now) must have ended:
        every phase (argument checks, per-replica setup, start-up, the run, the results) counts
        against the one timeout. None: no timeout."""
        if self.timeout is None:
            return None
        check_timeout(self.timeout)  # before it is used: a bad one is named, not a float() error
        return (time.monotonic() if begun is None else begun) + float(self.timeout)

    def checked(self, num_replicas: Any, infeed: Sequence[Sequence[Any]] | None = None) -> int:
        """Check every option for a job of `num_replicas` (and its `infeed`); the replica count."""
        passed = _PASSED.get(self) if infeed is None else None
        if passed is not None and (type(num_replicas), num_replicas) in passed:
            return num_replicas
        n = check_launch_options(num_replicas=num_replicas, timeout=self.timeout, infeed=infeed, trace=self.trace,
                                 strict=self.strict, backend=self.backend,
                                 replicas_per_actor=self.replicas_per_actor, resources=self.resources,
                                 address=self.address)
        if self.backend not in BACKENDS:
            raise ProgramError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        events = self.trace_events
        if isinstance(events, bool) or not isinstance(events, (int, np.integer)) or events < 1:
            raise ProgramError(f"trace_events must be a whole number >= 1, got {events!r}")
        if infeed is not None and len(infeed) != n:
            raise ProgramError(f"infeed must have one list per replica ({n}), got {len(infeed)}")
        if self.resources is not None and len(self.resources) != n:
            raise ProgramError(f"resources must have one dict per replica ({n}), got {len(self.resources)}")
        if infeed is None and type(num_replicas) is int:
            (passed if passed is not None else _PASSED.put(self, set())).add((int, n))
        return n


# A warm `rp.run` gives the same options call after call: made once (`LaunchOptions.of`) and checked
# once per replica count (`checked`; they are frozen).
_MADE: Cache[LaunchOptions] = Cache("launch options", 64)
_PASSED: Cache[set[tuple[type, int]]] = Cache("checked launch options", 64, by_identity=True)
