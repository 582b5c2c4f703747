"""Per-element While loops compiled to machine code (`replicas.ops.machine`): the same bits as the Python
code and the numpy path (every op on edge values of its type, threefry and a sampler as JAX writes
them, a signaling NaN), JAX as the oracle, replicas of one program equal, the deadline still noticed
while compiled trips run, the compile in the background by default, and the Python code running when
llvmlite cannot be used."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from test_python_elements import FOREVER

import replicas as rp
from replicas.ops.machine import loops as machine_loops
from replicas.ops.python_elements import compile_loop
from replicas.runtime.interpreter import Interpreter

pytest.importorskip("llvmlite")

STATE = "(s32[], u32[8], s32[8], f32[8], f64[4], s8[8], pred[8], s64[4])"

# Every op with a Python form on edge values (the state's entry below), and log-plus-one and
# exponential, left to their numpy kernels (numpy's own loops in machine code).
OPS = f"""HloModule ops

cond {{
  c = {STATE} parameter(0)
  i = s32[] get-tuple-element(c), index=0
  n = s32[] constant(6)
  ROOT lt = pred[] compare(i, n), direction=LT
}}

body {{
  s = {STATE} parameter(0)
  i = s32[] get-tuple-element(s), index=0
  k = u32[8] get-tuple-element(s), index=1
  j = s32[8] get-tuple-element(s), index=2
  x = f32[8] get-tuple-element(s), index=3
  d = f64[4] get-tuple-element(s), index=4
  b = s8[8] get-tuple-element(s), index=5
  p = pred[8] get-tuple-element(s), index=6
  w = s64[4] get-tuple-element(s), index=7
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  c63 = u32[] constant(63)
  m63 = u32[8] broadcast(c63), dimensions={{}}
  amount = u32[8] and(k, m63)
  kl = u32[8] shift-left(k, amount)
  kr = u32[8] shift-right-logical(k, amount)
  ka = u32[8] shift-right-arithmetic(k, amount)
  km = u32[8] multiply(k, kr)
  ks = u32[8] subtract(ka, km)
  kn = u32[8] not(ks)
  kx = u32[8] maximum(kn, kl)
  ko = u32[8] or(kx, amount)
  k2 = u32[8] xor(ko, k)
  c9 = u32[] constant(9)
  nine = u32[8] broadcast(c9), dimensions={{}}
  mant = u32[8] shift-right-logical(k2, nine)
  cexp = u32[] constant(1065353216)
  expo = u32[8] broadcast(cexp), dimensions={{}}
  fbits = u32[8] or(mant, expo)
  f = f32[8] bitcast-convert(fbits)
  ja = s32[8] convert(amount)
  jl = s32[8] shift-left(j, ja)
  jr = s32[8] shift-right-arithmetic(j, ja)
  jm = s32[8] multiply(jl, jr)
  jn = s32[8] negate(jm)
  jb = s32[8] abs(jn)
  jmin = s32[8] minimum(jb, j)
  jq = s32[8] shift-right-logical(jmin, ja)
  j2 = s32[8] add(jq, j)
  fj = f32[8] convert(j2)
  zero = f32[] constant(0)
  zeros = f32[8] broadcast(zero), dimensions={{}}
  xz = f32[8] divide(x, zeros)
  xy = f32[8] divide(fj, x)
  xs = f32[8] sqrt(xy)
  xmax = f32[8] maximum(xs, xz)
  xmin = f32[8] minimum(xmax, f)
  xl = f32[8] log-plus-one(xmin)
  xe = f32[8] exponential(f)
  xa = f32[8] add(xl, xe)
  xn = f32[8] negate(xa)
  xb = f32[8] abs(xn)
  gt = pred[8] compare(xb, f), direction=GT
  x2 = f32[8] select(gt, xa, xmin)
  xbits = u32[8] bitcast-convert(x2)
  xd = f64[8] convert(x2)
  dd = f64[4] slice(xd), slice={{[0:4]}}
  dm = f64[4] multiply(d, dd)
  dq = f64[4] divide(dm, d)
  ds = f64[4] sqrt(dq)
  d2 = f64[4] subtract(ds, d)
  bj = s8[8] convert(j2)
  bm = s8[8] multiply(b, bj)
  b2 = s8[8] add(bm, b)
  pj = pred[8] compare(j2, jm), direction=LE
  pk = pred[8] compare(xbits, k), direction=NE
  pa = pred[8] and(pj, p)
  po = pred[8] xor(pa, pk)
  p2 = pred[8] not(po)
  wj = s64[8] convert(j2)
  wjs = s64[4] slice(wj), slice={{[4:8]}}
  wm = s64[4] multiply(w, wjs)
  wn = s64[4] negate(wm)
  wb = s64[4] abs(wn)
  wa = s64[4] add(wb, w)
  wk = s64[8] convert(amount)
  wks = s64[4] slice(wk), slice={{[0:4]}}
  wl = s64[4] shift-left(wa, wks)
  wr = s64[4] shift-right-arithmetic(w, wks)
  w2 = s64[4] subtract(wl, wr)
  ROOT next = {STATE} tuple(i1, k2, j2, x2, d2, b2, p2, w2)
}}

