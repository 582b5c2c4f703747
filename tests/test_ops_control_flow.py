"""Control flow (call, fusion, while, conditional, map, async), custom-call and dynamic sizes, built from the IR."""

from __future__ import annotations

import numpy as np
import pytest
from jax import lax
from opkit import binary_computation, run_module
from xla_oracle import jit_answer

from replicas.errors import ProgramError
from replicas.hlo.ir import Computation, Instruction, Module
from replicas.ops.custom_call import register_custom_call, unregister_custom_call
from replicas.shapes import Shape


def computation(name: str, params: list[tuple[str, str]], body: list[tuple], root: str) -> Computation:
    """params: (name, shape); body: (name, opcode, shape, operands[, attrs])."""
    comp = Computation(name)
    for i, (pname, shape) in enumerate(params):
        comp.add(Instruction(pname, "parameter", Shape.parse(shape), [], {"parameter_number": i}))
    for entry in body:
        iname, opcode, shape, operands = entry[:4]
        attrs = entry[4] if len(entry) > 4 else {}
        comp.add(Instruction(iname, opcode, Shape.parse(shape), list(operands), dict(attrs)))
    comp.root = root
    return comp


def module(main: Computation, *others: Computation) -> Module:
    m = Module("m")
    for c in others:
        m.add(c)
    m.add(main)
    m.entry = main.name
    return m


def const(value, dtype) -> dict:
    return {"literal": np.asarray(value, dtype)}


# -- while -------------------------------------------------------------------------------------

def counting_loop(limit_dtype="s32") -> tuple[Computation, Computation]:
    """State (i: s32[], a: s32[3]); while i < 10: a = a * 2 + i; i = i + 1."""
    state = "(s32[], s32[3])"
    cond = computation("cond", [("s", state)], [
        ("i", "get-tuple-element", "s32[]", ["s"], {"index": 0}),
        ("ten", "constant", "s32[]", [], const(10, np.int32)),
        ("lt", "compare", "pred[]", ["i", "ten"], {"comparison_direction": "LT"}),
    ], "lt")
    body = computation("body", [("s", state)], [
        ("i", "get-tuple-element", "s32[]", ["s"], {"index": 0}),
        ("a", "get-tuple-element", "s32[3]", ["s"], {"index": 1}),
        ("two", "constant", "s32[3]", [], const([2, 2, 2], np.int32)),
        ("a2", "multiply", "s32[3]", ["a", "two"]),
        ("ib", "broadcast", "s32[3]", ["i"], {"dimensions": []}),
        ("a3", "add", "s32[3]", ["a2", "ib"]),
        ("one", "constant", "s32[]", [], const(1, np.int32)),
        ("i1", "add", "s32[]", ["i", "one"]),
        ("out", "tuple", state, ["i1", "a3"]),
    ], "out")
    return cond, body


@pytest.mark.parametrize("start", [0, 7, 10, 50])
def test_while_with_tuple_state_matches_lax(start):
    cond, body = counting_loop()
    main = computation("main", [("i", "s32[]"), ("a", "s32[3]")], [
        ("s", "tuple", "(s32[], s32[3])", ["i", "a"]),
        ("w", "while", "(s32[], s32[3])", ["s"], {"condition": "cond", "body": "body"}),
    ], "w")
    a0 = np.array([1, -2, 3], np.int32)
    i, a = run_module(module(main, cond, body), [np.int32(start), a0])

    def jax_body(state):
        i, a = state
        return i + 1, a * 2 + i

    ei, ea = lax.while_loop(lambda s: s[0] < 10, jax_body, (np.int32(start), a0))
    np.testing.assert_array_equal(i, np.asarray(ei))
    np.testing.assert_array_equal(a, np.asarray(ea))
    assert i.dtype == np.int32 and a.dtype == np.int32


