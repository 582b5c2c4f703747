"""A While loop's integer and pred scalars as Python numbers (`replicas.ops.python_scalars`): every
expression gives the numpy kernel's bits (wrap-around, signedness, pred logic) for edge values of
every type, loops computing on them end with the same values and dtypes as the numpy path (the
path `record_every_instruction` runs) and as JAX, and errors are still named by instruction."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import replicas as rp
from replicas.ops.custom_call import unregister_custom_call
from replicas.ops.python_scalars import FAST_TYPES, expression, loop_scalars
from replicas.runtime.interpreter import Interpreter
from replicas.shapes import PrimitiveType

TYPES = sorted((t.value for t in FAST_TYPES), key=lambda v: (v[0], len(v), v))


def edge_values(t: str) -> list:
    """min, max and their neighbours, -1, 0, 1 and a few values in between, as numpy scalars of `t`."""
    dtype = PrimitiveType(t).dtype
    if t == "pred":
        return [np.bool_(False), np.bool_(True)]
    info = np.iinfo(dtype)
    values = {info.min, info.min + 1, info.max, info.max - 1, 0, 1, 2, info.max // 3, info.max // 2 + 1}
    if info.min < 0:
        values |= {-1, -2, info.min // 3}
    return [dtype.type(v) for v in sorted(values)]


def one_op_module(opcode: str, t: str, arity: int, result: str | None = None, attrs: str = "") -> rp.Module:
    params = "\n".join(f"  p{i} = {t}[] parameter({i})" for i in range(arity))
    operands = ", ".join(f"p{i}" for i in range(arity))
    return rp.parse_hlo(f"HloModule one\n\nENTRY main {{\n{params}\n"
                        f"  ROOT r = {result or t}[] {opcode}({operands}){attrs}\n}}\n")


def check_expression(module: rp.Module, operand_types: list[str], cases) -> None:
    """The root's Python expression on every case equals the numpy kernel's 0-d result, bit for bit."""
    root = module.entry_computation.root_instruction
    found = expression(root, [PrimitiveType(t) for t in operand_types])
    assert found is not None, root
    code = compile(found([f"x{i}" for i in range(len(operand_types))]), "<expression>", "eval")
    numpy_path = Interpreter(module)
    dtype = root.shape.dtype
    for args in cases:
        want = numpy_path.run([np.asarray(a) for a in args])
        got = eval(code, {f"x{i}": a.item() for i, a in enumerate(args)})  # noqa: S307
        assert type(got) is (bool if dtype == np.bool_ else int), (root, args, got)
        assert np.array(got, dtype).tobytes() == want.tobytes() and want.dtype == dtype, (root.opcode, args, got, want)


@pytest.mark.parametrize("t", TYPES)
def test_binary_expressions_give_the_numpy_kernels_bits(t):
    pairs = list(itertools.product(edge_values(t), repeat=2))
    ops = ["add", "multiply", "maximum", "minimum", "and", "or", "xor"]
    if t != "pred":
        ops.append("subtract")
    for op in ops:
        check_expression(one_op_module(op, t, 2), [t, t], pairs)
    for direction in ("EQ", "NE", "GE", "GT", "LE", "LT"):
        kind = "UNSIGNED" if t == "pred" or t.startswith("u") else "SIGNED"
        attrs = f", direction={direction}, type={kind}"
        check_expression(one_op_module("compare", t, 2, "pred", attrs), [t, t], pairs)


@pytest.mark.parametrize("t", TYPES)
def test_unary_select_and_convert_expressions_give_the_numpy_kernels_bits(t):
    values = edge_values(t)
    for op in ["not"] + ([] if t == "pred" else ["negate"]):
        check_expression(one_op_module(op, t, 1), [t], [(v,) for v in values])
    select = rp.parse_hlo(f"HloModule s\n\nENTRY main {{\n  p = pred[] parameter(0)\n  a = {t}[] parameter(1)\n"
                          f"  b = {t}[] parameter(2)\n  ROOT r = {t}[] select(p, a, b)\n}}\n")
    check_expression(select, ["pred", t, t], [(np.bool_(p), a, b) for p in (False, True)
                                              for a, b in itertools.product(values[:3], values[-3:])])
    for dst in TYPES:
        check_expression(one_op_module("convert", t, 1, dst), [t], [(v,) for v in values])


def test_ops_without_an_exact_python_form_are_left_to_numpy():
    for op in ("divide", "remainder", "power", "shift-left", "shift-right-arithmetic", "shift-right-logical"):
        root = one_op_module(op, "s32", 2).entry_computation.root_instruction
        assert expression(root, [PrimitiveType.S32] * 2) is None
    f32 = one_op_module("add", "f32", 2).entry_computation.root_instruction
    assert expression(f32, [PrimitiveType.F32] * 2) is None


LOOP = """\
HloModule scalars

cond {{
  st = ({t}[], {t}[], s32[], pred[], f32[2]) parameter(0)
  n = s32[] get-tuple-element(st), index=2
  limit = s32[] constant({trips})
  ROOT more = pred[] compare(n, limit), direction=LT
}}

