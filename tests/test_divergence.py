"""Values that should agree, checked: an output declared replicated that differs across replicas
is a ReplicaDivergenceError naming the output, the sides and where the divergence was born.
Planted bugs of each kind: a forgotten pmean, per-replica randomness, batch-norm statistics left
unsynchronized; `rp.check` does the same for HLO given which outputs are replicated."""

from __future__ import annotations

import numpy as np
import pytest

import replicas as rp
from replicas.errors import ReplicaDivergenceError

jax = pytest.importorskip("jax")
jnp = jax.numpy

from jax.sharding import Mesh  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

pytestmark = pytest.mark.skipif(len(jax.devices()) < 4, reason="needs --xla_force_host_platform_device_count >= 4")

X = np.arange(32, dtype=np.float32).reshape(8, 4) / 32
W = np.ones(4, np.float32)
THIS = __file__.rsplit("/", 1)[-1]


def data_parallel(f):
    """shard_map without JAX's static replication check: what a user turns off, or GSPMD code has."""
    mesh = Mesh(np.array(jax.devices()[:4]), ("x",))
    return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(P("x"), P()), out_specs=P(), check_vma=False))


def line_of(f, text: str) -> int:
    import inspect

    lines, first = inspect.getsourcelines(f)
    return first + next(i for i, line in enumerate(lines) if text in line)


def test_a_forgotten_pmean_names_the_sharded_argument_and_the_line_that_uses_it() -> None:
    def step(x, w):
        g = jax.grad(lambda w: ((x @ w) ** 2).mean())(w)  # no pmean: each replica its own gradient
        return w - 0.1 * g

    with pytest.raises(ReplicaDivergenceError) as info:
        rp.jax.run(data_parallel(step), X, W, backend="threads")
    e = info.value
    assert e.sides == [[0], [1], [2], [3]] and "meant to be replicated" in str(e)
    assert e.report["argument"] == 0 and "differs across replicas" in str(e)
    assert f"{THIS}:{line_of(step, 'jax.grad')}" in e.report["first_use"]["source"], str(e)

    def fixed(x, w):
        g = jax.lax.pmean(jax.grad(lambda w: ((x @ w) ** 2).mean())(w), "x")
        return w - 0.1 * g

    np.testing.assert_allclose(rp.jax.run(data_parallel(fixed), X, W, backend="threads"),
                               data_parallel(fixed)(X, W), rtol=1e-6)


def test_per_replica_randomness_names_the_axis_index_that_seeded_it() -> None:
    def noisy(x, w):
        key = jax.random.fold_in(jax.random.key(0), jax.lax.axis_index("x"))
        return w + 0.01 * jax.random.normal(key, w.shape)

    with pytest.raises(ReplicaDivergenceError) as info:
        rp.jax.run(data_parallel(noisy), X, W, backend="threads")
    e = info.value
    assert e.report["opcode"] in ("partition-id", "replica-id"), str(e)
    assert e.source is not None and f"{THIS}:{line_of(noisy, 'axis_index')}" in e.source, str(e)
    assert "although everything it depends on agreed" in str(e)


def test_unsynchronized_batch_norm_statistics_diverge() -> None:
    def statistics(x, w):
        return w * 0.9 + 0.1 * x.mean(0)  # the running mean, from this replica's batch only

    with pytest.raises(ReplicaDivergenceError) as info:
        rp.jax.run(data_parallel(statistics), X, W, backend="threads")
    assert info.value.report["argument"] == 0 and info.value.output.startswith("output")

    def synchronized(x, w):
        return w * 0.9 + 0.1 * jax.lax.pmean(x.mean(0), "x")

    rp.jax.run(data_parallel(synchronized), X, W, backend="threads")


def test_a_tolerance_accepts_rounding_and_none_turns_the_check_off() -> None:
    def rounding(x, w):
        return w + 1e-7 * jax.lax.axis_index("x").astype(w.dtype)

    with pytest.raises(ReplicaDivergenceError, match="bitwise"):
        rp.jax.run(data_parallel(rounding), X, W, backend="threads")
    rp.jax.run(data_parallel(rounding), X, W, backend="threads", replicated_tolerance=1e-5)
    got = rp.jax.run(data_parallel(rounding), X, W, backend="threads", replicated_tolerance=None)
    np.testing.assert_array_equal(got, W)  # JAX's answer too: replica 0's copy


HLO = """HloModule drift, replica_count=2

FileNames
1 "/src/model.py"

FunctionNames
1 "update"

FileLocations
1 {file_name_id=1 function_name_id=1 line=12 end_line=12 column=1 end_column=2}

StackFrames
1 {file_location_id=1 parent_frame_id=1}

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
  x = f32[4] parameter(0)
  total = f32[4] all-reduce(x), replica_groups={}, to_apply=add
  id = u32[] replica-id(), metadata={op_name="jit(update)/axis_index" stack_frame_id=1}
  f = f32[] convert(id)
  fb = f32[4] broadcast(f), dimensions={}
  drift = f32[4] add(total, fb)
  ROOT out = (f32[4], f32[4]) tuple(total, drift)
}
"""


def test_rp_check_finds_the_divergence_of_an_hlo_program() -> None:
    args = [[np.full(4, r, np.float32)] for r in range(2)]
    rp.check(HLO, args, replicated=[0])  # the all-reduce agrees
    with pytest.raises(ReplicaDivergenceError) as info:
        rp.check(HLO, args, replicated=[0, 1])
    e = info.value
    assert e.output == "output 1" and e.sides == [[0], [1]]
    assert e.instruction == "id" and e.source == "axis_index at model.py:12 in update (jit(update)/axis_index)"
    with pytest.raises(rp.ProgramError, match="replicated= names output"):
        rp.check(HLO, args, replicated=[2])
