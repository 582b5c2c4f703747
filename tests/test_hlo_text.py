"""HLO text: modules JAX prints (lowered and optimized) load, print and load again unchanged;
attribute values land in the IR as docs/ir.md says; hand-written modules in the style of XLA's
hlo_parser_test.cc; errors carry line and column."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import Mesh  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from xla_oracle import jax_text  # noqa: E402

from replicas.errors import ProgramError  # noqa: E402
from replicas.hlo.ir import Module  # noqa: E402
from replicas.hlo.opcodes import UNSUPPORTED_OPCODES  # noqa: E402
from replicas.hlo.text import parse_hlo, print_module  # noqa: E402
from replicas.hlo.verify import verify  # noqa: E402

F = np.arange(12, dtype=np.float32).reshape(3, 4) / 7 - 0.5
G = np.arange(16, dtype=np.float32).reshape(4, 4) / 5 + 1
I = np.arange(12, dtype=np.int32).reshape(3, 4) - 5
U = np.arange(12, dtype=np.uint32).reshape(3, 4)
V = np.linspace(-2, 2, 8, dtype=np.float32)
IDX = np.array([2, 0, 1], dtype=np.int32)
SPD = (G @ G.T + 4 * np.eye(4)).astype(np.float32)


def _switch(i, x):
    return lax.switch(i, [lambda v: v + 1, lambda v: v * 2, lambda v: -v], x)


# name -> (function, example arguments). Each is lowered and compiled by JAX on CPU.
JAX_CASES = {
    "add": (lambda a, b: a + b, (F, F)),
    "sub_mul_div": (lambda a, b: (a - b) * b / (b + 2), (F, F)),
    "max_min": (lambda a, b: (jnp.maximum(a, b), jnp.minimum(a, b)), (F, F * 2)),
    "pow_atan2_rem": (lambda a, b: (a ** 2, jnp.arctan2(a, b + 1), lax.rem(a, b + 3)), (F, F)),
    "exp_log": (lambda a: (jnp.exp(a), jnp.log1p(a + 1), jnp.expm1(a), jnp.log(a + 1)), (F,)),
    "trig": (lambda a: (jnp.sin(a), jnp.cos(a), jnp.tan(a), jnp.tanh(a), lax.logistic(a)), (F,)),
    "roots": (lambda a: (jnp.sqrt(a + 1), lax.rsqrt(a + 1), jnp.cbrt(a)), (F,)),
    "rounding": (lambda a: (jnp.floor(a), jnp.ceil(a), jnp.round(a), lax.round(a, lax.RoundingMethod.TO_NEAREST_EVEN),
                            jnp.sign(a), jnp.abs(a)), (F,)),
    "is_finite": (lambda a: jnp.isfinite(a / (a - a[0, 0])), (F,)),
    "erf": (lambda a: lax.erf(a), (F,)),
    "bitwise": (lambda a, b: (a & b, a | b, a ^ b, ~a, lax.shift_left(a, 2), lax.shift_right_arithmetic(a, 1),
                              lax.shift_right_logical(a, 1)), (I, I)),
    "popcnt_clz": (lambda a: (lax.population_count(a), lax.clz(a)), (U,)),
    "complex": (lambda a, b: (lax.complex(a, b), jnp.real(lax.complex(a, b) * 2j), jnp.imag(lax.complex(a, b))),
                (F, F)),
    "convert": (lambda a: (a.astype(jnp.int32), a.astype(jnp.bfloat16), a.astype(jnp.float16)), (F,)),
    "bitcast_convert": (lambda a: lax.bitcast_convert_type(a, jnp.int32), (F,)),
    "reduce_precision": (lambda a: lax.reduce_precision(a, exponent_bits=5, mantissa_bits=10), (F,)),
    "clamp_select": (lambda a, b: (lax.clamp(-0.2, a, 0.3), jnp.where(a > b, a, b)), (F, F[::-1])),
    "compare_all": (lambda a, b: (a == b, a != b, a < b, a <= b, a > b, a >= b), (I, I[::-1])),
    "dot_general": (lambda a, b: lax.dot_general(a, b, (((2,), (1,)), ((0,), (0,)))),
                    (np.ones((2, 3, 4), np.float32), np.ones((2, 4, 5), np.float32))),
    "matmul": (lambda a, b: a @ b, (F, G)),
    "conv": (lambda x, w: lax.conv_general_dilated(x, w, (2, 1), [(1, 0), (0, 1)], lhs_dilation=(1, 2),
                                                   rhs_dilation=(2, 1)),
             (np.ones((1, 2, 7, 6), np.float32), np.ones((3, 2, 2, 3), np.float32))),
    "conv_groups": (lambda x, w: lax.conv_general_dilated(x, w, (1,), "SAME", feature_group_count=2),
                    (np.ones((2, 4, 9), np.float32), np.ones((6, 2, 3), np.float32))),
    "reduce": (lambda a: (jnp.sum(a, axis=1), jnp.max(a), jnp.prod(a, axis=0)), (F,)),
    "reduce_window": (lambda a: lax.reduce_window(a, -jnp.inf, lax.max, (2, 2), (1, 2), [(0, 1), (1, 0)]), (F,)),
    "argmax": (lambda a: (jnp.argmax(a, axis=1), jnp.argmin(a, axis=0)), (F,)),
    "sort": (lambda a, b: lax.sort((a, b), dimension=1, num_keys=1), (F, I)),
    "sort_stable": (lambda a: jnp.sort(a, axis=0, stable=True), (F,)),
    "gather": (lambda a, i: a[i], (F, IDX)),
    "gather_2d": (lambda a, i: a[i, 1:3], (F, IDX)),
    "scatter_add": (lambda a, i: a.at[i].add(1.0), (F, IDX)),
    "scatter_set": (lambda a, i: a.at[i, 2].set(0.0), (F, IDX)),
    "while_loop": (lambda x: lax.while_loop(lambda c: c[0] < 5, lambda c: (c[0] + 1, c[1] * 1.5), (0, x)), (F,)),
    "fori_loop": (lambda x: lax.fori_loop(0, 4, lambda k, v: v + k, x), (F,)),
    "cond": (lambda p, x: lax.cond(p, lambda v: v + 1, lambda v: v - 1, x), (np.bool_(True), F)),
    "switch": (_switch, (np.int32(1), F)),
    "cumsum": (lambda a: (jnp.cumsum(a, axis=1), lax.cummax(a, axis=0)), (F,)),
    "scan": (lambda a: lax.scan(lambda c, r: (c + r, c * r), jnp.zeros(4, jnp.float32), a), (F,)),
    "fft": (lambda a: (jnp.fft.fft(a), jnp.fft.rfft(a), jnp.fft.irfft(jnp.fft.rfft(a))), (F,)),
    "cholesky": (lambda a: jnp.linalg.cholesky(a), (SPD,)),
    "triangular_solve": (lambda a, b: lax.linalg.triangular_solve(a, b, left_side=True, lower=True),
                         (SPD, G)),
    "rng_bit_generator": (lambda k: lax.rng_bit_generator(k, (3, 4), algorithm=lax.RandomAlgorithm.RNG_THREE_FRY),
                          (np.arange(4, dtype=np.uint32),)),
    "random_threefry": (lambda: jax.random.uniform(jax.random.key(0), (5,)), ()),
    "iota": (lambda: (lax.iota(jnp.int32, 5), lax.broadcasted_iota(jnp.float32, (2, 3), 1)), ()),
    "pad": (lambda a: (lax.pad(a, 0.0, [(1, 2, 1), (-1, 0, 0)]), jnp.pad(a, 1)), (F,)),
    "concatenate": (lambda a, b: jnp.concatenate([a, b, a], axis=1), (F, F)),
    "dynamic_slice": (lambda a, i: lax.dynamic_slice(a, (i, 1), (2, 2)), (F, np.int32(1))),
    "dynamic_update_slice": (lambda a, i: lax.dynamic_update_slice(a, jnp.ones((2, 2), a.dtype), (i, 1)),
                             (F, np.int32(1))),
    "transpose_rev": (lambda a: (a.T, lax.rev(a, (0,)), jnp.flip(a)), (F,)),
    "reshape_broadcast": (lambda a: (a.reshape(4, 3), jnp.broadcast_to(a[:, None, :], (3, 2, 4))), (F,)),
    "slice_strided": (lambda a: a[::2, 1::2], (F,)),
    "top_k": (lambda a: lax.top_k(a, 3), (V,)),
    "constants": (lambda: (jnp.array([[1.5, -2.0], [np.inf, -np.inf]], jnp.float32),
                           jnp.array([1, 2], jnp.bfloat16), jnp.array([True, False]),
                           jnp.array([1 + 2j, -3j], jnp.complex64), jnp.array(7, jnp.uint8)), ()),
    "nan_constant": (lambda a: jnp.where(a > 0, jnp.nan, a), (F,)),
    "map": (lambda a: jax.lax.map(lambda r: r * 2, a), (F,)),
    "eigh": (lambda a: jnp.linalg.eigh(a), (SPD,)),
}



@pytest.fixture(autouse=True)
def _x64_off():
    """The cases are written for JAX's default 32-bit mode; other test files switch x64 on."""
    with jax.enable_x64(False):
        yield


