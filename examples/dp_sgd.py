"""Data-parallel SGD: each replica trains a linear model on its own shard; gradients are
all-reduced (mean) every step inside a While loop. The final weights are bitwise equal on every
replica and match single-replica full-batch training within float tolerance.

    python examples/dp_sgd.py [--replicas 4] [--steps 50]
"""

from __future__ import annotations

import argparse

import numpy as np

import replicas as rp

PROGRAM = """\
HloModule dp_sgd

add {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}}

cond {{
  st = (s32[], f32[{d}], f32[{b},{d}], f32[{b}]) parameter(0)
  i = s32[] get-tuple-element(st), index=0
  k = s32[] constant({steps})
  ROOT more = pred[] compare(i, k), direction=LT
}}

body {{
  st = (s32[], f32[{d}], f32[{b},{d}], f32[{b}]) parameter(0)
  i = s32[] get-tuple-element(st), index=0
  w = f32[{d}] get-tuple-element(st), index=1
  x = f32[{b},{d}] get-tuple-element(st), index=2
  y = f32[{b}] get-tuple-element(st), index=3
  pred = f32[{b}] dot(x, w), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  err = f32[{b}] subtract(pred, y)
  grad = f32[{d}] dot(x, err), lhs_contracting_dims={{0}}, rhs_contracting_dims={{0}}
  total = f32[{d}] all-reduce(grad), replica_groups={{}}, to_apply=add
  scale = f32[] constant({scale!r})
  scales = f32[{d}] broadcast(scale), dimensions={{}}
  step = f32[{d}] multiply(total, scales)
  w2 = f32[{d}] subtract(w, step)
  one = s32[] constant(1)
  i2 = s32[] add(i, one)
  ROOT next = (s32[], f32[{d}], f32[{b},{d}], f32[{b}]) tuple(i2, w2, x, y)
}}

ENTRY main {{
  w0 = f32[{d}] parameter(0)
  x = f32[{b},{d}] parameter(1)
  y = f32[{b}] parameter(2)
  zero = s32[] constant(0)
  init = (s32[], f32[{d}], f32[{b},{d}], f32[{b}]) tuple(zero, w0, x, y)
  loop = (s32[], f32[{d}], f32[{b},{d}], f32[{b}]) while(init), condition=cond, body=body
  ROOT w = f32[{d}] get-tuple-element(loop), index=1
}}
"""


def program(num_replicas: int, per_replica_batch: int, features: int, steps: int, lr: float) -> rp.Module:
    """Mean-squared-error SGD; the gradient of mean((Xw - y)^2) over the global batch is
    2/(B*N) * sum over replicas of X_r^T (X_r w - y_r)."""
    scale = float(np.float32(2 * lr / (per_replica_batch * num_replicas)))
    return rp.parse_hlo(PROGRAM.format(d=features, b=per_replica_batch, steps=steps, scale=scale))


def make_data(num_replicas: int, per_replica_batch: int, features: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    true_w = rng.normal(size=features).astype(np.float32)
    x = rng.normal(size=(num_replicas * per_replica_batch, features)).astype(np.float32)
    y = (x @ true_w + 0.01 * rng.normal(size=len(x))).astype(np.float32)
    return true_w, x, y


def train(num_replicas: int = 4, per_replica_batch: int = 16, features: int = 8, steps: int = 50,
          lr: float = 0.05, backend: str = "ray", **run_kwargs):
    """Returns (weights per replica, weights of single-replica full-batch training, true weights)."""
    true_w, x, y = make_data(num_replicas, per_replica_batch, features)
    w0 = np.zeros(features, np.float32)
    shards = [[w0, x[r * per_replica_batch:(r + 1) * per_replica_batch],
               y[r * per_replica_batch:(r + 1) * per_replica_batch]] for r in range(num_replicas)]
    parallel = rp.run(program(num_replicas, per_replica_batch, features, steps, lr), shards,
                      num_replicas=num_replicas, backend=backend, **run_kwargs)
    full = program(1, per_replica_batch * num_replicas, features, steps, lr)
    single = rp.run(full, [w0, x, y], num_replicas=1, backend="threads")[0]
    return parallel, single, true_w


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--steps", type=int, default=50)
    ns = p.parse_args()
    parallel, single, true_w = train(ns.replicas, steps=ns.steps)
    identical = all(np.array_equal(parallel[0], w) for w in parallel)
    print(f"weights on replica 0:        {np.round(parallel[0], 4).tolist()}")
    print(f"single-replica full batch:   {np.round(single, 4).tolist()}")
    print(f"true weights:                {np.round(true_w, 4).tolist()}")
    print(f"bitwise equal on all {ns.replicas} replicas: {identical}; "
          f"max |parallel - single| = {np.abs(parallel[0] - single).max():.3g}")


if __name__ == "__main__":
    main()
