"""Host callbacks through `rp.jax`: jax.debug.print, jax.debug.callback, pure_callback and
io_callback run the user's function on every replica, in JAX's order, and print one line per
replica; HLO text naming the callback target is a clear error naming rp.jax."""

from __future__ import annotations

import re

import numpy as np
import pytest

import replicas as rp
from replicas.errors import ProgramError

jax = pytest.importorskip("jax")
jnp = jax.numpy

from jax.experimental import io_callback  # noqa: E402
from jax.sharding import Mesh  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

shard_map = getattr(jax, "shard_map", None)
if shard_map is None:  # older jax
    from jax.experimental.shard_map import shard_map

pytestmark = pytest.mark.skipif(len(jax.devices()) < 4, reason="needs --xla_force_host_platform_device_count >= 4")
SPECS = {"in_specs": (P("x"),), "out_specs": P()}
X = np.arange(8, dtype=np.float32)


def jax_answer(f, *args):
    mesh = Mesh(np.array(jax.devices()[:4]), ("x",))
    return np.asarray(jax.jit(shard_map(f, mesh=mesh, **SPECS))(*args))


def test_debug_print_prints_one_prefixed_line_per_replica(capsys: pytest.CaptureFixture[str]) -> None:
    def f(x):
        jax.debug.print("local sum {s}", s=x.sum())
        return jax.lax.psum(x, "x")

    got = rp.jax.run(f, X, num_replicas=4, backend="threads", **SPECS)
    np.testing.assert_array_equal(got, jax_answer(f, X))
    printed = [line for line in capsys.readouterr().out.splitlines() if "local sum" in line]
    mine = sorted(line for line in printed if line.startswith("[replica "))
    assert mine == [f"[replica {r}] local sum {float(2 * r + 2 * r + 1)}" for r in range(4)], printed


def test_pure_callback_and_debug_callback_run_the_users_function_on_every_replica() -> None:
    calls: list[tuple[float, ...]] = []

    def f(x):
        doubled = jax.pure_callback(lambda a: (np.asarray(a) * 2).astype(a.dtype),
                                    jax.ShapeDtypeStruct(x.shape, x.dtype), x)
        jax.debug.callback(lambda a: calls.append(tuple(np.asarray(a).tolist())), doubled)
        return jax.lax.psum(doubled, "x")

    got = rp.jax.run(f, X, num_replicas=4, backend="threads", **SPECS)
    assert sorted(calls) == [(4.0 * r, 4.0 * r + 2) for r in range(4)]
    calls.clear()
    np.testing.assert_array_equal(got, jax_answer(f, X))


def test_ordered_io_callbacks_keep_their_order_on_every_replica() -> None:
    log: list[tuple[int, str]] = []

    def f(x):
        first = io_callback(lambda a: log.append((int(a[0]), "first")) or np.float32(a.sum()),
                            jax.ShapeDtypeStruct((), jnp.float32), x, ordered=True)
        io_callback(lambda a, s: log.append((int(a[0]), f"second {float(s)}")), None, x, first, ordered=True)
        return jax.lax.psum(x * first, "x")

    got = rp.jax.run(f, X, num_replicas=4, backend="threads", **SPECS)
    by_replica = {start: [what for s, what in log if s == start] for start in (0, 2, 4, 6)}
    assert by_replica == {s: ["first", f"second {float(2 * s + 1)}"] for s in (0, 2, 4, 6)}
    log.clear()
    np.testing.assert_array_equal(got, jax_answer(f, X))


def test_hlo_text_with_a_jax_callback_names_rp_jax() -> None:
    text = """HloModule cb, replica_count=2

ENTRY main {
  x = f32[2] parameter(0)
  ROOT y = (f32[2]) custom-call(x), custom_call_target="xla_ffi_python_cpu_callback", backend_config={index = 0 : ui64}
}
"""
    with pytest.raises(ProgramError, match=re.escape("rp.jax.run")):
        rp.run(text, [np.ones(2, np.float32)], backend="threads")


@pytest.mark.ray
def test_a_callback_travels_with_the_program_to_ray_actors(ray_session) -> None:
    def f(x):
        return jax.lax.psum(jax.pure_callback(lambda a: np.sqrt(a), jax.ShapeDtypeStruct(x.shape, x.dtype), x), "x")

    got = rp.jax.run(f, X, num_replicas=4, backend="ray", timeout=120, **SPECS)
    np.testing.assert_allclose(got, jax_answer(f, X), rtol=1e-6)


@pytest.mark.ray
@pytest.mark.parametrize("how", ["run", "jit"])
def test_debug_print_on_ray_reaches_the_drivers_stdout(ray_session, capfd: pytest.CaptureFixture[str],
                                                       how: str) -> None:
    """An actor's stdout is its worker's log: the lines come back to the driver with the job's (or
    the call's) outcome, one per replica and call, prefixed with the replica, each replica's in order."""
    def f(x):
        jax.debug.print("first {s}", s=x.sum())
        jax.debug.print("second {s}", s=x.max())
        return jax.lax.psum(x, "x")

    capfd.readouterr()
    if how == "run":
        got = rp.jax.run(f, X, num_replicas=4, backend="ray", timeout=120, **SPECS)
        calls = 1
    else:
        step = rp.jax.jit(f, num_replicas=4, backend="ray", timeout=120, **SPECS)
        try:
            got = np.asarray(step(X))
            np.asarray(step(X))
            (compiled,) = step._cache.values()
            session, backend = compiled.session.devices, compiled.session.devices._backend
            # The lines came with the doorbell's replies: no Ray call asked for them, but for a call
            # the monitor watched (one that did not end within its poll interval) at its settling.
            assert backend.calls["printed"] == session.watched_calls * len(backend._actors), backend.calls
        finally:
            step.close()
        calls = 2
    np.testing.assert_array_equal(got, jax_answer(f, X))
    out = capfd.readouterr().out.splitlines()
    for r in range(4):
        mine = [line for line in out if line.startswith(f"[replica {r}] ")]
        want = [f"[replica {r}] first {float(4 * r + 1)}", f"[replica {r}] second {float(2 * r + 1)}"]
        assert mine == want * calls, out
