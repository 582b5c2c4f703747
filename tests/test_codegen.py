"""The generated code of a computation (`replicas.runtime.codegen`): broadcasts that numpy's own
broadcasting can stand for call no kernel, and every program gives the numpy path's bits (the one
`record_every_instruction` runs)."""

from __future__ import annotations

import numpy as np

import replicas as rp
from replicas.runtime.bound import GENERATED
from replicas.runtime.interpreter import Interpreter

ROWS = """HloModule rows

ENTRY main {
  x = f32[4,3] parameter(0)
  m = f32[4] parameter(1)
  p = pred[4,3] parameter(2)
  b = f32[4,3] broadcast(m), dimensions={0}
  d = f32[4,3] subtract(x, b)
  e = f32[4,3] exponential(d)
  c = f32[4,3] broadcast(m), dimensions={0}
  s = f32[4,3] select(p, e, c)
  t = f32[4,3] transpose(x), dimensions={0,1}
  q = f32[2,4,3] broadcast(m), dimensions={1}
  r = f32[2,4,3] broadcast(t), dimensions={1,2}
  u = f32[2,4,3] multiply(q, r)
  ROOT out = (f32[4,3], f32[2,4,3]) tuple(s, u)
}
"""


def kernel_calls(interp: Interpreter) -> set[str]:
    """The instructions the entry's generated code calls a kernel for."""
    return {inst.name for inst in GENERATED[interp._entry._code].values()}


def test_a_broadcast_read_only_by_element_wise_ufuncs_is_a_reshape():
    module = rp.parse_hlo(ROWS)
    interp = Interpreter(module)
    calls = kernel_calls(interp)
    assert "b" not in calls  # its reader has another operand of the full shape
    assert "c" in calls  # read by a select, not a ufunc
    assert "r" not in calls and "q" in calls  # r only prepends (read as t): q must stay whole for their product
    rng = np.random.default_rng(0)
    args = [rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal(4).astype(np.float32),
            rng.random((4, 3)) > 0.5]
    got = interp.run(args)
    want = rp.run(module, args, num_replicas=1, backend="threads", record_every_instruction=True)[0]
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.tobytes() == w.tobytes()


LAYOUT = """HloModule layout

ENTRY main {
  x = f32[2,6] parameter(0)
  c = f32[2,6] copy(x)
  r = f32[3,4] reshape(c)
  b = f32[12] bitcast(r)
  n = f32[12] negate(b)
  k = f32[12] copy(n)
  ROOT out = (f32[12], f32[2,6], f32[3,4]) tuple(k, c, r)
}
"""


def test_copies_and_reshapes_call_no_kernel_and_give_the_numpy_paths_values():
    module = rp.parse_hlo(LAYOUT)
    interp = Interpreter(module)
    assert kernel_calls(interp) == {"n"}  # a copy is a renaming, a row-major reshape or bitcast a `.reshape`
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    got = interp.run([x])
    want = rp.run(module, [x], num_replicas=1, backend="threads", record_every_instruction=True)[0]
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.tobytes() == w.tobytes()
    assert np.shares_memory(got[1], x)  # as the copy kernel: values are never written, nothing is copied
