"""msgpack serialization of modules: exact round trips, and damaged or hostile files -> ProgramError."""

from __future__ import annotations

import math
import struct

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replicas.errors import ProgramError
from replicas.hlo import files
from replicas.hlo.ir import Computation, Instruction, Module, make_window
from replicas.hlo.serialize import (
    FORMAT_VERSION,
    MAGIC,
    decode_value,
    encode_value,
    module_from_bytes,
    module_to_bytes,
    pack_value,
    unpack_value,
)
from replicas.hlo.text import parse_hlo
from replicas.shapes import TOKEN, Layout, PrimitiveType, Shape, Token


def _has_dtype(element_type: PrimitiveType) -> bool:
    try:
        return element_type.dtype is not None
    except ProgramError:
        return False


ARRAY_TYPES = [t for t in PrimitiveType if t.is_array_type and _has_dtype(t)]
HEADER = MAGIC + struct.pack("<H", FORMAT_VERSION)


def assert_same(a, b, where="value"):
    """Equality that also demands identical Python types (list vs tuple, int vs float vs bool) and
    identical bits for floats and arrays."""
    # (an instruction without attributes may hold the IR's shared empty dict, a dict subclass)
    assert type(a) is type(b) or (isinstance(a, dict) and isinstance(b, dict)), \
        f"{where}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), where
    elif isinstance(a, float):
        assert struct.pack("<d", a) == struct.pack("<d", b), f"{where}: {a!r} != {b!r}"
    elif isinstance(a, dict):
        assert list(a) == list(b), f"{where}: keys {list(a)} != {list(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def assert_same_module(a: Module, b: Module) -> None:
    # Not `a == b`: Module equality compares floats with ==, and a nan attribute is never equal to itself.
    assert (a.name, a.entry) == (b.name, b.entry)
    assert_same(a.attrs, b.attrs, "module attrs")
    assert list(a.computations) == list(b.computations)
    for ca, cb in zip(a.computations.values(), b.computations.values()):
        assert (ca.name, ca.root, ca.is_fusion) == (cb.name, cb.root, cb.is_fusion)
        assert len(ca.instructions) == len(cb.instructions)
        for ia, ib in zip(ca.instructions, cb.instructions):
            where = f"%{ia.name}"
            assert (ia.name, ia.opcode, ia.operands, ia.line) == (ib.name, ib.opcode, ib.operands, ib.line), where
            assert ia.shape == ib.shape and repr(ia.shape) == repr(ib.shape), where
            assert ia.shape.layout == ib.shape.layout and ia.shape.dynamic == ib.shape.dynamic, where
            assert_same(ia.attrs, ib.attrs, where)


