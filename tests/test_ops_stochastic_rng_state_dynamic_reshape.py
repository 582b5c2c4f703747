"""stochastic-convert, rng-get-and-update-state, dynamic-reshape and the 3-operand rng, as XLA has them."""

from __future__ import annotations

import numpy as np
import pytest

import replicas as rp
from replicas.runtime.interpreter import Interpreter

# XLA's StochasticConvertDecomposer written out in HLO: the kernel must give the same answers.
DECOMPOSED = """HloModule decomposed
ENTRY e {
  x = f32[64] parameter(0)
  r = u32[64] parameter(1)
  sign = f32[64] sign(x)
  zero = f32[] constant(0)
  zeros = f32[64] broadcast(zero), dimensions={}
  neg = pred[64] compare(sign, zeros), direction=LT
  abs = f32[64] abs(x)
  whole = f32[64] floor(abs)
  frac = f32[64] subtract(abs, whole)
  two32 = f32[] constant(4294967296)
  scale = f32[64] broadcast(two32), dimensions={}
  fixed = f32[64] multiply(frac, scale)
  fixed_u = u32[64] convert(fixed)
  up = pred[64] compare(r, fixed_u), direction=LT
  t = s8[64] convert(whole)
  one = s8[] constant(1)
  ones = s8[64] broadcast(one), dimensions={}
  t1 = s8[64] add(t, ones)
  rounded = s8[64] select(up, t1, t)
  negated = s8[64] negate(rounded)
  signed = s8[64] select(neg, negated, rounded)
  minf = f32[] constant(-128)
  mins = f32[64] broadcast(minf), dimensions={}
  is_min = pred[64] compare(x, mins), direction=LE
  mini = s8[] constant(-128)
  minis = s8[64] broadcast(mini), dimensions={}
  a = s8[64] select(is_min, minis, signed)
  maxf = f32[] constant(127)
  maxs = f32[64] broadcast(maxf), dimensions={}
  is_max = pred[64] compare(x, maxs), direction=GE
  maxi = s8[] constant(127)
  maxis = s8[64] broadcast(maxi), dimensions={}
  ROOT b = s8[64] select(is_max, maxis, a)
}
"""

DIRECT = """HloModule direct
ENTRY e {
  x = f32[64] parameter(0)
  r = u32[64] parameter(1)
  ROOT c = s8[64] stochastic-convert(x, r)
}
"""


def test_stochastic_convert_is_xlas_decomposition():
    rng = np.random.default_rng(0)
    x = (rng.normal(size=64) * 60).astype(np.float32)
    x[:6] = [np.nan, np.inf, -np.inf, 200.0, -300.0, 2.5]
    r = rng.integers(0, 2**32, size=64, dtype=np.uint32)
    r[5] = 2**31 - 1  # just below the fraction .5 -> rounds up
    want = rp.evaluate(rp.parse_hlo(DECOMPOSED), [x, r])
    got = rp.evaluate(rp.parse_hlo(DIRECT), [x, r])
    np.testing.assert_array_equal(got, want)
    assert got[5] == 3


def test_stochastic_convert_rounds_up_as_often_as_the_fraction_says():
    x = np.full(64, 1.25, np.float32)
    r = (np.arange(64, dtype=np.uint64) * (2**32 // 64)).astype(np.uint32)
    got = rp.evaluate(rp.parse_hlo(DIRECT), [x, r])
    assert sorted(set(got.tolist())) == [1, 2] and (got == 2).sum() == 16


RNG_STATE = """HloModule rng_state
ENTRY e {
  a = u64[2] rng-get-and-update-state(), delta=5
  b = u64[2] rng-get-and-update-state(), delta=3
  ROOT t = (u64[2], u64[2]) tuple(a, b)
}
"""


def test_rng_get_and_update_state_starts_at_xla_cpus_seed_and_advances_across_runs():
    interp = Interpreter(rp.parse_hlo(RNG_STATE))
    first, second = interp.run([])
    assert first.tolist() == [0x7012395, 0] and second.tolist() == [0x7012395 + 5, 0]
    again, _ = interp.run([])
    assert again.tolist() == [0x7012395 + 8, 0]


DYNAMIC_RESHAPE = """HloModule dynamic_reshape
ENTRY e {
  x = f32[12] parameter(0)
  n = s32[] parameter(1)
  rows = s32[] parameter(2)
  cols = s32[] parameter(3)
  d = f32[<=12] set-dimension-size(x, n), dimensions={0}
  ROOT r = f32[<=4,<=6] dynamic-reshape(d, rows, cols)
}
"""


def test_dynamic_reshape_uses_the_sizes_given_at_run_time():
    x = np.arange(12, dtype=np.float32)
    got = rp.evaluate(rp.parse_hlo(DYNAMIC_RESHAPE), [x, np.int32(8), np.int32(2), np.int32(4)])
    np.testing.assert_array_equal(got, x[:8].reshape(2, 4))
    with pytest.raises(rp.ProgramError, match="dynamic-reshape"):
        rp.evaluate(rp.parse_hlo(DYNAMIC_RESHAPE), [x, np.int32(8), np.int32(3), np.int32(4)])


RNG3 = """HloModule rng3
ENTRY e {
  mu = f32[] constant(10)
  sigma = f32[] constant(0.5)
  shape = s64[2] constant({3, 4000})
  ROOT r = f32[3,4000] rng(mu, sigma, shape), distribution=rng_normal
}
"""


def test_rng_takes_xlas_optional_shape_operand():
    got = rp.evaluate(rp.parse_hlo(RNG3))
    assert got.shape == (3, 4000)
    assert abs(float(got.mean()) - 10) < 0.05 and abs(float(got.std()) - 0.5) < 0.05
