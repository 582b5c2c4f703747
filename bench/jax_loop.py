"""A JAX training loop as a JAX user writes it, on replicas and under JAX: a data-parallel MLP step
(`value_and_grad`, `pmean` of the gradients and the loss, SGD), jitted once, 100 steps in a Python
loop with the parameters carried from step to step and the loss fetched at the end.

Anchor, measured in the same run: the same loop under `jax.jit(shard_map(step))` on N forced CPU
devices. Replicas: `rp.jax.jit(step, ...)` on threads and on Ray (the parameters stay on the
replicas as `rp.Array`s). Each number is the median of `--repeat` rounds of one loop each, the
spread min-max; loops alternate JAX / threads / Ray round by round (the machine is shared), and the
ratio is the median of the rounds' ratios. Load average is printed at the start and the end.

Targets (issue 30): threads <= 1.2x JAX, Ray <= 1.5x JAX.

`--split`: the step as two jitted functions, the gradients then the update (one job on Ray, as
JAX's functions share the devices: the gradients and parameters stay on the replicas), against the
same two functions under JAX.

    python bench/jax_loop.py [--replicas 4 8] [--steps 100] [--repeat 5] [--no-ray] [--split]
                             [--features 128] [--hidden 256]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
from common import load_average  # noqa: E402

import replicas as rp  # noqa: E402

BATCH, CLASSES = 256, 16


def _loss(p, x, y):
    import jax.numpy as jnp

    h = jnp.tanh(x @ p["w1"] + p["b1"])
    logits = h @ p["w2"] + p["b2"]
    return jnp.mean((logits - y) ** 2)


def mlp_step():
    import jax

    def step(params, x, y):
        loss, grads = jax.value_and_grad(_loss)(params, x, y)
        grads, loss = jax.lax.pmean((grads, loss), "x")
        return jax.tree_util.tree_map(lambda p, g: p - 0.05 * g, params, grads), loss

    return step


def split_steps():
    """The step as two functions: the gradients (and the loss), then the update."""
    import jax

    def grads_of(params, x, y):
        loss, grads = jax.value_and_grad(_loss)(params, x, y)
        return jax.lax.pmean((grads, loss), "x")

    def update(params, grads):
        return jax.tree_util.tree_map(lambda p, g: p - 0.05 * g, params, grads)

    return grads_of, update


def chained(grads_of, update):
    """A step (params, x, y) -> (params, loss) of the two jitted functions."""
    def step(params, x, y):
        grads, loss = grads_of(params, x, y)
        return update(params, grads), loss

    return step


def data(features: int, hidden: int) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    params = {"w1": rng.normal(size=(features, hidden)).astype(np.float32) * 0.1,
              "b1": np.zeros(hidden, np.float32),
              "w2": rng.normal(size=(hidden, CLASSES)).astype(np.float32) * 0.1,
              "b2": np.zeros(CLASSES, np.float32)}
    x = rng.normal(size=(BATCH, features)).astype(np.float32)
    y = rng.normal(size=(BATCH, CLASSES)).astype(np.float32)
    return params, x, y


def loop(step, params, x, y, steps: int) -> tuple[float, float]:
    """Seconds of `steps` steps, and the last loss (fetched once, after the loop)."""
    t0 = time.perf_counter()
    for _ in range(steps):
        params, loss = step(params, x, y)
    last = float(loss)
    return time.perf_counter() - t0, last


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replicas", type=int, nargs="+", default=[4, 8])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--no-ray", action="store_true")
    p.add_argument("--split", action="store_true", help="the step as two jitted functions")
    p.add_argument("--features", type=int, default=128, help="inputs of the MLP (a batch is 256 of them)")
    p.add_argument("--hidden", type=int, default=256,
                   help="hidden units (the default 128 x 256 MLP has 0.14 MB of parameters; 512 x 2048: 4.3 MB)")
    ns = p.parse_args()
    import jax
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    try:
        from jax import shard_map
    except ImportError:  # jax < 0.7
        from jax.experimental.shard_map import shard_map

    params, x, y = data(ns.features, ns.hidden)
    megabytes = sum(a.nbytes for a in params.values()) / 1e6
    print(f"load average: {load_average()}; {megabytes:.2f} MB of parameters, {x.nbytes / 1e6:.2f} MB of inputs a step")
    specs = dict(in_specs=(P(), P("x"), P("x")), out_specs=(P(), P()))
    backends = ["threads"] + ([] if ns.no_ray else ["ray"])
    print(f"{'N':>3} {'JAX ms/step':>14} " + " ".join(f"{b + ' ms/step':>16} {'x JAX':>16}" for b in backends))
    for n in ns.replicas:
        mesh = Mesh(np.array(jax.devices()[:n]), ("x",))
        closing = []
        if ns.split:
            grads_of, update = split_steps()
            both = dict(in_specs=(P(), P()), out_specs=P())
            runners = {"jax": chained(jax.jit(shard_map(grads_of, mesh=mesh, **specs)),
                                      jax.jit(shard_map(update, mesh=mesh, **both)))}
            for b in backends:
                closing += [rp.jax.jit(grads_of, num_replicas=n, backend=b, **specs),
                            rp.jax.jit(update, num_replicas=n, backend=b, **both)]
                runners[b] = chained(*closing[-2:])
        else:
            runners = {"jax": jax.jit(shard_map(mlp_step(), mesh=mesh, **specs))}
            for b in backends:
                closing.append(rp.jax.jit(mlp_step(), num_replicas=n, backend=b, **specs))
                runners[b] = closing[-1]
        losses = {}
        for name, step in runners.items():  # compile, start the jobs, warm up
            losses[name] = loop(step, params, x, y, 3)[1]
        rounds: dict[str, list[float]] = {name: [] for name in runners}
        for _ in range(ns.repeat):
            for name, step in runners.items():
                seconds, losses[name] = loop(step, params, x, y, ns.steps)
                rounds[name].append(seconds / ns.steps)
        for name in backends:  # the same loop, the same numbers
            assert abs(losses[name] - losses["jax"]) <= 1e-4 * max(1.0, abs(losses["jax"])), (name, losses)
        cells = [f"{fmt(rounds['jax']):>14}"]
        for b in backends:
            ratios = [r / j for r, j in zip(rounds[b], rounds["jax"])]
            cells.append(f"{fmt(rounds[b]):>16} {np.median(ratios):6.2f}x ({min(ratios):.2f}-{max(ratios):.2f})")
        print(f"{n:>3} " + " ".join(cells))
        for f in closing:
            f.close()
    print(f"load average at the end: {load_average()}")


def fmt(rounds: list[float]) -> str:
    return f"{np.median(rounds) * 1e3:.2f} ({min(rounds) * 1e3:.2f}-{max(rounds) * 1e3:.2f})"


if __name__ == "__main__":
    main()
