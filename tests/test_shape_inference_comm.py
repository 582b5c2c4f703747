"""Shape inference of the collectives, channels, feeds, tokens and misc ops; every documented opcode
has a rule; random inputs never crash a rule (only ProgramError)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replicas.errors import ProgramError
from replicas.hlo.ir import Computation, Instruction, make_window
from replicas.hlo.shape_inference import infer_shape, known_opcodes
from replicas.shapes import Shape


def S(text: str) -> Shape:
    return Shape.parse(text)


def _adder(t: str) -> Computation:
    comp = Computation(f"add_{t}")
    for i in range(2):
        comp.add(Instruction(f"p{i}", "parameter", S(f"{t}[]"), [], {"parameter_number": i}))
    comp.add(Instruction("r", "add", S(f"{t}[]"), ["p0", "p1"]))
    comp.root = "r"
    return comp


COMPS = {"add_f32": _adder("f32"), "add_s32": _adder("s32")}


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


# -- collectives, channels, feeds -----------------------------------------------------------------

def test_all_reduce_and_groups() -> None:
    attrs = {"replica_groups": [[0, 1], [2, 3]], "to_apply": "add_f32"}
    assert infer("all-reduce", ["f32[4]"], attrs, num_replicas=4) == S("f32[4]")
    assert infer("all-reduce", ["f32[4]", "f32[2]"], attrs) == S("(f32[4], f32[2])")
    fails("do not cover", "all-reduce", ["f32[4]"], attrs, num_replicas=6)
    fails("out of range", "all-reduce", ["f32[4]"], attrs, num_replicas=3)
    fails("more than once", "all-reduce", ["f32[4]"], {**attrs, "replica_groups": [[0, 1], [1, 2]]})
    fails("empty group", "all-reduce", ["f32[4]"], {**attrs, "replica_groups": [[0, 1], []]})
    fails("reduction computation", "all-reduce", ["s32[4]"], attrs)


def test_all_gather_reduce_scatter_all_to_all() -> None:
    groups = {"replica_groups": [[0, 1, 2], [3, 4, 5]], "dimensions": [1]}
    assert infer("all-gather", ["f32[2,3]"], groups) == S("f32[2,9]")
    assert infer("all-gather", ["f32[2,3]"], {"replica_groups": [], "dimensions": [0]}, num_replicas=4) == S("f32[8,3]")
    assert infer("all-gather", ["f32[2,3]"], {"replica_groups": [], "dimensions": [0]}) is None
    fails("does not fit", "all-gather", ["f32[2,3]"], {"replica_groups": [], "dimensions": [0]}, result=S("f32[5,3]"))
    fails("same size", "all-gather", ["f32[2,3]"], {"replica_groups": [[0], [1, 2]], "dimensions": [0]})
    assert infer("all-gather-start", ["f32[2,3]"], groups) == S("(f32[2,3], f32[2,9])")
    rs = {**groups, "to_apply": "add_f32"}
    assert infer("reduce-scatter", ["f32[2,6]"], rs) == S("f32[2,2]")
    fails("not divisible by the group size 3", "reduce-scatter", ["f32[2,4]"], rs)
    a2a = {"replica_groups": [[0, 1, 2, 3]], "dimensions": [0]}
    assert infer("all-to-all", ["f32[8,3]"], a2a) == S("f32[8,3]")
    fails("split dimension 0 .* not divisible by the group size 4", "all-to-all", ["f32[6,3]"], a2a)
    assert infer("all-to-all", ["f32[2]", "f32[2]"], {"replica_groups": [[0, 1]]}) == S("(f32[2], f32[2])")
    fails("differs", "all-to-all", ["f32[2]", "f32[3]"], {"replica_groups": [[0, 1]]})


def test_collective_permute() -> None:
    attrs = {"source_target_pairs": [(0, 1), (1, 2), (2, 0)]}
    assert infer("collective-permute", ["f32[3]"], attrs) == S("f32[3]")
    fails("duplicate source 0", "collective-permute", ["f32[3]"], {"source_target_pairs": [(0, 1), (0, 2)]})
    fails("duplicate target 1", "collective-permute", ["f32[3]"], {"source_target_pairs": [(0, 1), (2, 1)]})
    fails("out of range", "collective-permute", ["f32[3]"], attrs, num_replicas=2)
    assert infer("collective-permute-start", ["f32[3]"], attrs) == S("(f32[3], f32[3])")
    assert infer("collective-permute-done", ["(f32[3], f32[3])"]) == S("f32[3]")


def test_send_recv_shapes() -> None:
    ctx = "(f32[2,3], u32[], token[])"
    assert infer("send", ["f32[2,3]", "token[]"], {"channel_id": 1}) == S(ctx)
    fails("token", "send", ["f32[2,3]", "f32[]"], {"channel_id": 1})
    assert infer("recv", ["token[]"], {"channel_id": 1}, result=S(ctx)) is None
    fails("data, u32", "recv", ["token[]"], {"channel_id": 1}, result=S("(f32[2,3], token[])"))
    assert infer("send-done", [ctx], {"channel_id": 1}) == S("token[]")
    assert infer("recv-done", [ctx], {"channel_id": 1}) == S("(f32[2,3], token[])")
    fails("recv", "recv-done", ["(f32[2,3], token[])"], {"channel_id": 1})
    fails("channel_id", "send", ["f32[2,3]", "token[]"], {"channel_id": -1})


def test_feeds_tokens_misc() -> None:
    assert infer("infeed", ["token[]"], {}, result=S("(f32[2], token[])")) is None
    fails("token", "infeed", ["f32[]"], {}, result=S("(f32[2], token[])"))
    fails("data, token", "infeed", ["token[]"], {}, result=S("f32[2]"))
    assert infer("outfeed", ["f32[2]", "token[]"], {"outfeed_shape": S("f32[2]")}) == S("token[]")
    fails("outfeed_shape", "outfeed", ["f32[2]", "token[]"], {"outfeed_shape": S("f32[3]")})
    assert infer("after-all", ["token[]", "token[]"]) == S("token[]")
    assert infer("after-all", []) == S("token[]")
    assert infer("after-all", ["f32[]", "token[]"]) == S("token[]")  # XLA orders after values too
    assert infer("add-dependency", ["f32[2]", "token[]"]) == S("f32[2]")
    assert infer("opt-barrier", ["(f32[2], s32[])"]) == S("(f32[2], s32[])")
    assert infer("replica-id", []) == S("u32[]")
    assert infer("partition-id", []) == S("u32[]")
    assert infer("rng", ["f32[]", "f32[]"], {"distribution": "rng_normal"}, result=S("f32[3]")) is None
    fails("rng_normal", "rng", ["s32[]", "s32[]"], {"distribution": "rng_normal"}, result=S("s32[3]"))
    fails("parameters' type", "rng", ["f32[]", "f32[]"], {"distribution": "rng_uniform"}, result=S("s32[3]"))
    assert infer("rng-bit-generator", ["u64[2]"], {"algorithm": "rng_default"},
                 result=S("(u64[2], u32[4])")) is None
    fails("state", "rng-bit-generator", ["u64[2]"], {"algorithm": "rng_default"}, result=S("(u64[3], u32[4])"))
    assert infer("custom-call", ["f32[2]"], {"custom_call_target": "foo"}, result=S("f32[9]")) is None
    assert infer("topk", ["f32[3,8]"], {"k": 2, "largest": True}) == S("(f32[3,2], s32[3,2])")
    fails("unknown opcode", "frobnicate", [])
    fails("malformed", "slice", ["f32[4]"], {"slice": 3})


def test_every_documented_opcode_has_a_rule() -> None:
    documented = {
        "parameter", "constant", "iota", "broadcast", "reshape", "bitcast", "copy", "convert", "bitcast-convert",
        "tuple", "after-all", "add-dependency", "opt-barrier", "domain", "select", "clamp", "replica-id",
        "partition-id", "dynamic-update-slice", "transpose", "reverse", "slice", "dynamic-slice", "pad",
        "concatenate", "get-tuple-element", "compare", "reduce-precision", "call", "fusion", "while",
        "conditional", "map", "reduce", "reduce-window", "select-and-scatter", "convolution", "dot", "gather",
        "scatter", "sort", "fft", "cholesky", "triangular-solve", "rng", "rng-bit-generator",
        "batch-norm-training", "batch-norm-inference", "batch-norm-grad", "custom-call", "get-dimension-size",
        "set-dimension-size", "infeed", "outfeed", "send", "recv", "send-done", "recv-done", "all-reduce",
        "all-reduce-start", "all-reduce-done", "reduce-scatter", "all-gather", "all-gather-start",
        "all-gather-done", "all-to-all", "collective-permute", "collective-permute-start",
        "collective-permute-done", "async-start", "async-update", "async-done",
    }
    assert documented <= known_opcodes()


SHAPE_POOL = ["f32[]", "f32[4]", "s32[2,3]", "pred[3]", "c64[4,4]", "u32[]", "token[]", "(f32[2], u32[], token[])",
              "(s32[], f32[4])", "f32[2,3,4,5]", "u8[0]"]
ATTR_POOL = st.fixed_dictionaries({}, optional={
    "dimensions": st.lists(st.integers(-1, 4), max_size=3),
    "index": st.integers(-1, 3),
    "slice": st.lists(st.tuples(st.integers(-1, 5), st.integers(-1, 5), st.integers(0, 2)), max_size=3),
    "padding": st.lists(st.tuples(st.integers(-2, 2), st.integers(-2, 2), st.integers(-1, 1)), max_size=3),
    "window": st.just(make_window(2, size=[2, 2])),
    "dim_labels": st.sampled_from(["b01f_01io->b01f", "bf_io->bf", "garbage"]),
    "to_apply": st.sampled_from(["add_f32", "add_s32", "missing"]),
    "replica_groups": st.lists(st.lists(st.integers(-1, 4), max_size=3), max_size=3),
    "source_target_pairs": st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), max_size=3),
    "fft_type": st.sampled_from(["FFT", "RFFT", "IRFFT", "nope"]),
    "fft_length": st.lists(st.integers(0, 5), max_size=4),
    "index_vector_dim": st.integers(-1, 3),
    "slice_sizes": st.lists(st.integers(-1, 4), max_size=4),
    "dynamic_slice_sizes": st.lists(st.integers(-1, 4), max_size=4),
    "comparison_direction": st.sampled_from(["LT", "XX"]),
    "lhs_contracting_dims": st.lists(st.integers(-1, 3), max_size=2),
    "rhs_contracting_dims": st.lists(st.integers(-1, 3), max_size=2),
    "feature_index": st.integers(-1, 3), "epsilon": st.just(0.1),
    "iota_dimension": st.integers(-1, 3), "parameter_number": st.integers(-1, 2),
    "exponent_bits": st.integers(-1, 8), "mantissa_bits": st.integers(-1, 8),
})


@given(st.sampled_from(sorted(known_opcodes())), st.lists(st.sampled_from(SHAPE_POOL), max_size=4), ATTR_POOL,
       st.one_of(st.none(), st.sampled_from(SHAPE_POOL)), st.one_of(st.none(), st.integers(1, 4)))
@settings(max_examples=400, deadline=None)
def test_rules_only_raise_program_errors(opcode, shapes, attrs, result, num_replicas) -> None:
    try:
        out = infer(opcode, shapes, attrs, result=None if result is None else S(result), num_replicas=num_replicas)
    except ProgramError as e:
        assert str(e).startswith(opcode)
        return
    assert out is None or isinstance(out, Shape)