def _texts(fn, args):
    """The text JAX lowers `fn` to and the one XLA:CPU compiles it to (recorded: xla_oracle.jax_text)."""
    return jax_text(fn, list(args), "lowered"), jax_text(fn, list(args), "compiled")


def _round_trip(text: str) -> Module:
    module = parse_hlo(text, verify=False)
    if any(inst.opcode in UNSUPPORTED_OPCODES for _, inst in module.instructions()):
        with pytest.raises(ProgramError, match="is not supported"):
            verify(module)
    else:
        verify(module)
    printed = module.to_hlo_text()
    again = parse_hlo(printed, verify=False)
    assert again == module
    assert print_module(again) == printed  # printing is deterministic
    return module


@pytest.mark.parametrize("case", sorted(JAX_CASES))
def test_jax_modules_round_trip(case):
    fn, args = JAX_CASES[case]
    lowered_text, compiled_text = _texts(fn, args)
    for text in (lowered_text, compiled_text):
        module = _round_trip(text)
        assert module.entry in module.computations
        assert module.entry_computation.root


def _shard_map_texts(body, n=8):
    mesh = Mesh(np.array(jax.devices()[:n]), ("i",))
    fn = jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    return _texts(fn, [np.arange(8 * n, dtype=np.float32)])


COLLECTIVE_CASES = {
    "psum": lambda a: lax.psum(a, "i"),
    "all_gather": lambda a: lax.all_gather(a, "i", tiled=True),
    "all_to_all": lambda a: lax.all_to_all(a, "i", 0, 0, tiled=True),
    "ppermute": lambda a: lax.ppermute(a, "i", [(j, (j + 1) % 8) for j in range(8)]),
    "psum_scatter": lambda a: lax.psum_scatter(a, "i", tiled=True),
    "axis_index": lambda a: a + lax.axis_index("i").astype(a.dtype),
    "pmax": lambda a: lax.pmax(a, "i"),
}


