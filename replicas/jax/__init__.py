"""Run JAX functions on N replicas: JAX lowers and partitions, replicas runs the per-device program.

    import replicas as rp
    from jax.sharding import PartitionSpec as P

    y = rp.jax.run(f, x, num_replicas=4, in_specs=(P("x"),), out_specs=P("x"))   # a global array
    step = rp.jax.jit(f, num_replicas=4, in_specs=(P("x"),), out_specs=P("x"))  # compiled once
    y = step(step(x))                            # rp.Arrays: the shards stay on the replicas

`f` is a plain function, a `jax.jit` one or a `shard_map` one. With `in_specs`/`out_specs` the
function is wrapped in `shard_map` over `mesh` (or a one-axis mesh of `num_replicas` devices named
`axis_name`); without them it is jitted as it is (its own shardings, if any, decide the split).
JAX compiles it to the per-device (SPMD) program; each replica runs one partition of it on the
shard of each global argument that JAX's input sharding gives that partition, and the outputs are
put back together by JAX's output shardings: the result is what `jax.jit(f)(*args)` returns, as
numpy arrays in the same pytree.

JAX is an optional extra (`pip install 'replicas[jax]'`) and is imported only here, on first use.
JAX needs as many devices as partitions: on a CPU-only machine set
`XLA_FLAGS=--xla_force_host_platform_device_count=8` before JAX is imported.
"""

from replicas.hlo.spmd_markers import has_spmd_markers, partition_spmd_markers
from replicas.jax.jit import JitFunction, jit, replicated, run
from replicas.jax.program import DEVICE_COUNT_HINT, JaxProgram, compile_jax

__all__ = ["DEVICE_COUNT_HINT", "JaxProgram", "JitFunction", "compile_jax", "has_spmd_markers", "jit",
           "partition_spmd_markers", "replicated", "run"]
