"""`jax.jit` with `NamedSharding`s (GSPMD: JAX partitions, no `shard_map`) on 1-D, 2-D and 3-D
meshes: the partitioner's collectives (all-reduce, all-gather, all-to-all, collective-permute, in
XLA's mesh form of replica groups) run, and `rp.jax.run` returns what `jax.jit(f)(*args)` does."""

from __future__ import annotations

import re

import numpy as np
import pytest

import replicas as rp

jax = pytest.importorskip("jax")
jnp = jax.numpy

from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

pytestmark = pytest.mark.skipif(len(jax.devices()) < 8, reason="needs --xla_force_host_platform_device_count >= 8")


def mesh_of(*shape: int) -> Mesh:
    return Mesh(np.array(jax.devices()[:int(np.prod(shape))]).reshape(shape), ("x", "y", "z")[:len(shape)])


M1, M2, M3 = mesh_of(8), mesh_of(4, 2), mesh_of(2, 2, 2)
rng = np.random.default_rng(3)
X = rng.normal(size=(8, 16)).astype(np.float32)
W = rng.normal(size=(16, 8)).astype(np.float32)
Y = rng.normal(size=(8, 8)).astype(np.float32)


def S(mesh: Mesh, *spec) -> NamedSharding:  # noqa: N802 - reads like JAX's own spelling
    return NamedSharding(mesh, P(*spec))


def loss(w, x, y):
    return ((jnp.tanh(x @ w) - y) ** 2).mean()


def step(w, x, y):
    value, grad = jax.value_and_grad(loss)(w, x, y)
    return w - 0.1 * grad, value


def reshard_2d(x):
    y = jax.lax.with_sharding_constraint(x * 2, S(M2, None, "x"))
    return jax.lax.with_sharding_constraint(jnp.sin(y) + 1, S(M2, "y", None))


def reshard_3d(x):
    return jax.lax.with_sharding_constraint(x.T, S(M3, ("x", "y", "z"))).cumsum(0)


CASES = {
    "1d_sum": (lambda: jax.jit(lambda x: x.sum(0), in_shardings=S(M1, "x")), (X,)),
    "1d_contracting_matmul": (lambda: jax.jit(lambda x, w: x @ w, in_shardings=(S(M1, None, "x"), S(M1, "x", None)),
                                              out_shardings=S(M1)), (X, W)),
    "1d_sort_along_the_sharded_axis": (lambda: jax.jit(lambda x: jnp.sort(x, axis=0), in_shardings=S(M1, "x")), (X,)),
    "2d_matmul": (lambda: jax.jit(lambda x, w: jnp.tanh(x @ w), in_shardings=(S(M2, "x", "y"), S(M2, "y", None)),
                                  out_shardings=S(M2, "x", None)), (X, W)),
    "3d_matmul_sum": (lambda: jax.jit(lambda x, w: (x @ w).sum(),
                                      in_shardings=(S(M3, ("x", "z"), "y"), S(M3, "y", None))), (X, W)),
    "1d_training_step": (lambda: jax.jit(step, in_shardings=(S(M1), S(M1, "x"), S(M1, "x")),
                                         out_shardings=(S(M1), S(M1))), (W, X, Y)),
    "2d_training_step": (lambda: jax.jit(step, in_shardings=(S(M2, None, "y"), S(M2, "x"), S(M2, "x")),
                                         out_shardings=(S(M2, None, "y"), S(M2))), (W, X, Y)),
    "3d_training_step": (lambda: jax.jit(step, in_shardings=(S(M3, "z", "y"), S(M3, "x"), S(M3, "x")),
                                         out_shardings=(S(M3, "z", "y"), S(M3))), (W, X, Y)),
    "2d_with_sharding_constraint": (lambda: jax.jit(reshard_2d, in_shardings=S(M2, "x", "y"),
                                                    out_shardings=S(M2, "y")), (X,)),
    "3d_with_sharding_constraint": (lambda: jax.jit(reshard_3d, in_shardings=S(M3, "x", ("y", "z"))), (X,)),
}


@pytest.mark.parametrize("name", CASES)
def test_gspmd_jit_equals_jax(name: str) -> None:
    make, args = CASES[name]
    f = make()
    text = f.lower(*args).compile().as_text()
    assert re.search(r"(all-reduce|all-gather|all-to-all|collective-permute)\(", text), "no collective to test"
    got = rp.jax.run(f, *args, backend="threads", timeout=60)
    want = f(*args)
    got_leaves, want_leaves = jax.tree.leaves(got), jax.tree.leaves(want)
    assert len(got_leaves) == len(want_leaves)
    for g, w in zip(got_leaves, want_leaves):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, np.asarray(w), rtol=1e-5, atol=1e-6)


def test_the_partitioned_text_uses_every_mesh_form_the_tests_need() -> None:
    """Guards the cases above: JAX writes the mesh form, with a device order on the 3-D mesh."""
    texts = [CASES[n][0]().lower(*CASES[n][1]).compile().as_text() for n in ("1d_sum", "3d_with_sharding_constraint")]
    assert "replica_groups=mesh[" in texts[0]
    assert "device_ids=(" in texts[1] and "collective-permute(" in texts[1]
