"""XlaBuilder element-wise ops: unary, binary (with XLA's implicit and in-dim broadcasting),
comparisons, select, clamp, conversions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from replicas.errors import ProgramError
from replicas.hlo.builder.core import BuilderCore, ElementType, XlaOp, as_type
from replicas.shapes import Shape


class ElementwiseOps(BuilderCore):
    # -- broadcasting as XlaBuilder::BinaryOp does it ------------------------------------------------
    def _broadcast_to(self, op: XlaOp, out_dims: Sequence[int], mapping: Sequence[int]) -> XlaOp:
        """Broadcast `op` (operand dim i -> result dim mapping[i]) to `out_dims`; size-1 dims that grow
        are first reshaped away, as XLA does, so the emitted broadcast only adds dimensions."""
        if list(op.shape.dimensions) == list(out_dims) and list(mapping) == list(range(len(out_dims))):
            return op
        keep = [i for i, d in enumerate(op.shape.dimensions) if d == out_dims[mapping[i]]]
        if len(keep) != op.shape.rank:
            op = self.reshape(op, [op.shape.dimensions[i] for i in keep])
        return self.broadcast_in_dim(op, list(out_dims), [mapping[i] for i in keep])

    def _broadcast_pair(self, opname: str, lhs: XlaOp, rhs: XlaOp,
                        broadcast_dimensions: Sequence[int] | None) -> tuple[XlaOp, XlaOp]:
        ls, rs = lhs.shape, rhs.shape
        if not (ls.is_array and rs.is_array):
            raise ProgramError(f"{opname}: operands must be arrays, got {ls} and {rs}")
        if ls.dimensions == rs.dimensions and not broadcast_dimensions:
            return lhs, rhs
        swap = ls.rank < rs.rank
        small, large = (lhs, rhs) if swap else (rhs, lhs)
        if small.shape.rank == large.shape.rank:
            if broadcast_dimensions and list(broadcast_dimensions) != list(range(large.shape.rank)):
                raise ProgramError(f"{opname}: broadcast_dimensions {list(broadcast_dimensions)} must be the "
                                   f"identity for operands of equal rank")
            mapping = list(range(small.shape.rank))
        elif broadcast_dimensions is None or len(broadcast_dimensions) == 0:
            if small.shape.rank != 0:
                raise ProgramError(f"{opname}: operands of different ranks {ls} and {rs} need "
                                   "broadcast_dimensions")
            mapping = []
        else:
            mapping = [int(d) for d in broadcast_dimensions]
            if len(mapping) != small.shape.rank:
                raise ProgramError(f"{opname}: broadcast_dimensions {mapping} must have one entry per dimension "
                                   f"of the lower-rank operand {small.shape}")
            if any(not 0 <= d < large.shape.rank for d in mapping) or mapping != sorted(set(mapping)):
                raise ProgramError(f"{opname}: broadcast_dimensions {mapping} must be strictly increasing "
                                   f"dimensions of the higher-rank operand {large.shape}")
        out = list(large.shape.dimensions)
        for i, d in enumerate(mapping):
            s, l = small.shape.dimensions[i], out[d]
            if s == l or s == 1:
                continue
            if l == 1:
                out[d] = s
            else:
                raise ProgramError(f"{opname}: incompatible shapes {ls} and {rs} (dimension {i} of the "
                                   f"lower-rank operand, size {s}, against size {l})")
        identity = list(range(large.shape.rank))
        # Emit lhs's broadcast before rhs's, as XlaBuilder does.
        if swap:
            return self._broadcast_to(small, out, mapping), self._broadcast_to(large, out, identity)
        lhs = self._broadcast_to(large, out, identity)
        return lhs, self._broadcast_to(small, out, mapping)

    def _binary(self, opcode: str, opname: str, lhs: Any, rhs: Any,
                broadcast_dimensions: Sequence[int] | None = None, attrs: dict[str, Any] | None = None) -> XlaOp:
        lhs = self._op_or_constant(lhs, rhs, "lhs")
        rhs = self._op_or_constant(rhs, lhs, "rhs")
        lhs, rhs = self._broadcast_pair(opname, lhs, rhs, broadcast_dimensions)
        return self._emit(opcode, [lhs, rhs], attrs)

    def add(self, lhs: Any, rhs: Any, broadcast_dimensions: Sequence[int] | None = None) -> XlaOp:
        return self._binary("add", "add", lhs, rhs, broadcast_dimensions)

    def sub(self, lhs: Any, rhs: Any, broadcast_dimensions: Sequence[int] | None = None) -> XlaOp:
        return self._binary("subtract", "sub", lhs, rhs, broadcast_dimensions)

    def mul(self, lhs: Any, rhs: Any, broadcast_dimensions: Sequence[int] | None = None) -> XlaOp:
        return self._binary("multiply", "mul", lhs, rhs, broadcast_dimensions)

    def div(self, lhs: Any, rhs: Any, broadcast_dimensions: Sequence[int] | None = None) -> XlaOp:
        return self._binary("divide", "div", lhs, rhs, broadcast_dimensions)

    def pow(self, lhs: Any, rhs: Any, broadcast_dimensions: Sequence[int] | None = None) -> XlaOp:
        return self._binary("power", "pow", lhs, rhs, broadcast_dimensions)

    def rem(self, lhs: Any, rhs: Any, broadcast_dimensions: Sequence[int] | None = None) -> XlaOp:
        return self._binary("remainder", "rem", lhs, rhs, broadcast_dimensions)

    def max(self, lhs: Any, rhs: Any, broadcast_dimensions: Sequence[int] | None = None) -> XlaOp:
        return self._binary("maximum", "max", lhs, rhs, broadcast_dimensions)

    def min(self, lhs: Any, rhs: Any, broadcast_dimensions: Sequence[int] | None = None) -> XlaOp:
        return self._binary("minimum", "min", lhs, rhs, broadcast_dimensions)

    def and_(self, lhs: Any, rhs: Any, broadcast_dimensions: Sequence[int] | None = None) -> XlaOp:
        return self._binary("and", "and", lhs, rhs, broadcast_dimensions)

    def or_(self, lhs: Any, rhs: Any, broadcast_dimensions: Sequence[int] | None = None) -> XlaOp:
        return self._binary("or", "or", lhs, rhs, broadcast_dimensions)

    def xor(self, lhs: Any, rhs: Any, broadcast_dimensions: Sequence[int] | None = None) -> XlaOp:
        return self._binary("xor", "xor", lhs, rhs, broadcast_dimensions)

    def shift_left(self, lhs: Any, rhs: Any, broadcast_dimensions: Sequence[int] | None = None) -> XlaOp:
        return self._binary("shift-left", "shift_left", lhs, rhs, broadcast_dimensions)

    def shift_right_arithmetic(self, lhs: Any, rhs: Any, broadcast_dimensions: Sequence[int] | None = None) -> XlaOp:
        return self._binary("shift-right-arithmetic", "shift_right_arithmetic", lhs, rhs, broadcast_dimensions)

    def shift_right_logical(self, lhs: Any, rhs: Any, broadcast_dimensions: Sequence[int] | None = None) -> XlaOp:
        return self._binary("shift-right-logical", "shift_right_logical", lhs, rhs, broadcast_dimensions)

    def atan2(self, y: Any, x: Any, broadcast_dimensions: Sequence[int] | None = None) -> XlaOp:
        return self._binary("atan2", "atan2", y, x, broadcast_dimensions)

    def complex(self, real: Any, imag: Any, broadcast_dimensions: Sequence[int] | None = None) -> XlaOp:
        return self._binary("complex", "complex", real, imag, broadcast_dimensions)

    # -- comparisons ------------------------------------------------------------------------------
    def compare(self, lhs: Any, rhs: Any, direction: str, comparison_type: str | None = None,
                broadcast_dimensions: Sequence[int] | None = None) -> XlaOp:
        direction = direction.upper()
        attrs: dict[str, Any] = {"comparison_direction": direction}
        if comparison_type is not None:
            attrs["type"] = comparison_type.upper()
        return self._binary("compare", f"compare {direction}", lhs, rhs, broadcast_dimensions, attrs)

    def eq(self, lhs: Any, rhs: Any, broadcast_dimensions: Sequence[int] | None = None) -> XlaOp:
        return self.compare(lhs, rhs, "EQ", None, broadcast_dimensions)

    def ne(self, lhs: Any, rhs: Any, broadcast_dimensions: Sequence[int] | None = None) -> XlaOp:
        return self.compare(lhs, rhs, "NE", None, broadcast_dimensions)

    def ge(self, lhs: Any, rhs: Any, broadcast_dimensions: Sequence[int] | None = None) -> XlaOp:
        return self.compare(lhs, rhs, "GE", None, broadcast_dimensions)

    def gt(self, lhs: Any, rhs: Any, broadcast_dimensions: Sequence[int] | None = None) -> XlaOp:
        return self.compare(lhs, rhs, "GT", None, broadcast_dimensions)

    def le(self, lhs: Any, rhs: Any, broadcast_dimensions: Sequence[int] | None = None) -> XlaOp:
        return self.compare(lhs, rhs, "LE", None, broadcast_dimensions)

    def lt(self, lhs: Any, rhs: Any, broadcast_dimensions: Sequence[int] | None = None) -> XlaOp:
        return self.compare(lhs, rhs, "LT", None, broadcast_dimensions)

    def _total(self, lhs: Any, rhs: Any, direction: str, broadcast_dimensions: Sequence[int] | None) -> XlaOp:
        # XLA's *TotalOrder compares use TOTALORDER for floats and the plain order otherwise.
        probe = lhs if isinstance(lhs, XlaOp) else rhs
        t = probe.shape.element_type if isinstance(probe, XlaOp) else None
        ctype = "TOTALORDER" if t is not None and (t.is_floating or t.is_complex) else None
        return self.compare(lhs, rhs, direction, ctype, broadcast_dimensions)

    def eq_total_order(self, lhs: Any, rhs: Any, broadcast_dimensions: Sequence[int] | None = None) -> XlaOp:
        return self._total(lhs, rhs, "EQ", broadcast_dimensions)

    def ne_total_order(self, lhs: Any, rhs: Any, broadcast_dimensions: Sequence[int] | None = None) -> XlaOp:
        return self._total(lhs, rhs, "NE", broadcast_dimensions)

    def ge_total_order(self, lhs: Any, rhs: Any, broadcast_dimensions: Sequence[int] | None = None) -> XlaOp:
        return self._total(lhs, rhs, "GE", broadcast_dimensions)

    def gt_total_order(self, lhs: Any, rhs: Any, broadcast_dimensions: Sequence[int] | None = None) -> XlaOp:
        return self._total(lhs, rhs, "GT", broadcast_dimensions)

    def le_total_order(self, lhs: Any, rhs: Any, broadcast_dimensions: Sequence[int] | None = None) -> XlaOp:
        return self._total(lhs, rhs, "LE", broadcast_dimensions)

    def lt_total_order(self, lhs: Any, rhs: Any, broadcast_dimensions: Sequence[int] | None = None) -> XlaOp:
        return self._total(lhs, rhs, "LT", broadcast_dimensions)

    # -- unary ----------------------------------------------------------------------------------------
    def _unary(self, opcode: str, operand: Any) -> XlaOp:
        return self._emit(opcode, [self._op(operand)])

    def abs(self, x: XlaOp) -> XlaOp:
        return self._unary("abs", x)

    def cbrt(self, x: XlaOp) -> XlaOp:
        return self._unary("cbrt", x)

    def ceil(self, x: XlaOp) -> XlaOp:
        return self._unary("ceil", x)

    def clz(self, x: XlaOp) -> XlaOp:
        return self._unary("count-leading-zeros", x)

    def cos(self, x: XlaOp) -> XlaOp:
        return self._unary("cosine", x)

    def erf(self, x: XlaOp) -> XlaOp:
        return self._unary("erf", x)

    def exp(self, x: XlaOp) -> XlaOp:
        return self._unary("exponential", x)

    def expm1(self, x: XlaOp) -> XlaOp:
        return self._unary("exponential-minus-one", x)

    def floor(self, x: XlaOp) -> XlaOp:
        return self._unary("floor", x)

    def imag(self, x: XlaOp) -> XlaOp:
        return self._unary("imag", x)

    def real(self, x: XlaOp) -> XlaOp:
        return self._unary("real", x)

    def is_finite(self, x: XlaOp) -> XlaOp:
        return self._unary("is-finite", x)

    def log(self, x: XlaOp) -> XlaOp:
        return self._unary("log", x)

    def log1p(self, x: XlaOp) -> XlaOp:
        return self._unary("log-plus-one", x)

    def logistic(self, x: XlaOp) -> XlaOp:
        return self._unary("logistic", x)

    def neg(self, x: XlaOp) -> XlaOp:
        return self._unary("negate", x)

    def not_(self, x: XlaOp) -> XlaOp:
        return self._unary("not", x)

    def population_count(self, x: XlaOp) -> XlaOp:
        return self._unary("popcnt", x)

    def round(self, x: XlaOp) -> XlaOp:
        return self._unary("round-nearest-afz", x)

    def round_nearest_even(self, x: XlaOp) -> XlaOp:
        return self._unary("round-nearest-even", x)

    def rsqrt(self, x: XlaOp) -> XlaOp:
        return self._unary("rsqrt", x)

    def sign(self, x: XlaOp) -> XlaOp:
        return self._unary("sign", x)

    def sin(self, x: XlaOp) -> XlaOp:
        return self._unary("sine", x)

    def sqrt(self, x: XlaOp) -> XlaOp:
        return self._unary("sqrt", x)

    def tan(self, x: XlaOp) -> XlaOp:
        return self._unary("tan", x)

    def tanh(self, x: XlaOp) -> XlaOp:
        return self._unary("tanh", x)

    def copy(self, x: XlaOp) -> XlaOp:
        return self._unary("copy", x)

    # -- ternary ----------------------------------------------------------------------------------
    def _expand_scalar(self, x: XlaOp, like: XlaOp) -> XlaOp:
        if x.shape.is_scalar and not like.shape.is_scalar:
            return self.broadcast(x, list(like.shape.dimensions))
        return x

    def select(self, pred: XlaOp, on_true: Any, on_false: Any) -> XlaOp:
        pred = self._op(pred, "pred")
        on_true = self._op_or_constant(on_true, on_false, "on_true")
        on_false = self._op_or_constant(on_false, on_true, "on_false")
        # XlaBuilder broadcasts scalar operands of select to the non-scalar shape.
        widest = max((pred, on_true, on_false), key=lambda o: o.shape.rank if o.shape.is_array else -1)
        pred = self._expand_scalar(pred, widest)
        on_true = self._expand_scalar(on_true, widest)
        on_false = self._expand_scalar(on_false, widest)
        return self._emit("select", [pred, on_true, on_false])

    def clamp(self, min: Any, operand: XlaOp, max: Any) -> XlaOp:  # noqa: A002  (XLA's argument names)
        operand = self._op(operand)
        lo = self._expand_scalar(self._op_or_constant(min, operand, "min"), operand)
        hi = self._expand_scalar(self._op_or_constant(max, operand, "max"), operand)
        return self._emit("clamp", [lo, operand, hi])

    # -- conversions --------------------------------------------------------------------------------
    def convert_element_type(self, operand: XlaOp, new_element_type: ElementType) -> XlaOp:
        operand = self._op(operand)
        t = as_type(new_element_type)
        if not operand.shape.is_array:
            raise ProgramError(f"convert_element_type: operand must be an array, got {operand.shape}")
        return self._emit("convert", [operand], shape=operand.shape.without_layout().with_element_type(t))

    def bitcast_convert_type(self, operand: XlaOp, new_element_type: ElementType) -> XlaOp:
        operand = self._op(operand)
        t = as_type(new_element_type)
        # Only the declared element type matters to inference; it derives the dimensions.
        inferred = self._infer("bitcast-convert", [operand], {}, result=Shape.scalar(t))
        return self._emit("bitcast-convert", [operand], shape=inferred)

    def reduce_precision(self, operand: XlaOp, exponent_bits: int, mantissa_bits: int) -> XlaOp:
        return self._emit("reduce-precision", [self._op(operand)],
                          {"exponent_bits": int(exponent_bits), "mantissa_bits": int(mantissa_bits)})
