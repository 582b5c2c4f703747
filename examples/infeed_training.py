"""A host-driven training loop: the host feeds each replica one batch per step through Infeed and
reads the global loss back through Outfeed, while the program all-reduces gradients.

    python examples/infeed_training.py
"""

from __future__ import annotations

import numpy as np

import replicas as rp

PROGRAM = """\
HloModule infeed_training

add {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}}

cond {{
  st = (s32[], f32[{d}]) parameter(0)
  i = s32[] get-tuple-element(st), index=0
  k = s32[] constant({steps})
  ROOT more = pred[] compare(i, k), direction=LT
}}

body {{
  st = (s32[], f32[{d}]) parameter(0)
  i = s32[] get-tuple-element(st), index=0
  w = f32[{d}] get-tuple-element(st), index=1
  tok = token[] after-all()
  feed = ((f32[{b},{d}], f32[{b}]), token[]) infeed(tok)
  batch = (f32[{b},{d}], f32[{b}]) get-tuple-element(feed), index=0
  tok2 = token[] get-tuple-element(feed), index=1
  x = f32[{b},{d}] get-tuple-element(batch), index=0
  y = f32[{b}] get-tuple-element(batch), index=1
  pred = f32[{b}] dot(x, w), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  err = f32[{b}] subtract(pred, y)
  sq = f32[{b}] multiply(err, err)
  fzero = f32[] constant(0)
  local = f32[] reduce(sq, fzero), dimensions={{0}}, to_apply=add
  total = f32[] all-reduce(local), replica_groups={{}}, to_apply=add
  inv = f32[] constant({inv_n!r})
  loss = f32[] multiply(total, inv)
  done = token[] outfeed(loss, tok2), outfeed_shape=f32[]
  grad = f32[{d}] dot(x, err), lhs_contracting_dims={{0}}, rhs_contracting_dims={{0}}
  gsum = f32[{d}] all-reduce(grad), replica_groups={{}}, to_apply=add
  scale = f32[] constant({scale!r})
  scales = f32[{d}] broadcast(scale), dimensions={{}}
  step = f32[{d}] multiply(gsum, scales)
  w2 = f32[{d}] subtract(w, step)
  one = s32[] constant(1)
  i2 = s32[] add(i, one)
  ROOT next = (s32[], f32[{d}]) tuple(i2, w2)
}}

ENTRY main {{
  w0 = f32[{d}] parameter(0)
  zero = s32[] constant(0)
  init = (s32[], f32[{d}]) tuple(zero, w0)
  loop = (s32[], f32[{d}]) while(init), condition=cond, body=body
  ROOT w = f32[{d}] get-tuple-element(loop), index=1
}}
"""


def program(num_replicas: int, batch: int, d: int, steps: int, lr: float) -> rp.Module:
    n = batch * num_replicas
    return rp.parse_hlo(PROGRAM.format(d=d, b=batch, steps=steps, inv_n=float(np.float32(1 / n)),
                                       scale=float(np.float32(2 * lr / n))))


def train(num_replicas: int = 2, steps: int = 20, batch: int = 8, d: int = 4, lr: float = 0.1,
          backend: str = "ray", seed: int = 0) -> tuple[list[float], list[np.ndarray]]:
    """Feeds batches step by step and reads each step's loss; returns (losses, final weights)."""
    rng = np.random.default_rng(seed)
    true_w = rng.normal(size=d).astype(np.float32)
    w0 = np.zeros(d, np.float32)
    losses = []
    with rp.launch(program(num_replicas, batch, d, steps, lr), [w0], num_replicas=num_replicas,
                   backend=backend) as job:
        for _ in range(steps):
            for r in range(num_replicas):
                x = rng.normal(size=(batch, d)).astype(np.float32)
                job.infeed(r, (x, (x @ true_w).astype(np.float32)))
            step_losses = [float(job.outfeed(r, timeout=60)) for r in range(num_replicas)]
            assert len(set(step_losses)) == 1, step_losses  # the loss is all-reduced: equal everywhere
            losses.append(step_losses[0])
        weights = job.result()
    return losses, weights


def main() -> None:
    losses, weights = train()
    print("loss per step:", " ".join(f"{v:.4f}" for v in losses))
    print("final weights:", np.round(weights[0], 4).tolist())


if __name__ == "__main__":
    main()
