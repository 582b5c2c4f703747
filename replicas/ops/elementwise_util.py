"""Shared machinery of the element-wise kernels (unary, binary, compare, convert, select).

The hot path of an element-wise kernel is one numpy call: factories pick the function for the
operand dtype once, and `finish` wraps it only as much as needed (0-d results kept as arrays;
numpy's warnings are silenced once per run by the interpreter). Narrow floats (f16, bf16, f8) are computed
in f32 and rounded once, as XLA:CPU does, unless numpy or ml_dtypes has a loop of that dtype for
the operation (those loops also compute in f32 and round once, and they are faster).

XLA:CPU runs with subnormals flushed to zero (FTZ/DAZ); numpy keeps them. The kernels do not
emulate the flush: results differ only where an input or a result is subnormal.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from replicas.hlo.ir import Instruction
from replicas.ops.registry import KernelContext, KernelFactory, kernel
from replicas.shapes import PrimitiveType, Shape

F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)

Compute = Callable[..., Any]

# numpy's floating-point error state: the context variable np.errstate sets, and the state that
# ignores everything. The interpreter sets it once per run (runtime/interpreter.py), so a kernel's
# `quiet()` costs nothing there (np.errstate builds a state and a context manager every call).
try:
    from numpy._core._ufunc_config import _extobj_contextvar as ERRORS
    from numpy._core._ufunc_config import _make_extobj

    IGNORED = _make_extobj(all="ignore")
except (ImportError, AttributeError, TypeError):
    ERRORS = IGNORED = None
_ALREADY = contextlib.nullcontext()


def quiet() -> contextlib.AbstractContextManager[Any]:
    """`np.errstate(all="ignore")`, or nothing when that is the state already (inside a run)."""
    if ERRORS is not None and ERRORS.get() is IGNORED:
        return _ALREADY
    return np.errstate(all="ignore")

# Sub-byte integers are computed in 8 bits and wrapped back (ml_dtypes' int4 ufuncs do not wrap).
SUB_BYTE_WIDE = {PrimitiveType.S2: PrimitiveType.S8, PrimitiveType.S4: PrimitiveType.S8,
                 PrimitiveType.U2: PrimitiveType.U8, PrimitiveType.U4: PrimitiveType.U8}
_UNSIGNED_OF = {np.dtype(s): np.dtype(u) for s, u in [(np.int8, np.uint8), (np.int16, np.uint16),
                                                      (np.int32, np.uint32), (np.int64, np.uint64)]}
SIGNED_OF = {u: s for s, u in _UNSIGNED_OF.items()}
UNSIGNED_OF = dict(_UNSIGNED_OF)
for _u in list(SIGNED_OF):
    UNSIGNED_OF[_u] = _u
for _s in list(_UNSIGNED_OF):
    SIGNED_OF[_s] = _s
INT_OF_WIDTH = {1: np.dtype(np.int8), 2: np.dtype(np.int16), 4: np.dtype(np.int32), 8: np.dtype(np.int64)}


def is_narrow_float(t: PrimitiveType) -> bool:
    return t.is_floating and t.bit_width < 32


def operand_types(inst: Instruction, ctx: KernelContext) -> list[PrimitiveType]:
    """The operands' element types (the verifier checked their count, kinds and shapes)."""
    return [s.element_type for s in ctx.operand_shapes(inst)]


def finish(inst: Instruction, compute: Compute) -> Compute:
    """The kernel: `compute` on the operands, 0-d results as arrays.

    Numpy's floating-point warnings are silenced once for the whole run by the interpreter
    (`Interpreter.run`), not per call.
    When the result is a scalar and every operand is 0-d, they are viewed as 1-element arrays so
    `compute` may use `out=` on its own intermediates and always gets arrays back from numpy. A
    scalar computation (a reducer, a comparator) is also called on whole arrays: then the
    operands pass through as they are.
    """
    if inst.shape.rank == 0 and isinstance(compute, np.ufunc) and compute.nout == 1:
        # A ufunc of 0-d arrays gives a numpy scalar: made a 0-d array again (the same loop ran
        # either way). Called on whole arrays, it gives the array.
        ndarray, asarray = np.ndarray, np.asarray

        def scalar_ufunc(*args: np.ndarray) -> np.ndarray:
            r = compute(*args)
            return r if type(r) is ndarray else asarray(r)

        return scalar_ufunc
    if inst.shape.rank == 0:
        dtype = inst.shape.dtype
        # A ufunc of one output writes a 0-d result into a fresh 0-d array (`out=`: half the cost of
        # the reshapes, and a While loop's counter and condition run it every iteration), once its
        # first call showed that its own result type is the result's: the same loop, the same bits.
        direct = [False] if isinstance(compute, np.ufunc) and compute.nout == 1 else None
        empty = np.empty

        def scalar_kernel(*args: np.ndarray) -> np.ndarray:
            for a in args:
                if a.ndim:
                    return compute(*args)
            if direct is not None and direct[0]:
                return compute(*args, out=empty((), dtype))
            result = compute(*[a.reshape(1) for a in args]).reshape(())
            if direct is not None:
                direct[0] = result.dtype == dtype
            return result

        return scalar_kernel
    return compute


