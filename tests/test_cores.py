"""Replicas share the cores: BLAS pools sized to cores // replicas while a job runs, restored after."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import replicas as rp
from replicas.tuning.cores import (
    any_thread_setters,
    cores,
    current_limits,
    narrow,
    pool_threads,
    release,
    share_cores,
    widen,
)

CALL = """HloModule pools
ENTRY main {
  x = s32[] parameter(0)
  ROOT t = s32[] custom-call(x), custom_call_target="blas_pool_threads"
}
"""


@pytest.fixture
def pool_probe():
    rp.register_custom_call("blas_pool_threads", lambda x: np.int32(min(current_limits().values())))
    yield
    rp.unregister_custom_call("blas_pool_threads")


def test_pool_size_follows_replicas_and_the_environment(monkeypatch):
    monkeypatch.delenv("REPLICAS_BLAS_THREADS", raising=False)
    assert pool_threads(1) == max(1, cores() - 1)
    assert pool_threads(4 * cores()) == 1
    monkeypatch.setenv("REPLICAS_BLAS_THREADS", "3")
    assert pool_threads(64) == 3
    monkeypatch.setenv("REPLICAS_BLAS_THREADS", "off")
    assert pool_threads(64) is None
    monkeypatch.setenv("REPLICAS_BLAS_THREADS", "many")
    with pytest.raises(ValueError, match="REPLICAS_BLAS_THREADS"):
        pool_threads(2)


@pytest.mark.usefixtures("pool_probe")
def test_replica_threads_run_with_shared_pools_and_the_process_gets_its_own_back(monkeypatch):
    monkeypatch.delenv("REPLICAS_BLAS_THREADS", raising=False)
    before = current_limits()
    n = 2 * cores()
    got = rp.run(rp.parse_hlo(CALL), [np.int32(0)], num_replicas=n, backend="threads")
    assert [int(g) for g in got] == [1] * n
    assert current_limits() == before
    monkeypatch.setenv("REPLICAS_BLAS_THREADS", "1")
    assert int(rp.run(rp.parse_hlo(CALL), [np.int32(0)], num_replicas=1, backend="threads")[0]) == 1
    assert current_limits() == before


def test_a_batched_run_calls_blas_with_the_cores_its_replicas_had_and_overlapping_runs_restore_once(
        monkeypatch):
    monkeypatch.delenv("REPLICAS_BLAS_THREADS", raising=False)
    if cores() < 2 or not any_thread_setters():
        pytest.skip("one core, or no OpenBLAS whose pool can be resized from any thread")
    shared = share_cores(2 * cores())  # a job of many replicas here: one thread per pool
    seen: list[int] = []

    def leader() -> None:  # the thread of a batched run of 4 replicas, the job's only process here
        first = widen(4, 1)
        seen.append(min(current_limits().values()))
        second = widen(4, 1)  # another job's run, overlapping
        narrow(first)
        seen.append(min(current_limits().values()))
        narrow(second)
        seen.append(min(current_limits().values()))

    try:
        thread = threading.Thread(target=leader)
        thread.start()
        thread.join()
        assert seen == [min(4, cores()), min(4, cores()), 1]
        assert widen(1, 1) is None  # one replica's own thread had one core's share already
        assert widen(4, cores()) is None  # a core per process: nothing to widen to
        monkeypatch.setenv("REPLICAS_BLAS_THREADS", "1")
        assert widen(4, 1) is None  # the setting decides
    finally:
        release(shared)


@pytest.mark.usefixtures("pool_probe")
def test_a_job_started_from_another_thread_shares_the_cores_too(monkeypatch):
    # (threadpoolctl's setter, called from a thread other than the main one, leaves OpenBLAS's pool
    # as it is: the replicas would each call BLAS on a pool of every core)
    monkeypatch.delenv("REPLICAS_BLAS_THREADS", raising=False)
    before = current_limits()
    n = 2 * cores()
    got: list[list[int]] = []

    def job() -> None:
        got.append([int(g) for g in rp.run(rp.parse_hlo(CALL), [np.int32(0)], num_replicas=n, backend="threads")])

    thread = threading.Thread(target=job)
    thread.start()
    thread.join()
    assert got == [[1] * n]
    assert current_limits() == before
