"""Unary element-wise kernels with XLA:CPU semantics.

Integers wrap (abs and negate of INT_MIN give INT_MIN, negate of unsigned wraps). sign keeps
-0.0 and NaN, is 0/1 on unsigned and x/|x| on complex. round-nearest-afz rounds halves away from
zero without the x + 0.5 error; round-nearest-even is rint. count-leading-zeros and popcnt use
whole-array bit tricks per width. real/imag of a real type are x and 0. logistic is
1 / (1 + exp(-x)). erf has no numpy ufunc: it is XLA's own Cephes approximation evaluated in f64.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from replicas.hlo.ir import Instruction
from replicas.ops.elementwise_util import (
    F32,
    F64,
    UNSIGNED_OF,
    Compute,
    elementwise_kernel,
    finish,
    float_compute,
    in_f32,
    is_narrow_float,
    operand_types,
)
from replicas.ops.registry import KernelContext, kernel
from replicas.shapes import PrimitiveType

# Element-wise maths numpy has as ufuncs (the shape rules say which element types each accepts).
_MATH: dict[str, np.ufunc] = {
    "exponential": np.exp, "exponential-minus-one": np.expm1, "log": np.log,
    "log-plus-one": np.log1p, "sqrt": np.sqrt, "sine": np.sin,
    "cosine": np.cos, "tan": np.tan, "tanh": np.tanh, "acos": np.arccos,
    "acosh": np.arccosh, "asin": np.arcsin, "asinh": np.arcsinh,
    "atan": np.arctan, "atanh": np.arctanh, "cosh": np.cosh, "sinh": np.sinh,
    "ceil": np.ceil, "floor": np.floor, "round-nearest-even": np.rint,
    "cbrt": np.cbrt,
}


def _unary_type(inst: Instruction, ctx: KernelContext) -> PrimitiveType:
    (t,) = operand_types(inst, ctx)
    return t


@kernel(*_MATH)
def make_math(inst: Instruction, ctx: KernelContext) -> Compute:
    t = _unary_type(inst, ctx)
    return finish(inst, float_compute(_MATH[inst.opcode], t, 1))


def _float_only(inst: Instruction, t: PrimitiveType, compute: Compute) -> Compute:
    """A float computation, run in f32 for narrow floats."""
    if is_narrow_float(t):
        compute = in_f32(compute, t.dtype)
    return finish(inst, compute)


@kernel("rsqrt")
def make_rsqrt(inst: Instruction, ctx: KernelContext) -> Compute:
    t = _unary_type(inst, ctx)
    if t.is_complex:

        def complex_rsqrt(x: np.ndarray) -> np.ndarray:
            r = np.sqrt(x)
            return np.divide(1, r, out=r)

        return finish(inst, complex_rsqrt)

    def rsqrt(x: np.ndarray) -> np.ndarray:
        r = np.sqrt(x)
        return np.divide(1, r, out=r)

    return _float_only(inst, t, rsqrt)


@kernel("logistic")
def make_logistic(inst: Instruction, ctx: KernelContext) -> Compute:
    t = _unary_type(inst, ctx)

    def logistic(x: np.ndarray) -> np.ndarray:
        r = np.negative(x)
        np.exp(r, out=r)
        r += 1
        return np.divide(1, r, out=r)

    if t.is_complex:
        return finish(inst, logistic)
    return _float_only(inst, t, logistic)


def _round_afz(x: np.ndarray) -> np.ndarray:
    # x - trunc(x) is exact, so halves are detected without the rounding error of x + 0.5.
    r = np.trunc(x)
    frac = np.subtract(x, r)
    np.abs(frac, out=frac)
    return np.add(r, np.copysign(1, x), out=r, where=frac >= 0.5)


@kernel("round-nearest-afz")
def make_round_afz(inst: Instruction, ctx: KernelContext) -> Compute:
    return _float_only(inst, _unary_type(inst, ctx), _round_afz)


# XLA's erf for f64 (Cephes; the same coefficients as the CHLO legalization XLA uses).
_ERF_T = (9.60497373987051638749E0, 9.00260197203842689217E1, 2.23200534594684319226E3,
          7.00332514112805075473E3, 5.55923013010394962768E4)
_ERF_U = (1.00000000000000000000E0, 3.35617141647503099647E1, 5.21357949780152679795E2,
          4.59432382970980127987E3, 2.26290000613890934246E4, 4.92673942608635921086E4)
_ERFC_P = (2.46196981473530512524E-10, 5.64189564831068821977E-1, 7.46321056442269912687E0,
           4.86371970985681366614E1, 1.96520832956077098242E2, 5.26445194995477358631E2,
           9.34528527171957607540E2, 1.02755188689515710272E3, 5.57535335369399327526E2)
_ERFC_Q = (1.00000000000000000000E0, 1.32281951154744992508E1, 8.67072140885989742329E1,
           3.54937778887819891062E2, 9.75708501743205489753E2, 1.82390916687909736289E3,
           2.24633760818710981792E3, 1.65666309194161350182E3, 5.57535340817727675546E2)
_ERFC_R = (5.64189583547755073984E-1, 1.27536670759978104416E0, 5.01905042251180477414E0,
           6.16021097993053585195E0, 7.40974269950448939160E0, 2.97886665372100240670E0)
_ERFC_S = (1.00000000000000000000E0, 2.26052863220117276590E0, 9.39603524938001434673E0,
           1.20489539808096656605E1, 1.70814450747565897222E1, 9.60896809063285878198E0,
           3.36907645100081516050E0)
_MAXLOG = 7.09782712893383996843E2


def _poly(x: np.ndarray, coefficients: tuple[float, ...]) -> np.ndarray:
    r = np.zeros_like(x)
    for c in coefficients:
        r *= x
        r += c
    return r


def _erf64(x: np.ndarray) -> np.ndarray:
    x = x.astype(F64, copy=False)
    ax = np.abs(x)
    small = ax < 1
    x2 = x * x
    erf_small = x * _poly(x2, _ERF_T) / _poly(x2, _ERF_U)
    ez = np.exp(-x2)
    erfc = np.where(ax < 8, ez * _poly(ax, _ERFC_P) / _poly(ax, _ERFC_Q), ez * _poly(ax, _ERFC_R) / _poly(ax, _ERFC_S))
    erfc[-x2 < -_MAXLOG] = 0
    # erf(x) = 1 - erfc(x), with erfc(x) = 2 - erfc(-x) below zero; the erfc polynomials take |x|.
    erfc = np.where(x < 0, 2 - erfc, erfc)
    r = np.where(small, erf_small, 1 - erfc)
    return np.where(np.isnan(x), x, r)


@kernel("erf")
def make_erf(inst: Instruction, ctx: KernelContext) -> Compute:
    t = _unary_type(inst, ctx)
    dtype = t.dtype
    if dtype == F64:
        return finish(inst, _erf64)
    return finish(inst, lambda x: _erf64(x).astype(dtype))


@elementwise_kernel("abs")
def make_abs(inst: Instruction, ctx: KernelContext) -> Compute:
    t = _unary_type(inst, ctx)
    if t.is_complex:
        return finish(inst, np.abs)
    if t.is_unsigned_integral:
        return lambda x: x
    if t.is_integral:
        return finish(inst, np.abs)  # numpy wraps abs(INT_MIN) to INT_MIN, as XLA does
    return finish(inst, float_compute(np.abs, t, 1))


@elementwise_kernel("negate")
def make_negate(inst: Instruction, ctx: KernelContext) -> Compute:
    t = _unary_type(inst, ctx)
    if t.is_integral:
        return finish(inst, np.negative)
    return finish(inst, float_compute(np.negative, t, 1))


@elementwise_kernel("sign")
def make_sign(inst: Instruction, ctx: KernelContext) -> Compute:
    t = _unary_type(inst, ctx)
    if t.is_integral:
        return finish(inst, np.sign)
    if t.is_complex:
        def complex_sign(z: np.ndarray) -> np.ndarray:
            # Componentwise z / |z| (XLA's definition: sign(inf + 1j) is nan + 0j), z itself at 0.
            a = np.abs(z)
            r = np.empty_like(z)
            r.real = z.real / a
            r.imag = z.imag / a
            zero = a == 0
            r[zero] = z[zero]
            return r

        return finish(inst, complex_sign)

    def float_sign(x: np.ndarray) -> np.ndarray:
        # copysign gives -0.0 for -0.0 and keeps a NaN's sign, as XLA returns x for 0 and NaN.
        r = np.sign(x)
        return np.copysign(r, x, out=r)

    return _float_only(inst, t, float_sign)


@elementwise_kernel("not")
def make_not(inst: Instruction, ctx: KernelContext) -> Compute:
    t = _unary_type(inst, ctx)
    return finish(inst, np.logical_not if t is PrimitiveType.PRED else np.invert)


def _bit_length32(u: np.ndarray) -> np.ndarray:
    """Bit length of values < 2**32 (given as an unsigned array), exact through f64's exponent."""
    return np.frexp(u.astype(F64))[1]


