# ruff: noqa: E501  (HLO text lines are as long as XLA prints them)
"""Hand-written HLO modules in the style of XLA's own parser tests (hlo_parser_test.cc): every
syntax form, every literal type, the attributes that change meaning, and the errors."""

import ml_dtypes
import numpy as np
import pytest

from replicas.errors import ProgramError
from replicas.hlo.text import parse_hlo as _parse_and_verify
from replicas.hlo.text import print_module
from replicas.shapes import Shape


def parse_hlo(text):
    """These modules exercise the syntax; whole-program validity is the verifier's tests' job."""
    return _parse_and_verify(text, verify=False)


def round_trip(text):
    module = parse_hlo(text)
    printed = print_module(module)
    assert parse_hlo(printed) == module, printed
    return module


def inst(module, name):
    for _, i in module.instructions():
        if i.name == name:
            return i
    raise KeyError(name)


COLLECTIVES = """
HloModule collectives, replica_count=4, num_partitions=1, entry_computation_layout={(f32[8]{0})->f32[8]{0}}

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %add = f32[] add(f32[] %a, f32[] %b)
}

ENTRY %main (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  %ar = f32[8]{0} all-reduce(f32[8]{0} %p), replica_groups={{0,1},{2,3}}, to_apply=%sum
  %ag = f32[16]{0} all-gather(f32[8]{0} %p), replica_groups=[2,2]<=[4], dimensions={0}
  %ar2 = f32[8]{0} all-reduce(%p), channel_id=3, replica_groups=[2,2]<=[2,2]T(1,0), use_global_device_ids=true, to_apply=%sum
  %ag8 = f32[64]{0} all-gather(%p), replica_groups=[1,8]<=[2,4]T(1,0), dimensions={0}
  %cp = f32[8]{0} collective-permute(%p), channel_id=2, source_target_pairs={{0,1},{1,2},{2,3},{3,0}}
  %rs = f32[2]{0} reduce-scatter(%p), replica_groups={}, dimensions={0}, to_apply=%sum
  %a2a = f32[8]{0} all-to-all(%p), replica_groups={{0,1,2,3}}, dimensions={0}
  %start = f32[8]{0} all-reduce-start(%p), replica_groups={{0,1,2,3}}, to_apply=%sum
  %done = f32[8]{0} all-reduce-done(%start)
  %ags = (f32[8]{0}, f32[32]{0}) all-gather-start(%p), replica_groups={{0,1,2,3}}, dimensions={0}
  %agd = f32[32]{0} all-gather-done(%ags)
  %cps = (f32[8]{0}, f32[8]{0}, u32[], u32[]) collective-permute-start(%p), source_target_pairs={{0,1},{1,0}}
  %cpd = f32[8]{0} collective-permute-done(%cps)
  ROOT %out = f32[8]{0} add(%ar, %ar2)
}
"""


def test_collectives_replica_groups_list_and_iota_forms():
    m = round_trip(COLLECTIVES)
    assert m.attrs == {"replica_count": 4, "num_partitions": 1,
                       "entry_computation_layout": "{(f32[8]{0})->f32[8]{0}}"}
    assert inst(m, "ar").attrs == {"replica_groups": [[0, 1], [2, 3]], "to_apply": "sum"}
    assert inst(m, "ag").attrs["replica_groups"] == [[0, 1], [2, 3]]
    assert inst(m, "ar2").attrs == {"channel_id": 3, "replica_groups": [[0, 2], [1, 3]],
                                    "use_global_device_ids": True, "to_apply": "sum"}
    assert inst(m, "ag8").attrs["replica_groups"] == [[0, 4, 1, 5, 2, 6, 3, 7]]
    assert inst(m, "cp").attrs["source_target_pairs"] == [(0, 1), (1, 2), (2, 3), (3, 0)]
    assert inst(m, "rs").attrs["replica_groups"] == []
    assert inst(m, "done").operands == ["start"]
    assert m.replica_count == 4 and m.num_partitions == 1


