"""What the per-call fast paths of a collective and of a scalar kernel keep: a flight recorder's
collective events carry their fingerprint's dict (while the ring holds untracked plain values), and
a scalar ufunc kernel's later calls (`out=` a fresh 0-d array) give the first call's type and bits."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import replicas as rp
from replicas.collectives.fingerprint import Fingerprint
from replicas.runtime import batched
from replicas.runtime.interpreter import Interpreter

PROGRAM = """\
HloModule loop, replica_count=4

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

cond {
  st = (s32[], f32[8]) parameter(0)
  i = s32[] get-tuple-element(st), index=0
  k = s32[] constant(3)
  ROOT more = pred[] compare(i, k), direction=LT
}

body {
  st = (s32[], f32[8]) parameter(0)
  i = s32[] get-tuple-element(st), index=0
  x = f32[8] get-tuple-element(st), index=1
  y = f32[8] all-reduce(x), replica_groups={}, to_apply=add
  one = s32[] constant(1)
  i2 = s32[] add(i, one)
  ROOT next = (s32[], f32[8]) tuple(i2, y)
}

ENTRY main {
  x = f32[8] parameter(0)
  zero = s32[] constant(0)
  init = (s32[], f32[8]) tuple(zero, x)
  loop = (s32[], f32[8]) while(init), condition=cond, body=body
  ROOT y = f32[8] get-tuple-element(loop), index=1
}
"""


def test_collective_events_carry_the_fingerprint_dict_and_the_ring_is_untracked(monkeypatch):
    # Each replica's own ring: replicas that run batched share one log of the run's collectives instead.
    monkeypatch.setattr(batched, "ENABLED", False)
    module = rp.parse_hlo(PROGRAM)
    rp.run(module, [np.ones(8, np.float32)], num_replicas=4, backend="threads")
    # The (interned) fingerprint wire and group, once seen by the collector, are untracked. A tuple is
    # untracked once its elements are: one pass per level of nesting when the collector meets the outer
    # tuple first.
    for _ in range(4):
        gc.collect()
    job = rp.launch(module, [np.ones(8, np.float32)], num_replicas=4, backend="threads")
    assert [float(r[0]) for r in job.result()] == [64.0] * 4
    recorder = job._backend._replicas[2].recorder  # noqa: SLF001 - the ring itself
    raw = [e for e in recorder._events if e["kind"] == "collective"]  # noqa: SLF001
    assert len(raw) == 3 and not any(gc.is_tracked(e) for e in raw)
    events = [e for e in recorder.events() if e["kind"] == "collective"]
    assert [e["seq"] for e in events] == [0, 1, 2]
    for e, stored in zip(events, raw):
        assert e["fingerprint"] == Fingerprint(stored["fingerprint"]).as_dict()
        assert e["fingerprint"]["kind"] == "all-reduce" and e["fingerprint"]["shapes"] == [[8]]
        assert e["group"] == (0, 1, 2, 3) and e["end_us"] >= e["start_us"]


SCALARS = [
    ("add", "s32", np.int32, [7, -3]),
    ("multiply", "f32", np.float32, [1.5, 1e30]),
    ("divide", "f64", np.float64, [1.0, 3.0]),
    ("maximum", "u8", np.uint8, [200, 100]),
    ("compare", "pred", np.int32, [3, 4]),
    ("negate", "s64", np.int64, [5]),
    ("sqrt", "f32", np.float32, [2.0]),
]


@pytest.mark.parametrize("opcode,result,dtype,values", SCALARS)
def test_a_scalar_kernel_gives_the_same_type_and_bits_on_every_call(opcode, result, dtype, values):
    operand = {np.int32: "s32", np.float32: "f32", np.float64: "f64", np.uint8: "u8", np.int64: "s64"}[dtype]
    params = "\n".join(f"  p{i} = {operand}[] parameter({i})" for i in range(len(values)))
    names = ", ".join(f"p{i}" for i in range(len(values)))
    attrs = ", direction=LT" if opcode == "compare" else ""
    text = (f"HloModule m\n\nENTRY main {{\n{params}\n  ROOT r = {result}[] {opcode}({names}){attrs}\n}}\n")
    module = rp.parse_hlo(text)
    args = [np.asarray(v, dtype) for v in values]
    interp = Interpreter(module)
    first = interp.run(args)
    for _ in range(3):  # later calls take the `out=` path
        again = interp.run(args)
        assert isinstance(again, np.ndarray) and again.shape == () and again.dtype == first.dtype
        assert again.tobytes() == first.tobytes()
    assert isinstance(first, np.ndarray) and first.shape == ()
