"""The doorbell of a persistent job on Ray (transport/doorbell.py): a call's arguments and outputs
packed for shared memory come back as they went (dtype, shape, values, writability), a jitted
function whose values take every form the packing knows matches JAX through real actors, and an
idle job's actor parks its main thread (runtime/ray/parking.py) yet answers every call."""

from __future__ import annotations

import os
import pickle
import secrets
import threading

import ml_dtypes
import numpy as np
import pytest

from replicas.runtime.resident import Kept
from replicas.transport import doorbell, shm, spin
from replicas.transport.doorbell import Doorbell, pack, unpack


def round_trip(values):
    return unpack(pickle.loads(pickle.dumps(pack(values), protocol=pickle.HIGHEST_PROTOCOL)))


def test_packed_values_come_back_as_they_went():
    frozen = np.arange(6, dtype=np.int16).reshape(2, 3)
    frozen.flags.writeable = False
    values = [np.arange(12, dtype=np.float32).reshape(3, 4), np.array(7, np.int32), np.zeros(0, np.float64),
              np.array([True, False]), np.arange(4, dtype=np.complex64), np.arange(8)[::2],
              np.ones(3, ml_dtypes.bfloat16), np.ones(1 << 15, np.float32), frozen,
              None, Kept(3, 1), (1, 2, 3), ("<f4", (2,), b"12345678"), np.float32(2.5)]
    got = round_trip(values)
    assert len(got) == len(values)
    for want, have in zip(values, got):
        assert type(have) is type(want)
        if isinstance(want, np.ndarray):
            assert have.dtype == want.dtype and have.shape == want.shape
            np.testing.assert_array_equal(have, want)
            assert have.flags.writeable == want.flags.writeable
        else:
            assert have == want or (want is None and have is None)
    a = got[0]
    a += 1  # a writable argument is the actor's own copy, never a view of shared memory
    np.testing.assert_array_equal(a, values[0] + 1)


@pytest.mark.skipif(not doorbell.available(), reason="needs futexes and /dev/shm")
def test_both_sides_spin_on_the_doorbell_and_see_the_other_write():
    """The actor's wait for a request and the driver's wait for a reply each watch their word first
    (a spinner with a budget far above anything the other side takes); both still sleep on the
    futex when the spinner does not spin."""
    token = "test" + secrets.token_hex(4)
    driver = Doorbell(token, 1, create=True)
    actor = Doorbell(token, 1)
    try:
        last = actor.request_seq()
        rung: list[int | None] = []
        ringer = threading.Thread(target=lambda: rung.append(driver.ring(("args", 1))))
        waiting = spin.Spinner(30.0)
        ringer.start()
        seq = actor.wait_request(last, timeout=30.0, spinner=waiting)
        ringer.join()
        assert seq == rung[0] and actor.request() == ("args", 1)
        assert waiting.spins in (0, 1) and waiting.hits == waiting.spins  # 0: rung before the wait began
        replier = threading.Thread(target=lambda: actor.reply(0, seq, b"done"))
        replying = spin.Spinner(30.0)
        replier.start()
        assert driver.replies(seq, [0], 30.0, replying) == [b"done"]
        replier.join()
        assert replying.hits == replying.spins
        # Without spinning: the futex wait and wake alone.
        sleeper = threading.Thread(target=lambda: rung.append(driver.ring(("again",))))
        sleeper.start()
        again = actor.wait_request(seq, timeout=30.0, spinner=spin.NEVER)
        sleeper.join()
        assert again == rung[1] and actor.request() == ("again",)
    finally:
        actor.close()
        driver.close()
        shm.remove_job_segments(token)


_ACTOR = """
import pickle
import sys
import time
from replicas.transport import spin
from replicas.transport.doorbell import Doorbell
bell = Doorbell(sys.argv[1], 1)
last = 0  # (the driver may have rung before this process started)
for _ in range(int(sys.argv[2])):
    # A wait may also end early, the request unchanged: the driver's wake-up of the previous round,
    # made after it saw this side's flag but run late, reaches this side's next wait. (Longer than
    # the driver's 10 s: a lost wake-up fails the driver's round first.)
    deadline = time.monotonic() + 30.0
    seq = None
    while seq is None and time.monotonic() < deadline:
        seq = bell.wait_request(last, timeout=max(0.0, deadline - time.monotonic()), spinner=spin.NEVER, actor=0)
    if seq is None:
        sys.exit("no request within 30 s")
    bell.reply(0, seq, pickle.dumps(bell.request()))
    last = seq
bell.close()
"""