def test_while_with_an_array_state():
    cond = computation("cond", [("x", "f64[]")], [
        ("k", "constant", "f64[]", [], const(100.0, np.float64)),
        ("lt", "compare", "pred[]", ["x", "k"], {"comparison_direction": "LT"}),
    ], "lt")
    body = computation("body", [("x", "f64[]")], [
        ("k", "constant", "f64[]", [], const(3.0, np.float64)),
        ("y", "multiply", "f64[]", ["x", "k"]),
    ], "y")
    main = computation("main", [("x", "f64[]")], [
        ("w", "while", "f64[]", ["x"], {"condition": "cond", "body": "body"})], "w")
    got = run_module(module(main, cond, body), [np.float64(1.5)])
    assert got.dtype == np.float64 and got.shape == ()
    assert float(got) == float(lax.while_loop(lambda x: x < 100.0, lambda x: x * 3.0, np.float64(1.5)))


def test_document_while_example():
    # result = {0, zero_vector[10]}; while result(0) < 1000: result = {result(0) + 1, result(1) + constant_vector}
    state = "(s32[], f32[10])"
    constant_vector = np.linspace(-1, 1, 10).astype(np.float32)
    cond = computation("cond", [("s", state)], [
        ("i", "get-tuple-element", "s32[]", ["s"], {"index": 0}),
        ("k", "constant", "s32[]", [], const(1000, np.int32)),
        ("lt", "compare", "pred[]", ["i", "k"], {"comparison_direction": "LT"})], "lt")
    body = computation("body", [("s", state)], [
        ("i", "get-tuple-element", "s32[]", ["s"], {"index": 0}),
        ("v", "get-tuple-element", "f32[10]", ["s"], {"index": 1}),
        ("one", "constant", "s32[]", [], const(1, np.int32)),
        ("c", "constant", "f32[10]", [], {"literal": constant_vector}),
        ("i1", "add", "s32[]", ["i", "one"]),
        ("v1", "add", "f32[10]", ["v", "c"]),
        ("out", "tuple", state, ["i1", "v1"])], "out")
    main = computation("main", [], [
        ("zero", "constant", "s32[]", [], const(0, np.int32)),
        ("zeros", "constant", "f32[10]", [], const(np.zeros(10), np.float32)),
        ("init", "tuple", state, ["zero", "zeros"]),
        ("w", "while", state, ["init"], {"condition": "cond", "body": "body"})], "w")
    count, vector = run_module(module(main, cond, body), [])
    expected = lax.fori_loop(0, 1000, lambda _, v: v + constant_vector, np.zeros(10, np.float32))
    assert int(count) == 1000
    np.testing.assert_array_equal(vector, np.asarray(expected))


def test_while_body_shape_must_match_the_state():
    cond = computation("cond", [("x", "f32[]")], [("t", "constant", "pred[]", [], const(False, np.bool_))], "t")
    body = computation("body", [("x", "f32[]")], [("y", "constant", "s32[]", [], const(1, np.int32))], "y")
    main = computation("main", [("x", "f32[]")], [
        ("w", "while", "f32[]", ["x"], {"condition": "cond", "body": "body"})], "w")
    with pytest.raises(ProgramError, match="body"):
        run_module(module(main, cond, body), [np.float32(0)])


# -- conditional -------------------------------------------------------------------------------

@pytest.mark.parametrize("pred", [True, False])
def test_conditional_pred_form(pred):
    on_true = computation("on_true", [("x", "f32[2]")], [
        ("k", "constant", "f32[2]", [], const([1, 1], np.float32)),
        ("y", "add", "f32[2]", ["x", "k"])], "y")
    on_false = computation("on_false", [("t", "(f32[2], f32[2])")], [
        ("a", "get-tuple-element", "f32[2]", ["t"], {"index": 0}),
        ("b", "get-tuple-element", "f32[2]", ["t"], {"index": 1}),
        ("y", "multiply", "f32[2]", ["a", "b"])], "y")
    main = computation("main", [("p", "pred[]"), ("x", "f32[2]"), ("a", "f32[2]"), ("b", "f32[2]")], [
        ("t", "tuple", "(f32[2], f32[2])", ["a", "b"]),
        ("c", "conditional", "f32[2]", ["p", "x", "t"],
         {"true_computation": "on_true", "false_computation": "on_false"})], "c")
    x, a, b = (np.array(v, np.float32) for v in ([1, 2], [3, 4], [5, 6]))
    got = run_module(module(main, on_true, on_false), [np.bool_(pred), x, a, b])
    expected = lax.cond(pred, lambda ops: ops[0] + 1, lambda ops: ops[1] * ops[2], (x, a, b))
    np.testing.assert_array_equal(got, np.asarray(expected))
    assert got.dtype == np.float32