def _literal(element_type: PrimitiveType, dims: list[int], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dtype = element_type.dtype
    numel = int(np.prod(dims))
    if element_type is PrimitiveType.PRED:
        return rng.integers(0, 2, dims).astype(bool)
    if element_type in (PrimitiveType.S2, PrimitiveType.S4):
        return rng.integers(-2, 2, dims).astype(dtype)
    if element_type in (PrimitiveType.U2, PrimitiveType.U4):
        return rng.integers(0, 4, dims).astype(dtype)
    raw = rng.integers(0, 256, numel * dtype.itemsize, dtype=np.uint8).tobytes()
    return np.frombuffer(raw, dtype=dtype).reshape(dims).copy()


def build_module() -> Module:
    """A module touching many opcodes, shapes and every attribute value kind of docs/ir.md."""
    f32 = Shape.parse("f32[]")
    add = Computation("add_f32", root="sum")
    add.add(Instruction("a", "parameter", f32, attrs={"parameter_number": 0}, line=2))
    add.add(Instruction("b", "parameter", f32, attrs={"parameter_number": 1}, line=3))
    add.add(Instruction("sum", "add", f32, ["a", "b"], line=4))

    entry = Computation("main", root="result")
    x_shape = Shape.array("f32", [4, 8], Layout((0, 1), padded_dimensions=(5, 8), padding_value=-0.0))
    entry.add(Instruction("x", "parameter", x_shape, attrs={"parameter_number": 0}, line=10))
    entry.add(Instruction("n", "parameter", Shape.parse("s32[<=16]"), attrs={"parameter_number": 1}))
    entry.add(Instruction("tok", "after-all", Shape.token()))
    for i, element_type in enumerate(ARRAY_TYPES):
        dims = [[], [3], [2, 3]][i % 3]
        entry.add(Instruction(f"c_{element_type.value}", "constant", Shape.array(element_type, dims),
                              attrs={"literal": _literal(element_type, dims, i)}))
    entry.add(Instruction("empty", "constant", Shape.parse("f32[0,3]"),
                          attrs={"literal": np.zeros((0, 3), np.float32)}))
    specials = np.array([np.nan, np.inf, -np.inf, -0.0, 5e-324], np.float64)
    entry.add(Instruction("specials", "constant", Shape.parse("f64[5]"), attrs={"literal": specials}))
    nested_shape = Shape.parse("(f32[2], (s32[], pred[]), ())")
    nested = (np.array([1.5, -2.0], np.float32), (np.array(7, np.int32), np.array(True)), ())
    entry.add(Instruction("tuple_literal", "constant", nested_shape, attrs={"literal": nested}))
    entry.add(Instruction("bc", "broadcast", Shape.parse("f32[4,8,3]{2,1,0}"), ["x"], {"dimensions": [0, 1]}))
    entry.add(Instruction("sl", "slice", Shape.parse("f32[2,4]"), ["x"], {"slice": [(0, 4, 2), (0, 8, 2)]}))
    entry.add(Instruction("pd", "pad", Shape.parse("f32[6,8]"), ["x", "c_f32"],
                          {"padding": [(1, 1, 0), (0, 0, 0)]}))
    entry.add(Instruction("cmp", "compare", Shape.parse("pred[4,8]"), ["x", "x"],
                          {"comparison_direction": "LT", "type": "TOTALORDER"}))
    entry.add(Instruction("rd", "reduce", Shape.parse("f32[4]"), ["x", "c_f32"],
                          {"to_apply": "add_f32", "dimensions": [1]}))
    entry.add(Instruction("rw", "reduce-window", Shape.parse("f32[4,8]"), ["x", "c_f32"],
                          {"to_apply": "add_f32", "window": make_window(2, size=[1, 3], pad=[(0, 0), (1, 1)],
                                                                        window_reversal=[False, True])}))
    entry.add(Instruction("ar", "all-reduce", x_shape, ["x"],
                          {"to_apply": "add_f32", "replica_groups": [[0, 1], [2, 3]], "channel_id": None,
                           "use_global_device_ids": False}))
    entry.add(Instruction("cp", "collective-permute", x_shape, ["x"],
                          {"source_target_pairs": [(0, 1), (1, 0)], "channel_id": 3}))
    entry.add(Instruction("send", "send", Shape.parse("(f32[4,8], u32[], token[])"), ["x", "tok"],
                          {"channel_id": 5, "is_host_transfer": False,
                           "frontend_attributes": {"_xla_send_recv_source_target_pairs": "{{0,1},{1,2}}"}}))
    entry.add(Instruction("out", "outfeed", Shape.token(), ["x", "tok"],
                          {"outfeed_shape": x_shape, "outfeed_config": ""}))
    entry.add(Instruction("cc", "custom-call", Shape.parse("(f32[4,8], s8[])"), ["x"],
                          {"custom_call_target": "my_target", "backend_config": "{\"k\": 1}",
                           "called_computations": ["add_f32"]}))
    entry.add(Instruction("bn", "batch-norm-inference", x_shape, ["x"],
                          {"epsilon": 1e-5, "feature_index": 1}))
    entry.add(Instruction("weird", "my-unknown-opcode", Shape.parse("((f32[1]{0}, token[]), s4[<=3,2]{0,1})"),
                          ["x"], {
                              "floats": [math.nan, math.inf, -math.inf, -0.0, 0.1, 1e308],
                              "ints": [0, -1, 2**63 - 1, -(2**63), 2**64 - 1, 2**80, -(2**70)],
                              "bools": (True, False), "none": None, "text": "ünïcode ∑",
                              "empty_list": [], "empty_tuple": (), "empty_dict": {},
                              "list_of_tuples": [(1, 2.0), ("a", None)], "tuple_of_lists": ([1], [[2]]),
                              "dict": {"nested": {"shape": Shape.parse("(f32[2]{0}, s32[])"), "n": 1}},
                              "shapes": [Shape.token(), Shape.parse("f32[<=10]"), Shape.parse("()")],
                              "int_vs_float": [1, 1.0, True],
                              "binary": b"\x00\xff",
                          }))
    entry.add(Instruction("result", "tuple", Shape.parse("(f32[4], token[])"), ["rd", "out"], line=99))

    module = Module("everything", entry="main", attrs={
        "replica_count": 4, "num_partitions": 1,
        "entry_computation_layout": "{(f32[4,8]{0,1}, s32[<=16]{0})->(f32[4]{0}, token[])}",
        "is_scheduled": "true",
    })
    module.add(add)
    module.add(entry)
    module.add(Computation("fused", [Instruction("p", "parameter", f32, attrs={"parameter_number": 0})],
                           root="p", is_fusion=True))
    return module


# -- round trips -------------------------------------------------------------------------------------

def test_module_round_trip_is_exact():
    module = build_module()
    data = module_to_bytes(module)
    assert data.startswith(MAGIC)
    back = module_from_bytes(data)
    assert_same_module(module, back)
    assert module_to_bytes(back) == data  # deterministic
    assert_same_module(module, module_from_bytes(bytearray(data)))
    assert_same_module(module, module_from_bytes(memoryview(data)))


def test_constants_of_every_dtype_round_trip():
    back = module_from_bytes(module_to_bytes(build_module())).computation("main")
    for element_type in ARRAY_TYPES:
        literal = back.instruction(f"c_{element_type.value}").attrs["literal"]
        assert literal.dtype == element_type.dtype
        assert literal.flags.writeable
    assert len(ARRAY_TYPES) >= 19


def test_dynamic_flags_of_a_hand_built_shape_survive():
    # A Shape built with the plain constructor may leave dynamic empty; the file keeps that exactly.
    shape = Shape(PrimitiveType.F32, (2, 3))
    module = Module("m", entry="e")
    module.add(Computation("e", [Instruction("p", "parameter", shape, attrs={"parameter_number": 0})], "p"))
    back = module_from_bytes(module_to_bytes(module))
    assert back.computation("e").instruction("p").shape.dynamic == ()


@pytest.mark.parametrize("value", [
    0, -1, 2**100, 1.5, math.nan, -0.0, True, None, "s", b"b", [1, [2]], (1, (2,)), {"a": (1,)},
    {1: "int key", (2, 3): "tuple key"}, 1 + 2j, TOKEN, Shape.parse("(f32[2]{0}, token[])"),
    np.arange(6, dtype=np.int16).reshape(2, 3), (np.zeros((2,), PrimitiveType.BF16.dtype), TOKEN),
    np.array(np.nan, np.float32), np.asfortranarray(np.arange(6.0).reshape(2, 3)),
])
def test_value_round_trip(value):
    assert_same(unpack_value(pack_value(value)), value)
    assert_same(decode_value(encode_value(value)), value)


attribute_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**90), 2**90) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text("ab∑", max_size=3),
    lambda inner: st.lists(inner, max_size=4) | st.lists(inner, max_size=4).map(tuple)
    | st.dictionaries(st.text("xy", max_size=2), inner, max_size=3),
    max_leaves=12)


