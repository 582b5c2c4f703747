"""XlaBuilder ops that rearrange one array: broadcast, reshape, transpose, reverse, iota, copy."""

from __future__ import annotations

from collections.abc import Sequence

from replicas.errors import ProgramError
from replicas.hlo.builder.core import BuilderCore, ElementType, XlaOp, as_type
from replicas.shapes import Shape


class ShapeOps(BuilderCore):
    def broadcast(self, operand: XlaOp, broadcast_sizes: Sequence[int]) -> XlaOp:
        """Prepend `broadcast_sizes` dimensions (XlaBuilder::Broadcast)."""
        operand = self._op(operand)
        sizes = [int(s) for s in broadcast_sizes]
        dims = sizes + list(operand.shape.dimensions)
        return self.broadcast_in_dim(operand, dims, list(range(len(sizes), len(dims))))

    def broadcast_in_dim(self, operand: XlaOp, out_dim_size: Sequence[int],
                         broadcast_dimensions: Sequence[int]) -> XlaOp:
        operand = self._op(operand)
        s = operand.shape
        out = [int(d) for d in out_dim_size]
        dims = [int(d) for d in broadcast_dimensions]
        if not s.is_array:
            raise ProgramError(f"broadcast_in_dim: operand must be an array, got {s}")
        if len(dims) != s.rank:
            raise ProgramError(f"broadcast_in_dim: broadcast_dimensions {dims} must have one entry per operand "
                               f"dimension ({s})")
        if dims != sorted(set(dims)) or any(not 0 <= d < len(out) for d in dims):
            raise ProgramError(f"broadcast_in_dim: broadcast_dimensions {dims} must be strictly increasing and "
                               f"below the result rank {len(out)}")
        return self._emit("broadcast", [operand], {"dimensions": dims}, shape=Shape.array(s.element_type, out))

    def reshape(self, operand: XlaOp, new_sizes: Sequence[int], dimensions: Sequence[int] | None = None) -> XlaOp:
        """Reshape; with `dimensions`, transpose by them first (XlaBuilder's Reshape(operand, dims, sizes))."""
        operand = self._op(operand)
        if dimensions is not None and list(dimensions) != list(range(operand.shape.rank)):
            operand = self.transpose(operand, dimensions)
        s = operand.shape
        if not s.is_array:
            raise ProgramError(f"reshape: operand must be an array, got {s}")
        out = Shape.array(s.element_type, [int(d) for d in new_sizes])
        return self._emit("reshape", [operand], shape=out)

    def collapse(self, operand: XlaOp, dimensions: Sequence[int]) -> XlaOp:
        """Merge consecutive `dimensions` into one (row-major), by a reshape."""
        operand = self._op(operand)
        dims = [int(d) for d in dimensions]
        if not dims:
            return operand
        if dims != list(range(dims[0], dims[0] + len(dims))) or dims[-1] >= operand.shape.rank or dims[0] < 0:
            raise ProgramError(f"collapse: dimensions {dims} must be consecutive, in order, and in range for "
                               f"{operand.shape}")
        sizes = list(operand.shape.dimensions)
        merged = 1
        for d in dims:
            merged *= sizes[d]
        return self.reshape(operand, sizes[:dims[0]] + [merged] + sizes[dims[-1] + 1:])

    def transpose(self, operand: XlaOp, permutation: Sequence[int]) -> XlaOp:
        return self._emit("transpose", [self._op(operand)], {"dimensions": [int(p) for p in permutation]})

    def rev(self, operand: XlaOp, dimensions: Sequence[int]) -> XlaOp:
        return self._emit("reverse", [self._op(operand)], {"dimensions": [int(d) for d in dimensions]})

    def iota(self, shape_or_type: Shape | str | ElementType, size: int | None = None,
             iota_dimension: int = 0) -> XlaOp:
        """`iota(shape, iota_dimension=d)` or `iota(element_type, size)` (rank 1)."""
        if isinstance(shape_or_type, Shape):
            shape = shape_or_type
        elif isinstance(shape_or_type, str) and "[" in shape_or_type:
            shape = Shape.parse(shape_or_type)
        else:
            if size is None:
                raise ProgramError("iota: give a shape, or an element type and a size")
            shape = Shape.array(as_type(shape_or_type), [int(size)])
        return self._emit("iota", [], {"iota_dimension": int(iota_dimension)}, shape=shape)

    def copy(self, x: XlaOp) -> XlaOp:
        return self._unary("copy", x)
