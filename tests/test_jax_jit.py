"""`rp.jax.jit`: compiled once per argument signature, the job kept between calls, outputs kept on
the replicas as `rp.Array`s; a training loop gives what the same loop gives under JAX."""

from __future__ import annotations

import importlib
import os
import select

import numpy as np
import pytest

import replicas as rp
from replicas.errors import ProgramError
from replicas.runtime.session import end_shared_jobs

jax = pytest.importorskip("jax")
jnp = jax.numpy

from jax.sharding import Mesh  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

shard_map = getattr(jax, "shard_map", None)
if shard_map is None:  # older jax
    from jax.experimental.shard_map import shard_map

pytestmark = pytest.mark.skipif(len(jax.devices()) < 4, reason="needs --xla_force_host_platform_device_count >= 4")

rng = np.random.default_rng(0)
X = rng.normal(size=(16, 8)).astype(np.float32)
Y = rng.normal(size=(16, 2)).astype(np.float32)
PARAMS = {"w1": rng.normal(size=(8, 16)).astype(np.float32) * 0.3, "b1": np.zeros(16, np.float32),
          "w2": rng.normal(size=(16, 2)).astype(np.float32) * 0.3}
SPECS = dict(in_specs=(P(), P("x"), P("x")), out_specs=(P(), P()))


def train_step(params, x, y):
    def loss_fn(p):
        h = jnp.tanh(x @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"] - y) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    grads, loss = jax.lax.pmean((grads, loss), "x")
    return jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads), loss


def jax_loop(steps: int):
    mesh = Mesh(np.array(jax.devices()[:4]), ("x",))
    step = jax.jit(shard_map(train_step, mesh=mesh, **SPECS))
    params, losses = PARAMS, []
    for _ in range(steps):
        params, loss = step(params, X, Y)
        losses.append(float(loss))
    return params, losses


def replicas_loop(step, steps: int):
    params, losses = PARAMS, []
    for _ in range(steps):
        params, loss = step(params, X, Y)
        losses.append(float(loss))
    return params, losses


def check_loop(backend: str, steps: int) -> None:
    end_shared_jobs()  # (the call counts below are a job's of its own)
    step = rp.jax.jit(train_step, num_replicas=4, backend=backend, **SPECS)
    params, losses = replicas_loop(step, steps)
    want_params, want_losses = jax_loop(steps)
    assert all(isinstance(p, rp.Array) for p in jax.tree_util.tree_leaves(params))
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
    for k in PARAMS:
        np.testing.assert_allclose(np.asarray(params[k]), np.asarray(want_params[k]), rtol=1e-5, atol=1e-6)
    # numpy arguments on the first step, the replicas' own arrays on the next: one compile
    assert step.cache_size() == 1
    if backend == "ray":  # every step rang the doorbell: no actor call
        calls = session_of(step).devices._backend.calls
        assert calls["doorbell"] == steps and calls["call"] == 0, calls
    step.close()


def session_of(step):
    return next(iter(step._cache.values())).session  # (a function's signatures share its job's devices)


def test_training_loop_on_threads_matches_jax():
    check_loop("threads", 6)


@pytest.mark.usefixtures("ray_session")
def test_training_loop_on_ray_matches_jax():
    check_loop("ray", 4)


def test_resident_arrays_are_the_replicas_shards():
    step = rp.jax.jit(lambda v: v * 2, num_replicas=4, in_specs=P("x"), out_specs=P("x"), backend="threads")
    v = np.arange(8, dtype=np.float32)
    a = step(v)
    assert isinstance(a, rp.Array) and a.shape == (8,) and a.dtype == np.float32
    assert [s.tolist() for s in a.shards()] == [[0, 2], [4, 6], [8, 10], [12, 14]]
    b = step(a)  # the shards go back to where they are: nothing gathered
    assert b.block_until_ready() is b and b[1:3].tolist() == [4, 8] and b[-1] == v[-1] * 4
    np.testing.assert_array_equal(np.asarray(b), v * 4)
    assert step.cache_size() == 1
    assert float(step(np.float32([1, 1, 1, 1, 1, 1, 1, 1])).value()[3]) == 2.0


def test_an_array_of_one_jitted_function_passed_to_another_matches_jax():
    check_passing("threads")


@pytest.mark.usefixtures("ray_session")
def test_an_array_of_one_jitted_function_passed_to_another_on_ray_matches_jax():
    check_passing("ray")


