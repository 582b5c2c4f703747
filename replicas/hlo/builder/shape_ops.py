"""XlaBuilder data-movement ops: broadcast, reshape, transpose, slicing, padding, concatenation,
iota, tuples, gather and scatter, dynamic dimension sizes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from replicas.errors import ProgramError
from replicas.hlo.builder.core import BuilderCore, ElementType, XlaOp, as_type
from replicas.shapes import Shape

_GATHER_FIELDS = ("offset_dims", "collapsed_slice_dims", "start_index_map", "operand_batching_dims",
                  "start_indices_batching_dims")
_SCATTER_FIELDS = ("update_window_dims", "inserted_window_dims", "scatter_dims_to_operand_dims",
                   "input_batching_dims", "scatter_indices_batching_dims")


def _dimension_numbers(fields: Sequence[str], dimension_numbers: Any, kwargs: dict[str, Any],
                       what: str) -> dict[str, list[int]]:
    """Read gather/scatter dimension numbers from an object (jax-style), a dict, or keywords."""
    out: dict[str, list[int]] = {}
    for f in fields:
        value = kwargs.pop(f, None)
        if value is None and dimension_numbers is not None:
            value = (dimension_numbers.get(f) if isinstance(dimension_numbers, dict)
                     else getattr(dimension_numbers, f, None))
        out[f] = [int(v) for v in (value or ())]
    if kwargs:
        raise ProgramError(f"{what}: unexpected arguments {sorted(kwargs)}")
    return out


class DataOps(BuilderCore):
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

    def tuple(self, elements: Sequence[XlaOp]) -> XlaOp:
        return self._emit("tuple", [self._op(e) for e in elements])

    def get_tuple_element(self, tuple_data: XlaOp, index: int) -> XlaOp:
        return self._emit("get-tuple-element", [self._op(tuple_data)], {"index": int(index)})

    def get_dimension_size(self, operand: XlaOp, dimension: int) -> XlaOp:
        return self._emit("get-dimension-size", [self._op(operand)], {"dimensions": [int(dimension)]})

    def set_dimension_size(self, operand: XlaOp, val: Any, dimension: int) -> XlaOp:
        size = self._index_op(val, "size")
        return self._emit("set-dimension-size", [self._op(operand), size], {"dimensions": [int(dimension)]})

    def gather(self, operand: XlaOp, start_indices: XlaOp, dimension_numbers: Any = None,
               slice_sizes: Sequence[int] = (), indices_are_sorted: bool = False,
               index_vector_dim: int | None = None, **kwargs: Any) -> XlaOp:
        """Gather. Dimension numbers come from `dimension_numbers` (an object with jax's field names, or
        a dict) or keywords (offset_dims=, collapsed_slice_dims=, start_index_map=,
        operand_batching_dims=, start_indices_batching_dims=). `index_vector_dim` defaults to the last
        dimension of the indices (jax's convention)."""
        operand, indices = self._op(operand), self._op(start_indices, "start_indices")
        dn = _dimension_numbers(_GATHER_FIELDS, dimension_numbers, dict(kwargs), "gather")
        if index_vector_dim is None:
            index_vector_dim = getattr(dimension_numbers, "index_vector_dim", None)
            if index_vector_dim is None and isinstance(dimension_numbers, dict):
                index_vector_dim = dimension_numbers.get("index_vector_dim")
        if index_vector_dim is None:
            index_vector_dim = indices.shape.rank - 1
        attrs: dict[str, Any] = dict(dn)
        attrs.update(index_vector_dim=int(index_vector_dim), slice_sizes=[int(s) for s in slice_sizes],
                     indices_are_sorted=bool(indices_are_sorted))
        return self._emit("gather", [operand, indices], attrs)

    def scatter(self, operands: XlaOp | Sequence[XlaOp], scatter_indices: XlaOp,
                updates: XlaOp | Sequence[XlaOp], update_computation: Any, dimension_numbers: Any = None,
                indices_are_sorted: bool = False, unique_indices: bool = False,
                index_vector_dim: int | None = None, **kwargs: Any) -> XlaOp:
        """Scatter (variadic: lists of operands and updates). Dimension numbers as for `gather`
        (update_window_dims=, inserted_window_dims=, scatter_dims_to_operand_dims=, input_batching_dims=,
        scatter_indices_batching_dims=)."""
        ops = [self._op(o) for o in (operands if isinstance(operands, (list, tuple)) else [operands])]
        ups = [self._op(u, "update") for u in (updates if isinstance(updates, (list, tuple)) else [updates])]
        indices = self._op(scatter_indices, "scatter_indices")
        dn = _dimension_numbers(_SCATTER_FIELDS, dimension_numbers, dict(kwargs), "scatter")
        if index_vector_dim is None:
            index_vector_dim = getattr(dimension_numbers, "index_vector_dim", None)
            if index_vector_dim is None and isinstance(dimension_numbers, dict):
                index_vector_dim = dimension_numbers.get("index_vector_dim")
        if index_vector_dim is None:
            index_vector_dim = indices.shape.rank - 1
        attrs: dict[str, Any] = dict(dn)
        attrs.update(index_vector_dim=int(index_vector_dim), to_apply=self._import(update_computation),
                     indices_are_sorted=bool(indices_are_sorted), unique_indices=bool(unique_indices))
        return self._emit("scatter", [*ops, indices, *ups], attrs)
