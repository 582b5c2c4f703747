"""The documented behaviour of a job on the threads backend when the driver interrupts it, cancels
it, leaves its `with` block by an exception, runs two jobs from two threads, or a custom call
raises: the error says what happened, every replica stops, and the next job works."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from test_faults_ray import (
    CALL,
    FED,
    HOST_SEND,
    X,
    _blocked_in,
    _eventually,
    _raise,
    _replica_one,
    healthy,
    interrupted_in,
)

import replicas as rp
from replicas.ops.custom_call import unregister_custom_call
from replicas.runtime import threads as thread_backend


def launch(text: str, args: list, **kwargs) -> rp.Job:
    return rp.launch(rp.parse_hlo(text), args, num_replicas=2, backend="threads", **kwargs)


def stopped(job: rp.Job) -> bool:
    return all(s.status not in ("running", "blocked") for s in job.states())


def assert_next_job_works() -> None:
    rp.register_custom_call("fault", healthy)
    try:
        np.testing.assert_array_equal(launch(CALL, [X], timeout=60).result()[0], 2 * X)
    finally:
        unregister_custom_call("fault")


def test_leaving_a_with_block_by_an_exception_cancels_the_job():
    with pytest.raises(ValueError, match="user code failed"), launch(FED, [], timeout=None) as job:
        raise ValueError("user code failed")
    with pytest.raises(rp.ReplicasError, match="cancelled"):
        job.result()
    assert _eventually(lambda: stopped(job))
    assert_next_job_works()


def test_ctrl_c_while_waiting_cancels_the_job_and_propagates():
    job = launch(FED, [], timeout=None)
    assert _eventually(lambda: all(_blocked_in(s, "infeed") for s in job.states()))

    with interrupted_in("_wait", "job.py"):  # the interrupt lands there
        job.result()
    with pytest.raises(rp.ReplicasError, match="interrupted"):
        job.result()
    assert _eventually(lambda: stopped(job))
    assert_next_job_works()


def test_ctrl_c_during_a_one_replica_run_propagates():
    """`rp.run` of one replica of a program without loops that is not quick runs on a replica
    thread (only a quick one runs in the caller's thread, where no deadline could stop it): Ctrl-C
    while the caller waits is a KeyboardInterrupt, not a replica's failure."""

    with interrupted_in("_wait", "job.py"):
        # ~0.4 s of BLAS on an idle machine: the caller waits for it in the job's monitor loop.
        rp.run(*_dot_chain(512, 100), backend="threads")
    thread_backend._wait_for_unwinding()  # the stopped replica ends with its current straight-line run
    assert rp.run(*_dot_chain(8, 2), backend="threads")[0].shape == (8, 8)  # the next run is not disturbed


def _dot_chain(n: int, length: int) -> tuple[str, list[np.ndarray]]:
    dots = "\n".join(f"  d{k} = f32[{n},{n}] dot(d{k - 1}, w), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}"
                     for k in range(1, length))
    text = (f"HloModule chain\n\nENTRY main {{\n  d0 = f32[{n},{n}] parameter(0)\n  w = f32[{n},{n}] parameter(1)\n"
            f"{dots}\n  ROOT r = f32[{n},{n}] copy(d{length - 1})\n}}\n")
    return text, [np.zeros((n, n), np.float32), np.eye(n, dtype=np.float32)]


def test_cancel_keeps_what_the_replicas_sent_the_host():
    job = launch(HOST_SEND, [X], timeout=60)
    assert _eventually(lambda: all(_blocked_in(s, "infeed") for s in job.states()))
    job.cancel()
    job.cancel()  # safe twice
    np.testing.assert_array_equal(job.recv(0, 5), X)
    with pytest.raises(rp.ReplicasError, match="cancelled|nothing more"):
        job.recv(0, 5, timeout=30)  # at once: a cancelled replica sends nothing more (it used to wait)
    assert _eventually(lambda: stopped(job))


def test_a_custom_call_that_raises_names_the_replica_and_instruction():
    rp.register_custom_call("fault", _replica_one(_raise))
    try:
        with pytest.raises(rp.ReplicaFailure, match="the custom call refuses") as info:
            launch(CALL, [X], timeout=60).result()
    finally:
        unregister_custom_call("fault")
    assert info.value.replica == 1 and info.value.instruction.startswith("%y (custom-call")
    assert_next_job_works()


def test_two_jobs_from_two_threads():
    out: dict[int, list] = {}
    errors: list[BaseException] = []

    def one(k: int) -> None:
        try:
            job = launch(FED, [], timeout=60)
            job.infeed(0, X + k)
            job.infeed(1, X + k)
            out[k] = job.result()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=one, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    for k in range(2):
        np.testing.assert_array_equal(out[k][0], 2 * (X + k))
