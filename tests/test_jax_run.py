"""`rp.jax.run`: JAX functions run on N replicas and return exactly what JAX returns; JAX's lowered
SPMD text (Shardy and GSPMD markers) runs through `rp.run` too."""

from __future__ import annotations

import numpy as np
import pytest

import replicas as rp
from replicas.errors import ProgramError

jax = pytest.importorskip("jax")
jnp = jax.numpy

from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

shard_map = getattr(jax, "shard_map", None)
if shard_map is None:  # older jax
    from jax.experimental.shard_map import shard_map

pytestmark = pytest.mark.skipif(len(jax.devices()) < 4, reason="needs --xla_force_host_platform_device_count >= 4")


def mesh_of(*shape: int, names: tuple[str, ...] = ("x", "y")) -> Mesh:
    n = int(np.prod(shape))
    return Mesh(np.array(jax.devices()[:n]).reshape(shape), names[:len(shape)])


def assert_same(got, want) -> None:
    got_leaves, want_leaves = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
    assert len(got_leaves) == len(want_leaves)
    for g, w in zip(got_leaves, want_leaves):
        w = np.asarray(w)
        assert isinstance(g, np.ndarray) and g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


rng = np.random.default_rng(0)
X = rng.normal(size=(8, 4)).astype(np.float32)
W = rng.normal(size=(4, 6)).astype(np.float32)


def test_single_replica_plain_function() -> None:
    f = lambda x, w: {"h": jnp.tanh(x @ w), "n": (x ** 2).sum()}  # noqa: E731
    assert_same(rp.jax.run(f, X, W, backend="threads"), jax.jit(f)(X, W))


def test_data_parallel_mean_over_replicas() -> None:
    def f(x, w):
        return jax.lax.pmean(jnp.tanh(x @ w).sum(axis=0), "x")

    got = rp.jax.run(f, X, W, num_replicas=4, in_specs=(P("x"), P()), out_specs=P(), backend="threads")
    want = jax.jit(shard_map(f, mesh=mesh_of(4, names=("x",)), in_specs=(P("x"), P()), out_specs=P()))(X, W)
    assert_same(got, want)


def test_tensor_parallel_on_a_2d_mesh_shard_map_and_gspmd() -> None:
    mesh = mesh_of(2, 2)

    def body(x, w):
        return x @ w, jax.lax.psum(w, "y")

    specs = {"in_specs": (P("x", None), P(None, "y")), "out_specs": (P("x", "y"), P())}
    want = jax.jit(shard_map(body, mesh=mesh, **specs))(X, W)
    assert_same(rp.jax.run(body, X, W, mesh=mesh, backend="threads", **specs), want)
    # Automatic partitioning: a jit with input shardings, partitioned by JAX.
    g = jax.jit(lambda x, w: jnp.tanh(x @ w),
                in_shardings=(NamedSharding(mesh, P("x", None)), NamedSharding(mesh, P(None, "y"))))
    assert_same(rp.jax.run(g, X, W, backend="threads"), g(X, W))


@pytest.mark.parametrize("name,body,in_spec,out_spec", [
    ("all_to_all", lambda x: jax.lax.all_to_all(x, "x", 1, 1, tiled=True), P("x"), P("x")),
    ("ppermute", lambda x: jax.lax.ppermute(x, "x", [(i, (i + 1) % 4) for i in range(4)]), P("x"), P("x")),
    ("all_gather", lambda x: jax.lax.all_gather(x, "x", tiled=True), P("x"), P("x")),
])
def test_collectives_match_jax(name, body, in_spec, out_spec) -> None:
    x = np.arange(64, dtype=np.int32).reshape(16, 4)
    got = rp.jax.run(body, x, num_replicas=4, in_specs=(in_spec,), out_specs=out_spec, backend="threads")
    want = jax.jit(shard_map(body, mesh=mesh_of(4, names=("x",)), in_specs=(in_spec,), out_specs=out_spec))(x)
    np.testing.assert_array_equal(got, np.asarray(want))


def sgd(x, y, w):
    def loss(w):
        return ((jnp.tanh(x @ w) - y) ** 2).mean()

    def step(i, w):
        return w - 0.1 * jax.lax.pmean(jax.grad(loss)(w), "x")

    return jax.lax.fori_loop(0, 5, step, w)


@pytest.mark.parametrize("backend", ["threads", pytest.param("ray", marks=pytest.mark.ray)])
def test_training_loop_in_fori_loop_on_both_backends(backend: str, request: pytest.FixtureRequest) -> None:
    if backend == "ray":
        request.getfixturevalue("ray_session")
    y = rng.normal(size=(8, 6)).astype(np.float32)
    specs = {"in_specs": (P("x"), P("x"), P()), "out_specs": P()}
    got = rp.jax.run(sgd, X, y, W, num_replicas=4, backend=backend, timeout=120, **specs)
    want = jax.jit(shard_map(sgd, mesh=mesh_of(4, names=("x",)), **specs))(X, y, W)
    assert_same(got, want)