def branch_computations() -> list[Computation]:
    """Branch k returns (k, x * (k + 1)) as a tuple."""
    out = []
    for k in range(3):
        out.append(computation(f"branch{k}", [("x", "s64[4]")], [
            ("k", "constant", "s32[]", [], const(k, np.int32)),
            ("m", "constant", "s64[4]", [], const([k + 1] * 4, np.int64)),
            ("y", "multiply", "s64[4]", ["x", "m"]),
            ("r", "tuple", "(s32[], s64[4])", ["k", "y"])], "r"))
    return out


@pytest.mark.parametrize("index", [-5, -1, 0, 1, 2, 3, 100, np.iinfo(np.int32).min])
def test_conditional_index_form_runs_the_last_branch_when_out_of_range(index):
    branches = branch_computations()
    main = computation("main", [("i", "s32[]"), ("x", "s64[4]")], [
        ("c", "conditional", "(s32[], s64[4])", ["i", "x", "x", "x"],
         {"branch_computations": [b.name for b in branches]})], "c")
    x = np.array([1, -2, 3, 2**40], np.int64)
    k, y = run_module(module(main, *branches), [np.int32(index), x])
    expected_branch = index if 0 <= index < 3 else 2
    assert int(k) == expected_branch
    if 0 <= index < 3:  # lax.switch clamps instead, so it is the oracle only in range
        ek, ey = lax.switch(index, [lambda v, j=j: (np.int32(j), v * (j + 1)) for j in range(3)], x)
        assert int(ek) == int(k)
        np.testing.assert_array_equal(y, np.asarray(ey))
    np.testing.assert_array_equal(y, x * (expected_branch + 1))


def test_conditional_rejects_a_pred_selector_for_branch_computations():
    branch = computation("b", [("x", "f32[]")], [], "x")
    main = computation("main", [("p", "pred[]"), ("x", "f32[]")], [
        ("c", "conditional", "f32[]", ["p", "x"], {"branch_computations": ["b"]})], "c")
    with pytest.raises(ProgramError, match="s32"):
        run_module(module(main, branch), [np.bool_(True), np.float32(1)])


# -- call / fusion / map / async ---------------------------------------------------------------

@pytest.mark.parametrize("opcode,attr", [("call", "to_apply"), ("fusion", "calls")])
def test_call_and_fusion_run_their_computation(opcode, attr):
    callee = computation("callee", [("a", "s32[2]"), ("b", "s32[2]")], [
        ("s", "subtract", "s32[2]", ["a", "b"]),
        ("m", "multiply", "s32[2]", ["s", "a"])], "m")
    attrs = {attr: "callee"} | ({"kind": "kLoop"} if opcode == "fusion" else {})
    main = computation("main", [("a", "s32[2]"), ("b", "s32[2]")], [
        ("c", opcode, "s32[2]", ["a", "b"], attrs)], "c")
    a, b = np.array([5, -7], np.int32), np.array([2, 3], np.int32)
    np.testing.assert_array_equal(run_module(module(main, callee), [a, b]), (a - b) * a)


def test_call_with_the_wrong_number_of_operands():
    callee = computation("callee", [("a", "f32[]")], [], "a")
    main = computation("main", [("a", "f32[]")], [("c", "call", "f32[]", ["a", "a"], {"to_apply": "callee"})], "c")
    with pytest.raises(ProgramError, match="takes 1 parameter"):
        run_module(module(main, callee), [np.float32(1)])


def map_computation() -> Computation:
    """(a, b) -> (a * b + a) - b, with a constant."""
    return computation("f", [("a", "f32[]"), ("b", "f32[]")], [
        ("ab", "multiply", "f32[]", ["a", "b"]),
        ("s", "add", "f32[]", ["ab", "a"]),
        ("d", "subtract", "f32[]", ["s", "b"]),
        ("half", "constant", "f32[]", [], const(0.5, np.float32)),
        ("r", "multiply", "f32[]", ["d", "half"])], "r")