body {{
  st = ({t}[], {t}[], s32[], pred[], f32[2]) parameter(0)
  a = {t}[] get-tuple-element(st), index=0
  b = {t}[] get-tuple-element(st), index=1
  n = s32[] get-tuple-element(st), index=2
  flag = pred[] get-tuple-element(st), index=3
  x = f32[2] get-tuple-element(st), index=4
  step = {t}[] constant({step})
  ab = {t}[] multiply(a, b)
  a2 = {t}[] add(ab, step)
  big = pred[] compare(a2, b), direction=GT, type={kind}
  b2 = {t}[] select(big, a2, b)
  flag2 = pred[] xor(flag, big)
  one = s32[] constant(1)
  n2 = s32[] add(n, one)
  y = f32[2] add(x, x)
  ROOT next = ({t}[], {t}[], s32[], pred[], f32[2]) tuple(a2, b2, n2, flag2, y)
}}

ENTRY main {{
  a = {t}[] parameter(0)
  b = {t}[] parameter(1)
  zero = s32[] constant(0)
  no = pred[] constant(false)
  x = f32[2] constant({{1, 2}})
  init = ({t}[], {t}[], s32[], pred[], f32[2]) tuple(a, b, zero, no, x)
  ROOT loop = ({t}[], {t}[], s32[], pred[], f32[2]) while(init), condition=cond, body=body
}}
"""


def scalar_loop(t: str, trips: int = 13, y: str = "y = f32[2] add(x, x)") -> rp.Module:
    """LOOP on `t`, its f32 element computed by `y`."""
    info = np.iinfo(PrimitiveType(t).dtype)
    kind = "UNSIGNED" if t.startswith("u") else "SIGNED"
    text = LOOP.format(t=t, trips=trips, step=info.max // 3 + 7, kind=kind)
    return rp.parse_hlo(text.replace("y = f32[2] add(x, x)", y))


@pytest.mark.parametrize("t", [t for t in TYPES if t != "pred"])
def test_a_loop_on_python_scalars_ends_as_the_numpy_path_does(t):
    module = scalar_loop(t)
    loop = module.entry_computation.root_instruction
    cond, body = (module.computation(loop.attrs[k]) for k in ("condition", "body"))
    assert loop_scalars(module, loop.shape, cond, body) == {0, 1, 2, 3}  # the f32 element stays an array
    values = edge_values(t)
    for a, b in [(values[0], values[-1]), (values[-2], values[2]), (values[len(values) // 2], values[1])]:
        fast = rp.evaluate(module, [a, b])
        numpy_path = rp.run(module, [a, b], num_replicas=1, backend="threads", record_every_instruction=True)[0]
        assert len(fast) == len(numpy_path) == 5
        for got, want in zip(fast, numpy_path):
            assert type(got) is np.ndarray and got.dtype == want.dtype and got.shape == want.shape
            assert got.tobytes() == want.tobytes(), (t, a, b, fast, numpy_path)
            assert got.flags.writeable


def test_a_loop_that_never_runs_returns_its_state_as_arrays():
    out = rp.evaluate(scalar_loop("u8", trips=0), [np.uint8(200), np.uint8(3)])
    assert [v.dtype for v in out] == [np.uint8, np.uint8, np.int32, np.bool_, np.float32]
    assert [v.item() for v in out[:4]] == [200, 3, 0, False]


def test_a_state_element_that_reaches_a_numpy_kernel_stays_an_array():
    module = scalar_loop("s32", y="nf = f32[] convert(n2)\n  nb = f32[2] broadcast(nf), dimensions={}\n"
                              "  y = f32[2] add(x, nb)")
    loop = module.entry_computation.root_instruction
    cond, body = (module.computation(loop.attrs[k]) for k in ("condition", "body"))
    assert loop_scalars(module, loop.shape, cond, body) == {0, 1, 3}  # the counter n feeds a float convert
    fast = rp.evaluate(module, [np.int32(5), np.int32(-9)])
    numpy_path = rp.run(module, [np.int32(5), np.int32(-9)], num_replicas=1, backend="threads",
                        record_every_instruction=True)[0]
    assert all(g.tobytes() == w.tobytes() and g.dtype == w.dtype for g, w in zip(fast, numpy_path))


def test_a_kernel_raising_in_a_loop_on_python_scalars_is_named():
    module = scalar_loop("s32", y='y = f32[2] custom-call(x), custom_call_target="scalars_refuse"')
    calls = []

    def refuse(x):
        calls.append(1)
        if len(calls) == 4:
            raise ValueError("refused on the fourth iteration")
        return x

    rp.register_custom_call("scalars_refuse", refuse)
    try:
        with pytest.raises(rp.ReplicaFailure, match="refused on the fourth") as info:
            rp.run(module, [np.int32(1), np.int32(2)], num_replicas=2, backend="threads", timeout=60)
    finally:
        unregister_custom_call("scalars_refuse")
    assert info.value.instruction.startswith("%y (custom-call")


def test_jax_integer_loops_wrap_as_jax():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    def f(x):
        def step(i, c):
            h, u, on = c
            h = h * jnp.int32(1103515245) + jnp.int32(12345) + i  # wraps around within a few steps
            u = (u - jnp.uint8(77)) ^ jnp.uint8(i & 0xFF)
            return h, u, jnp.logical_xor(on, h > 0)

        h, u, on = lax.fori_loop(0, 50, step, (jnp.int32(7), jnp.uint8(3), jnp.bool_(False)))
        return x + h.astype(x.dtype) + u.astype(x.dtype) + on.astype(x.dtype)

    x = np.zeros(4, np.int64)
    got = rp.jax.run(f, x, num_replicas=2, in_specs=(P("x"),), out_specs=P("x"), backend="threads")
    want = np.asarray(jax.jit(f)(x))
    assert got.dtype == want.dtype and got.tolist() == want.tolist()


FUSED = """\
HloModule fused

