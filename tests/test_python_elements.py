"""Small fusions and While loops as per-element Python code (`replicas.ops.python_elements`): every op
gives the numpy kernel's bits for edge values of every type it handles, layout ops and loops (unrolled
and not, nested, with ops left to numpy) end as the numpy path does (the one `record_every_instruction`
runs) and as JAX, and a compiled loop still stops at a deadline naming its While."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

import replicas as rp
from replicas.ops.python_elements import MAX_ELEMENTS, compile_fusion, compile_loop
from replicas.runtime.interpreter import Interpreter
from replicas.shapes import PrimitiveType

INTS = ["s8", "s16", "s32", "s64", "u8", "u16", "u32", "u64"]
FLOATS = ["f32", "f64"]
F32_EDGES = [0.0, -0.0, 1.0, -1.5, 0.1, 7.0, 3.4e38, -3.4e38, 1e-45, 1.1754944e-38, 2.5e-39, np.inf, -np.inf, np.nan,
             16777217.0, 0.3333333]


def edge_values(t: str) -> np.ndarray:
    dtype = PrimitiveType(t).dtype
    if t == "pred":
        return np.array([False, True])
    if t in FLOATS:
        return np.array(F32_EDGES + ([1e300, -1e-310] if t == "f64" else []), dtype)
    info = np.iinfo(dtype)
    values = {info.min, info.min + 1, info.max, info.max - 1, 0, 1, 2, 7, info.bits - 1, info.bits, info.bits + 1,
              info.max // 3}
    if info.min < 0:
        values |= {-1, -2, info.min // 3}
    return np.array(sorted(values), dtype)


def fusion_module(op: str, operand_types: list[str], result: str, n: int, attrs: str = "") -> rp.Module:
    params = "\n".join(f"  p{i} = {t}[{n}] parameter({i})" for i, t in enumerate(operand_types))
    operands = ", ".join(f"p{i}" for i in range(len(operand_types)))
    entry_params = "\n".join(f"  q{i} = {t}[{n}] parameter({i})" for i, t in enumerate(operand_types))
    entry_operands = ", ".join(f"q{i}" for i in range(len(operand_types)))
    return rp.parse_hlo(f"HloModule one\n\nfused {{\n{params}\n  ROOT r = {result}[{n}] {op}({operands}){attrs}\n}}\n\n"
                        f"ENTRY main {{\n{entry_params}\n  ROOT f = {result}[{n}] fusion({entry_operands}), "
                        f"kind=kLoop, calls=fused\n}}\n")


def check_op(op: str, operand_types: list[str], result: str, columns: list[np.ndarray], attrs: str = "") -> None:
    """The fusion of `op` compiled per element gives the numpy path's bits on every chunk of the columns."""
    n = MAX_ELEMENTS
    module = fusion_module(op, operand_types, result, n, attrs)
    interp = Interpreter(module)
    small = compile_fusion(module.computation("fused"), interp, cost_model=False)
    assert small is not None, (op, operand_types)
    numpy_path = interp.computation("fused")
    for start in range(0, len(columns[0]), n):
        chunk = [np.resize(c[start:start + n], n) for c in columns]
        with np.errstate(all="ignore"):  # as `Interpreter.run` runs kernels
            want, got = numpy_path(*chunk), small(*chunk)
        assert got.dtype == want.dtype and got.shape == want.shape, (op, got, want)
        assert got.tobytes() == want.tobytes(), (op, operand_types, chunk, got, want)


def pairs(t: str, u: str | None = None) -> list[np.ndarray]:
    a, b = edge_values(t), edge_values(u or t)
    grid = np.array(list(itertools.product(range(len(a)), range(len(b)))))
    return [a[grid[:, 0]], b[grid[:, 1]]]


@pytest.mark.parametrize("t", INTS + FLOATS + ["pred"])
def test_binary_ops_give_the_numpy_kernels_bits(t):
    ops = ["add", "multiply", "maximum", "minimum"]
    if t in INTS or t == "pred":
        ops += ["and", "or", "xor"]
    if t in INTS or t in FLOATS:
        ops += ["subtract"]
    if t in INTS:
        ops += ["shift-left", "shift-right-logical", "shift-right-arithmetic"]
    if t in FLOATS:
        ops += ["divide"]
    for op in ops:
        check_op(op, [t, t], t, pairs(t))
    for direction in ["EQ", "NE", "LT", "LE", "GT", "GE"]:
        check_op("compare", [t, t], "pred", pairs(t), f", direction={direction}")