SEND_RECV = """
HloModule send_recv

ENTRY %main () -> f32[] {
  %token0 = token[] after-all()
  %recv = (f32[], u32[], token[]) recv(token[] %token0), channel_id=15, frontend_attributes={_xla_send_recv_source_target_pairs="{{0,1},{1,2}}"}
  %recv-done = (f32[], token[]) recv-done((f32[], u32[], token[]) %recv), channel_id=15, frontend_attributes={_xla_send_recv_source_target_pairs="{{0,1},{1,2}}"}
  ROOT %data = f32[] get-tuple-element((f32[], token[]) %recv-done), index=0
  %constant = f32[] constant(2.1)
  %send = (f32[], u32[], token[]) send(f32[] %constant, token[] %token0), channel_id=16, is_host_transfer=true
  %send-done = token[] send-done((f32[], u32[], token[]) %send), channel_id=16, is_host_transfer=true
  %infeed = ((f32[2]{0}), token[]) infeed(token[] %token0), infeed_config="abc\\"def"
  %outfeed = token[] outfeed(f32[] %constant, token[] %token0), outfeed_shape=f32[], outfeed_config="cfg"
}
"""


def test_send_recv_frontend_attributes_and_host_transfer():
    m = round_trip(SEND_RECV)
    entry = m.entry_computation
    assert entry.root == "data"  # ROOT need not be last
    recv = inst(m, "recv")
    assert recv.attrs == {"channel_id": 15, "frontend_attributes": {
        "_xla_send_recv_source_target_pairs": "{{0,1},{1,2}}"}}
    assert inst(m, "send").attrs == {"channel_id": 16, "is_host_transfer": True}
    assert inst(m, "send").operands == ["constant", "token0"]
    assert inst(m, "token0").shape.is_token
    assert inst(m, "infeed").attrs["infeed_config"] == 'abc"def'
    assert inst(m, "outfeed").attrs["outfeed_shape"] == Shape.parse("f32[]")
    assert "ROOT %data = f32[] get-tuple-element(%recv-done), index=0" in print_module(m)


WHILE = """
HloModule WhileWithScalarS32Result_module

%body.v3 (prev.1: s32[]) -> s32[] {
  %constant = s32[] constant(1)
  %prev.1 = s32[] parameter(0)
  ROOT %add = s32[] add(s32[] %constant, s32[] %prev.1)
}

%condition.v3 (prev.2: s32[]) -> pred[] {
  %constant.1 = s32[] constant(5)
  %prev.2 = s32[] parameter(0)
  ROOT %greater-than = pred[] compare(s32[] %constant.1, s32[] %prev.2), direction=GT
}

ENTRY %WhileWithScalarS32Result.v2 () -> s32[] {
  %constant.2 = s32[] constant(0)
  ROOT %while = s32[] while(s32[] %constant.2), condition=%condition.v3, body=%body.v3, backend_config={"known_trip_count":{"n":"5"}}
}
"""


def test_while_loop():
    m = round_trip(WHILE)
    assert m.entry == "WhileWithScalarS32Result.v2"
    assert inst(m, "while").attrs == {"condition": "condition.v3", "body": "body.v3"}
    assert inst(m, "while").line == 18 and inst(m, "prev.1").line == 6
    assert inst(m, "greater-than").attrs == {"comparison_direction": "GT"}
    assert inst(m, "constant.2").attrs["literal"].dtype == np.int32


