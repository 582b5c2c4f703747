"""`replicas check`: run every replica as a thread of this process and report what goes wrong."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from replicas.errors import ReplicasError
from replicas.hlo.ir import Module


def check(module: Module, args: Sequence[Any] | None = None, num_replicas: int = 2, *,
          timeout: float = 30, infeed: Sequence[Sequence[Any]] | None = None,
          strict: bool = True) -> ReplicasError | None:
    """Run `module` on `num_replicas` threads; None if it completes, else the error it raised
    (DeadlockError, CollectiveMismatchError, ProgramError, ReplicaFailure, ExecutionTimeout),
    with the same report `rp.run` gives."""
    from replicas.runtime.driver import run

    try:
        run(module, args, num_replicas, timeout=timeout, infeed=infeed, strict=strict, backend="threads")
    except ReplicasError as e:
        return e
    return None
