"""Compile a JAX function for N replicas and run it: the per-device program, and how global
arguments split into shards and results join back."""

from __future__ import annotations

import glob
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from replicas.errors import ProgramError
from replicas.hlo.ir import Module
from replicas.jax.arguments import host_value, physical_dtype, physical_shape
from replicas.jax.callbacks import bind_jax_callbacks

DEVICE_COUNT_HINT = ("set XLA_FLAGS=--xla_force_host_platform_device_count=N (N >= the number of replicas) "
                     "before JAX is imported")


def _jax() -> Any:
    try:
        import jax
    except ImportError:
        raise ProgramError("replicas.jax needs JAX: pip install 'replicas[jax]'") from None
    return jax


@dataclass
class JaxProgram:
    """A JAX function compiled for `num_replicas` replicas: the per-device module, and how global
    arguments split into shards and shards join into global results (JAX's shardings)."""

    module: Module
    num_replicas: int
    in_shardings: list[Any]  # one jax Sharding per flattened argument
    out_shardings: list[Any]  # one per flattened output
    out_avals: list[Any]  # global shape and dtype of each flattened output
    out_tree: Any
    devices: list[Any]  # partition p runs what JAX would run on devices[p]
    arg_dtypes: list[np.dtype]

    def split(self, args: Sequence[Any]) -> list[list[np.ndarray]]:
        """Per replica, the shard of every flattened global argument."""
        jax = _jax()
        leaves = jax.tree_util.tree_leaves(list(args))
        if len(leaves) != len(self.in_shardings):
            raise ProgramError(f"the program was compiled for {len(self.in_shardings)} array arguments, "
                               f"got {len(leaves)}")
        per_replica: list[list[np.ndarray]] = [[] for _ in range(self.num_replicas)]
        for leaf, sharding, dtype in zip(leaves, self.in_shardings, self.arg_dtypes):
            value = host_value(leaf, dtype)
            index = _indices(sharding, value.shape, self.num_replicas)
            for p in range(self.num_replicas):
                per_replica[p].append(np.ascontiguousarray(value[index[p]]))
        return per_replica

    def join(self, results: Sequence[Any]) -> Any:
        """The global outputs (the pytree `f` returns) from every replica's result."""
        jax = _jax()
        per_replica = [_output_leaves(r, len(self.out_avals)) for r in results]
        outputs = []
        for i, (aval, sharding) in enumerate(zip(self.out_avals, self.out_shardings)):
            out = np.empty(physical_shape(aval.shape, aval.dtype), physical_dtype(aval.dtype))
            index = _indices(sharding, aval.shape, self.num_replicas)
            for p in range(self.num_replicas):
                out[index[p]] = per_replica[p][i]
            outputs.append(out)
        return jax.tree_util.tree_unflatten(self.out_tree, outputs)


def run_compiled(compiled: Any, args: Sequence[Any], options: dict[str, Any]) -> Any:
    """`rp.jax.run` of a JAX `Compiled` object: the global arguments in, its global outputs (the pytree
    `compiled(*args)` returns, as numpy arrays) out; `rp.run` takes it as it takes the lowered form."""
    jax = _jax()
    from replicas.runtime.driver import run as run_module

    leaves = jax.tree_util.tree_leaves(list(args))
    avals = jax.tree_util.tree_leaves(compiled.in_avals[0])
    if len(leaves) != len(avals):
        raise ProgramError(f"the compiled program takes {len(avals)} array arguments, got {len(leaves)}")
    values = [host_value(leaf, physical_dtype(aval.dtype)) for leaf, aval in zip(leaves, avals)]
    options.pop("replicated_tolerance", None)  # checked by rp.jax.jit's calls only
    result = run_module(compiled, values, **options)[0]  # every replica holds the global outputs
    count = compiled.out_tree.num_leaves
    return jax.tree_util.tree_unflatten(compiled.out_tree, _output_leaves(result, count))


def _indices(sharding: Any, shape: tuple[int, ...], num_replicas: int) -> list[Any]:
    """For each partition, the index of its shard in a global array of `shape`."""
    if sharding is None:
        return [tuple(slice(None) for _ in shape)] * num_replicas
    by_device = sharding.devices_indices_map(tuple(shape))
    devices = _device_order(sharding)
    if len(devices) == 1:
        return [by_device[devices[0]]] * num_replicas
    return [by_device[d] for d in devices]


def _device_order(sharding: Any) -> list[Any]:
    order = getattr(sharding, "_device_assignment", None)
    if order is None:  # a NamedSharding: the mesh's devices in logical-id order
        order = sharding.mesh.devices.flat
    return list(order)


def _output_leaves(result: Any, count: int) -> list[Any]:
    if count == 1 and not (isinstance(result, tuple) and len(result) == 1):
        return [result]
    if not isinstance(result, tuple) or len(result) != count:
        raise ProgramError(f"the program returned {type(result).__name__}, expected a tuple of {count} outputs")
    return list(result)


