"""Every phase of a job is under its one timeout: reading its program, checking the arguments, setting up each replica
(binding its kernels), a single replica that would have run in the caller's thread, starting the
replicas, the run. A job with `timeout=T` ends with ExecutionTimeout naming the phase and what
each replica was doing within T plus a stated grace: `GRACE` on threads, `RAY_GRACE` on Ray (a
poll of the actors, the abort, the report, each one actor call).

The only timed assertions are these "ended within the deadline plus the grace" bounds."""

from __future__ import annotations

import contextlib
import time

import numpy as np
import pytest
from test_runtime_ray import FOREVER

import replicas as rp
from replicas.runtime import codegen, threads
from replicas.runtime.compile import compile_module, runs_quickly

GRACE = 1.0  # seconds a threads job may take beyond its timeout to report and stop
RAY_GRACE = 3.0
TIMEOUT = 1.0

ADD = "add {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT c = f32[] add(a, b)\n}\n"


def _timed_out(fn, timeout: float, grace: float = GRACE) -> str:
    """Run `fn` (a job with `timeout`): its ExecutionTimeout's text, once it ended within the grace."""
    began = time.monotonic()
    with pytest.raises(rp.ExecutionTimeout) as info:
        fn()
    took = time.monotonic() - began
    assert took <= timeout + grace, f"ended {took:.2f} s after it began, timeout={timeout}"
    return str(info.value)


def test_reading_the_program_is_under_the_deadline():
    # Eight MiB of small instructions: parsing takes seconds; rp.run of the text stops at its deadline.
    lines = ["HloModule m\nENTRY e {\n  add.0 = f32[] parameter(0)\n  add.1 = f32[] negate(add.0)\n"]
    lines += [f"  add.{i} = f32[] add(add.{i - 1}, add.{i - 2})\n" for i in range(2, 200_000)]
    text = "".join(lines) + "  ROOT r = f32[] negate(add.199999)\n}\n"
    timeout = 0.5
    message = _timed_out(lambda: rp.run(text, [np.float32(1)], num_replicas=1, backend="threads", timeout=timeout),
                         timeout)
    assert "while reading its program" in message, message


def test_checking_the_arguments_is_under_the_deadline():
    # Each replica converts its own copy of a long Python list: 128 of them take seconds.
    values = [float(i) for i in range(1 << 20)]
    m = rp.parse_hlo("HloModule m\nENTRY e {\n  p = f32[1048576] parameter(0)\n  ROOT n = f32[1048576] negate(p)\n}\n")
    text = _timed_out(lambda: rp.run(m, [[values]] * 128, num_replicas=128, backend="threads", timeout=TIMEOUT),
                      TIMEOUT)
    assert "while checking its arguments" in text and "not checked" in text, text


def test_setting_up_many_replicas_is_under_the_deadline():
    # 1,024 replicas of 300 all-reduces: binding the kernels of every replica takes far longer. (The
    # stateful rng keeps them from running batched, where no replica binds kernels of its own.)
    lines = [f"HloModule m\n{ADD}ENTRY e {{\n  x0 = f32[4] parameter(0)\n"]
    lines += [f"  x{i} = f32[4] all-reduce(x{i - 1}), replica_groups={{}}, to_apply=add\n" for i in range(1, 301)]
    lines += ["  lo = f32[] constant(0)\n  hi = f32[] constant(1)\n",
              "  u = f32[4] rng(lo, hi), distribution=rng_uniform\n"]
    m = rp.parse_hlo("".join(lines) + "  ROOT r = f32[4] add(x300, u)\n}\n")
    compile_module(m, num_replicas=1024)  # compiled before the clock: this test is about the replicas
    x = np.ones(4, np.float32)
    text = _timed_out(lambda: rp.run(m, [x], num_replicas=1024, backend="threads", timeout=TIMEOUT), TIMEOUT)
    assert "while setting up its replicas" in text and "not set up" in text, text


def test_one_replica_without_a_loop_is_stopped_at_the_deadline():
    # No loop, no communication: it used to run in the caller's thread, where nothing could stop it.
    # One LAPACK call of seconds (as the issue's mutated Cholesky program): the job ends at its
    # deadline naming it; the thread ends with the call (nothing can stop a kernel midway).
    n, timeout = 6144, 0.5
    m = rp.parse_hlo(f"HloModule m\nENTRY e {{\n  p = f32[{n},{n}] parameter(0)\n"
                     f"  ROOT c = f32[{n},{n}] cholesky(p), lower=true\n}}\n")
    assert not runs_quickly(compile_module(m))
    a = np.eye(n, dtype=np.float32)
    text = _timed_out(lambda: rp.run(m, [a], num_replicas=1, backend="threads", timeout=timeout), timeout)
    assert "%c (cholesky)" in text, text
    threads._wait_for_unwinding()  # the next test starts without it