@settings(max_examples=40, deadline=None)
@given(attribute_values)
def test_random_attribute_values_round_trip(value):
    assert_same(unpack_value(pack_value(value)), value)


def test_numpy_scalars_become_python_scalars():
    assert_same(unpack_value(pack_value([np.int32(3), np.float32(0.5), np.bool_(True), np.complex64(1j)])),
                [3, 0.5, True, 1j])
    assert unpack_value(pack_value(TOKEN)) is TOKEN and isinstance(TOKEN, Token)


@pytest.mark.parametrize("value", [object(), {1, 2}, np.array([None], dtype=object), print, np.float64])
def test_unserializable_values_raise(value):
    with pytest.raises(ProgramError):
        pack_value(value)


def test_self_referential_value_raises():
    loop: list = []
    loop.append(loop)
    with pytest.raises(ProgramError, match="deeper"):
        pack_value(loop)


def test_bad_module_fields_raise_on_save():
    module = Module("m", entry="e")
    module.add(Computation("e", [Instruction("p", "parameter", Shape.parse("f32[]"),
                                             attrs={"parameter_number": object()})], "p"))
    with pytest.raises(ProgramError):
        module_to_bytes(module)
    module = Module("m", entry="e", attrs={1: "non-string key"})
    with pytest.raises(ProgramError):
        module_to_bytes(module)
    with pytest.raises(ProgramError):
        module_to_bytes("not a module")


# -- damaged and hostile files -----------------------------------------------------------------------