def test_decorator_form() -> None:
    @rp.jax.replicated(4, in_specs=(P("x"),), out_specs=P("x"), backend="threads")
    def shifted(x):
        return x + jax.lax.axis_index("x").astype(x.dtype)

    np.testing.assert_array_equal(shifted(np.zeros(8, np.float32)), np.repeat(np.arange(4, dtype=np.float32), 2))


@pytest.mark.parametrize("shardy", [True, False], ids=["shardy", "gspmd"])
def test_lowered_spmd_text_runs_through_rp_run(shardy: bool) -> None:
    mesh = mesh_of(2, 2)
    f = shard_map(lambda x, w: (x @ w, jax.lax.psum(w, "y")), mesh=mesh,
                  in_specs=(P("x", None), P(None, "y")), out_specs=(P("x", "y"), P()))
    before = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", shardy)
    try:
        text = jax.jit(f).lower(X, W).as_text(dialect="hlo")
        want = jax.jit(f)(X, W)
    finally:
        jax.config.update("jax_use_shardy_partitioner", before)
    assert ("xla.sdy.GlobalToLocalShape" in text) == shardy
    results = rp.run(text, [X, W], backend="threads")  # 4 replicas: the mesh's size
    assert len(results) == 4
    for r in results:
        assert_same(r, want)


def test_rp_run_takes_the_lowered_form_and_points_functions_at_rp_jax() -> None:
    f = jax.jit(lambda x: x * 2)
    with pytest.raises(ProgramError, match=r"rp\.jax\.run"):
        rp.run(f, [X], backend="threads")
    np.testing.assert_array_equal(rp.run(f.lower(X), [X], backend="threads")[0], X * 2)
    np.testing.assert_array_equal(rp.run(f.lower(X), [jnp.asarray(X)], backend="threads")[0], X * 2)


def test_importing_replicas_does_not_import_jax() -> None:
    import subprocess
    import sys

    code = "import sys, replicas; replicas.parse_hlo; assert 'jax' not in sys.modules, 'jax imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_the_command_line_runs_lowered_jax_text(tmp_path, capsys) -> None:
    from replicas.cli import main as cli_main

    f = shard_map(lambda x: jax.lax.psum(x, "x"), mesh=mesh_of(4, names=("x",)), in_specs=(P("x"),), out_specs=P())
    program = tmp_path / "lowered.hlo"
    program.write_text(jax.jit(f).lower(X).as_text(dialect="hlo"))
    np.savez(tmp_path / "args.npz", arg0=X)
    out = tmp_path / "out.npz"
    code = cli_main(["run", str(program), "--args", str(tmp_path / "args.npz"), "--backend", "threads", "-q",
                     "--out", str(out)])
    assert code == 0, capsys.readouterr()
    with np.load(out) as results:
        assert sorted(results.files) == ["r0", "r1", "r2", "r3"]  # one replica per device of the mesh
        np.testing.assert_allclose(results["r2"], np.asarray(jax.jit(f)(X)), rtol=1e-6)


def test_a_program_xla_cpu_cannot_run_runs_from_its_optimized_dump() -> None:
    """ragged-all-to-all has no XLA:CPU runtime (JAX's own test skips on CPU): replicas runs the
    module XLA optimized for it, with JAX's expected values (jax tests/ragged_collective_test.py)."""

    def f(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes):
        return jax.lax.ragged_all_to_all(operand[0], output[0], input_offsets[0], send_sizes[0], output_offsets[0],
                                         recv_sizes[0], axis_name="x")[None]

    args = [np.array(a, np.int32) for a in ([[1, 2, 2], [3, 4, 0]], [[0] * 4] * 2, [[0, 1], [0, 1]],
                                            [[1, 2], [1, 1]], [[0, 0], [1, 2]], [[1, 1], [2, 1]])]
    with pytest.raises(jax.errors.JaxRuntimeError, match="not supported by XLA:CPU"):
        jax.jit(shard_map(f, mesh=mesh_of(2, names=("x",)), in_specs=(P("x"),) * 6, out_specs=P("x")))(*args)
    got = rp.jax.run(f, *args, num_replicas=2, in_specs=(P("x"),) * 6, out_specs=P("x"), backend="threads")
    np.testing.assert_array_equal(got, [[1, 3, 0, 0], [2, 2, 4, 0]])
    with pytest.raises(ProgramError, match="XLA:CPU cannot run this program .* with in_specs and out_specs"):
        rp.jax.run(jax.jit(shard_map(f, mesh=mesh_of(2, names=("x",)), in_specs=(P("x"),) * 6, out_specs=P("x"))),
                   *args, backend="threads")