@pytest.mark.parametrize("t", INTS + FLOATS + ["pred"])
def test_unary_select_and_convert_give_the_numpy_kernels_bits(t):
    values = [edge_values(t)]
    unary = (["not"] if t == "pred" or t[0] == "u" else ["not", "negate", "abs"] if t[0] == "s"
             else ["negate", "abs", "sqrt"])
    for op in unary:
        check_op(op, [t], t, values)
    for target in INTS + FLOATS + ["pred"]:
        check_op("convert", [t], target, values)
    p, (a, b) = np.resize(np.array([True, False, True]), len(pairs(t)[0])), pairs(t)
    check_op("select", ["pred", t, t], t, [p, a, b])


def test_bitcast_convert_and_ops_left_to_numpy_give_the_numpy_kernels_bits():
    check_op("bitcast-convert", ["f32"], "u32", [edge_values("f32")])
    check_op("bitcast-convert", ["u32"], "f32", [np.array([0, 1, 0x3F800000, 0x7F800000, 0xFF800000, 0x80000000,
                                                           0x3FFFFFFF, 0x00400000], np.uint32)])
    check_op("bitcast-convert", ["s64"], "f64", [edge_values("s64")])
    for op in ["log-plus-one", "exponential", "tanh", "floor"]:
        check_op(op, ["f32"], "f32", [edge_values("f32")])
    check_op("remainder", ["s32", "s32"], "s32", pairs("s32"))
    check_op("convert", ["f32"], "s32", [edge_values("f32")])


LAYOUT = """HloModule layout

fused {
  p0 = f32[2,3] parameter(0)
  p1 = u32[3] parameter(1)
  t = f32[3,2] transpose(p0), dimensions={1,0}
  r = f32[6] reshape(t)
  v = f32[6] reverse(r), dimensions={0}
  s = f32[3] slice(v), slice={[1:6:2]}
  c = f32[9] concatenate(s, r), dimensions={0}
  b = f32[2,3] broadcast(s), dimensions={1}
  bb = f32[6] reshape(b)
  i = u32[3] iota(), iota_dimension=0
  k = u32[3] add(p1, i)
  kf = f32[3] convert(k)
  m = f32[3] multiply(s, kf)
  ms = f32[9] concatenate(m, bb), dimensions={0}
  ROOT out = f32[9] add(c, ms)
}

ENTRY main {
  a = f32[2,3] parameter(0)
  u = u32[3] parameter(1)
  ROOT f = f32[9] fusion(a, u), kind=kLoop, calls=fused
}
"""


def test_layout_ops_are_renamings_with_the_numpy_paths_values():
    module = rp.parse_hlo(LAYOUT)
    interp = Interpreter(module)
    small = compile_fusion(module.computation("fused"), interp)
    assert small is not None
    a, u = np.arange(6, dtype=np.float32).reshape(2, 3) * 1.5 - 2, np.array([4, 0, 9], np.uint32)
    want = interp.computation("fused")(a, u)
    assert small(a, u).tobytes() == want.tobytes()
    assert interp.run([a, u]).tobytes() == want.tobytes()


def test_a_fusion_of_large_arrays_or_one_cheap_op_stays_numpy():
    interp = Interpreter(fusion_module("add", ["f32", "f32"], "f32", 64))
    assert compile_fusion(interp.module.computation("fused"), interp) is None  # too many elements
    interp = Interpreter(fusion_module("add", ["f32", "f32"], "f32", 4))
    assert compile_fusion(interp.module.computation("fused"), interp) is None  # one numpy call is cheaper


def counted_loop(trips: int, body_ops: str, state: str = "(s32[], f32[2], u32[2])") -> rp.Module:
    return rp.parse_hlo(f"""HloModule loop

cond {{
  c = {state} parameter(0)
  i = s32[] get-tuple-element(c), index=0
  n = s32[] constant({trips})
  ROOT lt = pred[] compare(i, n), direction=LT
}}

body {{
  s = {state} parameter(0)
  i = s32[] get-tuple-element(s), index=0
  x = f32[2] get-tuple-element(s), index=1
  k = u32[2] get-tuple-element(s), index=2
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
{body_ops}
  ROOT next = {state} tuple(i1, x2, k2)
}}

ENTRY main {{
  i0 = s32[] parameter(0)
  x0 = f32[2] parameter(1)
  k0 = u32[2] parameter(2)
  s0 = {state} tuple(i0, x0, k0)
  ROOT w = {state} while(s0), condition=cond, body=body
}}
""")


