"""Functions jitted for the same replicas and options share one job on Ray, as JAX's functions
share the devices: one set of actors, an output of one passed to another where it is, one
failure ending the job for all (runtime/session.py)."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest

import replicas as rp
from replicas.errors import ProgramError
from replicas.runtime.session import end_shared_jobs

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax.sharding import Mesh  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

shard_map = getattr(jax, "shard_map", None)
if shard_map is None:  # older jax
    from jax.experimental.shard_map import shard_map

pytestmark = [pytest.mark.skipif(len(jax.devices()) < 4, reason="needs --xla_force_host_platform_device_count >= 4"),
              pytest.mark.usefixtures("ray_session")]

rng = np.random.default_rng(3)


def devices_of(fn):
    (compiled,) = fn._cache.values()
    return compiled.session.devices


def on_jax(f, in_specs, out_specs):
    return jax.jit(shard_map(f, mesh=Mesh(np.array(jax.devices()[:4]), ("x",)), in_specs=in_specs,
                             out_specs=out_specs))


def scale(x, s):  # no collective
    return x * s


def normalize(x):  # an all-reduce
    return x / jax.lax.psum(jnp.sum(x * x), "x")


@pytest.mark.parametrize("per_actor", [4, 2], ids=["one actor", "two actors"])
def test_an_output_passed_to_another_function_stays_where_it_is_and_matches_jax(per_actor):
    """The second function joins the first one's job (its actors, and across two actors the
    collectives its program adds); the arrays go back and forth without a fetch."""
    end_shared_jobs()
    first = rp.jax.jit(scale, num_replicas=4, in_specs=(P("x"), P()), out_specs=P("x"), replicas_per_actor=per_actor)
    then = rp.jax.jit(normalize, num_replicas=4, in_specs=P("x"), out_specs=P("x"), replicas_per_actor=per_actor)
    x = rng.normal(size=(1 << 18,)).astype(np.float32)  # 1 MiB: 256 KiB shards, kept on the actors
    try:
        y = first(x, np.float32(3))
        backend = devices_of(first)._backend
        z = then(y)
        assert devices_of(then) is devices_of(first) and devices_of(then)._backend is backend
        w = first(z, np.float32(2))
        v = then(w)
        calls = backend.calls
        assert calls["launch"] == 4 // per_actor and calls["add_program"] == 4 // per_actor, calls
        assert calls["doorbell"] == 4 and calls["call"] == 0, calls  # every call through the doorbell
        assert calls["doorbell_fetch"] == 0 and calls["fetch"] == 0, calls  # nothing gathered on the way
        jy = on_jax(scale, (P("x"), P()), P("x"))(x, np.float32(3))
        jz = on_jax(normalize, P("x"), P("x"))(jy)
        jv = on_jax(normalize, P("x"), P("x"))(on_jax(scale, (P("x"), P()), P("x"))(jz, np.float32(2)))
        np.testing.assert_allclose(np.asarray(z), np.asarray(jz), rtol=1e-5)
        np.testing.assert_allclose(np.asarray(v), np.asarray(jv), rtol=1e-5)
    finally:
        first.close()
        then.close()


@pytest.mark.parametrize("per_actor", [4, 2], ids=["one actor", "two actors"])
def test_an_output_placed_otherwise_is_cut_out_where_it_is_when_one_actor_holds_every_shard(per_actor):
    """Sharded -> replicated -> sharded: one actor cuts each replica's part from the shards it
    holds; across two actors the array is gathered and split again. Both match JAX."""
    def shift(x):  # replicated in and out
        return x * 2 + 1

    end_shared_jobs()
    first = rp.jax.jit(scale, num_replicas=4, in_specs=(P("x"), P()), out_specs=P("x"), replicas_per_actor=per_actor)
    then = rp.jax.jit(shift, num_replicas=4, in_specs=P(), out_specs=P(), replicas_per_actor=per_actor)
    x = rng.normal(size=(1 << 16,)).astype(np.float32)  # 64 KiB shards: kept on the actors
    try:
        y = first(x, np.float32(3))
        z = then(y)  # every replica takes the whole of it
        w = first(z, np.float32(0.5))  # each its quarter of a replicated array
        calls = devices_of(first)._backend.calls
        gathered = calls["doorbell_fetch"] + calls["fetch"]
        assert (gathered == 0) == (per_actor == 4), calls
        jz = on_jax(shift, P(), P())(on_jax(scale, (P("x"), P()), P("x"))(x, np.float32(3)))
        np.testing.assert_allclose(np.asarray(z), np.asarray(jz), rtol=1e-6)
        np.testing.assert_allclose(np.asarray(w), np.asarray(jz) * 0.5, rtol=1e-6)
    finally:
        first.close()
        then.close()


def test_a_failed_call_of_one_function_ends_the_job_of_all_and_their_arrays_outlive_it():
    def maybe_sum(v):  # a replica whose shard is large all-reduces; the others do not: a deadlock
        return jax.lax.cond(v[0] > 100, lambda u: jax.lax.psum(u, "x") + u, lambda u: u, v)

    end_shared_jobs()
    keep = rp.jax.jit(scale, num_replicas=4, in_specs=(P("x"), P()), out_specs=P("x"), timeout=30)
    bad = rp.jax.jit(maybe_sum, num_replicas=4, in_specs=P("x"), out_specs=P("x"), timeout=30)
    v = np.ones(8192, np.float32)
    try:
        kept = keep(v, np.float32(2))
        np.testing.assert_array_equal(np.asarray(bad(kept)), v * 2)  # (the other function's array, in place)
        poison = v.copy()
        poison[0] = 1000
        ramp = np.arange(8192, dtype=np.float32)
        sharded = keep(ramp, np.float32(0.01))  # one shard a replica, each under 100
        backend = devices_of(keep)._backend
        with pytest.raises(rp.DeadlockError, match="all-reduce"):  # the failing program's instruction
            bad(poison)
        assert backend._stopped and devices_of(keep)._backend is None
        # The other function's arrays were fetched before the job ended: they go on as host arrays.
        np.testing.assert_array_equal(np.asarray(keep(kept, np.float32(1))), v * 2)  # (a new job)
        assert [s[0] for s in sharded.shards()] == [ramp[i] * np.float32(0.01) for i in (0, 2048, 4096, 6144)]
        np.testing.assert_array_equal(np.asarray(bad(sharded)), ramp * np.float32(0.01))  # joins it
        assert devices_of(bad)._backend is devices_of(keep)._backend
    finally:
        keep.close()
        bad.close()


def test_the_shared_job_ends_with_its_last_function_and_array():
    # (options no other test's function has: `rp.jax.run`'s cached functions keep their job)
    first = rp.jax.jit(scale, num_replicas=4, in_specs=(P("x"), P()), out_specs=P("x"), trace_events=333)
    then = rp.jax.jit(normalize, num_replicas=4, in_specs=P("x"), out_specs=P("x"), trace_events=333)
    x = np.arange(1, 4097, dtype=np.float32)
    y = first(x, np.float32(2))
    z = then(y)
    backend = devices_of(first)._backend
    first.close()  # the job runs on: `then` uses it, and `y` is on it
    np.testing.assert_allclose(np.asarray(then(y)), np.asarray(z), rtol=1e-6)
    then.close()
    np.testing.assert_array_equal(np.asarray(y), x * 2)  # an array keeps the job
    assert not backend._stopped
    del y, z
    gc.collect()
    assert backend._stopped  # the last array gone: the actors went back to the pool


def test_a_closed_function_lets_its_program_go_on_the_actors_and_the_others_run_on():
    end_shared_jobs()
    first = rp.jax.jit(scale, num_replicas=4, in_specs=(P("x"), P()), out_specs=P("x"))
    then = rp.jax.jit(normalize, num_replicas=4, in_specs=P("x"), out_specs=P("x"))
    x = np.arange(1, 4097, dtype=np.float32)
    try:
        y = first(x, np.float32(2))
        z = then(y)
        backend = devices_of(first)._backend
        actor = backend._actors[0]

        def threads_of_programs(host):  # each program's replica runners (parked threads, interpreters)
            return [len(runners) for runners, _ in host._programs]

        assert ray_get(actor.__ray_call__.remote(threads_of_programs)) == [4, 4]
        first.close()
        np.testing.assert_allclose(np.asarray(then(z)), np.asarray(then(np.asarray(z))), rtol=1e-6)
        assert backend.calls["drop_program"] == 1, backend.calls
        for _ in range(200):  # (the drop is an actor call of its own: a threaded actor may answer this one first)
            left = ray_get(actor.__ray_call__.remote(threads_of_programs))
            if left == [0, 4]:
                break
        assert left == [0, 4]
    finally:
        first.close()
        then.close()


def ray_get(ref):
    import ray

    return ray.get(ref, timeout=60)


def test_a_function_called_after_ray_was_restarted_starts_a_new_job():
    import ray

    from replicas.runtime.ray.startup import ensure_ray

    step = rp.jax.jit(scale, num_replicas=4, in_specs=(P("x"), P()), out_specs=P("x"))
    x = np.arange(8, dtype=np.float32)
    try:
        np.testing.assert_array_equal(np.asarray(step(x, np.float32(2))), x * 2)
        old = devices_of(step)._backend
        ray.shutdown()
        ensure_ray()
        np.testing.assert_array_equal(np.asarray(step(x, np.float32(3))), x * 3)
        assert devices_of(step)._backend is not old
    finally:
        step.close()


def test_a_job_whose_actor_stopped_answering_ends_with_the_error_and_its_arrays_lost():
    """The evacuation of a failed job waits a bounded while for an actor: one stopped (SIGSTOP)
    answers nothing, and the call's error comes all the same."""
    import signal

    step = rp.jax.jit(scale, num_replicas=4, in_specs=(P("x"), P()), out_specs=P("x"), timeout=3, trace_events=334)
    x = np.ones(8192, np.float32)
    kept = step(x, np.float32(2))  # 8 KiB shards: kept on the actor
    backend = devices_of(step)._backend
    pid = ray_get(backend._actors[0].__ray_call__.remote(lambda host: os.getpid()))
    os.kill(pid, signal.SIGSTOP)
    try:
        with pytest.raises((rp.ExecutionTimeout, rp.ReplicaFailure)):
            step(x, np.float32(3))
    finally:
        os.kill(pid, signal.SIGCONT)
    with pytest.raises(ProgramError, match="lost with the job"):
        np.asarray(kept)
    np.testing.assert_array_equal(np.asarray(step(x, np.float32(3))), x * 3)  # a new job
    step.close()


