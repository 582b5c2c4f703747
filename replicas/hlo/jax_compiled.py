"""JAX's compiled (partitioned) program, run with global arguments as its lowered form is.

`jax.jit(f).lower(*args).compile()` holds the per-device module XLA's SPMD partitioner made, and the
shardings of its arguments and results. `globalize(compiled)` rewrites that module so that every
replica takes the *global* arguments and returns the *global* results, the contract of the `Lowered`
object and of its text: each parameter becomes the global value cut to the partition's shard
(`partition-id`, `dynamic-slice`), and each result is all-gathered along its sharded dimensions, as
`spmd_markers` enters and leaves a manual body. The program between runs as XLA partitioned it.

The `Compiled` object is read duck-typed (JAX is not imported here): `as_text()`, `in_avals`,
`input_shardings`, `out_info`, `output_shardings`, and of each sharding `is_fully_replicated`,
`devices_indices_map(shape)` and its mesh's devices (partition p runs on the p-th device of the
mesh, as JAX assigns them).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replicas.errors import ProgramError
from replicas.hlo.ir import Module
from replicas.hlo.spmd_markers import Tiling, take_global
from replicas.shapes import Shape


def is_compiled(program: Any) -> bool:
    """Whether `program` is a JAX `Compiled` object (jax.stages.Compiled)."""
    return hasattr(program, "as_text") and hasattr(program, "input_shardings") and hasattr(program, "out_info")


def globalize(compiled: Any) -> Module:
    """The per-device module of `compiled`, taking the global arguments and giving the global results
    on every replica."""
    from replicas.hlo.text import parse_hlo

    module = parse_hlo(compiled.as_text())
    partitions = module.num_partitions
    if partitions <= 1:
        return module  # not partitioned: its arguments and results are the global ones
    in_shardings, out_shardings = _leaves(compiled.input_shardings[0]), _leaves(compiled.output_shardings)
    in_avals, out_avals = _leaves(compiled.in_avals[0]), _leaves(compiled.out_info)
    entry = module.entry_computation
    params = entry.parameters
    if len(params) != len(in_shardings) or len(in_avals) != len(in_shardings):
        raise ProgramError(f"the compiled program takes {len(params)} parameters but JAX gives {len(in_shardings)} "
                           "input shardings")
    root = entry.root_instruction
    results = list(root.shape.tuple_shapes) if root.shape.is_tuple else [root.shape]
    if len(results) != len(out_shardings) or len(out_avals) != len(out_shardings):
        raise ProgramError(f"the compiled program returns {len(results)} values but JAX gives {len(out_shardings)} "
                           "output shardings")
    inputs = [_tiling(s, a.shape, p.shape, partitions, f"argument {i}")
              for i, (s, a, p) in enumerate(zip(in_shardings, in_avals, params))]
    outputs = [_tiling(s, a.shape, r, partitions, f"result {i}")
               for i, (s, a, r) in enumerate(zip(out_shardings, out_avals, results))]
    take_global(module, inputs, outputs)
    return module


def _leaves(tree: Any) -> list[Any]:
    """The leaves of a tuple/list/dict pytree of JAX's (shardings, avals), in JAX's flattening order."""
    if isinstance(tree, (tuple, list)):
        return [leaf for item in tree for leaf in _leaves(item)]
    if isinstance(tree, dict):
        return [leaf for key in sorted(tree) for leaf in _leaves(tree[key])]
    return [] if tree is None else [tree]


def _tiling(sharding: Any, logical: tuple[int, ...], local: Shape, partitions: int, what: str) -> Tiling:
    """How `sharding` splits a value of JAX's shape `logical` (the program's `local` shard may have
    more dimensions: a typed key's data) over the program's partitions."""
    rank = local.rank if local.is_array else 0
    index = np.zeros((partitions, rank), np.int64)
    if sharding.is_fully_replicated or not logical:
        return Tiling((1,) * rank, index)
    mesh = getattr(sharding, "mesh", None)
    if mesh is None:
        raise ProgramError(f"{what}: a {type(sharding).__name__} is not supported for a Compiled object (JAX "
                           "compiles jit shardings as NamedSharding)")
    devices = list(mesh.devices.flat)
    if len(devices) != partitions:
        raise ProgramError(f"{what}: its sharding spans {len(devices)} devices, the program {partitions}")
    by_device = sharding.devices_indices_map(tuple(logical))
    tiles = [1] * rank
    for d, size in enumerate(logical):
        spans = [by_device[dev][d].indices(size) for dev in devices]
        width = spans[0][1] - spans[0][0]
        if width <= 0 or size % width or any(stop - start != width for start, stop, _ in spans):
            raise ProgramError(f"{what}: dimension {d} of size {size} is split unevenly; replicas runs even "
                               "shards only")
        tiles[d] = size // width
        for p, (start, _, _) in enumerate(spans):
            index[p, d] = start // width
    return Tiling(tuple(tiles), index)
