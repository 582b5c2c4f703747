"""Shape inference: XLA's rules for every opcode, result shapes compared with jax.eval_shape."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import lax

from replicas.errors import ProgramError
from replicas.hlo.ir import Computation, Instruction, make_window
from replicas.hlo.shape_inference import infer_shape, parse_dim_labels
from replicas.shapes import Shape


def S(text: str) -> Shape:
    return Shape.parse(text)


def scalar_comp(name: str, param_types: list[str], root_opcode: str | None = "add", result: str | None = None,
                **attrs) -> Computation:
    """Parameters of the given scalar types; the root applies `root_opcode` to the first two."""
    comp = Computation(name)
    for i, t in enumerate(param_types):
        comp.add(Instruction(f"p{i}", "parameter", S(f"{t}[]"), [], {"parameter_number": i}))
    if root_opcode is None:
        comp.add(Instruction("r", "tuple", S(result), [f"p{i}" for i in range(len(param_types))]))
    else:
        out = S(result) if result else (S("pred[]") if root_opcode == "compare" else S(f"{param_types[0]}[]"))
        comp.add(Instruction("r", root_opcode, out, ["p0", "p1"], attrs))
    comp.root = "r"
    return comp


def shape_comp(name: str, params: list[str], root: str) -> Computation:
    """Parameters of the given shapes, root = a constant-free stand-in of shape `root`."""
    comp = Computation(name)
    for i, p in enumerate(params):
        comp.add(Instruction(f"p{i}", "parameter", S(p), [], {"parameter_number": i}))
    comp.add(Instruction("r", "custom-call", S(root), ["p0"] if params else [], {"custom_call_target": "x"}))
    comp.root = "r"
    return comp


COMPS = {
    "add_f32": scalar_comp("add_f32", ["f32", "f32"]),
    "add_s32": scalar_comp("add_s32", ["s32", "s32"]),
    "lt_f32": scalar_comp("lt_f32", ["f32", "f32"], "compare", comparison_direction="LT"),
    "lt_f32_s32": scalar_comp("lt_f32_s32", ["f32", "f32", "s32", "s32"], "compare", comparison_direction="LT"),
    "argmax": scalar_comp("argmax", ["f32", "s32", "f32", "s32"], None, "(f32[], s32[])"),
    "bad_add": scalar_comp("bad_add", ["f32", "f32", "f32"]),
    "cond": shape_comp("cond", ["(s32[], f32[4])"], "pred[]"),
    "body": shape_comp("body", ["(s32[], f32[4])"], "(s32[], f32[4])"),
    "bad_body": shape_comp("bad_body", ["(s32[], f32[4])"], "(s32[], f32[5])"),
    "branch_a": shape_comp("branch_a", ["f32[2]"], "f32[3]"),
    "branch_b": shape_comp("branch_b", ["s32[]"], "f32[3]"),
    "branch_c": shape_comp("branch_c", ["s32[]"], "f32[4]"),
}


def lookup(name: str) -> Computation:
    try:
        return COMPS[name]
    except KeyError:
        raise ProgramError(f"no computation {name}") from None


def infer(opcode: str, shapes: list[str], attrs: dict | None = None, **kw) -> Shape | None:
    return infer_shape(opcode, [S(s) for s in shapes], attrs or {}, lookup, **kw)


def fails(match: str, opcode: str, shapes: list[str], attrs: dict | None = None, **kw) -> None:
    with pytest.raises(ProgramError, match=match):
        infer(opcode, shapes, attrs, **kw)


def jshape(out) -> str:
    """jax.eval_shape result -> our shape text."""
    from replicas.shapes import PrimitiveType

    return str(Shape.array(PrimitiveType.from_dtype(out.dtype), out.shape))


def jspec(text: str):
    s = S(text)
    return jax.ShapeDtypeStruct(s.dimensions, s.dtype)


# -- element-wise --------------------------------------------------------------------------------------

@pytest.mark.parametrize("opcode,good,bad", [
    ("floor", "f32", "s32"), ("ceil", "bf16", "u8"), ("erf", "f64", "c64"), ("is-finite", "f16", "s8"),
    ("round-nearest-even", "f32", "s32"), ("sine", "c64", "s32"), ("tanh", "f32", "pred"), ("log", "c128", "u32"),
    ("abs", "s32", "u32"), ("sign", "f32", "u8"), ("not", "pred", "f32"), ("count-leading-zeros", "u16", "f32"),
    ("popcnt", "s64", "f64"), ("negate", "s8", "pred"), ("real", "f32", "s32"), ("imag", "c64", "s32"),
])
def test_unary_type_rules(opcode: str, good: str, bad: str) -> None:
    out = infer(opcode, [f"{good}[2,3]"])
    assert out is not None and out.dimensions == (2, 3)
    fails(opcode, opcode, [f"{bad}[2,3]"])


def test_unary_result_types() -> None:
    assert infer("is-finite", ["f32[3]"]) == S("pred[3]")
    assert infer("abs", ["c64[3]"]) == S("f32[3]")
    assert infer("real", ["c128[3]"]) == S("f64[3]")
    assert infer("imag", ["f32[3]"]) == S("f32[3]")


def test_binary_rules() -> None:
    assert infer("add", ["f32[2,3]", "f32[2,3]"]) == S("f32[2,3]")
    fails("same element type", "add", ["f32[2]", "f64[2]"])
    fails("same dimensions", "multiply", ["f32[2]", "f32[3]"])
    fails("same dimensions", "add", ["f32[]", "f32[3]"])
    assert infer("shift-left", ["u8[4]", "u8[4]"]) == S("u8[4]")
    fails("integer", "shift-right-logical", ["f32[4]", "f32[4]"])
    assert infer("and", ["pred[4]", "pred[4]"]) == S("pred[4]")
    fails("pred or integer", "xor", ["f32[4]", "f32[4]"])
    fails("floating-point or complex", "atan2", ["s32[4]", "s32[4]"])
    assert infer("complex", ["f32[4]", "f32[4]"]) == S("c64[4]")
    assert infer("complex", ["f64[]", "f64[]"]) == S("c128[]")
    fails("f32 or f64", "complex", ["bf16[4]", "bf16[4]"])
    fails("must be an array", "add", ["(f32[])", "(f32[])"])


def test_compare() -> None:
    assert infer("compare", ["f32[2]", "f32[2]"], {"comparison_direction": "LT"}) == S("pred[2]")
    assert infer("compare", ["f32[2]", "f32[2]"], {"comparison_direction": "LT", "type": "TOTALORDER"}) == S("pred[2]")
    fails("does not fit", "compare", ["s32[2]", "s32[2]"], {"comparison_direction": "LT", "type": "UNSIGNED"})
    fails("does not fit", "compare", ["f32[2]", "f32[2]"], {"comparison_direction": "LT", "type": "SIGNED"})
    fails("comparison_direction", "compare", ["f32[2]", "f32[2]"], {"comparison_direction": "XX"})
    fails("EQ or NE", "compare", ["c64[2]", "c64[2]"], {"comparison_direction": "LT"})


def test_select_and_clamp() -> None:
    assert infer("select", ["pred[3]", "f32[3]", "f32[3]"]) == S("f32[3]")
    assert infer("select", ["pred[]", "f32[3]", "f32[3]"]) == S("f32[3]")
    fails("pred", "select", ["s32[3]", "f32[3]", "f32[3]"])
    fails("same shape", "select", ["pred[3]", "f32[3]", "s32[3]"])
    fails("dimensions", "select", ["pred[2]", "f32[3]", "f32[3]"])
    assert infer("clamp", ["f32[]", "f32[3]", "f32[]"]) == S("f32[3]")
    assert infer("clamp", ["s32[3]", "s32[3]", "s32[3]"]) == S("s32[3]")
    fails("element type", "clamp", ["f64[]", "f32[3]", "f32[]"])
    fails("scalar or have", "clamp", ["f32[2]", "f32[3]", "f32[]"])


def test_conversions() -> None:
    assert infer("convert", ["f32[2]"], result=S("s8[2]")) == S("s8[2]")
    assert infer("convert", ["f32[2]"]) is None
    assert infer("convert", ["c64[2]"], result=S("f32[2]")) == S("f32[2]")  # the real part, as StableHLO
    assert infer("reduce-precision", ["f32[2]"], {"exponent_bits": 5, "mantissa_bits": 10}) == S("f32[2]")
    fails("floating", "reduce-precision", ["s32[2]"], {"exponent_bits": 5, "mantissa_bits": 10})
    fails("exponent_bits", "reduce-precision", ["f32[2]"], {"exponent_bits": 0, "mantissa_bits": 10})


@pytest.mark.parametrize("src,dst", [("f32[2,3]", "s32"), ("f32[2,3]", "u8"), ("u8[2,4]", "f32"),
                                     ("f64[5]", "u16"), ("s16[3,2]", "s32"), ("f32[]", "bf16")])
def test_bitcast_convert_matches_jax(src: str, dst: str) -> None:
    try:
        want = jshape(jax.eval_shape(lambda x: lax.bitcast_convert_type(x, S(f"{dst}[]").dtype), jspec(src)))
    except (TypeError, ValueError):
        fails("bitcast-convert", "bitcast-convert", [src], result=S(f"{dst}[]"))
        return
    assert str(infer("bitcast-convert", [src], result=S(f"{dst}[]"))) == want


def test_bitcast_convert_rules() -> None:
    fails("last dimension of size 4", "bitcast-convert", ["u8[2,3]"], result=S("f32[]"))
    fails("complex", "bitcast-convert", ["c64[2]"], result=S("f64[2]"))


# -- data movement ------------------------------------------------------------------------------------

def test_parameter_constant_iota() -> None:
    assert infer("parameter", [], {"parameter_number": 0}, result=S("f32[2]")) is None
    fails("parameter_number", "parameter", [], {"parameter_number": -1})
    assert infer("constant", [], {"literal": np.zeros((2, 3), np.float32)}, result=S("f32[2,3]")) is None
    fails("literal", "constant", [], {"literal": np.zeros((2,), np.float32)}, result=S("f32[2,3]"))
    assert infer("iota", [], {"iota_dimension": 1}, result=S("s32[2,3]")) is None
    fails("iota_dimension 2 out of range", "iota", [], {"iota_dimension": 2}, result=S("s32[2,3]"))


def test_broadcast_and_reshape() -> None:
    assert infer("broadcast", ["f32[3]"], {"dimensions": [1]}, result=S("f32[2,3]")) is None
    fails("does not match result dimension", "broadcast", ["f32[3]"], {"dimensions": [0]}, result=S("f32[2,3]"))
    fails("one entry per operand dimension", "broadcast", ["f32[3]"], {"dimensions": []}, result=S("f32[2,3]"))
    fails("repeated", "broadcast", ["f32[3,3]"], {"dimensions": [1, 1]}, result=S("f32[3,3]"))
    assert infer("reshape", ["f32[2,3]"], result=S("f32[6]")) is None
    fails("element count", "reshape", ["f32[2,3]"], result=S("f32[5]"))
    fails("element type", "reshape", ["f32[2,3]"], result=S("s32[6]"))
    fails("size in bits", "bitcast", ["f32[2,3]"], result=S("f32[5]"))


def test_transpose_reverse() -> None:
    assert infer("transpose", ["f32[2,3,4]"], {"dimensions": [2, 0, 1]}) == S("f32[4,2,3]")
    fails("permutation", "transpose", ["f32[2,3]"], {"dimensions": [0, 0]})
    assert infer("reverse", ["f32[2,3]"], {"dimensions": [1]}) == S("f32[2,3]")
    fails("out of range", "reverse", ["f32[2,3]"], {"dimensions": [2]})


@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6), st.integers(1, 3)), min_size=1, max_size=3))
@settings(max_examples=30, deadline=None)
def test_slice_matches_jax(spec) -> None:
    dims = [6] * len(spec)
    spec = [(min(a, b), max(a, b), s) for a, b, s in spec]
    want = jax.eval_shape(lambda x: lax.slice(x, [a for a, _, _ in spec], [b for _, b, _ in spec],
                                              [s for _, _, s in spec]), jax.ShapeDtypeStruct(dims, np.float32))
    assert str(infer("slice", [f"f32[{','.join(map(str, dims))}]"], {"slice": spec})) == jshape(want)


def test_slice_bounds() -> None:
    fails("out of bounds", "slice", ["f32[4]"], {"slice": [(0, 5, 1)]})
    fails("out of bounds", "slice", ["f32[4]"], {"slice": [(3, 2, 1)]})
    fails("stride", "slice", ["f32[4]"], {"slice": [(0, 4, 0)]})
    fails("entries", "slice", ["f32[4,4]"], {"slice": [(0, 4, 1)]})


def test_dynamic_slices() -> None:
    assert infer("dynamic-slice", ["f32[5,6]", "s32[]", "s32[]"], {"dynamic_slice_sizes": [2, 3]}) == S("f32[2,3]")
    fails("between 0 and", "dynamic-slice", ["f32[5,6]", "s32[]", "s32[]"], {"dynamic_slice_sizes": [6, 3]})
    fails("2 scalar start indices", "dynamic-slice", ["f32[5,6]", "s32[]"], {"dynamic_slice_sizes": [2, 3]})
    fails("integer scalar", "dynamic-slice", ["f32[5,6]", "f32[]", "f32[]"], {"dynamic_slice_sizes": [2, 3]})
    fails("same type", "dynamic-slice", ["f32[5,6]", "s32[]", "s64[]"], {"dynamic_slice_sizes": [2, 3]})
    assert infer("dynamic-update-slice", ["f32[5,6]", "f32[2,6]", "s32[]", "s32[]"]) == S("f32[5,6]")
    fails("exceeds", "dynamic-update-slice", ["f32[5,6]", "f32[2,7]", "s32[]", "s32[]"])
    fails("element type", "dynamic-update-slice", ["f32[5,6]", "s32[2,6]", "s32[]", "s32[]"])


@pytest.mark.parametrize("cfg", [[(1, 2, 0)], [(-1, -1, 1)], [(0, 0, 2), (2, -3, 0)], [(-2, 0, 0), (0, 0, 0)]])
def test_pad_matches_jax(cfg) -> None:
    dims = [4] * len(cfg)
    want = jax.eval_shape(lambda x: lax.pad(x, np.float32(0), cfg), jax.ShapeDtypeStruct(dims, np.float32))
    got = infer("pad", [f"f32[{','.join(map(str, dims))}]", "f32[]"], {"padding": cfg})
    assert str(got) == jshape(want)


def test_pad_rules() -> None:
    fails("negative size", "pad", ["f32[2]", "f32[]"], {"padding": [(-2, -1, 0)]})
    fails("interior", "pad", ["f32[2]", "f32[]"], {"padding": [(0, 0, -1)]})
    fails("padding value", "pad", ["f32[2]", "s32[]"], {"padding": [(0, 0, 0)]})


def test_concatenate() -> None:
    assert infer("concatenate", ["f32[2,3]", "f32[4,3]"], {"dimensions": [0]}) == S("f32[6,3]")
    fails("rank", "concatenate", ["f32[2,3]", "f32[3]"], {"dimensions": [0]})
    fails("non-concatenated dimension 1", "concatenate", ["f32[2,3]", "f32[2,4]"], {"dimensions": [0]})
    fails("element type", "concatenate", ["f32[2,3]", "s32[2,3]"], {"dimensions": [0]})
    fails("out of range", "concatenate", ["f32[2,3]"], {"dimensions": [2]})


def test_tuples_and_dynamic_sizes() -> None:
    assert infer("tuple", ["f32[2]", "s32[]"]) == S("(f32[2], s32[])")
    assert infer("get-tuple-element", ["(f32[2], s32[])"], {"index": 1}) == S("s32[]")
    fails("index 2 out of range", "get-tuple-element", ["(f32[2], s32[])"], {"index": 2})
    fails("tuple", "get-tuple-element", ["f32[2]"], {"index": 0})
    assert infer("get-dimension-size", ["f32[2,3]"], {"dimensions": [1]}) == S("s32[]")
    out = infer("set-dimension-size", ["f32[2,3]", "s32[]"], {"dimensions": [1]})
    assert out is not None and out.dynamic == (False, True)


# -- dot and convolution ------------------------------------------------------------------------------

@pytest.mark.parametrize("lhs,rhs,dn", [
    ("f32[2,3]", "f32[3,4]", (([1], [0]), ([], []))),
    ("f32[5,2,3]", "f32[5,3,4]", (([2], [1]), ([0], [0]))),
    ("f32[3,5,2]", "f32[4,3,5]", (([0], [1]), ([1], [2]))),
    ("f32[7,3,2,6]", "f32[6,2,9,7]", (([2], [1]), ([3, 0], [0, 3]))),
    ("f32[3]", "f32[3]", (([0], [0]), ([], []))),
    ("f32[2,3]", "f32[4]", (([], []), ([], []))),
])
def test_dot_general_matches_jax(lhs: str, rhs: str, dn) -> None:
    want = jax.eval_shape(lambda a, b: lax.dot_general(a, b, dn), jspec(lhs), jspec(rhs))
    (lc, rc), (lb, rb) = dn
    got = infer("dot", [lhs, rhs], {"lhs_contracting_dims": lc, "rhs_contracting_dims": rc,
                                    "lhs_batch_dims": lb, "rhs_batch_dims": rb})
    assert str(got) == jshape(want)


def test_dot_rules() -> None:
    attrs = {"lhs_contracting_dims": [1], "rhs_contracting_dims": [0]}
    fails("contracting dimension sizes differ", "dot", ["f32[2,3]", "f32[4,5]"], attrs)
    fails("same element type", "dot", ["f32[2,3]", "s32[3,5]"], attrs)
    fails("same length", "dot", ["f32[2,3]", "f32[3,5]"], {"lhs_contracting_dims": [1]})
    fails("batch dimension sizes", "dot", ["f32[2,3]", "f32[4,3]"],
          {"lhs_batch_dims": [0], "rhs_batch_dims": [0], "lhs_contracting_dims": [1], "rhs_contracting_dims": [1]})
    fails("repeated", "dot", ["f32[3,3]", "f32[3,3]"],
          {"lhs_batch_dims": [1], "rhs_batch_dims": [0], "lhs_contracting_dims": [1], "rhs_contracting_dims": [1]})
    # A declared result type (preferred_element_type) is kept.
    assert infer("dot", ["s8[2,3]", "s8[3,4]"], attrs, result=S("s32[2,4]")) == S("s32[2,4]")


def test_parse_dim_labels() -> None:
    dn = parse_dim_labels("b01f_01io->b01f")
    assert (dn.input_batch, dn.input_feature, dn.input_spatial) == (0, 3, [1, 2])
    assert (dn.kernel_input_feature, dn.kernel_output_feature, dn.kernel_spatial) == (2, 3, [0, 1])
    assert (dn.output_batch, dn.output_feature, dn.output_spatial) == (0, 3, [1, 2])
    dn = parse_dim_labels("bf10_oi01->f1b0")
    assert dn.input_spatial == [3, 2] and dn.kernel_spatial == [2, 3] and dn.output_spatial == [3, 1]
    assert dn.to_labels() == "bf10_oi01->f1b0"
    for bad in ("b01f_01io", "b01f01io->b01f", "b01f_01i->b01f", "b01x_01io->b01f", "bb1f_01io->b01f"):
        with pytest.raises(ProgramError, match="dim_labels"):
            parse_dim_labels(bad)


CONV_CASES = [
    # lhs, rhs, strides, padding, lhs_dil, rhs_dil, jax dimension_numbers, fgc, bgc
    ("f32[2,3,9,9]", "f32[4,3,3,3]", (1, 1), [(0, 0), (0, 0)], (1, 1), (1, 1), ("NCHW", "OIHW", "NCHW"), 1, 1),
    ("f32[2,9,8,6]", "f32[3,3,2,6]", (2, 1), [(1, 1), (2, 0)], (1, 1), (2, 1), ("NHWC", "HWIO", "NHWC"), 3, 1),
    ("f32[4,7,5]", "f32[6,3,5]", (1,), [(1, 2)], (2,), (1,), ("NWC", "OWI", "NCW"), 1, 2),
    ("f32[1,2,10]", "f32[2,2,4]", (3,), [(-1, 0)], (1,), (2,), ("NCW", "IOW", "NWC"), 1, 1),
    ("f32[2,4,6,6,3]", "f32[5,2,2,2,3]", (1, 2, 1), [(0, 0), (1, 1), (0, 1)], (1, 1, 2), (1, 1, 1),
     ("NDHWC", "OHWDI", "NCDHW"), 1, 1),
]


def _labels(dn: tuple[str, str, str]) -> str:
    lhs, rhs, out = dn
    spatial = [c for c in rhs if c not in "OI"]

    def spell(spec: str, names: dict[str, str]) -> str:
        return "".join(names.get(c) or str(spatial.index(c)) for c in spec)

    return (spell(lhs, {"N": "b", "C": "f"}) + "_" + spell(rhs, {"I": "i", "O": "o"}) + "->"
            + spell(out, {"N": "b", "C": "f"}))


@pytest.mark.parametrize("case", CONV_CASES)
def test_convolution_matches_jax(case) -> None:
    lhs, rhs, strides, pad, ld, rd, dn, fgc, bgc = case
    want = jax.eval_shape(lambda a, b: lax.conv_general_dilated(a, b, strides, pad, ld, rd, dn, fgc, bgc),
                          jspec(lhs), jspec(rhs))
    rs = S(rhs)
    spatial = [rs.dimensions[dn[1].index(c)] for c in dn[1] if c not in "OI"]
    window = make_window(len(strides), size=spatial, stride=list(strides), pad=pad, lhs_dilate=list(ld),
                         rhs_dilate=list(rd))
    got = infer("convolution", [lhs, rhs], {"window": window, "dim_labels": _labels(dn),
                                            "feature_group_count": fgc, "batch_group_count": bgc})
    assert str(got) == jshape(want)


def test_convolution_rules() -> None:
    w = make_window(2, size=[3, 3])
    base = {"window": w, "dim_labels": "bf01_oi01->bf01"}
    assert infer("convolution", ["f32[2,4,5,5]", "f32[6,4,3,3]"], base) == S("f32[2,6,3,3]")
    fails("kernel input feature", "convolution", ["f32[2,4,5,5]", "f32[6,3,3,3]"], base)
    fails("feature_group_count", "convolution", ["f32[2,4,5,5]", "f32[6,2,3,3]"], {**base, "feature_group_count": 3})
    fails("kernel output feature size 6 is not divisible by feature_group_count 4", "convolution",
          ["f32[2,4,5,5]", "f32[6,1,3,3]"], {**base, "feature_group_count": 4})
    fails("batch size 3 is not divisible", "convolution", ["f32[3,4,5,5]", "f32[6,4,3,3]"],
          {**base, "batch_group_count": 2})
    fails("cannot both", "convolution", ["f32[4,4,5,5]", "f32[4,2,3,3]"],
          {**base, "feature_group_count": 2, "batch_group_count": 2})
    fails("window size", "convolution", ["f32[2,4,5,5]", "f32[6,4,2,2]"], base)
    fails("rank 4", "convolution", ["f32[2,4,5]", "f32[6,4,3]"], base)
    fails("dim_labels", "convolution", ["f32[2,4,5,5]", "f32[6,4,3,3]"], {**base, "dim_labels": "bf01->bf01"})


# -- gather / scatter ---------------------------------------------------------------------------------

GATHER_CASES = [
    # operand, indices, offset_dims, collapsed, start_index_map, operand_batching, indices_batching, slice_sizes
    ("f32[5,6]", "s32[3,1]", (1,), (0,), (0,), (), (), (1, 6)),
    ("f32[5,6,7]", "s32[4,2,2]", (2, 3), (0,), (0, 1), (), (), (1, 2, 7)),
    ("f32[5,6]", "s32[2,3,2]", (), (0, 1), (0, 1), (), (), (1, 1)),
    ("f32[3,5,6]", "s32[3,4,1]", (2,), (1,), (1,), (0,), (0,), (1, 1, 6)),
    ("f32[8]", "s32[2,2,1]", (0,), (), (0,), (), (), (3,)),
]


@pytest.mark.parametrize("case", GATHER_CASES)
def test_gather_matches_jax(case) -> None:
    operand, indices, offset, collapsed, sim, ob, ib, sizes = case
    dn = lax.GatherDimensionNumbers(offset_dims=offset, collapsed_slice_dims=collapsed, start_index_map=sim,
                                    operand_batching_dims=ob, start_indices_batching_dims=ib)
    want = jax.eval_shape(lambda a, i: lax.gather(a, i, dn, sizes), jspec(operand), jspec(indices))
    attrs = {"offset_dims": list(offset), "collapsed_slice_dims": list(collapsed), "start_index_map": list(sim),
             "operand_batching_dims": list(ob), "start_indices_batching_dims": list(ib),
             "index_vector_dim": S(indices).rank - 1, "slice_sizes": list(sizes), "indices_are_sorted": False}
    assert str(infer("gather", [operand, indices], attrs)) == jshape(want)


def test_gather_rules() -> None:
    base = {"offset_dims": [1], "collapsed_slice_dims": [0], "start_index_map": [0], "index_vector_dim": 1,
            "slice_sizes": [1, 6]}
    assert infer("gather", ["f32[5,6]", "s32[3,1]"], base) == S("f32[3,6]")
    # index_vector_dim == rank: an implicit trailing 1.
    assert infer("gather", ["f32[5,6]", "s32[3]"], base) == S("f32[3,6]")
    fails("index vector size", "gather", ["f32[5,6]", "s32[3,2]"], base)
    fails("between 0 and the operand size", "gather", ["f32[5,6]", "s32[3,1]"], {**base, "slice_sizes": [1, 7]})
    fails("collapsed or batching dimension 0 must be at most 1", "gather", ["f32[5,6]", "s32[3,1]"],
          {**base, "slice_sizes": [2, 6]})
    fails("add up to the operand rank", "gather", ["f32[5,6]", "s32[3,1]"], {**base, "collapsed_slice_dims": []})
    fails("sorted", "gather", ["f32[5,6,7]", "s32[3,1]"],
          {**base, "offset_dims": [2, 1], "slice_sizes": [1, 6, 7]})
    fails("integers", "gather", ["f32[5,6]", "f32[3,1]"], base)
    fails("index_vector_dim", "gather", ["f32[5,6]", "s32[3,1]"], {**base, "index_vector_dim": 3})


SCATTER_CASES = [
    # operand, indices, updates, update_window_dims, inserted, sdod, input_batching, indices_batching
    ("f32[5,6]", "s32[3,1]", "f32[3,6]", (1,), (0,), (0,), (), ()),
    ("f32[5,6,7]", "s32[4,2]", "f32[4,7]", (1,), (0, 1), (0, 1), (), ()),
    ("f32[3,5,6]", "s32[3,4,1]", "f32[3,4,6]", (2,), (1,), (1,), (0,), (0,)),
    ("f32[8]", "s32[2,1]", "f32[2,3]", (1,), (), (0,), (), ()),
]


@pytest.mark.parametrize("case", SCATTER_CASES)
def test_scatter_matches_jax(case) -> None:
    operand, indices, updates, uwd, iwd, sdod, ib, sib = case
    dn = lax.ScatterDimensionNumbers(update_window_dims=uwd, inserted_window_dims=iwd,
                                     scatter_dims_to_operand_dims=sdod, operand_batching_dims=ib,
                                     scatter_indices_batching_dims=sib)
    want = jax.eval_shape(lambda a, i, u: lax.scatter_add(a, i, u, dn), jspec(operand), jspec(indices),
                          jspec(updates))
    attrs = {"update_window_dims": list(uwd), "inserted_window_dims": list(iwd),
             "scatter_dims_to_operand_dims": list(sdod), "input_batching_dims": list(ib),
             "scatter_indices_batching_dims": list(sib), "index_vector_dim": S(indices).rank - 1,
             "to_apply": "add_f32"}
    assert str(infer("scatter", [operand, indices, updates], attrs)) == jshape(want)


def test_scatter_rules() -> None:
    base = {"update_window_dims": [1], "inserted_window_dims": [0], "scatter_dims_to_operand_dims": [0],
            "index_vector_dim": 1, "to_apply": "add_f32"}
    fails("larger than operand dimension", "scatter", ["f32[5,6]", "s32[3,1]", "f32[3,7]"], base)
    fails("scatter dimensions of updates", "scatter", ["f32[5,6]", "s32[3,1]", "f32[4,6]"], base)
    fails("rank", "scatter", ["f32[5,6]", "s32[3,1]", "f32[3,1,6]"], base)
    fails("element type", "scatter", ["f32[5,6]", "s32[3,1]", "s32[3,6]"], base)
    fails("update computation", "scatter", ["s32[5,6]", "s32[3,1]", "s32[3,6]"], base)
    fails("odd count", "scatter", ["f32[5,6]", "s32[3,1]"], base)
    # Variadic: two operands, the indices, two updates -> a tuple.
    variadic = {**base, "to_apply": "argmax"}
    assert infer("scatter", ["f32[5,6]", "s32[5,6]", "s32[3,1]", "f32[3,6]", "s32[3,6]"],
                 variadic) == S("(f32[5,6], s32[5,6])")


# -- reductions, windows, sort, control flow ------------------------------------------------------

def test_reduce() -> None:
    assert infer("reduce", ["f32[2,3,4]", "f32[]"], {"dimensions": [0, 2], "to_apply": "add_f32"}) == S("f32[3]")
    assert infer("reduce", ["f32[2,3]", "s32[2,3]", "f32[]", "s32[]"],
                 {"dimensions": [1], "to_apply": "argmax"}) == S("(f32[2], s32[2])")
    fails("out of range", "reduce", ["f32[2,3]", "f32[]"], {"dimensions": [2], "to_apply": "add_f32"})
    fails("repeated", "reduce", ["f32[2,3]", "f32[]"], {"dimensions": [1, 1], "to_apply": "add_f32"})
    fails("reducer add_s32 parameter 0", "reduce", ["f32[2,3]", "f32[]"], {"dimensions": [1], "to_apply": "add_s32"})
    fails("takes 3 parameters", "reduce", ["f32[2,3]", "f32[]"], {"dimensions": [1], "to_apply": "bad_add"})
    fails("init value", "reduce", ["f32[2,3]", "f32[2]"], {"dimensions": [1], "to_apply": "add_f32"})
    fails("N inputs", "reduce", ["f32[2,3]"], {"dimensions": [1], "to_apply": "add_f32"})
    fails("does not exist", "reduce", ["f32[2,3]", "f32[]"], {"dimensions": [1], "to_apply": "nope"})


RW_CASES = [
    ("f32[8,9]", (2, 3), (1, 2), [(0, 0), (1, 1)], (1, 1), (1, 1)),
    ("f32[5,6,7]", (3, 1, 2), (2, 1, 3), [(1, 0), (0, 0), (2, 2)], (2, 1, 1), (1, 1, 2)),
    ("f32[4]", (5,), (1,), [(0, 0)], (1,), (1,)),
]


@pytest.mark.parametrize("case", RW_CASES)
def test_reduce_window_matches_jax(case) -> None:
    operand, size, stride, pad, bd, wd = case
    want = jax.eval_shape(lambda x: lax.reduce_window(x, np.float32(0), lax.add, size, stride, pad, bd, wd),
                          jspec(operand))
    window = make_window(len(size), size=list(size), stride=list(stride), pad=pad, lhs_dilate=list(bd),
                         rhs_dilate=list(wd))
    got = infer("reduce-window", [operand, "f32[]"], {"window": window, "to_apply": "add_f32"})
    assert str(got) == jshape(want)


def test_select_and_scatter() -> None:
    w = make_window(2, size=[2, 2], stride=[2, 2])
    attrs = {"window": w, "select": "lt_f32", "scatter": "add_f32"}
    assert infer("select-and-scatter", ["f32[4,6]", "f32[2,3]", "f32[]"], attrs) == S("f32[4,6]")
    fails("windowed operand", "select-and-scatter", ["f32[4,6]", "f32[2,2]", "f32[]"], attrs)
    fails("select", "select-and-scatter", ["f32[4,6]", "f32[2,3]", "f32[]"], {**attrs, "select": "add_f32"})


def test_sort() -> None:
    assert infer("sort", ["f32[3,4]"], {"dimensions": [1], "is_stable": False, "to_apply": "lt_f32"}) == S("f32[3,4]")
    assert infer("sort", ["f32[3]", "s32[3]"], {"dimensions": [0], "to_apply": "lt_f32_s32"}) == S("(f32[3], s32[3])")
    fails("comparator lt_f32 takes 2 parameters, expected 4", "sort", ["f32[3]", "s32[3]"],
          {"dimensions": [0], "to_apply": "lt_f32"})
    fails("comparator add_f32 returns", "sort", ["f32[3]"], {"dimensions": [0], "to_apply": "add_f32"})
    fails("dimensions", "sort", ["f32[3]"], {"dimensions": [1], "to_apply": "lt_f32"})
    fails("dimensions of operand 0", "sort", ["f32[3]", "s32[4]"], {"dimensions": [0], "to_apply": "lt_f32_s32"})


def test_while_conditional_call_map() -> None:
    state = "(s32[], f32[4])"
    assert infer("while", [state], {"condition": "cond", "body": "body"}) == S(state)
    fails("body bad_body returns", "while", [state], {"condition": "cond", "body": "bad_body"})
    fails("condition body", "while", [state], {"condition": "body", "body": "body"})
    fails("parameter 0", "while", ["(s32[], f32[5])"], {"condition": "cond", "body": "body"})
    assert infer("conditional", ["s32[]", "f32[2]", "s32[]"],
                 {"branch_computations": ["branch_a", "branch_b"]}) == S("f32[3]")
    fails("branch 1", "conditional", ["s32[]", "f32[2]", "s32[]"], {"branch_computations": ["branch_a", "branch_c"]})
    fails("branch index", "conditional", ["pred[]", "f32[2]", "s32[]"],
          {"branch_computations": ["branch_a", "branch_b"]})
    assert infer("conditional", ["pred[]", "f32[2]", "s32[]"],
                 {"true_computation": "branch_a", "false_computation": "branch_b"}) == S("f32[3]")
    fails("2 branches need 2 branch operands", "conditional", ["pred[]", "f32[2]"],
          {"true_computation": "branch_a", "false_computation": "branch_b"})
    assert infer("call", ["f32[2]"], {"to_apply": "branch_a"}) == S("f32[3]")
    fails("parameter 0", "call", ["f32[3]"], {"to_apply": "branch_a"})
    assert infer("map", ["f32[2,3]", "f32[2,3]"], {"dimensions": [0, 1], "to_apply": "add_f32"}) == S("f32[2,3]")
    fails("dimensions of operand 0", "map", ["f32[2,3]", "f32[3,2]"], {"to_apply": "add_f32"})


# -- fft and linear algebra -----------------------------------------------------------------------

@pytest.mark.parametrize("kind,operand,lengths", [
    ("FFT", "c64[3,8]", [8]), ("IFFT", "c128[4,6]", [4, 6]), ("RFFT", "f32[2,8]", [8]), ("RFFT", "f64[5,7]", [5, 7]),
    ("IRFFT", "c64[2,5]", [8]), ("IRFFT", "c128[3,4,4]", [3, 4, 6]),
])
def test_fft_matches_jax(kind: str, operand: str, lengths: list[int]) -> None:
    want = jax.eval_shape(lambda x: lax.fft(x, kind, tuple(lengths)), jspec(operand))
    assert str(infer("fft", [operand], {"fft_type": kind, "fft_length": lengths})) == jshape(want)


def test_fft_rules() -> None:
    fails("complex", "fft", ["f32[8]"], {"fft_type": "FFT", "fft_length": [8]})
    fails("trailing", "fft", ["c64[8]"], {"fft_type": "FFT", "fft_length": [4]})
    fails("trailing", "fft", ["c64[8]"], {"fft_type": "IRFFT", "fft_length": [8]})
    fails("1 to 3", "fft", ["c64[2,2,2,2]"], {"fft_type": "FFT", "fft_length": [2, 2, 2, 2]})


def test_linalg() -> None:
    assert infer("cholesky", ["f32[2,3,3]"], {"lower": True}) == S("f32[2,3,3]")
    fails("square", "cholesky", ["f32[3,4]"], {"lower": True})
    fails("floating", "cholesky", ["s32[3,3]"], {"lower": True})
    ts = {"left_side": True, "lower": True, "unit_diagonal": False, "transpose_a": "NO_TRANSPOSE"}
    assert infer("triangular-solve", ["f32[2,3,3]", "f32[2,3,5]"], ts) == S("f32[2,3,5]")
    assert infer("triangular-solve", ["f32[3,3]", "f32[5,3]"], {**ts, "left_side": False}) == S("f32[5,3]")
    fails("3 rows", "triangular-solve", ["f32[3,3]", "f32[5,3]"], ts)
    fails("batch", "triangular-solve", ["f32[2,3,3]", "f32[4,3,5]"], ts)
    fails("transpose_a", "triangular-solve", ["f32[3,3]", "f32[3,5]"], {**ts, "transpose_a": "X"})


def test_batch_norm() -> None:
    bn = {"epsilon": 1e-3, "feature_index": 1}
    assert infer("batch-norm-training", ["f32[2,3,4]", "f32[3]", "f32[3]"], bn) == S("(f32[2,3,4], f32[3], f32[3])")
    assert infer("batch-norm-inference", ["f32[2,3]", "f32[3]", "f32[3]", "f32[3]", "f32[3]"], bn) == S("f32[2,3]")
    assert infer("batch-norm-grad", ["f32[2,3]", "f32[3]", "f32[3]", "f32[3]", "f32[2,3]"],
                 bn) == S("(f32[2,3], f32[3], f32[3])")
    fails("scale", "batch-norm-training", ["f32[2,3,4]", "f32[4]", "f32[3]"], bn)
    fails("feature_index", "batch-norm-training", ["f32[2,3]", "f32[3]", "f32[3]"], {**bn, "feature_index": 2})
    fails("grad_output", "batch-norm-grad", ["f32[2,3]", "f32[3]", "f32[3]", "f32[3]", "f32[3,3]"], bn)


@given(st.data())
@settings(max_examples=40, deadline=None)
def test_convolution_and_reduce_window_match_jax_on_random_windows(data) -> None:
    n = data.draw(st.integers(1, 2))
    in_sizes = data.draw(st.lists(st.integers(1, 7), min_size=n, max_size=n))
    k_sizes = data.draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
    strides = data.draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
    pads = data.draw(st.lists(st.tuples(st.integers(-1, 2), st.integers(-1, 2)), min_size=n, max_size=n))
    ld = data.draw(st.lists(st.integers(1, 2), min_size=n, max_size=n))
    rd = data.draw(st.lists(st.integers(1, 2), min_size=n, max_size=n))
    groups = data.draw(st.sampled_from([(1, 1), (2, 1), (1, 2)]))
    fgc, bgc = groups
    lhs = f"f32[{2 * bgc},{2 * fgc},{','.join(map(str, in_sizes))}]"
    rhs = f"f32[{2 * fgc * bgc},2,{','.join(map(str, k_sizes))}]"
    try:
        want = jshape(jax.eval_shape(lambda a, b: lax.conv_general_dilated(a, b, strides, pads, ld, rd,
                                                                            feature_group_count=fgc,
                                                                            batch_group_count=bgc),
                                     jspec(lhs), jspec(rhs)))
    except (TypeError, ValueError):
        want = None
    spatial = "".join(str(i) for i in range(n))
    window = make_window(n, size=k_sizes, stride=strides, pad=pads, lhs_dilate=ld, rhs_dilate=rd)
    attrs = {"window": window, "dim_labels": f"bf{spatial}_oi{spatial}->bf{spatial}", "feature_group_count": fgc,
             "batch_group_count": bgc}
    if want is None:
        with pytest.raises(ProgramError):
            infer("convolution", [lhs, rhs], attrs)
    else:
        assert str(infer("convolution", [lhs, rhs], attrs)) == want
    operand = f"f32[{','.join(map(str, in_sizes))}]"
    try:
        want_rw = jshape(jax.eval_shape(lambda x: lax.reduce_window(x, np.float32(0), lax.add, k_sizes, strides, pads,
                                                                    ld, rd), jspec(operand)))
    except (TypeError, ValueError):
        want_rw = None
    rw_attrs = {"window": window, "to_apply": "add_f32"}
    if want_rw is None:
        with pytest.raises(ProgramError):
            infer("reduce-window", [operand, "f32[]"], rw_attrs)
    else:
        assert str(infer("reduce-window", [operand, "f32[]"], rw_attrs)) == want_rw