def test_two_threads_calling_two_functions_of_one_job_take_turns_and_match_jax():
    import threading

    end_shared_jobs()
    first = rp.jax.jit(scale, num_replicas=4, in_specs=(P("x"), P()), out_specs=P("x"))
    then = rp.jax.jit(normalize, num_replicas=4, in_specs=P("x"), out_specs=P("x"))
    x = np.arange(1, 8193, dtype=np.float32)
    results: dict[str, object] = {}

    def loop(name, step):
        try:
            y = x
            for _ in range(20):
                y = step(y)
            results[name] = np.asarray(y)
        except BaseException as e:  # noqa: BLE001 - reported below
            results[name] = e

    threads = [threading.Thread(target=loop, args=("scale", lambda y: first(y, np.float32(1.01)))),
               threading.Thread(target=loop, args=("normalize", then))]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads)
        want_scale, want_norm = x, x
        for _ in range(20):
            want_scale = on_jax(scale, (P("x"), P()), P("x"))(want_scale, np.float32(1.01))
            want_norm = on_jax(normalize, P("x"), P("x"))(want_norm)
        np.testing.assert_allclose(results["scale"], np.asarray(want_scale), rtol=1e-5)
        np.testing.assert_allclose(results["normalize"], np.asarray(want_norm), rtol=1e-5)
        assert devices_of(first)._backend is devices_of(then)._backend
    finally:
        first.close()
        then.close()