@pytest.mark.parametrize("dims", [(3, 4), (), (0, 2), (7,)])
def test_map_evaluates_a_multi_op_computation_on_whole_arrays(dims):
    rng = np.random.default_rng(0)
    a = rng.standard_normal(dims).astype(np.float32)
    b = rng.standard_normal(dims).astype(np.float32)
    shape = str(Shape.array("f32", dims))
    main = computation("main", [("a", shape), ("b", shape)], [
        ("m", "map", shape, ["a", "b"], {"to_apply": "f", "dimensions": list(range(len(dims)))})], "m")
    got = run_module(module(main, map_computation()), [a, b])
    (expected,) = jit_answer(lambda a, b: (a * b + a - b) * np.float32(0.5), [a, b])
    assert got.dtype == np.float32 and got.shape == dims
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


def test_map_of_a_computation_that_ignores_its_parameter_broadcasts():
    f = computation("f", [("a", "s32[]")], [("k", "constant", "s32[]", [], const(9, np.int32))], "k")
    main = computation("main", [("a", "s32[2,3]")], [
        ("m", "map", "s32[2,3]", ["a"], {"to_apply": "f", "dimensions": [0, 1]})], "m")
    got = run_module(module(main, f), [np.zeros((2, 3), np.int32)])
    np.testing.assert_array_equal(got, np.full((2, 3), 9, np.int32))


def test_async_start_update_done_wrap_a_computation():
    wrapped = binary_computation("add", "f32", name="wrapped")
    wrapped.instructions[0].shape = Shape.parse("f32[3]")
    wrapped.instructions[1].shape = Shape.parse("f32[3]")
    wrapped.instructions[2].shape = Shape.parse("f32[3]")
    start_shape = "((f32[3], f32[3]), f32[3], s32[])"
    main = computation("main", [("a", "f32[3]"), ("b", "f32[3]")], [
        ("s", "async-start", start_shape, ["a", "b"], {"calls": "wrapped"}),
        ("u", "async-update", start_shape, ["s"]),
        ("d", "async-done", "f32[3]", ["u"])], "d")
    a, b = np.array([1, 2, 3], np.float32), np.array([10, 20, 30], np.float32)
    got = run_module(module(main, wrapped), [a, b])
    np.testing.assert_array_equal(got, a + b)
    assert got.dtype == np.float32


# -- custom-call -------------------------------------------------------------------------------

def custom_call_module(target: str, result: str = "f32[3]", operands: int = 1) -> Module:
    params = [(f"x{i}", "f32[3]") for i in range(operands)]
    main = computation("main", params, [
        ("c", "custom-call", result, [p for p, _ in params], {"custom_call_target": target})], "c")
    return module(main)


def test_custom_call_runs_a_registered_function():
    register_custom_call("test_axpy", lambda x, y: 2 * x + y)
    try:
        x, y = np.array([1, 2, 3], np.float32), np.array([1, 1, 1], np.float32)
        got = run_module(custom_call_module("test_axpy", operands=2), [x, y])
        np.testing.assert_array_equal(got, 2 * x + y)
        assert got.dtype == np.float32
    finally:
        unregister_custom_call("test_axpy")


def test_custom_call_tuple_result_and_wrong_shape():
    register_custom_call("test_split", lambda x: (x[:1], x.sum()))
    register_custom_call("test_bad", lambda x: x[:2])
    try:
        first, total = run_module(custom_call_module("test_split", "(f32[1], f32[])"), [np.ones(3, np.float32)])
        np.testing.assert_array_equal(first, [1])
        assert total.shape == () and float(total) == 3
        with pytest.raises(ProgramError, match="test_bad"):
            run_module(custom_call_module("test_bad"), [np.ones(3, np.float32)])
    finally:
        unregister_custom_call("test_split")
        unregister_custom_call("test_bad")


def test_unknown_custom_call_target_is_named():
    with pytest.raises(ProgramError, match="os.system"):
        run_module(custom_call_module("os.system"), [np.ones(3, np.float32)])


@pytest.mark.parametrize("target", ["Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape",
                                    "annotate_device_placement", "MoveToHost", "MoveToDevice"])