@pytest.mark.skipif(not doorbell.available(), reason="needs futexes and /dev/shm")
def test_no_wake_up_is_lost_between_two_processes_that_always_sleep():
    """Each side wakes the other only when its flag says it sleeps: with both sides sleeping at every
    wait (no spin), a wake-up lost to the race of a flag and a word would leave a side asleep until
    its 10 s wait ends, failing the round."""
    import subprocess
    import sys

    token = "test" + secrets.token_hex(4)
    rounds = 2000
    driver = Doorbell(token, 1, create=True)
    actor = subprocess.Popen([sys.executable, "-c", _ACTOR, token, str(rounds)])
    try:
        for k in range(rounds):
            seq = driver.ring(k)
            replies = driver.replies(seq, [0], 10.0, spin.NEVER)
            assert replies is not None, f"round {k}: no reply within 10 s"
            assert pickle.loads(replies[0]) == k
        assert actor.wait(timeout=30) == 0
    finally:
        if actor.poll() is None:
            actor.kill()
            actor.wait()
        driver.close()
        shm.remove_job_segments(token)


@pytest.mark.usefixtures("ray_session")
def test_a_jitted_function_of_every_packed_form_matches_jax_through_the_doorbell():
    jax = pytest.importorskip("jax")
    from jax.sharding import PartitionSpec as P

    import replicas as rp

    if len(jax.devices()) < 4:
        pytest.skip("needs --xla_force_host_platform_device_count >= 4")

    def f(x, m, k, s):  # x split over the replicas (each its own request), the rest replicated
        return x * 2 + s, (m & (x > 0)), k.astype(jax.numpy.bfloat16) + 1, s * 3

    step = rp.jax.jit(f, num_replicas=4, in_specs=(P("x"), P("x"), P(), P()), out_specs=(P("x"), P("x"), P(), P()))
    x = np.linspace(-1, 1, 16, dtype=np.float32)
    m = np.arange(16) % 3 == 0
    k = np.arange(5, dtype=np.int8)
    want = jax.jit(f)(x, m, k, np.float32(0.5))
    for _ in range(3):  # the first call starts the job; the next ones ring its doorbell
        got = step(x, m, k, np.float32(0.5))
    for g, w in zip(got, want):
        assert np.asarray(g).dtype == np.asarray(w).dtype
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    backend = next(iter(step._cache.values())).session.devices._backend
    assert backend.calls["doorbell"] == 3 and backend.calls["call"] == 0, backend.calls
    kept = step(got[0], m, k, np.float32(0.5))[0]  # a resident argument: a name in the request
    np.testing.assert_array_equal(np.asarray(kept), np.asarray(want[0]) * 2 + 0.5)
    step.close()


@pytest.mark.usefixtures("ray_session")
def test_outputs_kept_on_the_actors_are_fetched_through_the_doorbell_or_by_actor_calls_when_larger_than_a_slot():
    jax = pytest.importorskip("jax")
    from jax.sharding import PartitionSpec as P

    import replicas as rp

    if len(jax.devices()) < 4:
        pytest.skip("needs --xla_force_host_platform_device_count >= 4")

    def f(x, y):
        return x * 2, jax.lax.psum(y, "x")

    step = rp.jax.jit(f, num_replicas=4, in_specs=(P("x"), P()), out_specs=(P("x"), P()))
    x = np.arange(4 * 4096, dtype=np.float32)  # 16 KiB shards: kept on the actors, not in the reply
    y = np.arange(1 << 19, dtype=np.float32)  # a 2 MiB replicated output: more than a call's reply holds
    a, b = step(x, y)
    backend = next(iter(step._cache.values())).session.devices._backend
    np.testing.assert_array_equal(np.asarray(a), x * 2)
    assert backend.calls["doorbell_fetch"] == 1 and backend.calls["fetch"] == 0, backend.calls
    np.testing.assert_array_equal(np.asarray(b), y * 4)  # asked again once the driver made the room
    assert backend.calls["doorbell_fetch"] == 3 and backend.calls["fetch"] == 0, backend.calls
    a, b = step(x, y)
    np.testing.assert_array_equal(np.asarray(b), y * 4)  # the room is still there
    assert backend.calls["doorbell_fetch"] == 4 and backend.calls["fetch"] == 0, backend.calls
    backend._bell.reply_max = 1 << 20  # slots of 1 MiB: the actors are asked by Ray calls
    a, b = step(x, y)
    np.testing.assert_array_equal(np.asarray(b), y * 4)
    assert backend.calls["fetch"] == 1, backend.calls  # one actor holds the replica it reads
    np.testing.assert_array_equal(np.asarray(step(a, y)[0]), x * 4)  # a fetched array is still resident
    step.close()