ENTRY main {{
  i0 = s32[] parameter(0)
  k0 = u32[8] parameter(1)
  j0 = s32[8] parameter(2)
  x0 = f32[8] parameter(3)
  d0 = f64[4] parameter(4)
  b0 = s8[8] parameter(5)
  p0 = pred[8] parameter(6)
  w0 = s64[4] parameter(7)
  s0 = {STATE} tuple(i0, k0, j0, x0, d0, b0, p0, w0)
  ROOT w = {STATE} while(s0), condition=cond, body=body
}}
"""

ARGS = [np.int32(0), np.array([0, 1, 31, 32, 33, 0xFFFFFFFF, 0x80000000, 0x12345678], np.uint32),
        np.array([0, -1, 1, 2**31 - 1, -2**31, 7, -7, 12345], np.int32),
        np.array([0.0, -0.0, 1.5, -2.0, np.inf, -np.inf, np.nan, 3.4e38], np.float32),
        np.array([1.0, -0.0, 1e300, 2.0], np.float64), np.array([0, 1, -1, 127, -128, 3, -3, 64], np.int8),
        np.array([True, False, True, True, False, False, True, False]),
        np.array([2**63 - 1, -2**63, -1, 3037000500], np.int64)]


@pytest.fixture
def compiled(monkeypatch):
    """Loops bound from now on are compiled at their first call."""
    monkeypatch.setenv("REPLICAS_COMPILED_LOOPS", "on")


def python_code(module: rp.Module, args: list, monkeypatch) -> tuple:
    with monkeypatch.context() as m:
        m.setenv("REPLICAS_COMPILED_LOOPS", "off")
        return Interpreter(module).run(args)


def same_bits(got: tuple, want: tuple) -> None:
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape and g.tobytes() == w.tobytes(), (g, w)


def test_every_op_gives_the_python_codes_and_numpy_paths_bits(compiled, monkeypatch):
    module = rp.parse_hlo(OPS)
    interp = Interpreter(module)
    loop = compile_loop(module.entry_computation.root_instruction, interp)
    got = interp.run(ARGS)
    assert machine_loops.is_compiled(loop)
    same_bits(got, python_code(module, ARGS, monkeypatch))
    same_bits(got, rp.run(module, ARGS, num_replicas=1, backend="threads", record_every_instruction=True)[0])
    assert int(got[0]) == 6


def test_threefry_sampler_as_jax_writes_it_matches_xla_and_the_python_code(compiled, monkeypatch):
    jax = pytest.importorskip("jax")
    jnp = jax.numpy

    def sampler(key, x):
        def step(i, s):
            x, k = s
            k, sub = jax.random.split(k)
            x = x - 0.01 * (x * x - 1.0) + jnp.sqrt(0.02) * jax.random.normal(sub, x.shape, x.dtype)
            return x, k

        return jax.lax.fori_loop(0, 300, step, (x, key))[0]

    key, x = np.array([0, 7], np.uint32), np.zeros(2, np.float32)
    module = rp.jax.compile_jax(sampler, key, x).module
    interp = Interpreter(module)
    before = machine_loops.compiled_loops()
    got = interp.run([key, x])
    assert machine_loops.compiled_loops() > before
    same_bits(got, python_code(module, [key, x], monkeypatch))
    replicas = rp.run(module, [key, x], num_replicas=2, backend="threads")
    same_bits(replicas[0], got)
    same_bits(replicas[1], got)
    got = got[0] if isinstance(got, tuple) else got
    np.testing.assert_allclose(got, np.asarray(jax.jit(sampler)(jnp.asarray(key), jnp.asarray(x))), rtol=1e-5,
                               atol=1e-5)


def test_a_compiled_loop_stops_at_the_deadline_naming_its_while(compiled):
    module = rp.parse_hlo(FOREVER)
    loop = compile_loop(module.entry_computation.root_instruction, Interpreter(module))
    with pytest.raises(rp.ExecutionTimeout) as info:
        rp.run(module, [np.int32(0), np.array([1, 2], np.uint32)], num_replicas=1, backend="threads", timeout=0.5)
    assert "%w (while)" in str(info.value), str(info.value)
    assert machine_loops.is_compiled(loop)


def test_without_llvmlite_the_python_code_runs(compiled, monkeypatch):
    import replicas.ops.machine as machine

    monkeypatch.setitem(sys.modules, "replicas.ops.machine.emit", None)  # its import fails, as without llvmlite
    monkeypatch.delattr(machine, "emit", raising=False)
    module = rp.parse_hlo(OPS.replace("constant(6)", "constant(5)"))  # a loop not compiled before
    interp = Interpreter(module)
    loop = compile_loop(module.entry_computation.root_instruction, interp)
    got = interp.run(ARGS)
    assert not machine_loops.is_compiled(loop)
    same_bits(got, python_code(module, ARGS, monkeypatch))


def test_by_default_a_loop_compiles_in_the_background_once_its_python_time_would_pay(monkeypatch):
    import threading

    monkeypatch.setenv("REPLICAS_COMPILED_LOOPS", "auto")
    for name in ("COMPILE_SECONDS", "COMPILE_SECONDS_PER_STATEMENT"):
        monkeypatch.setattr(machine_loops, name, 0.0)  # any Python time pays
    monkeypatch.setattr(machine_loops, "_loops", {})  # no loop compiled in this process
    module = rp.parse_hlo(OPS)
    interp = Interpreter(module)
    loop = compile_loop(module.entry_computation.root_instruction, interp)
    python = interp.run(ARGS)  # the Python code; its time passes the threshold
    interp.run(ARGS)  # starts the compile, and runs the Python code meanwhile
    for thread in threading.enumerate():
        if thread.name == "replicas-compile-loop":
            thread.join()
    assert machine_loops.is_compiled(loop)
    same_bits(interp.run(ARGS), python)


SIGNALING_LOOP = """HloModule snan