FUSION_AND_FRIENDS = """
HloModule fusion_module, is_scheduled=true

%fused_computation (param_0: f32[2], param_1: f32[2]) -> f32[2] {
  %param_0 = f32[2]{0} parameter(0)
  %param_1 = f32[2]{0} parameter(1)
  ROOT %multiply = f32[2]{0} multiply(f32[2]{0} %param_0, f32[2]{0} %param_1)
}

%async_wrapped (p0: f32[2]) -> f32[2] {
  %p0 = f32[2]{0} parameter(0)
  ROOT %neg = f32[2]{0} negate(%p0)
}

%callee (x: f32[2]) -> f32[2] {
  %x = f32[2]{0} parameter(0)
  ROOT %copy = f32[2]{0} copy(%x)
}

ENTRY %main (a: f32[2], b: f32[2]) -> f32[2] {
  %a = f32[2]{0} parameter(0), sharding={replicated}, metadata={op_name="a" source_file="x.py" source_line=3}
  %b = f32[2]{0} parameter(1)
  %fusion = f32[2]{0} fusion(f32[2]{0} %a, f32[2]{0} %b), kind=kLoop, calls=%fused_computation, metadata={op_name="jit(f)/mul {weird}, \\"quoted\\"" stack_frame_id=3}
  %call = f32[2]{0} call(%fusion), to_apply=%callee
  %pid = u32[] partition-id()
  %rid = u32[] replica-id()
  %rp = f32[2]{0} reduce-precision(%call), exponent_bits=5, mantissa_bits=10
  %bc = s32[2]{0} bitcast-convert(%rp)
  %bit = f32[2,1]{1,0} bitcast(%rp)
  %async-start = ((f32[2]{0}), f32[2]{0}, s32[]) async-start(%rp), calls=%async_wrapped
  %async-update = ((f32[2]{0}), f32[2]{0}, s32[]) async-update(%async-start), calls=%async_wrapped
  %async-done = f32[2]{0} async-done(%async-update), calls=%async_wrapped
  %copy-start = (f32[2]{0}, f32[2]{0}, u32[]) copy-start(%async-done), cross_program_prefetch_index=0
  %copy-done = f32[2]{0} copy-done(%copy-start)
  %domain = f32[2]{0} domain(%copy-done), domain={kind="sharding", entry={maximal device=0}, exit={replicated}}
  %token = token[] after-all()
  %dep = f32[2]{0} add-dependency(%domain, %token)
  %tuple = (f32[2]{0}, s32[2]{0}) tuple(%dep, %bc)
  %barrier = (f32[2]{0}, s32[2]{0}) opt-barrier(%tuple)
  %gte = f32[2]{0} get-tuple-element(%barrier), index=0
  %random = u32[2]{0} bitcast-convert(%gte)
  %sc = bf16[2]{0} stochastic-convert(%gte, %random)
  ROOT %root = f32[2]{0} convert(%sc), control-predecessors={%pid}
}
"""


def test_fusion_call_async_and_other_opcodes():
    m = round_trip(FUSION_AND_FRIENDS)
    assert m.attrs == {"is_scheduled": "true"}
    assert inst(m, "fusion").attrs == {"kind": "kLoop", "calls": "fused_computation"}
    assert m.computation("fused_computation").is_fusion
    assert not m.computation("callee").is_fusion
    assert inst(m, "a").attrs == {"parameter_number": 0}  # sharding and metadata dropped
    assert inst(m, "rp").attrs == {"exponent_bits": 5, "mantissa_bits": 10}
    assert inst(m, "async-start").attrs == {"calls": "async_wrapped"}
    assert inst(m, "async-done").attrs == {}  # the start names the computation
    assert inst(m, "copy-start").attrs == {}
    assert inst(m, "domain").attrs == {}
    assert inst(m, "root").attrs == {}
    assert [i.opcode for i in m.entry_computation.instructions][-3:] == [
        "bitcast-convert", "stochastic-convert", "convert"]


CONDITIONALS = """
HloModule conditionals

ENTRY %main (p: pred[], i: s32[], x: f32[]) -> (f32[], f32[]) {
  %p = pred[] parameter(0)
  %i = s32[] parameter(1)
  %x = f32[] parameter(2)
  %c1 = f32[] conditional(pred[] %p, f32[] %x, f32[] %x), true_computation=%then, false_computation=%else
  %c2 = f32[] conditional(s32[] %i, f32[] %x, f32[] %x, f32[] %x), branch_computations={%then, %else, %then}
  ROOT %t = (f32[], f32[]) tuple(%c1, %c2)
}

%then (a: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  ROOT %n = f32[] negate(%a)
}

%else (b: f32[]) -> f32[] {
  ROOT %b = f32[] parameter(0)
}
"""


def test_conditional_both_forms_and_forward_computation_references():
    m = round_trip(CONDITIONALS)
    assert m.entry == "main"
    assert list(m.computations) == ["main", "then", "else"]
    assert inst(m, "c1").attrs == {"true_computation": "then", "false_computation": "else"}
    assert inst(m, "c2").attrs == {"branch_computations": ["then", "else", "then"]}
    assert inst(m, "c2").called_computations() == ["then", "else", "then"]