@pytest.mark.usefixtures("ray_session")
def test_what_a_watched_call_printed_reaches_the_drivers_stdout_once(capfd):
    """A call longer than the poll interval ends under the monitor; its printed lines, which the
    actor may have put in the doorbell's reply or kept for the monitor's question, show once."""
    jax = pytest.importorskip("jax")

    import replicas as rp

    def f(x):
        jax.debug.print("start {s}", s=x[0])
        # Far past the poll interval: 64 elements keep each trip's ops numpy calls (a loop of a few
        # elements runs as per-element Python code, fast enough to end before the first poll).
        y = jax.lax.fori_loop(0, 1_000_000, lambda i, v: v * 0.5 + 1.0, x)
        jax.debug.print("end {s}", s=y[0])
        return y

    step = rp.jax.jit(f, backend="ray", timeout=300)
    x = np.zeros(64, np.float32)
    capfd.readouterr()
    try:
        got = np.asarray(step(x))
        np.asarray(step(x))
        session = next(iter(step._cache.values())).session
    finally:
        step.close()
    np.testing.assert_allclose(got, np.asarray(jax.jit(f)(x)), rtol=1e-6)
    lines = [line for line in capfd.readouterr().out.splitlines() if line.startswith("[replica 0] ")]
    assert lines == ["[replica 0] start 0.0", "[replica 0] end 2.0"] * 2, lines
    assert session.devices.watched_calls >= 1  # (what this test is about: a call the monitor watched)


@pytest.mark.skipif(not doorbell.available(), reason="needs futexes and /dev/shm")
def test_the_drivers_hold_keeps_the_actors_awake_and_moves_their_release_word():
    token = "test" + secrets.token_hex(4)
    driver = Doorbell(token, 1, create=True)
    actor = Doorbell(token, 1)
    try:
        assert not actor.held()  # a new doorbell's actors may park at once
        seen = actor.release_word()
        driver.hold(60.0)
        assert actor.held() and actor.release_word() != seen
        actor.wait_release(seen, 30.0)  # returns at once: the word moved
        seen = actor.release_word()
        driver.stop()  # the job's end releases parked main threads too
        assert actor.stopped() and actor.release_word() != seen
    finally:
        actor.close()
        driver.close()
        shm.remove_job_segments(token)


@pytest.mark.usefixtures("ray_session")
def test_an_idle_jobs_actor_parks_its_main_thread_and_still_answers_every_call():
    """Between doorbell calls the actor's main thread (Ray's task loop) is parked; the driver's own
    actor calls wake it (a watched call, `progress()`, a large output's fetch, the job's end), and
    any other call is answered once the bounded park ends."""
    jax = pytest.importorskip("jax")
    import ray

    import replicas as rp
    from replicas.runtime.ray import parking

    step = rp.jax.jit(lambda x: x * 2 + 1, backend="ray")
    x = np.arange(1 << 18, dtype=np.float32)
    try:
        out = step(x)
        backend = next(iter(step._cache.values())).session.devices._backend
        backend._bell.reply_max = 1 << 16  # the 1 MiB output is fetched by an actor call
        actor = backend._actors[0]
        parks = 0
        for _ in range(50):  # the doorbell's thread parks the main thread before it waits for a call
            out = step(x)
            parks = ray.get(actor.__ray_call__.remote(lambda host: parking._state.parks))
            if parks:
                break
        assert parks > 0
        assert step.progress().finished == 1  # states: an actor call after the driver's hold
        np.testing.assert_array_equal(np.asarray(out), np.asarray(jax.jit(lambda v: v * 2 + 1)(x)))
        np.testing.assert_array_equal(np.asarray(step(out)), x * 4 + 3)  # resident, then fetched
    finally:
        step.close()


@pytest.mark.usefixtures("ray_session")
def test_a_request_or_a_fetch_larger_than_the_pages_kept_gives_the_rest_back_to_dev_shm():
    pytest.importorskip("jax")
    import jax.numpy as jnp

    import replicas as rp

    def allocated(fn):
        backend = next(iter(fn._cache.values())).session.devices._backend
        return os.stat(backend._bell.map.path).st_blocks * 512, backend.calls

    big = rp.jax.jit(lambda s: jnp.full((5 << 20,), s, jnp.float32) * 2)  # a 20 MiB output from a scalar
    total = rp.jax.jit(lambda x: x.sum())  # a scalar from a 20 MiB argument
    try:
        np.testing.assert_array_equal(np.asarray(big(np.float32(1.5))), np.full(5 << 20, 3.0, np.float32))
        used, calls = allocated(big)
        assert calls["doorbell_fetch"] == 2 and calls["fetch"] == 0, calls
        assert used <= doorbell._KEEP + (1 << 20) < 20 << 20, used
        rung = calls["doorbell"]
        assert float(total(np.ones(5 << 20, np.float32))) == 5 << 20
        used, calls = allocated(total)  # (the same job: both functions run on one set of replicas)
        assert calls["doorbell"] == rung + 1 and calls["call"] == 0, calls
        # (the request's pages kept and the reply slot's: 40 MiB without the give-back)
        assert used <= 2 * doorbell._KEEP + (1 << 20) < 40 << 20, used
    finally:
        big.close()
        total.close()