def _mesh(mesh: Any, num_replicas: int | None, axis_name: str) -> Any:
    jax = _jax()
    if mesh is not None:
        if num_replicas is not None and num_replicas != mesh.devices.size:
            raise ProgramError(f"num_replicas={num_replicas} but the mesh has {mesh.devices.size} devices")
        return mesh
    if num_replicas is None:
        return None
    devices = jax.devices()
    if len(devices) < num_replicas:
        raise ProgramError(f"JAX sees {len(devices)} device(s), {num_replicas} replicas need as many: "
                           f"{DEVICE_COUNT_HINT}")
    return jax.sharding.Mesh(np.array(devices[:num_replicas]), (axis_name,))


def compile_jax(f: Callable[..., Any], *args: Any, num_replicas: int | None = None, mesh: Any = None,
                in_specs: Any = None, out_specs: Any = None, axis_name: str = "x",
                donate_argnums: tuple[int, ...] = ()) -> JaxProgram:
    """Lower and compile `f` for `args` (arrays, or `jax.ShapeDtypeStruct`s) with JAX; the
    per-device module and its shardings."""
    jax = _jax()
    from replicas.hlo.text import parse_hlo

    mesh = _mesh(mesh, num_replicas, axis_name)
    fn = f
    if in_specs is not None or out_specs is not None:
        if mesh is None:
            raise ProgramError("in_specs/out_specs need num_replicas=N or mesh=...")
        fn = _shard_map(f, mesh, in_specs, out_specs)
    leaves = [leaf if isinstance(leaf, jax.ShapeDtypeStruct) else jax.numpy.asarray(leaf)
              for leaf in jax.tree_util.tree_leaves(list(args))]
    compiled = None
    try:
        lowered = jax.jit(fn, keep_unused=True, donate_argnums=donate_argnums).lower(*args)
        compiled = lowered.compile()
        text = compiled.as_text()
    except RuntimeError as e:
        if "devices" in str(e):
            raise ProgramError(f"JAX could not compile for this mesh: {e}; {DEVICE_COUNT_HINT}") from None
        if "not supported by XLA:CPU" not in str(e):
            raise
        # XLA:CPU optimized and partitioned the program but has no runtime for one of its ops (e.g.
        # ragged-all-to-all, which replicas runs): take the per-device module from the compile's dump.
        if mesh is None or in_specs is None or out_specs is None:
            raise ProgramError(f"XLA:CPU cannot run this program ({e}); replicas can, given num_replicas or mesh "
                               "with in_specs and out_specs (its shardings then come from them)") from None
        text = _optimized_text(lowered, e)
    module = parse_hlo(text)
    bind_jax_callbacks(module, lowered)  # jax.debug.print, pure_callback, io_callback
    partitions = module.num_partitions
    if num_replicas is None:
        num_replicas = partitions if partitions > 1 else (mesh.devices.size if mesh is not None else 1)
    if partitions > 1 and partitions != num_replicas:
        raise ProgramError(f"JAX partitioned the program {partitions} ways; num_replicas={num_replicas}")
    if partitions == 1:
        module.attrs.pop("num_partitions", None)
    out_avals = jax.tree_util.tree_leaves(lowered.out_info)
    if partitions == 1:
        in_shardings, out_shardings = [None] * len(leaves), [None] * len(out_avals)
    elif compiled is not None:
        in_shardings = jax.tree_util.tree_leaves(compiled.input_shardings[0])
        out_shardings = jax.tree_util.tree_leaves(compiled.output_shardings)
    else:
        in_shardings = _named(mesh, in_specs, tuple(args))
        out_shardings = _named(mesh, out_specs, lowered.out_info)
    devices = _device_order(in_shardings[0] if in_shardings and in_shardings[0] is not None
                            else out_shardings[0]) if partitions > 1 else []
    return JaxProgram(module, num_replicas, in_shardings, out_shardings, out_avals, lowered.out_tree, devices,
                      [physical_dtype(leaf.dtype) for leaf in leaves])


def _optimized_text(lowered: Any, error: BaseException) -> str:
    """The optimized per-device module XLA:CPU dumps before it fails to emit code for it."""
    with tempfile.TemporaryDirectory(prefix="replicas-jax-") as where:
        try:
            lowered.compile(compiler_options={"xla_dump_to": where})
        except RuntimeError:
            pass
        found = sorted(glob.glob(os.path.join(where, "*cpu_after_optimizations.txt")))
        if not found:
            raise ProgramError(f"XLA:CPU cannot run this program ({error}) and left no optimized module "
                               "to run instead") from None
        with open(found[-1]) as f:
            return f.read()


def _named(mesh: Any, specs: Any, tree: Any) -> list[Any]:
    """One NamedSharding per leaf of `tree`, from the shard_map `specs` (a prefix of it)."""
    jax = _jax()
    spec_type = jax.sharding.PartitionSpec

    def is_spec(x: Any) -> bool:
        return x is None or isinstance(x, spec_type)

    per_leaf = jax.tree.leaves(jax.tree.broadcast(specs, tree, is_leaf=is_spec), is_leaf=is_spec)
    return [jax.sharding.NamedSharding(mesh, spec if spec is not None else spec_type()) for spec in per_leaf]


def _shard_map(f: Callable[..., Any], mesh: Any, in_specs: Any, out_specs: Any) -> Callable[..., Any]:
    _jax()
    try:
        from jax import shard_map
    except ImportError:  # jax < 0.7
        from jax.experimental.shard_map import shard_map
    return shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs)