NO_SIGILS = """
HloModule plain

add_f32 {
  lhs = f32[] parameter(0)
  rhs = f32[] parameter(1)
  ROOT sum = f32[] add(lhs, rhs)
}

main {
  x = f32[4,6]{1,0} parameter(0)
  zero = f32[] constant(0)
  r = f32[4]{0} reduce(x, zero), dimensions={1}, to_apply=add_f32
  rw = f32[2,3]{1,0} reduce-window(x, zero), window={size=2x2 stride=2x2}, to_apply=add_f32
  pad = f32[7,8]{1,0} pad(x, zero), padding=0_1_2x1_1
  s = f32[2,3]{1,0} slice(x), slice={[0:4:2], [0:6:2]}
  ds = f32[2,2]{1,0} dynamic-slice(x, i, i), dynamic_slice_sizes={2,2}
  i = s32[] constant(1)
}
"""


def test_no_sigils_no_signatures_and_last_computation_is_entry():
    text = NO_SIGILS.replace("  ds = f32[2,2]{1,0} dynamic-slice(x, i, i), dynamic_slice_sizes={2,2}\n", "")
    m = round_trip(text)
    assert m.entry == "main"
    assert m.entry_computation.root == "i"  # no ROOT: the last instruction
    assert inst(m, "r").attrs == {"dimensions": [1], "to_apply": "add_f32"}
    window = inst(m, "rw").attrs["window"]
    assert window == {"size": [2, 2], "stride": [2, 2], "pad": [(0, 0), (0, 0)], "lhs_dilate": [1, 1],
                      "rhs_dilate": [1, 1], "window_reversal": [False, False]}
    assert inst(m, "pad").attrs["padding"] == [(0, 1, 2), (1, 1, 0)]
    assert inst(m, "s").attrs["slice"] == [(0, 4, 2), (0, 6, 2)]


def test_operand_defined_later_is_rejected():
    with pytest.raises(ProgramError, match="undefined instruction %i") as info:
        parse_hlo(NO_SIGILS)
    assert info.value.line == 17 and info.value.column is not None


def test_every_other_meaningful_attribute():
    text = """
HloModule attrs

%cmp (a: f32[], b: f32[]) -> pred[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %lt = pred[] compare(%a, %b), direction=LT, type=TOTALORDER
}

%sum (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

ENTRY %main (p: f32[4,4], idx: s32[2,1], k: u64[2]) -> f32[4,4] {
  %p = f32[4,4]{1,0} parameter(0)
  %idx = s32[2,1]{1,0} parameter(1)
  %k = u64[2]{0} parameter(2)
  %sort = f32[4,4]{1,0} sort(%p), dimensions={1}, is_stable=true, to_apply=%cmp
  %fft = c64[4,3]{1,0} fft(%p), fft_type=RFFT, fft_length={4}
  %chol = f32[4,4]{1,0} cholesky(%p), lower=true
  %ts = f32[4,4]{1,0} triangular-solve(%p, %p), left_side=true, lower=true, unit_diagonal=false, transpose_a=TRANSPOSE
  %iota = s32[4,4]{1,0} iota(), iota_dimension=1
  %rng = (u64[2]{0}, u32[4]{0}) rng-bit-generator(%k), algorithm=rng_philox
  %zero = f32[] constant(0)
  %one = f32[] constant(1)
  %rn = f32[3]{0} rng(%zero, %one), distribution=rng_normal
  %g = f32[2,4]{1,0} gather(%p, %idx), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,4}, indices_are_sorted=true
  %upd = f32[2,4]{1,0} broadcast(%one), dimensions={}
  %sc = f32[4,4]{1,0} scatter(%p, %idx, %upd), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, indices_are_sorted=true, unique_indices=true, to_apply=%sum
  %dot = f32[4,4]{1,0} dot(%p, %p), lhs_batch_dims={}, lhs_contracting_dims={1}, rhs_contracting_dims={0}, operand_precision={highest,default}, algorithm=dot_f32_f32_f32
  %bc = f32[1,1,4,4]{3,2,1,0} bitcast(%p)
  %conv = f32[1,1,3,3]{3,2,1,0} convolution(%bc, %bc), window={size=2x2 pad=0_0x0_0 lhs_dilate=1x1 rhs_dilate=1x1 rhs_reversal=1x0}, dim_labels=bf01_oi01->bf01, feature_group_count=1, batch_group_count=1
  %bn = (f32[4,4]{1,0}, f32[4]{0}, f32[4]{0}) batch-norm-training(%p, %one, %zero), epsilon=0.001, feature_index=1
  %cc = f32[4,4]{1,0} custom-call(%p), custom_call_target="my_target", backend_config="cfg\\n", api_version=API_VERSION_STATUS_RETURNING, custom_call_has_side_effect=true
  %topk = (f32[4,2]{1,0}, s32[4,2]{1,0}) topk(%p), k=2, largest=true
  ROOT %r = f32[4,4]{1,0} transpose(%p), dimensions={1,0}
}
"""
    m = round_trip(text)
    assert inst(m, "lt").attrs == {"comparison_direction": "LT", "type": "TOTALORDER"}
    assert inst(m, "sort").attrs == {"dimensions": [1], "is_stable": True, "to_apply": "cmp"}
    assert inst(m, "fft").attrs == {"fft_type": "RFFT", "fft_length": [4]}
    assert inst(m, "chol").attrs == {"lower": True}
    assert inst(m, "ts").attrs == {"left_side": True, "lower": True, "unit_diagonal": False,
                                   "transpose_a": "TRANSPOSE"}
    assert inst(m, "iota").attrs == {"iota_dimension": 1}
    assert inst(m, "rng").attrs == {"algorithm": "rng_philox"}
    assert inst(m, "rn").attrs == {"distribution": "rng_normal"}
    assert inst(m, "g").attrs["indices_are_sorted"] is True
    assert inst(m, "sc").attrs["unique_indices"] is True
    assert inst(m, "dot").attrs == {"lhs_batch_dims": [], "lhs_contracting_dims": [1], "rhs_contracting_dims": [0]}
    conv = inst(m, "conv").attrs
    assert conv["window"]["window_reversal"] == [True, False]
    assert conv["dim_labels"] == "bf01_oi01->bf01" and conv["feature_group_count"] == 1
    assert inst(m, "bn").attrs == {"epsilon": 0.001, "feature_index": 1}
    assert inst(m, "cc").attrs == {"custom_call_target": "my_target", "backend_config": "cfg\n"}
    assert inst(m, "topk").attrs == {"k": 2, "largest": True}