def _bit_length(u: np.ndarray, bits: int) -> np.ndarray:
    if bits <= 32:
        return _bit_length32(u)
    high = (u >> np.uint64(32)).astype(np.uint32)
    low = (u & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    return np.where(high != 0, _bit_length32(high) + 32, _bit_length32(low))


@elementwise_kernel("count-leading-zeros")
def make_clz(inst: Instruction, ctx: KernelContext) -> Compute:
    t = _unary_type(inst, ctx)
    dtype, unsigned, bits = t.dtype, UNSIGNED_OF[t.dtype], t.bit_width

    def clz(x: np.ndarray) -> np.ndarray:
        n = np.subtract(bits, _bit_length(x.view(unsigned), bits), dtype=np.int64)
        return n.astype(dtype)

    return finish(inst, clz)


_M1, _M2, _M4, _H01 = 0x5555555555555555, 0x3333333333333333, 0x0F0F0F0F0F0F0F0F, 0x0101010101010101


def _popcount_swar(u: np.ndarray, bits: int) -> np.ndarray:
    """Population count of an unsigned array (numpy < 2 has no bitwise_count): SWAR in uint64."""
    v = u.astype(np.uint64)
    v = v - ((v >> np.uint64(1)) & np.uint64(_M1))
    v = (v & np.uint64(_M2)) + ((v >> np.uint64(2)) & np.uint64(_M2))
    v = (v + (v >> np.uint64(4))) & np.uint64(_M4)
    return (v * np.uint64(_H01)) >> np.uint64(56)


@elementwise_kernel("popcnt")
def make_popcnt(inst: Instruction, ctx: KernelContext) -> Compute:
    t = _unary_type(inst, ctx)
    dtype, unsigned, bits = t.dtype, UNSIGNED_OF[t.dtype], t.bit_width
    bitwise_count: Callable[[np.ndarray], np.ndarray] | None = getattr(np, "bitwise_count", None)
    if bitwise_count is not None:
        def popcnt(x: np.ndarray) -> np.ndarray:
            return bitwise_count(x.view(unsigned)).astype(dtype)
    else:
        def popcnt(x: np.ndarray) -> np.ndarray:
            return _popcount_swar(x.view(unsigned), bits).astype(dtype)

    return finish(inst, popcnt)


@kernel("real", "imag")
def make_real_imag(inst: Instruction, ctx: KernelContext) -> Compute:
    t = _unary_type(inst, ctx)
    if t.is_complex:
        if inst.opcode == "real":
            return finish(inst, lambda z: z.real.copy())
        return finish(inst, lambda z: z.imag.copy())
    if inst.opcode == "real":
        return lambda x: x
    dtype = t.dtype
    return finish(inst, lambda x: np.zeros(x.shape, dtype))


@kernel("is-finite")
def make_is_finite(inst: Instruction, ctx: KernelContext) -> Compute:
    t = _unary_type(inst, ctx)
    if is_narrow_float(t):
        return finish(inst, lambda x: np.isfinite(x.astype(F32)))
    return finish(inst, np.isfinite)