def _small_module_bytes() -> bytes:
    module = Module("small", entry="e", attrs={"replica_count": 2})
    comp = Computation("e", root="c")
    comp.add(Instruction("c", "constant", Shape.parse("(f32[2], s32[])"),
                         attrs={"literal": (np.array([1, 2], np.float32), np.array(3, np.int32))}))
    module.add(comp)
    return module_to_bytes(module)


def _with_body(body) -> bytes:
    return HEADER + msgpack.packb(body, use_bin_type=True)


def _expect_program_error(data: bytes) -> ProgramError:
    with pytest.raises(ProgramError) as info:
        module_from_bytes(data)
    return info.value


def test_every_truncation_raises():
    data = _small_module_bytes()
    for cut in range(len(data)):
        _expect_program_error(data[:cut])


def test_extra_data_raises():
    assert "extra" in str(_expect_program_error(_small_module_bytes() + b"\xc0"))


def test_wrong_magic_and_version():
    data = _small_module_bytes()
    assert "magic" in str(_expect_program_error(b"XXXXXXXX" + data[8:]))
    assert "magic" in str(_expect_program_error(b"HloModule m\n"))
    future = MAGIC + struct.pack("<H", FORMAT_VERSION + 1) + data[len(HEADER):]
    assert "version" in str(_expect_program_error(future))
    _expect_program_error(b"")


@pytest.mark.parametrize("declaration", [
    b"\xdd\xff\xff\xff\xff",  # array32 of 4G entries
    b"\xdf\xff\xff\xff\xff",  # map32
    b"\xdb\xff\xff\xff\xff",  # str32
    b"\xc6\xff\xff\xff\xff",  # bin32
    b"\xc9\xff\xff\xff\xff\x01",  # ext32
    b"\xdc\xff\xff" + b"\xc0" * 16,  # array16 with too few entries
])
def test_huge_declared_lengths_raise(declaration):
    _expect_program_error(HEADER + declaration)
    body = {"name": "m", "entry": "e", "attrs": {}, "computations": []}
    packed = msgpack.packb(body)
    # The same declaration where the module's attributes should be.
    _expect_program_error(HEADER + packed.replace(b"\xa5attrs\x80", b"\xa5attrs" + declaration))


def test_deep_nesting_raises():
    _expect_program_error(HEADER + b"\x91" * 200_000 + b"\xc0")  # native arrays, deeper than any stack
    attr = b"\x91" * 500 + b"\xc0"
    body = msgpack.packb({"name": "m", "entry": "e", "attrs": {}, "computations": []})
    assert "deeper" in str(_expect_program_error(HEADER + body.replace(b"\xa5attrs\x80", b"\xa5attrs\x81\xa1x"
                                                                       + attr)))
    # Tuples nest through extension payloads; build one 200 levels deep without the encoder's checks.
    value = msgpack.ExtType(1, msgpack.packb([]))
    for _ in range(200):
        value = msgpack.ExtType(1, msgpack.packb([value]))
    error = _expect_program_error(_with_body({"name": "m", "entry": "e", "attrs": {"t": value}, "computations": []}))
    assert "deeper" in str(error)
    shape = ["token"]
    for _ in range(200):
        shape = ["tuple", [shape]]
    inst = {"name": "p", "opcode": "parameter", "shape": shape, "operands": [], "attrs": {}, "line": None}
    comp = {"name": "e", "root": "p", "is_fusion": False, "instructions": [inst]}
    _expect_program_error(_with_body({"name": "m", "entry": "e", "attrs": {}, "computations": [comp]}))


def _module_body(inst_overrides=None, **overrides):
    inst = {"name": "p", "opcode": "parameter", "shape": ["f32", [2], [False], None], "operands": [],
            "attrs": {"parameter_number": 0}, "line": 1}
    inst.update(inst_overrides or {})
    comp = {"name": "e", "root": "p", "is_fusion": False, "instructions": [inst]}
    body = {"name": "m", "entry": "e", "attrs": {}, "computations": [comp]}
    body.update(overrides)
    return body


def test_hand_written_body_loads():
    module = module_from_bytes(_with_body(_module_body()))
    assert module.computation("e").instruction("p").shape == Shape.parse("f32[2]")