MIX = """\
  thirteen = u32[] constant(13)
  r = u32[2] broadcast(thirteen), dimensions={}
  kl = u32[2] shift-left(k, r)
  nineteen = u32[] constant(19)
  q = u32[2] broadcast(nineteen), dimensions={}
  kr = u32[2] shift-right-logical(k, q)
  rot = u32[2] or(kl, kr)
  k2 = u32[2] xor(rot, k)
  bits = u32[2] shift-right-logical(k2, q)
  fb = f32[2] convert(bits)
  scale = f32[] constant(1e-6)
  sb = f32[2] broadcast(scale), dimensions={}
  noise = f32[2] multiply(fb, sb)
  e = f32[2] log-plus-one(noise)
  half = f32[] constant(0.5)
  h = f32[2] broadcast(half), dimensions={}
  xh = f32[2] multiply(x, h)
  x2 = f32[2] add(xh, e)"""


@pytest.mark.parametrize("trips", [0, 1, 5, 300])
def test_a_loop_compiled_per_element_ends_as_the_numpy_path(trips):
    module = counted_loop(trips, MIX)
    args = [np.int32(0), np.array([0.25, -3.0], np.float32), np.array([0x12345678, 0xDEADBEEF], np.uint32)]
    interp = Interpreter(module)
    loop = compile_loop(module.entry_computation.root_instruction, interp)
    assert loop is not None
    got = interp.run(args)
    want = rp.run(module, args, num_replicas=1, backend="threads", record_every_instruction=True)[0]
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape and g.tobytes() == w.tobytes(), (g, w)
    assert int(got[0]) == trips


def test_a_loop_from_a_runtime_bound_is_not_unrolled_and_still_counts():
    module = counted_loop(7, MIX)
    args = [np.int32(-3), np.array([1.0, 2.0], np.float32), np.array([1, 2], np.uint32)]
    want = rp.run(module, args, num_replicas=1, backend="threads", record_every_instruction=True)[0]
    got = Interpreter(module).run(args)
    assert int(got[0]) == 7 and all(g.tobytes() == w.tobytes() for g, w in zip(got, want))


FOREVER = """HloModule forever

cond {
  c = (s32[], u32[2]) parameter(0)
  ROOT t = pred[] constant(true)
}

body {
  s = (s32[], u32[2]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  k = u32[2] get-tuple-element(s), index=1
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  k1 = u32[2] xor(k, k)
  k2 = u32[2] add(k1, k)
  ROOT next = (s32[], u32[2]) tuple(i1, k2)
}

ENTRY main {
  i0 = s32[] parameter(0)
  k0 = u32[2] parameter(1)
  s0 = (s32[], u32[2]) tuple(i0, k0)
  ROOT w = (s32[], u32[2]) while(s0), condition=cond, body=body
}
"""


def test_a_compiled_loop_stops_at_the_deadline_naming_its_while():
    module = rp.parse_hlo(FOREVER)
    interp = Interpreter(module)
    assert compile_loop(module.entry_computation.root_instruction, interp) is not None
    with pytest.raises(rp.ExecutionTimeout) as info:
        rp.run(module, [np.int32(0), np.array([1, 2], np.uint32)], num_replicas=1, backend="threads", timeout=0.5)
    assert "%w (while)" in str(info.value), str(info.value)


def test_a_recorded_run_steps_through_the_loops_instructions(tmp_path):
    module = counted_loop(3, MIX)
    args = [np.int32(0), np.array([0.25, -3.0], np.float32), np.array([5, 6], np.uint32)]
    path = tmp_path / "trace.json"
    with rp.launch(module, args, num_replicas=1, backend="threads", trace=str(path),
                   record_every_instruction=True) as job:
        job.result()
    events = json.loads(path.read_text())["traceEvents"]
    assert sum(1 for e in events if e["ph"] == "X" and e["name"].startswith("log-plus-one")) == 3


def test_jax_threefry_in_a_fori_loop_matches_xla_and_the_numpy_path():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy

    def sampler(key, x):
        def step(i, s):
            x, k = s
            k, sub = jax.random.split(k)
            return x * jnp.float32(0.9) + jnp.float32(0.1) * jax.random.normal(sub, x.shape, x.dtype), k

        return jax.lax.fori_loop(0, 40, step, (x, key))[0]

    key, x = np.array([0, 7], np.uint32), np.zeros(3, np.float32)
    module = rp.jax.compile_jax(sampler, key, x).module
    got = Interpreter(module).run([key, x])
    got = got[0] if isinstance(got, tuple) else got
    want = rp.run(module, [key, x], num_replicas=1, backend="threads", record_every_instruction=True)[0]
    want = want[0] if isinstance(want, tuple) else want
    assert got.tobytes() == want.tobytes()
    np.testing.assert_allclose(got, np.asarray(jax.jit(sampler)(jnp.asarray(key), jnp.asarray(x))), rtol=1e-5,
                               atol=1e-6)


