"""The public entry points: launch N replicas of a program, or run it to completion."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from replicas.errors import ProgramError
from replicas.hlo.ir import Module
from replicas.runtime.arguments import check_launch_options
from replicas.runtime.compile import Executable
from replicas.runtime.job import Job, prepare

BACKENDS = ("ray", "threads")


def launch(module: Module | Executable, args: Sequence[Any] | None = None, num_replicas: int = 4, *,
           timeout: float | None = 60, address: str | None = None,
           infeed: Sequence[Sequence[Any]] | None = None, trace: str | None = None, strict: bool = True,
           backend: str = "ray", replicas_per_actor: int | None = None,
           resources: Sequence[dict[str, float]] | None = None,
           record_every_instruction: bool = False) -> Job:
    """Start `num_replicas` replicas of `module` and return the Job without waiting.

    args: one list of values per replica, or one list given to every replica.
    infeed: values preloaded into each replica's infeed queue (one list per replica).
    backend: "ray" (actors; `address` joins a cluster) or "threads" (one process, no Ray).
    resources: per-replica Ray custom resources, to place replicas on chosen nodes.
    replicas_per_actor: how many replicas share one actor process. By default one each, until N
        exceeds twice the cluster's CPUs: then they are packed so about that many processes start
        (each costs ~2 s of CPU to start; 32 replicas on 2 cores start in ~4 s instead of ~32 s).
    """
    num_replicas = check_launch_options(num_replicas=num_replicas, timeout=timeout, infeed=infeed, trace=trace,
                                        strict=strict, backend=backend, replicas_per_actor=replicas_per_actor,
                                        resources=resources, address=address)
    if backend not in BACKENDS:
        raise ProgramError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if infeed is not None and len(infeed) != num_replicas:
        raise ProgramError(f"infeed must have one list per replica ({num_replicas}), got {len(infeed)}")
    if resources is not None and len(resources) != num_replicas:
        raise ProgramError(f"resources must have one dict per replica ({num_replicas}), got {len(resources)}")
    executable, per_replica = prepare(module, args, num_replicas)
    if backend == "threads":
        from replicas.runtime.threads import ThreadBackend

        engine: Any = ThreadBackend(executable, per_replica, strict=strict,
                                    record_every_instruction=record_every_instruction)
    else:
        from replicas.runtime.ray_backend import RayBackend

        engine = RayBackend(executable, per_replica, address=address, strict=strict,
                            record_every_instruction=record_every_instruction,
                            replicas_per_actor=replicas_per_actor or 0,
                            resources=list(resources) if resources is not None else None, timeout=timeout)
    job = Job(engine, executable, timeout=timeout, host_may_send=True, trace=trace)
    for r, values in enumerate(infeed or []):
        for v in values:
            job.infeed(r, v)
    return job


def run(module: Module | Executable, args: Sequence[Any] | None = None, num_replicas: int = 4, *,
        timeout: float | None = 60, address: str | None = None,
        infeed: Sequence[Sequence[Any]] | None = None, trace: str | None = None, strict: bool = True,
        backend: str = "ray", replicas_per_actor: int | None = None,
        resources: Sequence[dict[str, float]] | None = None) -> list[Any]:
    """Run `module` on `num_replicas` replicas to completion; one result per replica.

    Nothing hangs: a deadlock raises DeadlockError within seconds, a disagreement between the
    members of a collective raises CollectiveMismatchError, and `timeout` seconds of work raise
    ExecutionTimeout naming what each replica was doing.
    """
    job = launch(module, args, num_replicas, timeout=timeout, address=address, infeed=infeed, trace=trace,
                 strict=strict, backend=backend, replicas_per_actor=replicas_per_actor, resources=resources)
    job._host_may_send = False  # noqa: SLF001 - run() feeds nothing beyond the preloaded infeed
    with job:
        return job.result()
