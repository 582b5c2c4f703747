"""Programs JAX compiles run unchanged: single-device jit programs on one replica, and SPMD
(shard_map) programs with num_partitions=P on P replicas, compared with JAX's own answers."""

from __future__ import annotations

import numpy as np
import pytest
from xla_oracle import jax_text, jit_answer

import replicas as rp

jax = pytest.importorskip("jax")
jnp = jax.numpy

from jax.sharding import Mesh  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

try:
    from jax import shard_map
except ImportError:  # older jax
    from jax.experimental.shard_map import shard_map


def compiled_text(f, *args) -> str:
    return jax_text(f, list(args), "compiled")


def lowered_text(f, *args) -> str:
    return jax_text(f, list(args), "lowered")


SINGLE = [
    ("mlp", lambda x, w: jnp.tanh(x @ w).sum(axis=0), [(8, 16), (16, 4)]),
    ("softmax", lambda x: jax.nn.softmax(x, axis=-1), [(4, 10)]),
    ("cumsum", lambda x: jnp.cumsum(x, axis=1), [(3, 17)]),
    ("sort", lambda x: jnp.sort(x, axis=0), [(33, 2)]),
    ("argmax", lambda x: jnp.argmax(x, axis=1), [(5, 9)]),
    ("while", lambda x: jax.lax.fori_loop(0, 7, lambda i, v: v * 1.5 + i, x), [(6,)]),
    ("cond", lambda x: jax.lax.cond(x.sum() > 0, jnp.sin, jnp.cos, x), [(6,)]),
    ("gather_scatter", lambda x: x.at[jnp.array([0, 2, 2])].add(x[jnp.array([1, 1, 0])]), [(4, 3)]),
    ("conv", lambda x, k: jax.lax.conv_general_dilated(x, k, (1, 1), "SAME"), [(2, 3, 9, 9), (4, 3, 3, 3)]),
    ("reduce_window", lambda x: jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 2, 2), (1, 2, 2), "VALID"),
     [(2, 8, 8)]),
]


@pytest.mark.parametrize("form", ["lowered", "compiled"])
@pytest.mark.parametrize("name,f,shapes", SINGLE, ids=[s[0] for s in SINGLE])
def test_jax_program_runs_unchanged_on_one_replica(name, f, shapes, form):
    rng = np.random.default_rng(0)
    args = [rng.normal(size=s).astype(np.float32) for s in shapes]
    text = (lowered_text if form == "lowered" else compiled_text)(f, *args)
    module = rp.parse_hlo(text)
    got = rp.run(module, args, num_replicas=1, backend="threads")[0]
    (want,) = jit_answer(f, args)
    got = got[0] if isinstance(got, tuple) and len(got) == 1 else got
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=2e-5)


def _mesh(n: int) -> Mesh:
    return Mesh(np.array(jax.devices()[:n]), ("x",))


SPMD = [
    ("psum", lambda x: jax.lax.psum(x, "x"), P("x"), P()),
    ("all_gather", lambda x: jax.lax.all_gather(x, "x", tiled=True), P("x"), P()),
    ("ppermute", lambda x: jax.lax.ppermute(x, "x", [(i, (i + 1) % 4) for i in range(4)]), P("x"), P("x")),
    ("psum_scatter", lambda x: jax.lax.psum_scatter(x, "x", tiled=True), P(), P("x")),
    ("all_to_all", lambda x: jax.lax.all_to_all(x, "x", 1, 1, tiled=True), P("x"), P("x")),
    ("axis_index", lambda x: x + jax.lax.axis_index("x").astype(x.dtype), P("x"), P("x")),
]


@pytest.mark.parametrize("name,body,in_spec,out_spec", SPMD, ids=[s[0] for s in SPMD])
def test_shard_map_program_runs_on_partitions_as_replicas(name, body, in_spec, out_spec):
    if len(jax.devices()) < 4:
        pytest.skip("needs --xla_force_host_platform_device_count >= 4")
    mesh = _mesh(4)
    f = shard_map(body, mesh=mesh, in_specs=(in_spec,), out_specs=out_spec, check_vma=False) \
        if "check_vma" in shard_map.__code__.co_varnames else \
        shard_map(body, mesh=mesh, in_specs=(in_spec,), out_specs=out_spec)
    x = np.arange(32, dtype=np.float32).reshape(8, 4)
    (want,) = jit_answer(f, [x])
    text = compiled_text(f, x)
    module = rp.parse_hlo(text)
    assert module.num_partitions == 4
    # Each partition's argument is its shard (in_spec), as XLA's SPMD program expects.
    shards = np.split(x, 4) if in_spec == P("x") else [x] * 4
    results = rp.run(module, [[s] for s in shards], num_replicas=4, backend="threads")
    results = [r[0] if isinstance(r, tuple) and len(r) == 1 else r for r in results]
    got = np.concatenate(results) if out_spec == P("x") else results[0]
    np.testing.assert_allclose(got, want, rtol=1e-6)
