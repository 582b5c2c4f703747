"""Arguments as JAX accepts them: 0-d arrays, Python scalars, typed PRNG keys of every built-in
impl, JAX arrays with any sharding, and JAX's `Lowered` and `Compiled` objects with global arguments."""

from __future__ import annotations

import numpy as np
import pytest

import replicas as rp

jax = pytest.importorskip("jax")
jnp = jax.numpy

from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

pytestmark = pytest.mark.skipif(len(jax.devices()) < 8, reason="needs --xla_force_host_platform_device_count >= 8")

MESH = Mesh(np.array(jax.devices()[:4]), ("x",))
MESH_2D = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("a", "b"))
X = np.arange(32, dtype=np.float32).reshape(8, 4) / 8
scale = jax.jit(lambda x, s: x * s, in_shardings=(NamedSharding(MESH, P("x")), NamedSharding(MESH, P())))


def same(got, want) -> None:
    got_leaves, want_leaves = jax.tree.leaves(got), jax.tree.leaves(want)
    assert len(got_leaves) == len(want_leaves)
    for g, w in zip(got_leaves, want_leaves):
        w = np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-6)


@pytest.mark.parametrize("s", [np.float32(3), np.array(3, np.float32), 3.0, 3],
                         ids=["numpy_scalar", "0d_array", "python_float", "python_int"])
def test_scalars_and_0d_arrays(s) -> None:
    same(rp.jax.run(scale, X, s, backend="threads"), scale(X, s))
    shard_mapped = rp.jax.run(lambda x, s: x * s, X, s, num_replicas=4, in_specs=(P("x"), P()), out_specs=P("x"),
                              backend="threads")
    same(shard_mapped, jax.jit(lambda x, s: x * s)(X, s))


@pytest.mark.parametrize("impl", ["threefry2x32", "rbg", "unsafe_rbg"])
def test_typed_prng_keys_of_each_impl(impl: str) -> None:
    key = jax.random.key(7, impl=impl)
    noisy = lambda k, x: x + jax.random.normal(k, x.shape)  # noqa: E731
    same(rp.jax.run(noisy, key, X, backend="threads"), jax.jit(noisy)(key, X))
    keys = jax.random.split(key, 4)
    per_replica = lambda k, x: x + jax.random.uniform(k[0], x.shape)  # noqa: E731
    got = rp.jax.run(per_replica, keys, X, num_replicas=4, in_specs=(P("x"), P("x")), out_specs=P("x"),
                     backend="threads")
    want = jax.jit(jax.shard_map(per_replica, mesh=MESH, in_specs=(P("x"), P("x")), out_specs=P("x")))(keys, X)
    same(got, want)
    # A key the program returns comes back as its key data.
    split = rp.jax.run(lambda k: jax.random.split(k, 3), key, backend="threads")
    np.testing.assert_array_equal(split, jax.random.key_data(jax.jit(lambda k: jax.random.split(k, 3))(key)))


@pytest.mark.parametrize("placement", ["one_device", "same_mesh", "other_mesh_2d"])
def test_jax_arrays_with_any_sharding(placement: str) -> None:
    x = {"one_device": jax.device_put(X, jax.devices()[3]),
         "same_mesh": jax.device_put(X, NamedSharding(MESH, P("x"))),
         "other_mesh_2d": jax.device_put(X, NamedSharding(MESH_2D, P("b", "a")))}[placement]
    got = rp.jax.run(lambda v: jax.lax.psum(jnp.tanh(v).sum(0), "x"), x, num_replicas=4, in_specs=(P("x"),),
                     out_specs=P(), backend="threads")
    np.testing.assert_allclose(got, np.tanh(X).sum(0), rtol=1e-6)
    same(rp.jax.run(lambda v: v * 2, x, backend="threads"), X * 2)  # partitioned as the array is
    if placement == "same_mesh":  # JAX too refuses an array committed elsewhere than in_shardings
        same(rp.jax.run(scale, x, 2.0, backend="threads"), scale(x, 2.0))


def test_the_lowered_object_takes_global_arguments_like_its_text() -> None:
    lowered = scale.lower(X, np.float32(2))
    results = rp.run(lowered, [X, np.float32(2)], backend="threads")
    for r in results:
        same(r, scale(X, np.float32(2)))
    text = rp.run(lowered.as_text(dialect="hlo"), [X, np.float32(2)], backend="threads")
    same(results, text)


def _matmul_1d():
    return jax.jit(lambda x, w: (jnp.tanh(x @ w), jax.numpy.sum(x)),
                   in_shardings=(NamedSharding(MESH, P("x")), NamedSharding(MESH, P())))


def _matmul_2d():
    return jax.jit(lambda x, w: jnp.tanh(x @ w).T,
                   in_shardings=(NamedSharding(MESH_2D, P("a", "b")), NamedSharding(MESH_2D, P("b", None))),
                   out_shardings=NamedSharding(MESH_2D, P("b", "a")))


@pytest.mark.parametrize("make", [_matmul_1d, _matmul_2d], ids=["1d_mesh", "2d_mesh"])
def test_the_compiled_object_takes_global_arguments_like_the_lowered_one(make) -> None:
    f = make()
    w = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)
    compiled = f.lower(X, w).compile()
    assert "num_partitions=" in compiled.as_text()  # a partitioned program: shards inside, globals outside
    want = f(X, w)
    results = rp.run(compiled, [X, w], backend="threads")
    assert len(results) == compiled.input_shardings[0][0].mesh.devices.size  # one replica per partition
    lowered = rp.run(f.lower(X, w), [X, w], backend="threads")
    for r in [*results, *lowered]:  # the partitioned matmul sums in another order than the lowered one
        for g, v in zip(jax.tree.leaves(r), jax.tree.leaves(want), strict=True):
            assert g.shape == np.shape(v) and g.dtype == v.dtype
            np.testing.assert_allclose(g, np.asarray(v), rtol=1e-5, atol=1e-6)
    # rp.jax.run takes it too, giving the pytree compiled(*args) returns
    for g, v in zip(jax.tree.leaves(rp.jax.run(compiled, X, w, backend="threads")), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, np.asarray(v), rtol=1e-5, atol=1e-6)
    assert jax.tree.structure(rp.jax.run(compiled, X, w, backend="threads")) == jax.tree.structure(want)