LITERALS = [
    ("pred[2]", "{true, false}", np.array([True, False])),
    ("s8[3]", "{-128, 0, 127}", np.array([-128, 0, 127], np.int8)),
    ("s16[2]", "{-32768, 32767}", np.array([-32768, 32767], np.int16)),
    ("s32[]", "-7", np.array(-7, np.int32)),
    ("s64[2]", "{-9223372036854775808, 9223372036854775807}",
     np.array([-2**63, 2**63 - 1], np.int64)),
    ("u8[2]", "{0, 255}", np.array([0, 255], np.uint8)),
    ("u16[1]", "{65535}", np.array([65535], np.uint16)),
    ("u32[1]", "{4294967295}", np.array([4294967295], np.uint32)),
    ("u64[1]", "{18446744073709551615}", np.array([2**64 - 1], np.uint64)),
    ("s4[2]", "{-8, 7}", np.array([-8, 7], ml_dtypes.int4)),
    ("s2[2]", "{-2, 1}", np.array([-2, 1], ml_dtypes.int2)),
    ("u2[2]", "{0, 3}", np.array([0, 3], ml_dtypes.uint2)),
    ("s32[3]", "{0x10, -0x1, 5}", np.array([16, -1, 5], np.int32)),
    ("u4[2]", "{0, 15}", np.array([0, 15], ml_dtypes.uint4)),
    ("f16[3]", "{1.5, inf, -inf}", np.array([1.5, np.inf, -np.inf], np.float16)),
    ("bf16[2]", "{1, -2.5}", np.array([1, -2.5], ml_dtypes.bfloat16)),
    ("f32[4]", "{0.1, 1e-05, 3.40282347e+38, -0}", np.array([0.1, 1e-05, 3.40282347e+38, -0.0], np.float32)),
    ("f64[2]", "{0.1, 2.5e-300}", np.array([0.1, 2.5e-300], np.float64)),
    ("f8e5m2[2]", "{0.5, -2}", np.array([0.5, -2], ml_dtypes.float8_e5m2)),
    ("f8e4m3fn[2]", "{0.5, 448}", np.array([0.5, 448], ml_dtypes.float8_e4m3fn)),
    ("f8e4m3b11fnuz[1]", "{0.25}", np.array([0.25], ml_dtypes.float8_e4m3b11fnuz)),
    ("c64[2]", "{(1, 2), (-inf, 0.5)}", np.array([1 + 2j, complex(-np.inf, 0.5)], np.complex64)),
    ("c128[]", "(1, -0.5)", np.array(1 - 0.5j, np.complex128)),
    ("f32[2,2]", "{ { 1, 2 }, { 3, 4 } }", np.array([[1, 2], [3, 4]], np.float32)),
    ("f32[2,1,2]", "{ { { 1, 2 } }, { { 3, 4 } } }", np.array([[[1, 2]], [[3, 4]]], np.float32)),
    ("f32[2,0]", "{ {}, {} }", np.zeros((2, 0), np.float32)),
    ("f32[0]", "{}", np.zeros((0,), np.float32)),
    ("f32[]", "42", np.array(42, np.float32)),
]


