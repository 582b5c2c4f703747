"""rng (uniform / normal) and rng-bit-generator (ThreeFry / Philox, bit-exact with XLA).

rng-bit-generator follows XLA's expansion (`xla/service/rng_bit_generator_expander.cc` and
`xla/hlo/builder/lib/prng.cc`): the state's first u64 is the key, the rest is the counter.
ThreeFry2x32 (20 rounds) numbers the elements from the counter in row-major order; for 32-bit
results the shape is split in halves along its first even (else largest) dimension and the two
output words interleave along it. Philox4x32 (10 rounds) scrambles nothing: the key is used as
is, the 128-bit counter is (state[1], state[2]) or, for a u64[2] state, (state[1], state[0]);
each counter value gives four u32 (two u64) consecutive results. Results narrower than 32 bits
keep the low bits of the 32-bit result. `rng_default` is Philox, as on XLA CPU.

rng draws from numpy's PCG64 seeded by (replica id, a CRC of the instruction name, how many
times this instruction ran on this replica): reproducible run to run and different on every
replica and every execution. XLA only promises "implementation-defined" values here.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable

import numpy as np

from replicas.hlo.ir import Instruction
from replicas.ops.elementwise_util import quiet
from replicas.ops.registry import KernelContext, kernel
from replicas.shapes import Shape

_U32 = np.uint32
_U64 = np.uint64
_MASK32 = _U64(0xFFFFFFFF)
_THREEFRY_ROTATIONS = (13, 15, 26, 6, 17, 29, 16, 24)


def _split_u64(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return (x & _MASK32).astype(_U32), (x >> _U64(32)).astype(_U32)


def _join_u32(low: np.ndarray, high: np.ndarray) -> np.ndarray:
    return low.astype(_U64) | (high.astype(_U64) << _U64(32))


def _rotate_left(v: np.ndarray, distance: int) -> np.ndarray:
    return (v << _U32(distance)) | (v >> _U32(32 - distance))


def threefry2x32(
    x0: np.ndarray, x1: np.ndarray, key0: np.uint32, key1: np.uint32
) -> tuple[np.ndarray, np.ndarray]:
    ks = (_U32(key0), _U32(key1), _U32(0x1BD11BDA) ^ _U32(key0) ^ _U32(key1))
    x0 = x0 + ks[0]
    x1 = x1 + ks[1]
    for group in range(5):
        rotations = _THREEFRY_ROTATIONS[:4] if group % 2 == 0 else _THREEFRY_ROTATIONS[4:]
        for r in rotations:
            x0 = x0 + x1
            x1 = _rotate_left(x1, r) ^ x0
        x0 = x0 + ks[(group + 1) % 3]
        x1 = x1 + ks[(group + 2) % 3] + _U32(group + 1)
    return x0, x1


def philox4x32(counter: list[np.ndarray], key0: np.uint32, key1: np.uint32) -> list[np.ndarray]:
    k0, k1 = _U32(key0), _U32(key1)
    x = counter
    for _ in range(10):
        p0 = x[0].astype(_U64) * _U64(0xD2511F53)
        p1 = x[2].astype(_U64) * _U64(0xCD9E8D57)
        x = [
            (p1 >> _U64(32)).astype(_U32) ^ x[1] ^ k0,
            (p1 & _MASK32).astype(_U32),
            (p0 >> _U64(32)).astype(_U32) ^ x[3] ^ k1,
            (p0 & _MASK32).astype(_U32),
        ]
        k0 = k0 + _U32(0x9E3779B9)
        k1 = k1 + _U32(0xBB67AE85)
    return x


def _threefry_bits32(
    key: np.uint64, counter: np.uint64, dims: tuple[int, ...]
) -> tuple[np.ndarray, np.uint64]:
    """XLA's ThreeFryRngBit32: u32 bits of shape `dims` and the new counter."""
    if not dims:
        half_dims: tuple[int, ...] = (1,)
        split = None
    else:
        evens = [i for i, d in enumerate(dims) if d % 2 == 0]
        split = evens[0] if evens else max(range(len(dims)), key=lambda i: (dims[i], -i))
        half_dims = dims[:split] + (-(-dims[split] // 2),) + dims[split + 1 :]
    count = math.prod(half_dims)
    inputs = counter + np.arange(count, dtype=_U64)
    k0, k1 = _split_u64(np.asarray(key, _U64))
    out0, out1 = threefry2x32(*_split_u64(inputs), k0[()], k1[()])
    new_counter = counter + _U64(count)
    if split is None:
        return out0.reshape(()), new_counter
    pair = np.stack([out0.reshape(half_dims), out1.reshape(half_dims)], axis=split + 1)
    full = pair.reshape(dims[:split] + (2 * half_dims[split],) + dims[split + 1 :])
    return full[(slice(None),) * split + (slice(0, dims[split]),)], new_counter


def _threefry_bits64(
    key: np.uint64, counter: np.uint64, dims: tuple[int, ...]
) -> tuple[np.ndarray, np.uint64]:
    count = math.prod(dims)
    inputs = counter + np.arange(count, dtype=_U64)
    k0, k1 = _split_u64(np.asarray(key, _U64))
    out0, out1 = threefry2x32(*_split_u64(inputs), k0[()], k1[()])
    return _join_u32(out0, out1).reshape(dims), counter + _U64(count)


def _philox_blocks(
    key: np.uint64, low: np.uint64, high: np.uint64, blocks: int
) -> tuple[list[np.ndarray], np.uint64, np.uint64]:
    """`blocks` Philox outputs (4 u32 each) from the 128-bit counter (low, high), and the new counter."""
    steps = np.arange(blocks, dtype=_U64)
    lows = low + steps
    highs = np.where(lows < low, high + _U64(1), high).astype(_U64)
    k0, k1 = _split_u64(np.asarray(key, _U64))
    words = [*_split_u64(lows), *_split_u64(highs)]
    out = philox4x32(words, k0[()], k1[()])
    new_low = low + _U64(blocks)
    new_high = high + _U64(1) if new_low < low else high
    return out, new_low, new_high


def _philox_bits(
    key: np.uint64, low: np.uint64, high: np.uint64, dims: tuple[int, ...], bits64: bool
) -> tuple[np.ndarray, np.uint64, np.uint64]:
    count = math.prod(dims)
    if bits64:
        out, new_low, new_high = _philox_blocks(key, low, high, -(-count // 2))
        words = np.stack([_join_u32(out[0], out[1]), _join_u32(out[2], out[3])], axis=1)
    else:
        out, new_low, new_high = _philox_blocks(key, low, high, -(-count // 4))
        words = np.stack(out, axis=1)
    return words.reshape(-1)[:count].reshape(dims), new_low, new_high


def _bit_width(shape: Shape) -> int:
    return shape.dtype.itemsize * 8


@kernel("rng-bit-generator")
def make_rng_bit_generator(inst: Instruction, ctx: KernelContext) -> Callable[[np.ndarray], tuple]:
    (state_shape,) = ctx.operand_shapes(inst)
    # The verifier checked the algorithm, a u64 state of its length and the result (state, bits) of a
    # type of 8-64 bits (hlo/shape_inference/rng.py).
    algorithm = inst.attrs.get("algorithm", "rng_default")
    if algorithm == "rng_default":
        algorithm = "rng_philox"
    state_len = state_shape.dimensions[0]
    out_shape = inst.shape.tuple_shapes[1]
    out_dtype = out_shape.dtype
    width = _bit_width(out_shape)
    dims = out_shape.dimensions
    unsigned = {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}[width]

    def finish(bits: np.ndarray) -> np.ndarray:
        if width < 32:
            bits = bits.astype(unsigned)
        return np.ascontiguousarray(bits).view(out_dtype).reshape(dims)

    def three_fry(state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        key, counter = state[0], state[1]
        if width == 64:
            bits, new_counter = _threefry_bits64(key, counter, dims)
        else:
            bits, new_counter = _threefry_bits32(key, counter, dims)
        return np.array([key, new_counter], dtype=_U64), finish(bits)

    def philox(state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        key = state[0]
        low, high = (state[1], state[2]) if state_len == 3 else (state[1], state[0])
        bits, new_low, new_high = _philox_bits(key, low, high, dims, width == 64)
        new_state = [key, new_low, new_high] if state_len == 3 else [key, new_low]
        return np.array(new_state, dtype=_U64), finish(bits)

    generate = three_fry if algorithm == "rng_three_fry" else philox

    def rng_bit_generator(state: np.ndarray) -> tuple:
        with np.errstate(over="ignore"):
            return generate(state)

    return rng_bit_generator


CHUNK = 1 << 20  # float64 draws an rng kernel makes at a time (8 MiB)


@kernel("rng")
def make_rng(inst: Instruction, ctx: KernelContext) -> Callable[..., np.ndarray]:
    # The verifier checked the distribution, two scalar parameters of the result's element type, and
    # a floating-point type for rng_normal (hlo/shape_inference/rng.py).
    distribution = inst.attrs["distribution"]
    shape = inst.shape
    dtype = shape.dtype
    kind = shape.element_type
    dims = shape.dimensions
    seed_words = [ctx.replica_id, zlib.crc32(inst.name.encode())]
    runs = [0]

    def generator() -> np.random.Generator:
        runs[0] += 1
        return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed_words + [runs[0]])))

    def normal(mu: np.ndarray, sigma: np.ndarray, _dims: np.ndarray | None = None) -> np.ndarray:
        rng, m, s = generator(), float(mu), float(sigma)
        out = np.empty(dims, dtype)
        flat = out.reshape(-1)
        # A chunk of float64 draws at a time, written into the result: the same draws in the same
        # order as one call, without a float64 copy of the whole result (runtime/memory.py declares it).
        with quiet():
            for start in range(0, flat.size, CHUNK):
                draws = rng.standard_normal(min(CHUNK, flat.size - start))
                draws *= s
                draws += m
                flat[start:start + draws.size] = draws
        return out

    def uniform(a: np.ndarray, b: np.ndarray, _dims: np.ndarray | None = None) -> np.ndarray:
        rng = generator()
        if kind.is_floating:
            lo, hi = float(a), float(b)
            out = np.empty(dims, dtype)
            flat = out.reshape(-1)
            low, high = np.asarray(lo).astype(dtype), np.asarray(hi).astype(dtype)
            with quiet():
                for start in range(0, flat.size, CHUNK):
                    draws = rng.random(min(CHUNK, flat.size - start))
                    draws *= hi - lo
                    draws += lo
                    part = flat[start:start + draws.size]
                    part[...] = draws
                    if lo < hi:  # rounding to a narrow type may reach b; [a, b) excludes it
                        part[part >= high] = low
            return out
        lo, hi = int(a), int(b)
        if hi <= lo:
            return np.full(dims, a, dtype=dtype)
        if kind.name == "PRED":
            return rng.integers(lo, hi, size=dims).astype(np.bool_)
        return rng.integers(lo, hi, size=dims, dtype=dtype)

    return normal if distribution == "rng_normal" else uniform


# XLA:CPU's initial value of the module's 128-bit rng state (llvm_util.cc, GetOrCreateVariableForRngState).
RNG_STATE_INITIAL = 0x7012395


@kernel("rng-get-and-update-state")
def make_rng_get_and_update_state(inst: Instruction, ctx: KernelContext) -> Callable[[], np.ndarray]:
    """The module's 128-bit state as u64[2] (low word first), then advanced by `delta`. One state per
    replica's module, shared by every such instruction and kept across executions, as XLA:CPU's global."""
    delta = int(inst.attrs.get("delta", 0))
    states = ctx.__dict__.setdefault("_rng_state", [RNG_STATE_INITIAL])
    mask = (1 << 128) - 1

    def rng_get_and_update_state() -> np.ndarray:
        old = states[0]
        states[0] = (old + delta) & mask
        return np.array([old & 0xFFFFFFFFFFFFFFFF, old >> 64], dtype=np.uint64)

    return rng_get_and_update_state