SIGNALING = """HloModule signaling

fused {
  p = u32[4] parameter(0)
  q = f32[4] parameter(1)
  s = pred[4] parameter(2)
  zero = u32[] constant(0)
  z = u32[4] broadcast(zero), dimensions={}
  x = u32[4] or(p, z)
  f = f32[4] bitcast-convert(x)
  m = f32[4] select(s, q, f)
  ROOT r = (f32[4], f32[4]) tuple(f, m)
}

ENTRY main {
  p = u32[4] parameter(0)
  q = f32[4] parameter(1)
  s = pred[4] parameter(2)
  ROOT f = (f32[4], f32[4]) fusion(p, q, s), kind=kLoop, calls=fused
}
"""


def test_a_signaling_nan_keeps_its_bits_as_in_the_numpy_path():
    # A Python float cannot hold an f32 signaling NaN: a call that meets one, made by a bitcast or given
    # as an operand, runs on the numpy kernels, which move it bit for bit as XLA does.
    module = rp.parse_hlo(SIGNALING)
    assert compile_fusion(module.computation("fused"), Interpreter(module)) is not None  # per element
    quiet, signaling = np.array([0x7FC00001, 0x3F800000, 0, 0xFFC00000], np.uint32), 0x7F800001
    select = np.array([True, False, True, False])
    for p, q in [(quiet, quiet), (np.array([signaling, 1, 2, 0xFFA00000], np.uint32), quiet),
                 (quiet, np.array([0x3F800000, 0, signaling, 0xFF800002], np.uint32))]:
        got = rp.run(module, [p, q.view(np.float32), select], num_replicas=1, backend="threads")[0]
        assert got[0].view(np.uint32).tolist() == p.tolist()
        assert got[1].view(np.uint32).tolist() == np.where(select, q, p).tolist()


def test_a_scan_over_arrays_keeps_them_numpy_and_its_scalars_python():
    # ema over rows: the rows and accumulator stay arrays (too large), the counter is a Python int.
    jax = pytest.importorskip("jax")
    jnp = jax.numpy

    def ema(xs):
        return jax.lax.scan(lambda m, x: (jnp.float32(0.9) * m + jnp.float32(0.1) * x, m), jnp.zeros(xs.shape[1]),
                            xs)[1]

    def rand(key):
        return jax.random.normal(jax.random.wrap_key_data(key), (64,))

    for f, arg in [(ema, np.random.default_rng(0).standard_normal((32, 16)).astype(np.float32)),
                   (rand, np.array([3, 9], np.uint32))]:
        module = rp.jax.compile_jax(f, arg).module
        loops = [i for c in module.computations.values() for i in c.instructions if i.opcode == "while"]
        interp = Interpreter(module)
        assert loops and all(compile_loop(w, interp) is not None for w in loops)
        got = interp.run([arg])
        want = rp.run(module, [arg], num_replicas=1, backend="threads", record_every_instruction=True)[0]
        got, want = (got[0], want[0]) if isinstance(got, tuple) else (got, want)
        assert got.tobytes() == want.tobytes()
        np.testing.assert_allclose(got, np.asarray(jax.jit(f)(arg)), rtol=1e-5, atol=1e-6)


REDUCED_CONDITION = """HloModule reduced

both {
  a = pred[] parameter(0)
  b = pred[] parameter(1)
  ROOT c = pred[] and(a, b)
}

cond {
  c = (s32[], f32[2]) parameter(0)
  x = f32[2] get-tuple-element(c), index=1
  limit = f32[2] constant({10, 20})
  below = pred[2] compare(x, limit), direction=LT
  yes = pred[] constant(true)
  ROOT all = pred[] reduce(below, yes), dimensions={0}, to_apply=both
}

body {
  s = (s32[], f32[2]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  x = f32[2] get-tuple-element(s), index=1
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  step = f32[2] constant({1.5, 0.25})
  x1 = f32[2] add(x, step)
  ROOT next = (s32[], f32[2]) tuple(i1, x1)
}

ENTRY main {
  i0 = s32[] constant(0)
  x0 = f32[2] parameter(0)
  s0 = (s32[], f32[2]) tuple(i0, x0)
  ROOT w = (s32[], f32[2]) while(s0), condition=cond, body=body
}
"""


def test_a_loop_whose_condition_a_kernel_computes_is_compiled_and_ends_as_the_numpy_path():
    module = rp.parse_hlo(REDUCED_CONDITION)
    x = np.array([0.0, 1.0], np.float32)
    interp = Interpreter(module)
    assert compile_loop(module.entry_computation.root_instruction, interp) is not None
    got = interp.run([x])
    want = rp.run(module, [x], num_replicas=1, backend="threads", record_every_instruction=True)[0]
    assert all(g.tobytes() == w.tobytes() for g, w in zip(got, want)) and int(got[0]) == 7