@pytest.mark.parametrize("pad", [0, 8192], ids=["small instruction", "instruction over 4 KiB"])
def test_lists_where_a_name_or_line_belongs_are_refused_undecoded(pad):
    """A list or map in a string, bool or int field is refused as it would be decoded (the same
    message), without being decoded: an instruction of over 4 KiB is read field by field."""
    attrs = {"parameter_number": 0, "pad": "x" * pad}
    nested = [[[]] * 50] * 50
    assert "line of instruction %p must be an int or null" in str(
        _expect_program_error(_with_body(_module_body({"attrs": attrs, "line": nested}))))
    assert "an instruction name must be str, not list" in str(
        _expect_program_error(_with_body(_module_body({"attrs": attrs, "name": nested}))))
    assert "opcode of instruction %p must be str, not dict" in str(
        _expect_program_error(_with_body(_module_body({"attrs": attrs, "opcode": {"a": nested}}))))
    assert "is_fusion of e must be bool, not list" in str(
        _expect_program_error(_with_body(_module_body(computations=[
            {"name": "e", "root": "p", "is_fusion": nested, "instructions": []}]))))
    assert "the module name must be str, not dict" in str(_expect_program_error(_with_body(_module_body(name={}))))
    assert "not allowed for map key" in str(_expect_program_error(
        HEADER + msgpack.packb(_module_body({"attrs": attrs})).replace(b"\xa4line", b"\x91\x91\xc0", 1)))
    module = module_from_bytes(_with_body(_module_body({"attrs": attrs})))  # and a well-formed one loads
    assert module.computation("e").instruction("p").attrs["pad"] == "x" * pad


def _array_ext(type_name, dims, data):
    return msgpack.ExtType(2, msgpack.packb([type_name, dims, data], use_bin_type=True))


@pytest.mark.parametrize("body", [
    [],
    "a string",
    _module_body(name=5),
    _module_body(entry=None),
    _module_body(attrs=[]),
    _module_body(computations={}),
    _module_body(extra_field=1),
    {"name": "m", "entry": "e", "attrs": {}},
    _module_body({"name": b"p"}),
    _module_body({"opcode": 3}),
    _module_body({"operands": [1]}),
    _module_body({"operands": "x"}),
    _module_body({"line": "1"}),
    _module_body({"line": True}),
    _module_body({"attrs": {"parameter_number": 0, "bad": msgpack.ExtType(99, b"")}}),
    _module_body({"attrs": {"t": msgpack.Timestamp(0)}}),  # msgpack timestamp
    _module_body({"attrs": {"n": msgpack.ExtType(4, b"12a")}}),
    _module_body({"attrs": {"n": msgpack.ExtType(4, b"9" * 5000)}}),
    _module_body({"attrs": {"t": msgpack.ExtType(1, b"\xc1")}}),  # never-used msgpack byte
    _module_body({"attrs": {"t": msgpack.ExtType(1, b"\x93\xc0")}}),  # truncated payload
    _module_body({"attrs": {"t": msgpack.ExtType(1, b"\xc0")}}),  # tuple payload not a list
    _module_body({"attrs": {"d": msgpack.ExtType(6, msgpack.packb([[[1], 2]]))}}),  # unhashable key
    _module_body({"attrs": {"d": msgpack.ExtType(6, msgpack.packb([[1]]))}}),
    _module_body({"attrs": {"tok": msgpack.ExtType(5, b"x")}}),
    _module_body({"attrs": {"z": msgpack.ExtType(7, msgpack.packb([1, 2]))}}),
    _module_body({"attrs": {"a": _array_ext("f32", [2], b"\x00" * 7)}}),
    _module_body({"attrs": {"a": _array_ext("f99", [2], b"\x00" * 8)}}),
    _module_body({"attrs": {"a": _array_ext("tuple", [], b"")}}),
    _module_body({"attrs": {"a": _array_ext("f32", [-1], b"")}}),
    _module_body({"attrs": {"a": _array_ext("f32", [0, 2**62], b"")}}),
    _module_body({"attrs": {"a": _array_ext("f32", [2**40, 2**40], b"")}}),
    _module_body({"attrs": {"a": _array_ext("f32", [2.0], b"\x00" * 8)}}),
    _module_body({"attrs": {"a": _array_ext("f32", [2], "text")}}),
    _module_body({"attrs": {"a": msgpack.ExtType(2, msgpack.packb(["f32", [2]]))}}),
    _module_body({"attrs": {"s": msgpack.ExtType(3, msgpack.packb(["f32", [2], [], [[1], None, 0, ""]]))}}),
    _module_body({"shape": []}),
    _module_body({"shape": "f32[2]"}),
    _module_body({"shape": ["f32", [-2], [], None]}),
    _module_body({"shape": ["f32", [2], [True, False], None]}),
    _module_body({"shape": ["f32", [2], [1], None]}),
    _module_body({"shape": ["token", [2], [], None]}),
    _module_body({"shape": ["f32", [2, 3], [], [[0, 0], None, 0, ""]]}),
    _module_body({"shape": ["f32", [2, 3], [], [[0, 1], [1, 3], 0, ""]]}),
    _module_body({"shape": ["f32", [2, 3], [], [[0, 1], [3], 0, ""]]}),
    _module_body({"shape": ["f32", [2, 3], [], [[0, 1], None, "0", ""]]}),
    _module_body({"shape": ["f32", [2, 3], [], [[0, 1], None, 0]]}),
    _module_body({"shape": ["tuple", "x"]}),
    _module_body({"shape": ["tuple", [["bad"]]]}),
])
def test_malformed_bodies_raise(body):
    _expect_program_error(_with_body(body))


