"""XlaBuilder slicing: slice, dynamic-slice, dynamic-update-slice, pad, concatenate."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from replicas.errors import ProgramError
from replicas.hlo.builder.core import BuilderCore, XlaOp


class SlicingOps(BuilderCore):
    def slice(self, operand: XlaOp, start_indices: Sequence[int], limit_indices: Sequence[int],
              strides: Sequence[int] | None = None) -> XlaOp:
        operand = self._op(operand)
        strides = [1] * len(start_indices) if strides is None else strides
        if not len(start_indices) == len(limit_indices) == len(strides):
            raise ProgramError("slice: start_indices, limit_indices and strides must have the same length")
        spec = [(int(a), int(b), int(c)) for a, b, c in zip(start_indices, limit_indices, strides)]
        return self._emit("slice", [operand], {"slice": spec})

    def slice_in_dim(self, operand: XlaOp, start_index: int, limit_index: int, stride: int, dimno: int) -> XlaOp:
        operand = self._op(operand)
        dims = operand.shape.dimensions
        if not 0 <= dimno < len(dims):
            raise ProgramError(f"slice_in_dim: dimension {dimno} out of range for {operand.shape}")
        starts = [0] * len(dims)
        limits = list(dims)
        strides = [1] * len(dims)
        starts[dimno], limits[dimno], strides[dimno] = start_index, limit_index, stride
        return self.slice(operand, starts, limits, strides)

    def dynamic_slice(self, operand: XlaOp, start_indices: Sequence[Any], slice_sizes: Sequence[int]) -> XlaOp:
        operand = self._op(operand)
        starts = [self._index_op(i, "start index") for i in start_indices]
        return self._emit("dynamic-slice", [operand, *starts], {"dynamic_slice_sizes": [int(s) for s in slice_sizes]})

    def dynamic_update_slice(self, operand: XlaOp, update: XlaOp, start_indices: Sequence[Any]) -> XlaOp:
        starts = [self._index_op(i, "start index") for i in start_indices]
        return self._emit("dynamic-update-slice", [self._op(operand), self._op(update, "update"), *starts])

    def pad(self, operand: XlaOp, padding_value: Any, padding_config: Sequence[Sequence[int]]) -> XlaOp:
        operand = self._op(operand)
        value = self._op_or_constant(padding_value, operand, "padding_value")
        cfg = []
        for entry in padding_config:
            entry = [int(x) for x in entry]
            if len(entry) not in (2, 3):
                raise ProgramError(f"pad: padding entry {entry} must be (low, high) or (low, high, interior)")
            cfg.append((entry[0], entry[1], entry[2] if len(entry) == 3 else 0))
        return self._emit("pad", [operand, value], {"padding": cfg})

    def concatenate(self, operands: Sequence[XlaOp], dimension: int) -> XlaOp:
        ops = [self._op(o) for o in operands]
        if not ops:
            raise ProgramError("concatenate: needs at least one operand")
        return self._emit("concatenate", ops, {"dimensions": [int(dimension)]})

    def concat_in_dim(self, operands: Sequence[XlaOp], dimension: int) -> XlaOp:
        return self.concatenate(operands, dimension)
