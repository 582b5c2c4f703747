"""XlaBuilder binary element-wise ops (scalars broadcast like XLA's implicit broadcast)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from replicas.errors import ProgramError
from replicas.hlo.builder.core import BuilderCore, XlaOp


class ElementwiseBinaryOps(BuilderCore):
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