def test_duplicate_names_raise():
    body = _module_body()
    body["computations"][0]["instructions"].append(body["computations"][0]["instructions"][0])
    _expect_program_error(_with_body(body))
    body = _module_body()
    body["computations"].append(body["computations"][0])
    _expect_program_error(_with_body(body))


def test_invalid_utf8_and_non_string_keys_raise():
    packed = msgpack.packb(_module_body())
    _expect_program_error(HEADER + packed.replace(b"\xa4name", b"\xa4n\xffme", 1))
    _expect_program_error(HEADER + packed.replace(b"\xa4name", b"\xc4\x04name", 1))  # binary map key
    _expect_program_error(HEADER + packed.replace(b"\xa4name", b"\x05", 1))


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_raise_program_error(junk):
    _expect_program_error(junk)
    _expect_program_error(HEADER + junk)
    try:
        unpack_value(junk)  # a value has no header: junk may well be valid msgpack
    except ProgramError:
        pass


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_mutated_files_load_or_raise_program_error(data):
    original = bytearray(_small_module_bytes())
    for _ in range(data.draw(st.integers(1, 4))):
        position = data.draw(st.integers(len(HEADER), len(original) - 1))
        original[position] = data.draw(st.integers(0, 255))
    try:
        module = module_from_bytes(bytes(original))
    except ProgramError:
        return
    assert isinstance(module, Module)


# -- files -------------------------------------------------------------------------------------------

def test_save_and_load_msgpack(tmp_path):
    module = build_module()
    path = tmp_path / "prog.msgpack"
    files.save(module, path)
    assert path.read_bytes() == module_to_bytes(module)
    assert_same_module(module, files.load(str(path), verify=False))  # it exercises the IR, not a program
    files.save(module, path)  # overwriting works and leaves no temporary files behind
    assert [p.name for p in tmp_path.iterdir()] == ["prog.msgpack"]


def test_load_errors_name_the_path(tmp_path):
    missing = tmp_path / "missing.msgpack"
    with pytest.raises(ProgramError, match="missing.msgpack"):
        files.load(missing)
    with pytest.raises(ProgramError, match="suffix"):
        files.load(tmp_path / "prog.pb")
    with pytest.raises(ProgramError, match="suffix"):
        files.save(build_module(), tmp_path / "prog")
    damaged = tmp_path / "damaged.msgpack"
    damaged.write_bytes(b"garbage")
    with pytest.raises(ProgramError, match="damaged.msgpack"):
        files.load(damaged)
    (tmp_path / "d.msgpack").mkdir()
    with pytest.raises(ProgramError, match="cannot read"):
        files.load(tmp_path / "d.msgpack")
    with pytest.raises(ProgramError, match="cannot write"):
        files.save(build_module(), tmp_path / "no" / "such" / "dir.msgpack")
    with pytest.raises(ProgramError):
        files.load(42)
    latin = tmp_path / "latin.hlo"
    latin.write_bytes(b"HloModule \xff")
    with pytest.raises(ProgramError, match="UTF-8"):
        files.load(latin)


def test_save_and_load_hlo_text(tmp_path):
    module = parse_hlo(
        "HloModule m\n\nENTRY main {\n  p = f32[2,3]{1,0} parameter(0)\n  ROOT n = f32[2,3]{1,0} negate(p)\n}\n")
    for suffix in (".hlo", ".txt", ".HLO"):
        path = tmp_path / f"prog{suffix}"
        files.save(module, path)
        assert path.read_text() == module.to_hlo_text()
        assert files.load(path) == module