def check_passing(backend: str) -> None:
    """Another function is another job: its argument is gathered from where the first left it
    (on Ray, MiBs of shards through the doorbell's reply slots) and split by the second's shardings."""
    mesh = Mesh(np.array(jax.devices()[:4]), ("x",))

    def scale(x, s):
        return x * s, jax.lax.psum(jnp.sum(x), "x")

    def shift(x, t):
        return x + t, jnp.sum(x) * 2

    x = rng.normal(size=(1 << 19,)).astype(np.float32)  # 2 MiB: each replica's shard 512 KiB
    first = rp.jax.jit(scale, num_replicas=4, in_specs=(P("x"), P()), out_specs=(P("x"), P()), backend=backend)
    then = rp.jax.jit(shift, num_replicas=4, in_specs=(P(), P()), out_specs=(P(), P()), backend=backend)
    want_first = jax.jit(shard_map(scale, mesh=mesh, in_specs=(P("x"), P()), out_specs=(P("x"), P())))
    want_then = jax.jit(shard_map(shift, mesh=mesh, in_specs=(P(), P()), out_specs=(P(), P())))
    try:
        y, total = first(x, np.float32(3))
        z, twice = then(y, total)  # sharded -> replicated, and a replicated scalar
        y2, _ = first(z, np.float32(0.5))  # replicated -> sharded
        jy, jtotal = want_first(x, np.float32(3))
        jz, jtwice = want_then(jy, jtotal)
        jy2, _ = want_first(jz, np.float32(0.5))
        np.testing.assert_allclose(np.asarray(z), np.asarray(jz), rtol=1e-6)
        np.testing.assert_allclose(float(twice), float(jtwice), rtol=1e-4)
        np.testing.assert_allclose(np.asarray(y2), np.asarray(jy2), rtol=1e-6)
        z3, _ = then(z, total)  # its own output: where it is
        np.testing.assert_allclose(np.asarray(z3), np.asarray(jz) + float(jtotal), rtol=1e-6)
        if backend == "ray":  # every shard came back through a doorbell, none by an actor call
            for c in [*first._cache.values(), *then._cache.values()]:
                calls = c.session.devices._backend.calls
                assert calls["doorbell_fetch"] > 0 and calls["fetch"] == 0, calls
    finally:
        first.close()
        then.close()


def test_a_new_signature_compiles_again_and_static_arguments_are_keys():
    def scaled(v, k):
        return v * k

    step = rp.jax.jit(scaled, num_replicas=4, in_specs=P("x"), out_specs=P("x"), static_argnums=(1,),
                      backend="threads")
    v = np.arange(8, dtype=np.float32)
    np.testing.assert_array_equal(np.asarray(step(v, 2)), v * 2)
    np.testing.assert_array_equal(np.asarray(step(v, 3)), v * 3)
    np.testing.assert_array_equal(np.asarray(step(v, 2)), v * 2)
    assert step.cache_size() == 2
    np.testing.assert_array_equal(np.asarray(step(np.arange(16, dtype=np.float32), 2)), np.arange(16) * 2)
    assert step.cache_size() == 3
    with pytest.raises(ProgramError, match="hashable"):
        step(v, [2])


def test_signatures_beyond_the_cache_bound_compile_again_and_the_one_called_all_along_stays(monkeypatch):
    # `replicas.jax.jit` the attribute is the function: the module by its name
    monkeypatch.setattr(importlib.import_module("replicas.jax.jit"), "CACHE_SIZE", 2)
    traced = []

    def double(v):
        traced.append(v.shape)  # once per compile
        return v * 2

    step = rp.jax.jit(double, backend="threads")
    a = np.arange(4, dtype=np.float32)
    for n in (5, 6, 7):  # other signatures come and go between calls of `a`'s
        for _ in range(2):  # the second call of a signature takes the quick path
            np.testing.assert_array_equal(np.asarray(step(a)), a * 2)
            np.testing.assert_array_equal(np.asarray(step(np.ones(n, np.float32))), np.full(n, 2))
    assert traced.count((4,)) == 1 and step.cache_size() == 2
    np.testing.assert_array_equal(np.asarray(step(np.ones(5, np.float32))), np.full(5, 2))  # evicted: again
    np.testing.assert_array_equal(np.asarray(step(np.ones(5, np.float32))), np.full(5, 2))
    assert traced.count((5,)) == 2 and step.cache_size() == 2
    np.testing.assert_array_equal(np.asarray(step(np.arange(4, dtype=np.int32))), np.arange(4) * 2)  # a dtype
    np.testing.assert_array_equal(np.asarray(step(a)), a * 2)
    assert traced == [(4,), (5,), (6,), (7,), (5,), (4,), (4,)]
    step.close()