def native_loop(ufunc: np.ufunc, dtype: np.dtype, nin: int, out_dtype: np.dtype | None = None) -> bool:
    """Whether `ufunc` computes on `dtype` directly (ml_dtypes or numpy loops), returning `out_dtype`."""
    try:
        with np.errstate(all="ignore"):
            out = ufunc(*[np.ones(2, dtype)] * nin)
    except (TypeError, ValueError, NotImplementedError):
        return False
    return isinstance(out, np.ndarray) and out.dtype == (dtype if out_dtype is None else out_dtype)


def in_f32(compute: Compute, dtype: np.dtype) -> Compute:
    """`compute` on f32 copies of the (narrow float) operands, rounded once back to `dtype`."""

    def narrow(*args: np.ndarray) -> np.ndarray:
        return compute(*[a.astype(F32) for a in args]).astype(dtype)

    return narrow


def float_compute(ufunc: np.ufunc, t: PrimitiveType, nin: int) -> Compute:
    """The ufunc for float type `t`, computing narrow floats in f32 when there is no native loop."""
    dtype = t.dtype
    if is_narrow_float(t) and not native_loop(ufunc, dtype, nin):
        return in_f32(ufunc, dtype)
    return ufunc


def real_dtype_of(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.float32) if dtype == np.complex64 else np.dtype(np.float64)


class WithOperandShapes:
    """A kernel context whose operands have the shapes given (sub-byte ones widened to 8 bits, a
    batched run's stacked ones) while a kernel is bound; everything else is the context's."""

    def __init__(self, ctx: KernelContext, shapes: list[Shape]) -> None:
        self._ctx = ctx
        self._shapes = shapes

    def operand_shapes(self, inst: Instruction) -> list[Shape]:
        return self._shapes

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)


def _widen(shape: Shape) -> Shape:
    if shape.is_array and shape.element_type in SUB_BYTE_WIDE:
        return shape.with_element_type(SUB_BYTE_WIDE[shape.element_type])
    return shape


# Ops that read the bits above the value's width: their operand is masked to its own width first.
# popcnt only for 2-bit types: XLA:CPU counts the sign-extended byte of a negative s4 (and we match it).
_MASKED = ("shift-right-logical", "count-leading-zeros")


def elementwise_kernel(*opcodes: str) -> Callable[[KernelFactory], KernelFactory]:
    """Register an element-wise kernel factory for `opcodes`; operands or results of s2/s4/u2/u4
    run the factory's 8-bit kernel with conversions in and out (`sub_byte_kernel`)."""

    def register(factory: KernelFactory) -> KernelFactory:
        @functools.wraps(factory)
        def with_sub_byte(inst: Instruction, ctx: KernelContext) -> Compute:
            return sub_byte_kernel(inst, ctx, factory) or factory(inst, ctx)

        kernel(*opcodes)(with_sub_byte)
        return factory

    return register


def sub_byte_kernel(inst: Instruction, ctx: KernelContext, factory: KernelFactory) -> Compute | None:
    """For s2/s4/u2/u4 operands or result: `factory`'s 8-bit kernel, with conversions in and out."""
    shapes = ctx.operand_shapes(inst)
    if not any(s.is_array and s.element_type in SUB_BYTE_WIDE for s in [*shapes, inst.shape]):
        return None
    wide_inst = Instruction(inst.name, inst.opcode, _widen(inst.shape), inst.operands, inst.attrs, inst.line)
    wide = factory(wide_inst, WithOperandShapes(ctx, [_widen(s) for s in shapes]))
    to_wide = [_widen(s).dtype if s.is_array and s.element_type in SUB_BYTE_WIDE else None for s in shapes]
    out = inst.shape.dtype if inst.shape.element_type in SUB_BYTE_WIDE else None
    first = shapes[0].element_type
    masked = inst.opcode in _MASKED or (inst.opcode == "popcnt" and first.bit_width == 2)
    mask = (1 << first.bit_width) - 1 if masked and first in SUB_BYTE_WIDE else None
    clz_excess = 8 - first.bit_width if inst.opcode == "count-leading-zeros" and mask is not None else 0
    # shift-right-arithmetic fills with the value's own top bit, also on unsigned types.
    sign_bit = (1 << (first.bit_width - 1)) if (inst.opcode == "shift-right-arithmetic"
                                                and first in SUB_BYTE_WIDE and first.is_unsigned_integral) else 0

    def narrow(*args: np.ndarray) -> np.ndarray:
        args = tuple(a if d is None else a.astype(d) for a, d in zip(args, to_wide))
        if mask is not None:
            args = (args[0] & args[0].dtype.type(mask),) + args[1:]
        if sign_bit:
            extended = (args[0].astype(np.int16) ^ sign_bit) - sign_bit
            args = (extended.astype(args[0].dtype),) + args[1:]
        r = wide(*args)
        if clz_excess:
            r = r - r.dtype.type(clz_excess)
        return r if out is None else r.astype(out)

    return narrow