@pytest.mark.parametrize("shape,literal,expected", LITERALS, ids=[c[0] for c in LITERALS])
def test_literals_of_every_type(shape, literal, expected):
    m = round_trip(f"HloModule m\n\nENTRY %e () -> {shape} {{\n  ROOT %c = {shape} constant({literal})\n}}\n")
    value = inst(m, "c").attrs["literal"]
    assert isinstance(value, np.ndarray)
    assert value.dtype == expected.dtype and value.shape == expected.shape
    assert value.tobytes() == expected.tobytes()


def test_nan_literals_keep_sign_and_payload():
    m = round_trip("HloModule m\nENTRY %e () -> f32[4] {\n"
                   "  ROOT %c = f32[4] constant({nan, -nan, nan(0x1), -nan(0x7fff)})\n}\n")
    bits = inst(m, "c").attrs["literal"].view(np.uint32).tolist()
    assert bits == [0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF807FFF]
    m = round_trip("HloModule m\nENTRY %e () -> bf16[2] {\n  ROOT %c = bf16[2] constant({nan, -nan})\n}\n")
    assert np.isnan(inst(m, "c").attrs["literal"].astype(np.float32)).all()


def test_tuple_constant():
    m = round_trip("HloModule m\nENTRY %e () -> (f32[2], s32[]) {\n"
                   "  ROOT %c = (f32[2], s32[]) constant(( {1, 2}, 3 ))\n}\n")
    value = inst(m, "c").attrs["literal"]
    assert isinstance(value, tuple) and value[0].tolist() == [1.0, 2.0] and value[1].dtype == np.int32


def test_random_float_literals_print_back_bit_exactly():
    rng = np.random.default_rng(0)
    for dtype, name in [(np.float32, "f32"), (np.float64, "f64"), (np.float16, "f16"),
                        (ml_dtypes.bfloat16, "bf16"), (ml_dtypes.float8_e4m3fn, "f8e4m3fn"),
                        (ml_dtypes.float8_e5m2, "f8e5m2"), (ml_dtypes.float8_e4m3fnuz, "f8e4m3fnuz"),
                        (ml_dtypes.float8_e8m0fnu, "f8e8m0fnu"), (ml_dtypes.float8_e3m4, "f8e3m4")]:
        bits = rng.integers(0, 2 ** (8 * np.dtype(dtype).itemsize), size=64, dtype=np.uint64)
        values = bits.astype(f"u{np.dtype(dtype).itemsize}").view(dtype)
        m = parse_hlo(f"HloModule m\nENTRY %e () -> {name}[64] {{\n  ROOT %c = {name}[64] constant({{0}})\n}}\n"
                      .replace("constant({0})", "constant({" + ", ".join(["0"] * 64) + "})"))
        inst(m, "c").attrs["literal"] = values
        again = parse_hlo(print_module(m))
        got = inst(again, "c").attrs["literal"]
        assert got.dtype == np.dtype(dtype) and got.tobytes() == values.tobytes(), name


def test_layouts_tiling_tokens_and_index_comments():
    text = """HloModule layouts
ENTRY %e (p: f32[8,128], t: (f32[], f32[], f32[], f32[], f32[], f32[])) -> f32[8,128] {
  %p = f32[8,128]{1,0:T(8,128)} parameter(0)
  %t = (f32[], f32[], f32[], f32[], f32[], /*index=5*/f32[]) parameter(1)
  %tok = token[] after-all()
  %tup = (f32[8,128]{1,0:T(8,128)}, token[]) tuple(f32[8,128]{1,0:T(8,128)} %p, /*index=1*/token[] %tok)
  ROOT %g = f32[8,128]{0,1} get-tuple-element(%tup), index=0
}"""
    m = round_trip(text)
    p = inst(m, "p").shape
    assert p.layout.minor_to_major == (1, 0) and p.layout.extra == ":T(8,128)"
    assert len(inst(m, "t").shape.tuple_shapes) == 6
    assert inst(m, "g").shape.layout.minor_to_major == (0, 1)


