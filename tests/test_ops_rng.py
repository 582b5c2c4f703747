"""rng-bit-generator bit-exact vs XLA on CPU (ThreeFry, Philox, default; u64[2] and u64[3] states; every
integer/float result width), and rng (uniform / normal): ranges, types, per-replica reproducible seeding."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax._src import xla_bridge
from jax._src.lib import xla_client
from opkit import run_module, run_op, single_op_module
from xla_oracle import GOLDEN

from replicas.errors import ProgramError
from replicas.runtime.compile import compile_module
from replicas.runtime.interpreter import Interpreter
from replicas.shapes import Shape

MLIR_TYPES = {
    "u8": "ui8",
    "u16": "ui16",
    "u32": "ui32",
    "u64": "ui64",
    "s8": "i8",
    "s16": "i16",
    "s32": "i32",
    "s64": "i64",
    "f16": "f16",
    "f32": "f32",
    "f64": "f64",
}
ALGORITHMS = {"rng_three_fry": "THREE_FRY", "rng_philox": "PHILOX", "rng_default": "DEFAULT"}


def _rng_bit_generator_text(algorithm: str, state_len: int, element_type: str, dims: tuple[int, ...]) -> str:
    """One stablehlo.rng_bit_generator (the oracle; jax.lax only takes u64[2] keys)."""
    data = "tensor<" + "".join(f"{d}x" for d in dims) + MLIR_TYPES[element_type] + ">"
    state = f"tensor<{state_len}xui64>"
    return (
        f"module @oracle {{\n func.func public @main(%s: {state}) -> ({state}, {data}) {{\n"
        f'  %0:2 = "stablehlo.rng_bit_generator"(%s) {{rng_algorithm = #stablehlo<rng_algorithm '
        f"{ALGORITHMS[algorithm]}>}} : ({state}) -> ({state}, {data})\n"
        f"  return %0#0, %0#1 : {state}, {data}\n }}\n}}\n"
    )


@functools.cache
def _compiled(text: str):
    backend = xla_bridge.get_backend("cpu")
    devices = xla_client.DeviceList(tuple(backend.local_devices()[:1]))
    return backend, backend.compile_and_load(text, devices, xla_client.CompileOptions())


def xla_bits(algorithm: str, state: np.ndarray, element_type: str, dims: tuple[int, ...]):
    """XLA's answer, recorded in tests/golden/ (compiling each program here every run cost this file
    5-8 CPU s of the suite: it was the only oracle outside the store)."""
    text = _rng_bit_generator_text(algorithm, len(state), element_type, dims)

    def compute() -> list[np.ndarray]:
        backend, exe = _compiled(text)
        out = exe.execute_sharded([jax.device_put(state, backend.local_devices()[0])])
        return [np.asarray(o[0]) for o in out.disassemble_into_single_device_arrays()]

    new_state, bits = GOLDEN.answer(("stablehlo", text), [state], compute)
    return new_state, bits


def check_bits(algorithm: str, state: np.ndarray, element_type: str, dims: tuple[int, ...]) -> None:
    expected_state, expected_bits = xla_bits(algorithm, state, element_type, dims)
    data = Shape.array(element_type, dims)
    got_state, got_bits = run_op(
        "rng-bit-generator", Shape.tuple([Shape.of(state), data]), [state], {"algorithm": algorithm}
    )
    np.testing.assert_array_equal(got_state, expected_state)
    assert got_bits.dtype == data.dtype and got_bits.shape == dims
    unsigned = f"u{got_bits.dtype.itemsize}"
    np.testing.assert_array_equal(got_bits.view(unsigned), expected_bits.view(unsigned))


# Scalar, odd-only (split along the largest), even (split along the first even), empty; each distinct
# shape costs one XLA compilation, so the matrix is kept small.
SHAPES = [(), (5,), (4,), (3, 5), (4, 6), (3, 5, 7), (0,)]


@pytest.mark.parametrize("algorithm", ["rng_three_fry", "rng_philox"])
def test_rng_bit_generator_u32_layouts_match_xla(algorithm):
    rng = np.random.default_rng(len(algorithm))
    for dims in SHAPES:
        state = rng.integers(0, 2**64 - 1, 2, dtype=np.uint64, endpoint=True)
        check_bits(algorithm, state, "u32", dims)


@pytest.mark.parametrize("algorithm", ["rng_three_fry", "rng_philox"])
@pytest.mark.parametrize("element_type", ["u64", "u8", "u16", "s32", "s64", "f32"])
def test_rng_bit_generator_result_types_match_xla(algorithm, element_type):
    state = np.array([0x0123456789ABCDEF, 2**64 - 5], np.uint64)
    check_bits(algorithm, state, element_type, (3, 5))


def test_rng_bit_generator_default_is_philox_like_xla_cpu():
    state = np.array([7, 99], np.uint64)
    for dims in [(3, 5), (4, 6)]:
        check_bits("rng_default", state, "u32", dims)
    philox = run_op("rng-bit-generator", "(u64[2], u32[3,5])", [state], {"algorithm": "rng_philox"})
    default = run_op("rng-bit-generator", "(u64[2], u32[3,5])", [state], {"algorithm": "rng_default"})
    np.testing.assert_array_equal(philox[1], default[1])


@pytest.mark.parametrize("element_type", ["u32", "u64", "s16", "f64"])
def test_rng_bit_generator_philox_u64x3_state_and_counter_carry(element_type):
    for state in ([1, 2**64 - 3, 5], [2**63, 7, 2**64 - 1], [0, 0, 0]):
        check_bits("rng_philox", np.array(state, np.uint64), element_type, (5, 3))


def test_rng_bit_generator_counter_wraps_like_xla():
    for algorithm in ("rng_three_fry", "rng_philox"):
        check_bits(algorithm, np.array([3, 2**64 - 2], np.uint64), "u32", (4, 6))
        check_bits(algorithm, np.array([3, 2**64 - 2], np.uint64), "u64", (3, 5))


@settings(max_examples=15, deadline=None)
@given(
    st.sampled_from(["rng_three_fry", "rng_philox"]),
    st.integers(0, 2**64 - 1),
    st.integers(0, 2**64 - 1),
    st.sampled_from([(), (5,), (3, 5), (4, 6)]),
)
def test_rng_bit_generator_random_states(algorithm, key, counter, dims):
    check_bits(algorithm, np.array([key, counter], np.uint64), "u32", dims)


def test_rng_bit_generator_state_chains():
    """Feeding the new state back gives fresh bits (the counter advanced past the used values)."""
    state = np.array([42, 0], np.uint64)
    shape = "(u64[2], u32[8])"
    s1, b1 = run_op("rng-bit-generator", shape, [state], {"algorithm": "rng_three_fry"})
    s2, b2 = run_op("rng-bit-generator", shape, [s1], {"algorithm": "rng_three_fry"})
    assert s1.tolist() == [42, 4] and s2.tolist() == [42, 8]
    assert not np.array_equal(b1, b2)


def test_rng_bit_generator_rejects_bad_state():
    with pytest.raises(ProgramError, match="u64"):
        run_op("rng-bit-generator", "(u32[2], u32[4])", [np.zeros(2, np.uint32)], {"algorithm": "rng_philox"})
    with pytest.raises(ProgramError, match="three_fry"):
        run_op(
            "rng-bit-generator", "(u64[3], u32[4])", [np.zeros(3, np.uint64)], {"algorithm": "rng_three_fry"}
        )


# ---------------------------------------------------------------------------------------------- rng


def rng_module(distribution: str, element_type: str, dims: tuple[int, ...]):
    scalar = Shape.scalar(element_type)
    return single_op_module(
        "rng", Shape.array(element_type, dims), [scalar, scalar], {"distribution": distribution}
    )


def test_rng_uniform_float_range_and_type():
    module = rng_module("rng_uniform", "f32", (100, 100))
    values = run_module(module, [np.float32(-2.0), np.float32(3.0)])
    assert values.dtype == np.float32 and values.shape == (100, 100)
    assert values.min() >= -2.0 and values.max() < 3.0
    assert abs(float(values.mean()) - 0.5) < 0.1  # 10^4 draws: the mean of U(-2, 3) is 0.5 +- 0.015


@pytest.mark.parametrize("element_type", ["s32", "u64", "s64", "u8", "bf16", "f16", "f64"])
def test_rng_uniform_types_stay_in_half_open_interval(element_type):
    module = rng_module("rng_uniform", element_type, (5000,))
    dtype = Shape.scalar(element_type).dtype
    a, b = np.asarray(3).astype(dtype), np.asarray(7).astype(dtype)
    values = run_module(module, [a, b])
    assert values.dtype == dtype
    wide = values.astype(np.float64)
    assert wide.min() >= 3 and wide.max() < 7
    if element_type[0] in "su":
        assert set(np.unique(values).tolist()) == {3, 4, 5, 6}


def test_rng_normal_statistics():
    values = run_module(rng_module("rng_normal", "f64", (200, 100)), [np.float64(10.0), np.float64(2.0)])
    assert abs(values.mean() - 10.0) < 0.1 and abs(values.std() - 2.0) < 0.1


def test_rng_seeding_per_replica_reproducible_and_advancing():
    module = rng_module("rng_uniform", "f32", (16,))
    args = [np.float32(0), np.float32(1)]
    first = Interpreter(compile_module(module), replica_id=0)
    a1, a2 = first.run(args), first.run(args)
    again = Interpreter(compile_module(module), replica_id=0).run(args)
    other = Interpreter(compile_module(module), replica_id=1).run(args)
    np.testing.assert_array_equal(a1, again)  # same replica, fresh run: same values
    assert not np.array_equal(a1, a2)  # the next execution draws new values
    assert not np.array_equal(a1, other)  # another replica draws different values


def test_rng_rejects_bad_operands():
    with pytest.raises(ProgramError, match="distribution"):
        run_op("rng", "f32[2]", [np.float32(0), np.float32(1)], {"distribution": "rng_cauchy"})
    with pytest.raises(ProgramError, match="floating"):
        run_op("rng", "s32[2]", [np.int32(0), np.int32(1)], {"distribution": "rng_normal"})