cond {
  c = (s32[], u32[4], f32[4]) parameter(0)
  i = s32[] get-tuple-element(c), index=0
  n = s32[] constant(3)
  ROOT lt = pred[] compare(i, n), direction=LT
}

body {
  s = (s32[], u32[4], f32[4]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  k = u32[4] get-tuple-element(s), index=1
  x = f32[4] get-tuple-element(s), index=2
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  f = f32[4] bitcast-convert(k)
  neg = f32[4] negate(f)
  ROOT next = (s32[], u32[4], f32[4]) tuple(i1, k, neg)
}

ENTRY main {
  i0 = s32[] parameter(0)
  k0 = u32[4] parameter(1)
  x0 = f32[4] parameter(2)
  s0 = (s32[], u32[4], f32[4]) tuple(i0, k0, x0)
  ROOT w = (s32[], u32[4], f32[4]) while(s0), condition=cond, body=body
}
"""


def test_a_signaling_nan_made_in_machine_code_runs_the_call_on_the_numpy_kernels(compiled):
    # As in the Python code: the bitcast's signaling NaN would not survive a double, so the call runs
    # on the numpy kernels, which keep its bits (negate flips the sign bit only).
    module = rp.parse_hlo(SIGNALING_LOOP)
    interp = Interpreter(module)
    loop = compile_loop(module.entry_computation.root_instruction, interp)
    for k in ([0x3F800000, 0, 0xFFC00000, 7], [0x7F800001, 0x3F800000, 0, 0xFFA00000]):
        args = [np.int32(0), np.array(k, np.uint32), np.zeros(4, np.float32)]
        got = interp.run(args)
        assert machine_loops.is_compiled(loop)
        same_bits(got, rp.run(module, args, num_replicas=1, backend="threads", record_every_instruction=True)[0])