wrapped_compare_computation {
  p0 = s32[] parameter(0)
  p1 = s32[] parameter(1)
  ROOT lt = pred[] compare(p0, p1), direction=LT
}

add_multiply_computation {
  p0 = u16[] parameter(0)
  p1 = u16[] parameter(1)
  m = u16[] multiply(p0, p0)
  ROOT a = u16[] add(m, p1)
}

cond {
  st = (s32[], u16[]) parameter(0)
  i = s32[] get-tuple-element(st), index=0
  k = s32[] constant(20)
  ROOT more = pred[] fusion(i, k), kind=kLoop, calls=wrapped_compare_computation
}

body {
  st = (s32[], u16[]) parameter(0)
  i = s32[] get-tuple-element(st), index=0
  h = u16[] get-tuple-element(st), index=1
  c = s32[] copy(i)
  one = s32[] constant(1)
  i2 = s32[] add(c, one)
  seven = u16[] constant(65531)
  h2 = u16[] fusion(h, seven), kind=kLoop, calls=add_multiply_computation
  ROOT next = (s32[], u16[]) tuple(i2, h2)
}

ENTRY main {
  h = u16[] parameter(0)
  zero = s32[] constant(0)
  init = (s32[], u16[]) tuple(zero, h)
  ROOT loop = (s32[], u16[]) while(init), condition=cond, body=body
}
"""


def test_fusions_and_copies_of_scalar_ops_are_composed_as_xla_compiled_loops_have_them():
    module = rp.parse_hlo(FUSED)
    loop = module.entry_computation.root_instruction
    cond, body = (module.computation(loop.attrs[k]) for k in ("condition", "body"))
    assert loop_scalars(module, loop.shape, cond, body) == {0, 1}
    for h in (np.uint16(0), np.uint16(3), np.uint16(65535)):
        fast = rp.evaluate(module, [h])
        numpy_path = rp.run(module, [h], num_replicas=1, backend="threads", record_every_instruction=True)[0]
        assert [(v.dtype, v.tobytes()) for v in fast] == [(v.dtype, v.tobytes()) for v in numpy_path]


def test_a_fusion_whose_expression_would_grow_too_long_stays_numpy():
    # Each maximum writes its operands twice: 40 nested ones would be 2**40 characters long.
    chain = "\n".join(f"  m{i + 1} = s32[] maximum(m{i}, p1)" for i in range(40))
    text = FUSED.replace("  ROOT lt = pred[] compare(p0, p1), direction=LT",
                         f"  m0 = s32[] copy(p0)\n{chain}\n  ROOT lt = pred[] compare(m40, p1), direction=LT")
    module = rp.parse_hlo(text)
    loop = module.entry_computation.root_instruction
    cond, body = (module.computation(loop.attrs[k]) for k in ("condition", "body"))
    fusion = cond.root_instruction
    assert expression(fusion, [PrimitiveType.S32] * 2, module) is None
    assert loop_scalars(module, loop.shape, cond, body) == {1}  # h; the counter reaches the fusion
    fast = rp.evaluate(module, [np.uint16(3)])
    numpy_path = rp.run(module, [np.uint16(3)], num_replicas=1, backend="threads", record_every_instruction=True)[0]
    assert [(v.dtype, v.tobytes()) for v in fast] == [(v.dtype, v.tobytes()) for v in numpy_path]


def test_a_body_that_reads_its_own_next_state_keeps_arrays():
    text = LOOP.format(t="s32", trips=5, step=3, kind="SIGNED").replace(
        "  ROOT next = (s32[], s32[], s32[], pred[], f32[2]) tuple(a2, b2, n2, flag2, y)",
        "  ROOT next = (s32[], s32[], s32[], pred[], f32[2]) tuple(a2, b2, n2, flag2, y)\n"
        "  again = s32[] get-tuple-element(next), index=0")
    module = rp.parse_hlo(text)
    loop = module.entry_computation.root_instruction
    cond, body = (module.computation(loop.attrs[k]) for k in ("condition", "body"))
    assert loop_scalars(module, loop.shape, cond, body) == frozenset()
    out = rp.evaluate(module, [np.int32(2), np.int32(9)])
    assert [v.dtype for v in out] == [np.int32, np.int32, np.int32, np.bool_, np.float32]