def test_stack_frame_tables_and_execution_thread_are_accepted():
    text = """HloModule m, entry_computation_layout={()->f32[]}

FileNames
1 "/tmp/a.py"

FunctionNames
1 "f"

FileLocations
1 {file_name_id=1 function_name_id=1 line=3 end_line=3 column=1 end_column=2}

StackFrames
1 {file_location_id=1 parent_frame_id=1}


%c (a: f32[]) -> f32[] {
  ROOT %a = f32[] parameter(0)
}, execution_thread="host"

ENTRY %e () -> f32[] {
  %one = f32[] constant(1), metadata={op_name="x" stack_frame_id=1}
  ROOT %r = f32[] call(%one), to_apply=%c
}
"""
    m = round_trip(text)
    assert list(m.computations) == ["c", "e"]


def test_frontend_attributes_forms():
    text = """HloModule m, frontend_attributes={xla.sdy.meshes={mesh = #sdy.mesh<["i"=8]>}}
ENTRY %e () -> f32[] {
  ROOT %c = f32[] constant(1), frontend_attributes={a="x,y}", b={k = "v"}, "quoted key"="\\"q\\""}
}"""
    m = round_trip(text)
    assert m.attrs["frontend_attributes"] == '{xla.sdy.meshes={mesh = #sdy.mesh<["i"=8]>}}'
    assert inst(m, "c").attrs["frontend_attributes"] == {"a": "x,y}", "b": '{k = "v"}', "quoted key": '"q"'}


def test_printed_text_looks_like_xla():
    text = print_module(parse_hlo(WHILE))
    assert text.startswith("HloModule WhileWithScalarS32Result_module\n")
    assert "%body.v3 (prev.1: s32[]) -> s32[] {" in text
    assert "ENTRY %WhileWithScalarS32Result.v2 () -> s32[] {" in text
    assert "  ROOT %while = s32[] while(%constant.2), condition=%condition.v3, body=%body.v3\n" in text
    assert "compare(%constant.1, %prev.2), direction=GT" in text


# -- errors ----------------------------------------------------------------------------------------

BASE = """HloModule m

ENTRY %e (p: f32[2]) -> f32[2] {
  %p = f32[2]{0} parameter(0)
  ROOT %r = f32[2]{0} LINE
}
"""


@pytest.mark.parametrize("line,message,marker", [
    ("frobnicate(%p)", "unknown opcode 'frobnicate'", "frobnicate"),
    ("negate(%p), foo_bar=1", "unknown attribute 'foo_bar'", "foo_bar"),
    ("negate(%q)", "undefined instruction %q", "%q"),
    ("call(%p), to_apply=%nowhere", "undefined computation %nowhere", "%nowhere"),
    ("negate(%p), dimensions={a}", "bad value for attribute dimensions", "{a}"),
    ("all-reduce(%p), replica_groups={{0,1},{2", "unclosed", "{{0"),
    ("all-reduce(%p), replica_groups=[2,2]<=[3]", "bad value for attribute replica_groups", "[2,2]"),
    ("reduce-window(%p, %p), window={size=2 bogus=1}", "unknown window field", "{size"),
    ("negate(f32[3] %p)", "declared as f32[3]", "f32[3]"),
    ("negate(%p %p)", "',' or ')'", "%p)"),
    ("negate(%p) extra", "unexpected text after the instruction", "extra"),
    ("negate(%p), slice={[0:1:2:3]}", "bad slice range", "{[0"),
    ("negate(%p), channel_id=1.5", "bad value for attribute channel_id", "1.5"),
    ("negate(%p), direction=SIDEWAYS", "expected one of", "SIDEWAYS"),
])
def test_errors_carry_line_column_and_text(line, message, marker):
    with pytest.raises(ProgramError) as info:
        parse_hlo(BASE.replace("LINE", line))
    assert message in str(info.value)
    assert info.value.line == 5
    full_line = "  ROOT %r = f32[2]{0} " + line + "\n"
    assert info.value.column == full_line.index(marker) + 1


