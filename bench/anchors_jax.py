"""The JAX anchor: the same looped collectives under jit(shard_map) on 4 forced CPU devices; prints JSON.

    python bench/anchors_jax.py --replicas 4 --ops all-reduce,all-gather --sizes 4096,1048576

XLA_FLAGS=--xla_force_host_platform_device_count=N is set here before jax is imported (so this
runs as its own process). Each op runs K times in a lax.fori_loop inside one jitted program and is
timed by differencing (T(K2) - T(K1)) / (K2 - K1), like the replicas program (the median of
several such differences; "samples" in the JSON has each). Where the op's result
has another shape than its operand, the next operand is derived from the result by one slice or
update (an extra copy of at most the buffer, noted in bench/README.md) so XLA cannot hoist it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--ops", default="all-reduce")
    parser.add_argument("--sizes", default="4096")
    parser.add_argument("--repeat", type=int, default=3)
    a = parser.parse_args()
    n = a.replicas
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={n}")
    try:
        import jax
        import jax.numpy as jnp
        import numpy as np
        from jax import lax
        from jax.sharding import Mesh, NamedSharding
        from jax.sharding import PartitionSpec as P
    except ImportError:
        print(json.dumps({"skipped": "not installed"}))
        return
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from common import iterations_for, per_iteration

    mesh = Mesh(np.array(jax.devices()[:n]), ("r",))
    perm = [(r, (r + 1) % n) for r in range(n)]

    def step(op: str, x):
        if op == "all-reduce":
            return lax.psum(x, "r")
        if op == "all-gather":
            g = lax.all_gather(x, "r", tiled=True)
            return lax.dynamic_slice_in_dim(g, lax.axis_index("r") * x.shape[0], x.shape[0])
        if op == "reduce-scatter":
            part = lax.psum_scatter(x, "r", tiled=True)
            return lax.dynamic_update_slice_in_dim(x, part, 0, 0)
        if op == "all-to-all":
            return lax.all_to_all(x, "r", 0, 0, tiled=True)
        if op == "collective-permute":
            return lax.ppermute(x, "r", perm)
        raise ValueError(op)

    def program(op: str):
        def local(x, k):
            return lax.fori_loop(0, k[0], lambda i, v: step(op, v), x)

        sharded = jax.shard_map(local, mesh=mesh, in_specs=(P("r"), P("r")), out_specs=P("r"), check_vma=False)
        return jax.jit(sharded)

    results: dict[str, dict[str, float]] = {}  # op -> size -> median seconds
    samples: dict[str, dict[str, list[float]]] = {}  # op -> size -> each differenced measurement
    for op in a.ops.split(","):
        fn = program(op)
        results[op] = {}
        for nbytes in (int(s) for s in a.sizes.split(",")):
            e = nbytes // 4
            x = jax.device_put(jnp.ones(e * n, jnp.float32), NamedSharding(mesh, P("r")))
            k1, k2 = iterations_for(nbytes)

            def run(k: int, fn=fn, x=x) -> float:
                ks = jax.device_put(jnp.full((n,), k, jnp.int32), NamedSharding(mesh, P("r")))
                t0 = time.perf_counter()
                fn(x, ks).block_until_ready()
                return time.perf_counter() - t0

            run(1)  # compiles once per shape (k is data, not a constant)
            timing = per_iteration(run, k1, k2, a.repeat)
            results[op][str(nbytes)] = timing.median
            samples.setdefault(op, {})[str(nbytes)] = timing.samples
    print(json.dumps({"devices": n, "jax": jax.__version__, "results": results, "samples": samples}), flush=True)


if __name__ == "__main__":
    main()