def test_arguments_in_tuples_and_lists_are_keyed_by_their_tree():
    def f(p, x):
        return sum(jnp.sum(leaf) for leaf in jax.tree_util.tree_leaves(p)) * x

    step = rp.jax.jit(f, backend="threads")
    a, b, x = (np.full(3, v, np.float32) for v in (1, 2, 3))
    for tree, compiles in [((a, b), 1), ((a, b), 1), ([a, b], 2), ((a, (b,)), 3), ((a, [b]), 4), ((a, (b,)), 4),
                           ((a, b, a), 5), ((a, b[:2]), 6), ((a, b.astype(np.int32)), 7), ((a, b), 7)]:
        np.testing.assert_array_equal(np.asarray(step(tree, x)), np.asarray(jax.jit(f)(tree, x)))
        assert step.cache_size() == compiles, (tree, compiles)
    with pytest.raises(ProgramError, match="deleted"):
        dead = step((a, b), x)
        dead.delete()
        step((a, b), dead)
    step.close()


def test_a_donated_array_is_deleted_by_the_call():
    step = rp.jax.jit(lambda v: v + 1, num_replicas=4, in_specs=P("x"), out_specs=P("x"), donate_argnums=0,
                      backend="threads")
    a = step(np.zeros(8, np.float32))
    b = step(a)
    assert a.is_deleted() and not b.is_deleted()
    np.testing.assert_array_equal(np.asarray(b), np.full(8, 2, np.float32))
    with pytest.raises(ProgramError, match="deleted"):
        np.asarray(a)
    with pytest.raises(ProgramError, match="deleted"):
        step(a)


def check_deadlock_ends_the_job(backend: str) -> None:
    def maybe_sum(v):  # a replica whose shard is large all-reduces; the others do not: a deadlock
        return jax.lax.cond(v[0] > 100, lambda u: jax.lax.psum(u, "x") + u, lambda u: u, v)

    step = rp.jax.jit(maybe_sum, num_replicas=4, in_specs=P("x"), out_specs=P("x"), backend=backend, timeout=30)
    v = np.ones(8192, np.float32)  # shards larger than what comes back with a call: they stay on the replicas
    kept = step(v)
    np.testing.assert_array_equal(np.asarray(step(kept)), v)
    bad = v.copy()
    bad[0] = 1000
    with pytest.raises(rp.DeadlockError):
        step(bad)
    np.testing.assert_array_equal(np.asarray(step(v * 2)), v * 2)
    assert step.cache_size() == 1
    # Its shards were on the replicas of the job that ended: fetched before it ended, they live on.
    np.testing.assert_array_equal(np.asarray(step(step(kept))), v)
    step.close()


def test_a_deadlocked_call_is_reported_and_the_next_call_starts_a_new_job():
    check_deadlock_ends_the_job("threads")


@pytest.mark.usefixtures("ray_session")
def test_a_deadlocked_call_on_ray_is_reported_and_its_kept_arrays_outlive_the_job():
    check_deadlock_ends_the_job("ray")


@pytest.mark.usefixtures("ray_session")
def test_an_actor_killed_between_calls_fails_the_call_naming_its_replicas():
    import ray

    step = rp.jax.jit(lambda v: jax.lax.psum(v, "x"), num_replicas=4, in_specs=P("x"), out_specs=P("x"), timeout=60)
    v = np.ones(8, np.float32)
    np.testing.assert_array_equal(np.asarray(step(v)), np.full(8, 4, np.float32))
    kept = step(np.ones(8192, np.float32))  # its shards stay on the actor about to die (another signature)
    backend = session_of(step).devices._backend
    victim = backend._actors[-1]
    pid = ray.get(victim.__ray_call__.remote(lambda host: os.getpid()))
    gone = os.pidfd_open(pid)  # readable once the process has exited
    ray.kill(victim, no_restart=True)
    try:
        assert select.select([gone], [], [], 60)[0], "the killed actor's process still runs after 60 s"
    finally:
        os.close(gone)
    with pytest.raises(rp.ReplicaFailure, match="replica"):
        step(v)
    with pytest.raises(ProgramError, match="lost with the job"):
        np.asarray(kept)
    np.testing.assert_array_equal(np.asarray(step(v)), np.full(8, 4, np.float32))  # a new job, new actors
    step.close()


# -- what a one-shot job offers, per call ------------------------------------------------------------

