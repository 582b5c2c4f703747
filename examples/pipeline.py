"""Pipeline parallelism with Send/Recv: stage 0 (replica 0) computes tanh(x W0) for each
micro-batch and sends it to stage 1 (replica 1), which computes h W1, inside a While loop.
Replica 1's output equals the single-replica computation tanh(X W0) W1.

    python examples/pipeline.py
"""

from __future__ import annotations

import numpy as np

import replicas as rp

ROUTE = 'frontend_attributes={_xla_send_recv_source_target_pairs="{{0,1}}"}'

PROGRAM = """\
HloModule pipeline, replica_count=2

cond {{
  st = (s32[], f32[{m},{b},{d}], f32[{d},{h}], f32[{h},{o}], f32[{m},{b},{o}]) parameter(0)
  i = s32[] get-tuple-element(st), index=0
  n = s32[] constant({m})
  ROOT more = pred[] compare(i, n), direction=LT
}}

body {{
  st = (s32[], f32[{m},{b},{d}], f32[{d},{h}], f32[{h},{o}], f32[{m},{b},{o}]) parameter(0)
  i = s32[] get-tuple-element(st), index=0
  x = f32[{m},{b},{d}] get-tuple-element(st), index=1
  w0 = f32[{d},{h}] get-tuple-element(st), index=2
  w1 = f32[{h},{o}] get-tuple-element(st), index=3
  out = f32[{m},{b},{o}] get-tuple-element(st), index=4
  zero = s32[] constant(0)
  xi3 = f32[1,{b},{d}] dynamic-slice(x, i, zero, zero), dynamic_slice_sizes={{1,{b},{d}}}
  xi = f32[{b},{d}] reshape(xi3)
  pre = f32[{b},{h}] dot(xi, w0), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  act = f32[{b},{h}] tanh(pre)
  tok = token[] after-all()
  snd = (f32[{b},{h}], u32[], token[]) send(act, tok), channel_id=1, {route}
  rcv = (f32[{b},{h}], u32[], token[]) recv(tok), channel_id=1, {route}
  got = (f32[{b},{h}], token[]) recv-done(rcv), channel_id=1, {route}
  sent = token[] send-done(snd), channel_id=1, {route}
  hin = f32[{b},{h}] get-tuple-element(got), index=0
  oi = f32[{b},{o}] dot(hin, w1), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  oi3 = f32[1,{b},{o}] reshape(oi)
  out2 = f32[{m},{b},{o}] dynamic-update-slice(out, oi3, i, zero, zero)
  one = s32[] constant(1)
  i2 = s32[] add(i, one)
  ROOT next = (s32[], f32[{m},{b},{d}], f32[{d},{h}], f32[{h},{o}], f32[{m},{b},{o}]) tuple(i2, x, w0, w1, out2)
}}

ENTRY main {{
  x = f32[{m},{b},{d}] parameter(0)
  w0 = f32[{d},{h}] parameter(1)
  w1 = f32[{h},{o}] parameter(2)
  zero = s32[] constant(0)
  fzero = f32[] constant(0)
  out0 = f32[{m},{b},{o}] broadcast(fzero), dimensions={{}}
  init = (s32[], f32[{m},{b},{d}], f32[{d},{h}], f32[{h},{o}], f32[{m},{b},{o}]) tuple(zero, x, w0, w1, out0)
  loop = (s32[], f32[{m},{b},{d}], f32[{d},{h}], f32[{h},{o}], f32[{m},{b},{o}]) while(init), condition=cond, body=body
  ROOT y = f32[{m},{b},{o}] get-tuple-element(loop), index=4
}}
"""


def program(micro_batches: int = 8, batch: int = 4, d: int = 16, h: int = 32, o: int = 8) -> rp.Module:
    return rp.parse_hlo(PROGRAM.format(m=micro_batches, b=batch, d=d, h=h, o=o, route=ROUTE))


def run_pipeline(micro_batches: int = 8, backend: str = "ray", seed: int = 0, **run_kwargs):
    """Returns (replica 1's output, the single-replica reference)."""
    rng = np.random.default_rng(seed)
    b, d, h, o = 4, 16, 32, 8
    x = rng.normal(size=(micro_batches, b, d)).astype(np.float32)
    w0 = rng.normal(size=(d, h)).astype(np.float32) / 4
    w1 = rng.normal(size=(h, o)).astype(np.float32) / 4
    out = rp.run(program(micro_batches, b, d, h, o), [x, w0, w1], num_replicas=2, backend=backend, **run_kwargs)
    reference = np.tanh(x @ w0) @ w1
    return out[1], reference


def main() -> None:
    got, want = run_pipeline()
    print(f"stage 1 output shape {got.shape}; max |pipeline - single replica| = {np.abs(got - want).max():.3g}")


if __name__ == "__main__":
    main()