@pytest.mark.parametrize("case", sorted(COLLECTIVE_CASES))
def test_shard_map_collectives_round_trip(case):
    lowered_text, compiled_text = _shard_map_texts(COLLECTIVE_CASES[case])
    for text in (lowered_text, compiled_text):
        _round_trip(text)
    compiled = parse_hlo(compiled_text)
    assert compiled.attrs["num_partitions"] == 8
    assert isinstance(compiled.attrs["entry_computation_layout"], str)


def _instructions(module, opcode):
    return [inst for _, inst in module.instructions() if inst.opcode == opcode]


def test_jax_collective_attributes_land_in_ir():
    def body(a):
        return lax.psum(a, "i"), lax.ppermute(a, "i", [(j, (j + 1) % 8) for j in range(8)]), \
            lax.all_gather(a, "i", tiled=True)

    _, compiled_text = _shard_map_texts(body)
    module = parse_hlo(compiled_text)
    (all_reduce,) = _instructions(module, "all-reduce")
    assert all_reduce.attrs["replica_groups"] == [list(range(8))]
    assert all_reduce.attrs["use_global_device_ids"] is True
    assert isinstance(all_reduce.attrs["channel_id"], int)
    assert module.computation(all_reduce.attrs["to_apply"]).root_instruction.opcode == "add"
    (permute,) = _instructions(module, "collective-permute")
    assert permute.attrs["source_target_pairs"] == [(j, (j + 1) % 8) for j in range(8)]
    assert all(isinstance(p, tuple) for p in permute.attrs["source_target_pairs"])
    (gather,) = _instructions(module, "all-gather")
    assert gather.attrs["dimensions"] == [0]