@pytest.mark.parametrize("text,message", [
    ("", "no computations"),  # without an HloModule line, the text is bare computations
    ("HloModule m\n", "no computations"),
    ("HloModule m\nENTRY %e {\n}\n", "has no instructions"),
    ("HloModule m\nENTRY %e {\n  %a = f32[] constant(1)\n", "not closed"),
    ("HloModule m\nENTRY %e {\n  %a = f32[] constant(1)\n  %a = f32[] constant(2)\n}\n", "defined twice"),
    ("HloModule m\nENTRY %e {\n  ROOT %a = f32[] constant(1)\n  ROOT %b = f32[] constant(2)\n}\n", "two ROOT"),
    ("HloModule m\n%c {\n  ROOT %a = f32[] constant(1)\n}\n%c {\n  ROOT %a = f32[] constant(1)\n}\n",
     "defined twice"),
    ("HloModule m\nENTRY %e {\n  ROOT %a = f32[2] constant({1, 2, 3})\n}\n", "has 3 elements"),
    ("HloModule m\nENTRY %e {\n  ROOT %a = s8[] constant(300)\n}\n", "does not fit"),
    ("HloModule m\nENTRY %e {\n  ROOT %a = f32[] constant(abc)\n}\n", "bad floating-point literal"),
    ("HloModule m\nENTRY %e {\n  ROOT %a = pred[] constant(2)\n}\n", "bad pred literal"),
    ("HloModule m\nENTRY %e {\n  ROOT %a = f33[] constant(1)\n}\n", "bad shape|expected a shape"),
    ("HloModule m\nENTRY %e {\n  ROOT %a = f32[2]{0,1} constant({1, 2})\n}\n", "bad shape"),
    ("HloModule m, replica_count=two\nENTRY %e {\n  ROOT %a = f32[] constant(1)\n}\n", "must be an integer"),
    ('HloModule m\nENTRY %e {\n  ROOT %a = f32[] constant(1), metadata={op_name="x}\n}\n', "unterminated|unclosed"),
])
def test_module_level_errors(text, message):
    with pytest.raises(ProgramError, match=message):
        parse_hlo(text)


def test_modules_built_from_the_ir_round_trip():
    from replicas.hlo.ir import Computation, Instruction, Module, make_window

    f32 = Shape.parse("f32[]")
    reducer = Computation("max")
    reducer.add(Instruction("a", "parameter", f32, [], {"parameter_number": 0}))
    reducer.add(Instruction("b", "parameter", f32, [], {"parameter_number": 1}))
    reducer.add(Instruction("m", "maximum", f32, ["a", "b"]))
    reducer.root = "m"
    entry = Computation("main")
    entry.add(Instruction("x", "parameter", Shape.parse("f32[4,4]"), [], {"parameter_number": 0}))
    entry.add(Instruction("init", "constant", f32, [], {"literal": np.array(-np.inf, np.float32)}))
    entry.add(Instruction("rw", "reduce-window", Shape.parse("f32[2,2]"), ["x", "init"],
                          {"to_apply": "max", "window": make_window(2, size=[2, 2], stride=[2, 2])}))
    entry.add(Instruction("cp", "collective-permute", Shape.parse("f32[2,2]"), ["rw"],
                          {"source_target_pairs": [(0, 1), (1, 0)], "channel_id": None}))
    entry.add(Instruction("ar", "all-reduce", Shape.parse("f32[2,2]"), ["cp"],
                          {"replica_groups": [], "to_apply": "max", "frontend_attributes": {"k": 'v "q"'}}))
    entry.root = "ar"
    module = Module("built", attrs={"replica_count": 2})
    module.add(reducer)
    module.add(entry)
    module.entry = "main"
    text = module.to_hlo_text()
    again = parse_hlo(text)
    assert again.computation("main").instruction("cp").attrs == {"source_target_pairs": [(0, 1), (1, 0)]}
    del module.computation("main").instruction("cp").attrs["channel_id"]  # None means absent
    assert again == module


def test_parse_hlo_rejects_non_text():
    with pytest.raises(ProgramError):
        parse_hlo(42)  # type: ignore[arg-type]