def test_annotation_custom_calls_pass_their_operand_through(target):
    x = np.array([1, 2, 3], np.float32)
    np.testing.assert_array_equal(run_module(custom_call_module(target), [x]), x)


def test_builtin_targets_cannot_be_replaced():
    with pytest.raises(ProgramError, match="built in"):
        register_custom_call("Sharding", lambda x: x)


# -- dynamic sizes -----------------------------------------------------------------------------

def reduce_computation(kind: str) -> Computation:
    return binary_computation(kind, "f32", name=f"r_{kind}")


def test_document_set_dimension_size_example():
    v = np.arange(1, 11, dtype=np.float32)
    main = computation("main", [("v", "f32[10]")], [
        ("five", "constant", "s32[]", [], const(5, np.int32)),
        ("six", "constant", "s32[]", [], const(6, np.int32)),
        ("zero", "constant", "f32[]", [], const(0, np.float32)),
        ("one", "constant", "f32[]", [], const(1, np.float32)),
        ("v5", "set-dimension-size", "f32[<=10]", ["v", "five"], {"dimensions": [0]}),
        ("v6", "set-dimension-size", "f32[<=10]", ["v", "six"], {"dimensions": [0]}),
        ("sum5", "reduce", "f32[]", ["v5", "zero"], {"to_apply": "r_add", "dimensions": [0]}),
        ("prod5", "reduce", "f32[]", ["v5", "one"], {"to_apply": "r_multiply", "dimensions": [0]}),
        ("sum6", "reduce", "f32[]", ["v6", "zero"], {"to_apply": "r_add", "dimensions": [0]}),
        ("regrown", "set-dimension-size", "f32[<=10]", ["v5", "six"], {"dimensions": [0]}),
        ("sum_regrown", "reduce", "f32[]", ["regrown", "zero"], {"to_apply": "r_add", "dimensions": [0]}),
        ("size5", "get-dimension-size", "s32[]", ["v5"], {"dimensions": [0]}),
        ("out", "tuple", "(f32[], f32[], f32[], f32[], s32[])", ["sum5", "prod5", "sum6", "sum_regrown", "size5"]),
    ], "out")
    sum5, prod5, sum6, sum_regrown, size5 = run_module(
        module(main, reduce_computation("add"), reduce_computation("multiply")), [v])
    assert float(sum5) == 1 + 2 + 3 + 4 + 5
    assert float(prod5) == 1 * 2 * 3 * 4 * 5
    assert float(sum6) == 1 + 2 + 3 + 4 + 5 + 6
    assert float(sum_regrown) == 1 + 2 + 3 + 4 + 5 + 6
    assert size5.dtype == np.int32 and size5.shape == () and int(size5) == 5


def test_get_dimension_size_of_static_and_dynamic_dimensions():
    main = computation("main", [("x", "s32[4,7]"), ("n", "s32[]")], [
        ("d1", "get-dimension-size", "s32[]", ["x"], {"dimensions": [1]}),
        ("y", "set-dimension-size", "s32[4,<=7]", ["x", "n"], {"dimensions": [1]}),
        ("d2", "get-dimension-size", "s32[]", ["y"], {"dimensions": [1]}),
        ("out", "tuple", "(s32[], s32[], s32[4,<=7])", ["d1", "d2", "y"])], "out")
    x = np.arange(28, dtype=np.int32).reshape(4, 7)
    d1, d2, y = run_module(module(main), [x, np.int32(3)])
    assert int(d1) == 7 and int(d2) == 3
    np.testing.assert_array_equal(y, x[:, :3])
    with pytest.raises(ProgramError, match="out of range"):
        run_module(module(main), [x, np.int32(8)])


def test_growing_a_computed_dynamic_value_pads_with_zeros():
    main = computation("main", [("x", "s32[<=6]"), ("n", "s32[]")], [
        ("y", "set-dimension-size", "s32[<=6]", ["x", "n"], {"dimensions": [0]})], "y")
    got = run_module(module(main), [np.array([4, 5], np.int32), np.int32(4)])
    np.testing.assert_array_equal(got, [4, 5, 0, 0])