def test_progress_and_traces_of_a_jitted_function(tmp_path):
    path = tmp_path / "trace.json"
    step = rp.jax.jit(lambda v: jax.lax.psum(v, "x"), num_replicas=4, in_specs=P("x"), out_specs=P("x"),
                      backend="threads", trace=str(path))
    with pytest.raises(ProgramError, match="not been called"):
        step.progress()
    v = np.ones(8, np.float32)
    step(step(v))
    progress = step.progress()
    assert progress.finished == 4 and progress.running == 0 and progress.collective >= 2, progress
    step.write_trace(str(tmp_path / "now.json"))
    assert "all-reduce" in (tmp_path / "now.json").read_text()
    assert not path.exists()  # written when the job ends
    step.close()
    assert "all-reduce" in path.read_text()
    with pytest.raises(ProgramError, match="does not exist"):
        step.write_trace(str(tmp_path / "missing" / "t.json"))


def test_a_host_feed_is_refused_naming_its_instruction():
    from replicas.jax.jit import _refuse_host_feeds

    fed = rp.parse_hlo("""HloModule fed
ENTRY main {
  tok = token[] after-all()
  in = (f32[2], token[]) infeed(tok)
  ROOT x = f32[2] get-tuple-element(in), index=0
}
""")
    with pytest.raises(ProgramError, match=r"%in \(infeed\).*rp.launch"):
        _refuse_host_feeds(fed)


def interrupted_while_watched(step, args, *, when=lambda: True):
    """Call `step(*args)`; Ctrl-C (`_thread.interrupt_main`) once the call is watched by the
    monitor (the main thread in job.py's `_wait`) and `when()` holds. The call must raise
    KeyboardInterrupt."""
    import _thread
    import gc
    import sys
    import threading

    def watched() -> bool:
        frame = sys._current_frames().get(threading.main_thread().ident)
        while frame is not None:
            if frame.f_code.co_name == "_wait" and frame.f_code.co_filename.endswith("job.py"):
                return True
            frame = frame.f_back
        return False

    def interrupt() -> None:
        tick = threading.Event()
        for _ in range(1200):  # 60 s
            if watched() and when():
                break
            tick.wait(0.05)
        _thread.interrupt_main()  # (after 60 s anyway: the test then fails instead of hanging)

    threading.Thread(target=interrupt, daemon=True).start()
    gc.disable()  # a gc callback (JAX registers one) would swallow an interrupt raised while it runs
    try:
        with pytest.raises(KeyboardInterrupt):
            step(*args)
    finally:
        gc.enable()


def test_ctrl_c_ends_a_watched_call_and_the_next_call_starts_a_new_job():
    import threading

    release = threading.Event()

    def held(v):  # the host callback waits until the test lets it go: the call runs on meanwhile
        release.wait(60)
        return v

    def step_fn(v):
        return jax.pure_callback(held, jax.ShapeDtypeStruct(v.shape, v.dtype), v) * 2

    step = rp.jax.jit(step_fn, num_replicas=4, in_specs=P("x"), out_specs=P("x"), backend="threads", timeout=None)
    v = np.ones(8, np.float32)
    release.set()
    np.testing.assert_array_equal(np.asarray(step(v)), v * 2)
    job = session_of(step).devices.job
    release.clear()
    try:
        interrupted_while_watched(step, (v,), when=lambda: step.progress().running == 4)
    finally:
        release.set()
    assert session_of(step).devices._backend is None  # the interrupted call ended its job
    np.testing.assert_array_equal(np.asarray(step(v)), v * 2)
    assert session_of(step).devices.job == job + 1
    step.close()
    from replicas.jax.callbacks import _bound

    _bound.clear()  # its callback holds a lock: a later Ray launch could not ship the registry


@pytest.mark.usefixtures("ray_session")
def test_ctrl_c_ends_a_long_call_on_ray_and_progress_shows_it_running():
    def spin(v):  # a long loop: the monitor watches the call
        return jax.lax.fori_loop(0, 1 << 30, lambda i, u: u * 0.5 + 1.0, v)

    step = rp.jax.jit(spin, num_replicas=4, in_specs=P("x"), out_specs=P("x"), timeout=None)
    seen = []

    def running() -> bool:  # (its replicas may run batched: one leader running, the others waiting for it)
        progress = step.progress()
        seen.append(progress)
        return progress.running >= 1 and progress.finished == 0

    interrupted_while_watched(step, (np.ones(8, np.float32),), when=running)
    assert seen[-1].running >= 1 and seen[-1].finished == 0 and seen[-1].elapsed > 0, seen[-1]
    assert session_of(step).devices._backend is None
    step.close()