def test_a_small_program_still_runs_in_the_callers_thread():
    m = rp.parse_hlo("HloModule m\nENTRY e {\n  p = f32[8] parameter(0)\n  ROOT n = f32[8] negate(p)\n}\n")
    assert runs_quickly(compile_module(m))
    np.testing.assert_array_equal(rp.run(m, [np.ones(8, np.float32)], backend="threads", timeout=TIMEOUT)[0],
                                  -np.ones(8, np.float32))


def test_the_run_is_under_the_deadline_on_threads():
    m = rp.parse_hlo(FOREVER)
    text = _timed_out(lambda: rp.run(m, [], num_replicas=4, backend="threads", timeout=TIMEOUT), TIMEOUT)
    assert "still running after" in text and "running" in text, text


def test_the_deadline_counts_from_the_launch_not_from_the_wait_for_the_result():
    m = rp.parse_hlo(FOREVER)
    began = time.monotonic()
    with rp.launch(m, [], num_replicas=2, backend="threads", timeout=TIMEOUT) as job:
        while job.progress().elapsed < TIMEOUT:  # the host is busy with something else meanwhile
            job.states()
        with pytest.raises(rp.ExecutionTimeout):
            job.result()
    assert time.monotonic() - began <= TIMEOUT + GRACE


@pytest.mark.usefixtures("ray_session")
def test_the_run_is_under_the_deadline_on_ray():
    m = rp.parse_hlo(FOREVER)
    rp.run(rp.parse_hlo("HloModule w\nENTRY e {\n  ROOT c = f32[] constant(1)\n}\n"), [], num_replicas=2)  # warm
    text = _timed_out(lambda: rp.run(m, [], num_replicas=2, timeout=TIMEOUT), TIMEOUT, RAY_GRACE)
    assert "still running after" in text, text


@pytest.mark.usefixtures("ray_session")
def test_starting_actors_that_cannot_be_placed_is_under_the_deadline_on_ray():
    import ray

    cpus = ray.cluster_resources()["CPU"]
    m = rp.parse_hlo("HloModule w\nENTRY e {\n  ROOT c = f32[] constant(1)\n}\n")
    # Each asks for every CPU of the only node: the second can never start while the first runs.
    text = _timed_out(lambda: rp.run(m, [], num_replicas=2, timeout=2 * TIMEOUT,
                                     resources=[{"CPU": cpus}, {"CPU": cpus}]), 2 * TIMEOUT, RAY_GRACE)
    assert "did not start" in text, text


@pytest.mark.usefixtures("ray_session")
def test_an_actor_that_stops_answering_on_the_drivers_node_is_under_the_deadline():
    # A frozen actor process (SIGSTOP; or one whose thread holds the GIL in a long call) answers no
    # poll: the driver's polls, result collection and clean-up wait no longer than the job's deadline.
    import os
    import signal

    import ray

    m = rp.parse_hlo(FOREVER)
    rp.run(rp.parse_hlo("HloModule w\nENTRY e {\n  ROOT c = f32[] constant(1)\n}\n"), [], num_replicas=2)  # warm
    job = rp.launch(m, [], num_replicas=2, timeout=TIMEOUT)
    job.states()  # the launch seen: the actors stop while they run, not while they start
    actors = list(job._backend._actors)  # noqa: SLF001 - the fault under test
    pids = ray.get([a.__ray_call__.remote(lambda self: os.getpid()) for a in actors])
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        text = _timed_out(job.result, TIMEOUT, RAY_GRACE)
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    assert "did not answer" in text and "%" in text, text  # what they were doing, from their published slots


def test_a_long_straight_line_replica_stops_soon_after_the_deadline():
    # No loop, no communication, a thousand slow kernels in a row: the replica's thread notices the
    # job's end between kernels (every codegen.ABORT_CHECK_EVERY), not only at the end of its program.
    calls = []

    def slow(x):
        calls.append(1)
        time.sleep(0.01)
        return x

    rp.register_custom_call("test_slow", slow)
    try:
        lines = ["HloModule m\nENTRY e {\n  x0 = f32[] parameter(0)\n"]
        lines += [f'  x{i} = f32[] custom-call(x{i - 1}), custom_call_target="test_slow"\n' for i in range(1, 1000)]
        m = rp.parse_hlo("".join(lines) + "  ROOT r = f32[] negate(x999)\n}\n")
        _timed_out(lambda: rp.run(m, [np.float32(1)], num_replicas=1, backend="threads", timeout=TIMEOUT), TIMEOUT)
        threads._wait_for_unwinding()
        assert len(calls) < 999 - codegen.ABORT_CHECK_EVERY, len(calls)  # it did not run to its end
    finally:
        rp.unregister_custom_call("test_slow")
