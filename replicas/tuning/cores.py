"""Share the cores among replicas: the BLAS / OpenMP thread pools of a process running replicas are
sized (with threadpoolctl) so that the replicas of one node never run more threads than it has cores.

Every BLAS call of a replica may use the whole pool; N replicas calling at once use N pools. So a
process hosting replicas of a job with N replicas on this node limits its pools to
max(1, (cores - 1) // N) threads (the pools are per process, not per thread). While one thread
computes k replicas of its process at once (a batched run, `runtime/batched.py`: one BLAS caller
where k threads would have called), that thread's calls may use as many threads as the k replica
threads had cores between them: min(k, the process's share of the cores) (`widen`; the other k - 1
threads wait for the run meanwhile).
`REPLICAS_BLAS_THREADS` overrides both: an integer (threads per pool), or "off" to leave the pools
alone.
"""

from __future__ import annotations

import os
import threading
from typing import Any

ENV = "REPLICAS_BLAS_THREADS"

_lock = threading.Lock()
_controller: Any = None
_applied: list[Any] = []  # the limiter of the latest share_cores, restored when its job ends


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _setting() -> str:
    return os.environ.get(ENV, "auto").strip().lower()


def pool_threads(replicas_on_node: int) -> int | None:
    """Threads each BLAS/OpenMP pool of a replica process may use; None: leave the pools alone."""
    setting = _setting()
    if setting == "off":
        return None
    if setting not in ("", "auto"):
        try:
            return max(1, int(setting))
        except ValueError:
            raise ValueError(f"{ENV}={setting!r}: expected an integer, 'auto' or 'off'") from None
    # One core is left to what runs beside the replicas (the driver's monitor, the transports, other
    # processes): OpenBLAS workers spin while they wait, and a pool that finds its cores taken
    # stalls every call (a one-replica model step ran several times slower with a thread per core
    # than with one).
    return max(1, (cores() - 1) // max(1, replicas_on_node))


def share_cores(replicas_on_node: int) -> Any:
    """Limit this process's BLAS/OpenMP pools for a job with `replicas_on_node` replicas here.
    Returns a token for `release` (None when nothing was changed)."""
    threads = pool_threads(replicas_on_node)
    if threads is None or (threads >= cores() and not _applied):
        return None
    pools = _pools()
    with _lock:
        limiter = _Limit(pools, threads)
        _applied.append(limiter)
    return limiter


class _Limit:
    """`ThreadpoolController.limit(limits=threads)` for every pool, and its restore, through the
    pools' own setters, without threadpoolctl's bookkeeping (a warm one-replica run of a program
    with a dot pays it on every run)."""

    def __init__(self, pools: list[Any], threads: int) -> None:
        self._original = [(pool, pool.get_num_threads()) for pool in pools]
        for pool in pools:
            _set_threads(pool, threads)

    def restore_original_limits(self) -> None:
        for pool, threads in self._original:
            if threads is not None:
                try:
                    _set_threads(pool, threads)
                except KeyboardInterrupt:
                    # OpenBLAS answers a thread it cannot start (a process or thread limit) by raising
                    # SIGINT in this process: not the user's Ctrl-C, and the pools stay as they are.
                    if _a_thread_can_start():
                        raise
                    return


def _a_thread_can_start() -> bool:
    try:
        probe = threading.Thread(target=int, daemon=True, name="replicas-thread-probe")
        probe.start()
    except RuntimeError:  # "can't start new thread"
        return False
    probe.join()
    return True


_sized: list[int | None] = [None]


def size_replica_process(replicas_on_node: int) -> None:
    """`share_cores` for a process that exists to run replicas (a Ray actor): applied for good,
    and only when the size changes (a pooled actor runs job after job)."""
    threads = pool_threads(replicas_on_node)
    if threads is None or threads == _sized[0]:
        return
    pools = _pools()
    with _lock:
        for pool in pools:
            _set_threads(pool, threads)
        _sized[0] = threads


def release(token: Any) -> None:
    """Undo `share_cores` once its job ended (the latest one only: an older job's token is dropped)."""
    if token is None:
        return
    with _lock:
        if _applied and _applied[-1] is token:
            _applied.pop()
            token.restore_original_limits()
        elif token in _applied:
            _applied.remove(token)


def widen(replicas: int, processes_on_node: int) -> Any:
    """While the calling thread computes `replicas` replicas of its process at once (a batched run)
    of a job with `processes_on_node` processes here: the pools get as many threads as those
    replicas' own threads had cores, min(`replicas`, the process's share of the cores) (the other
    replica threads wait for the run meanwhile). A token for `narrow`; None when nothing changed
    (one core, the setting fixes the pools, or no pool can be resized from any thread). Runs that
    overlap (jobs side by side) share one widening: the last to end restores the pools."""
    if _setting() not in ("", "auto"):
        return None
    threads = min(replicas, cores() // max(1, processes_on_node))
    if threads < 2:
        return None
    setters = any_thread_setters()
    if not setters:
        return None
    with _lock:
        if _widened[0] == 0:
            _widened[1] = [(setter, setter(threads)) for setter in setters]
        _widened[0] += 1
    return _widened


def narrow(token: Any) -> None:
    """Undo `widen` (the pools as they were once the last overlapping run ended)."""
    if token is None:
        return
    with _lock:
        _widened[0] -= 1
        if _widened[0] == 0:
            for setter, threads in _widened[1]:
                setter(threads)
            _widened[1] = None


_widened: list[Any] = [0, None]  # batched runs widening the pools now, what the pools had before


def _pools() -> list[Any]:
    """This process's BLAS/OpenMP pools (threadpoolctl's controllers of them, found once)."""
    global _controller
    if _controller is None:
        from threadpoolctl import ThreadpoolController

        with _lock:
            if _controller is None:
                _controller = ThreadpoolController()
    return _controller.lib_controllers


def any_thread_setters() -> list[Any]:
    """The any-thread setter (`_setter_of`) of each pool of this process that has one."""
    return [setter for pool in _pools() if (setter := _setter_of(pool)) is not None]


def _set_threads(pool: Any, threads: int) -> None:
    """`pool.set_num_threads(threads)`, from whatever thread calls it (see `_setter_of`)."""
    setter = _setter_of(pool)
    if setter is not None:
        setter(threads)
    else:
        pool.set_num_threads(threads)


_SETTERS: dict[str, Any] = {}  # a pool's library file -> its any-thread setter (None: it has none)


def _setter_of(pool: Any) -> Any:
    """An OpenBLAS pool's `openblas_set_num_threads_local`: it sets the pool's threads from any thread
    and returns what they were (threadpoolctl's setter, called from a thread other than the main one,
    leaves an OpenBLAS pool as it is: a job started from such a thread would run its replicas on
    pools of every core). None for other pools, and for an OpenBLAS older than the function."""
    path = pool.filepath
    if path in _SETTERS:
        return _SETTERS[path]
    setter = None
    if pool.internal_api == "openblas":
        import ctypes

        try:
            setter = ctypes.CDLL(path).openblas_set_num_threads_local
            setter.argtypes, setter.restype = [ctypes.c_int], ctypes.c_int
        except (OSError, AttributeError):
            setter = None
    _SETTERS[path] = setter
    return setter


def current_limits() -> dict[str, int]:
    """{library prefix: threads} of this process's pools (for benchmarks and tests)."""
    from threadpoolctl import threadpool_info

    return {info["prefix"]: info["num_threads"] for info in threadpool_info()}