def test_jax_attributes_land_in_ir():
    def f(x, w, a, i):
        conv = lax.conv_general_dilated(x, w, (2, 1), [(1, 0), (0, 1)], rhs_dilation=(2, 1))
        return conv, a @ a.T, a[i], jnp.sort(a, axis=1), a[::2, 1:3], lax.pad(a, 0.0, [(1, 2, 1), (0, 0, 0)])

    args = (np.ones((1, 2, 7, 6), np.float32), np.ones((3, 2, 2, 3), np.float32), F, IDX)
    module = parse_hlo(jax.jit(f).lower(*args).as_text(dialect="hlo"))
    (conv,) = _instructions(module, "convolution")
    window = conv.attrs["window"]
    assert window["size"] == [2, 3] and window["stride"] == [2, 1]
    assert window["pad"] == [(1, 0), (0, 1)] and window["rhs_dilate"] == [2, 1]
    assert window["lhs_dilate"] == [1, 1] and window["window_reversal"] == [False, False]
    assert conv.attrs["dim_labels"] == "bf01_oi01->bf01"
    (dot,) = _instructions(module, "dot")
    assert dot.attrs["lhs_contracting_dims"] == [1] and dot.attrs["rhs_contracting_dims"] == [0]
    (gather,) = _instructions(module, "gather")
    assert gather.attrs["slice_sizes"] == [1, 4] and gather.attrs["index_vector_dim"] == 1
    assert gather.attrs["collapsed_slice_dims"] == [0] and gather.attrs["start_index_map"] == [0]
    (sort,) = _instructions(module, "sort")
    assert sort.attrs["dimensions"] == [1] and isinstance(sort.attrs["to_apply"], str)
    slices = [s.attrs["slice"] for s in _instructions(module, "slice")]
    assert [(0, 3, 2), (1, 3, 1)] in slices
    (pad,) = _instructions(module, "pad")
    assert pad.attrs["padding"] == [(1, 2, 1), (0, 0, 0)]
    compares = _instructions(module, "compare")
    assert {c.attrs["comparison_direction"] for c in compares} <= {"EQ", "NE", "GE", "GT", "LE", "LT"}
    assert any(c.attrs.get("type") == "TOTALORDER" for c in compares)
    for _, inst in module.instructions():
        assert "metadata" not in inst.attrs and "sharding" not in inst.attrs


def test_jax_constants_are_numpy_arrays_of_the_shape_dtype():
    def f():
        return (jnp.array([[1.5, -2.0], [np.inf, -np.inf]], jnp.float32), jnp.array([1.25, 2], jnp.bfloat16),
                jnp.array([True, False]), jnp.array([1 + 2j, -3j], jnp.complex64))

    module = parse_hlo(jax.jit(f).lower().as_text(dialect="hlo"))
    literals = {str(i.shape.without_layout()): i.attrs["literal"] for i in _instructions(module, "constant")}
    np.testing.assert_array_equal(literals["f32[2,2]"], np.array([[1.5, -2.0], [np.inf, -np.inf]], np.float32))
    assert literals["bf16[2]"].dtype == np.dtype(ml_dtypes.bfloat16)
    assert literals["bf16[2]"].astype(np.float32).tolist() == [1.25, 2.0]
    assert literals["pred[2]"].dtype == np.bool_ and literals["pred[2]"].tolist() == [True, False]
    assert literals["c64[2]"].tolist() == [1 + 2j, -3j]


def test_large_constants_print_in_full_when_lowered_and_elided_when_compiled():
    values = np.arange(40, dtype=np.float32) * 1.5
    lowered = jax.jit(lambda a: a + values).lower(np.ones(40, np.float32))
    module = _round_trip(lowered.as_text(dialect="hlo"))
    (constant,) = _instructions(module, "constant")
    np.testing.assert_array_equal(constant.attrs["literal"], values)
    compiled = lowered.compile().as_text()
    assert "{...}" in compiled
    with pytest.raises(ProgramError, match="elided") as info:
        parse_hlo(compiled)
    assert info.value.line is not None and info.value.column is not None
