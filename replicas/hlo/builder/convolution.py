"""XlaBuilder convolutions (ConvGeneralDilated and its shorthands) and their padding and dimension numbers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from replicas.errors import ProgramError
from replicas.hlo.builder.core import BuilderCore, ElementType, XlaOp, as_type
from replicas.hlo.ir import make_window
from replicas.hlo.shape_inference import ConvDimensionNumbers, parse_dim_labels

Padding = str | Sequence[Sequence[int]]


def padding_pairs(padding: Padding, in_sizes: Sequence[int], window: Sequence[int],
                  strides: Sequence[int], what: str) -> list[tuple[int, int]]:
    """Explicit (low, high) pairs, or "SAME"/"SAME_LOWER"/"VALID" resolved as jax's padtype_to_pads."""
    if isinstance(padding, str):
        kind = padding.upper()
        if kind == "VALID":
            return [(0, 0)] * len(in_sizes)
        if kind not in ("SAME", "SAME_LOWER"):
            raise ProgramError(f"{what}: padding must be 'SAME', 'SAME_LOWER', 'VALID' or (low, high) pairs, "
                               f"got {padding!r}")
        pairs = []
        for n, w, s in zip(in_sizes, window, strides):
            out = -(-n // s)
            total = max((out - 1) * s + w - n, 0)
            lo = total // 2 if kind == "SAME" else total - total // 2
            pairs.append((lo, total - lo))
        return pairs
    pairs = [(int(p[0]), int(p[1])) for p in padding]
    if len(pairs) != len(in_sizes):
        raise ProgramError(f"{what}: padding has {len(pairs)} pairs, expected {len(in_sizes)}")
    return pairs


def conv_dimension_numbers(dimension_numbers: Any, rank: int) -> ConvDimensionNumbers:
    """A dim_labels string, a ConvDimensionNumbers, jax-style spec strings ("NCHW", "OIHW", "NCHW"), or
    jax's ConvDimensionNumbers of integer tuples (lhs_spec, rhs_spec, out_spec); None = XLA's default."""
    if dimension_numbers is None:
        spatial = list(range(2, rank))
        return ConvDimensionNumbers(0, 1, spatial, 1, 0, spatial, 0, 1, spatial)
    if isinstance(dimension_numbers, ConvDimensionNumbers):
        return dimension_numbers
    if isinstance(dimension_numbers, str):
        return parse_dim_labels(dimension_numbers)
    try:
        lhs, rhs, out = dimension_numbers
    except (TypeError, ValueError):
        raise ProgramError(f"conv: bad dimension_numbers {dimension_numbers!r}") from None
    if isinstance(lhs, str):
        if not (len(lhs) == len(rhs) == len(out) == rank):
            raise ProgramError(f"conv: dimension spec strings {dimension_numbers!r} must have length {rank}")
        spatial_chars = [ch for ch in rhs if ch not in "OI"]
        try:
            return ConvDimensionNumbers(
                lhs.index("N"), lhs.index("C"), [lhs.index(ch) for ch in spatial_chars],
                rhs.index("I"), rhs.index("O"), [rhs.index(ch) for ch in spatial_chars],
                out.index("N"), out.index("C"), [out.index(ch) for ch in spatial_chars])
        except ValueError:
            raise ProgramError(f"conv: dimension spec strings {dimension_numbers!r} do not match") from None
    lhs, rhs, out = (list(map(int, x)) for x in (lhs, rhs, out))
    return ConvDimensionNumbers(lhs[0], lhs[1], lhs[2:], rhs[1], rhs[0], rhs[2:], out[0], out[1], out[2:])


class ConvolutionOps(BuilderCore):
    # -- convolution --------------------------------------------------------------------------------
    def conv_general_dilated(self, lhs: XlaOp, rhs: XlaOp, window_strides: Sequence[int], padding: Padding,
                             lhs_dilation: Sequence[int] | None = None, rhs_dilation: Sequence[int] | None = None,
                             dimension_numbers: Any = None, feature_group_count: int = 1,
                             batch_group_count: int = 1, precision_config: Any = None,
                             preferred_element_type: ElementType | None = None,
                             window_reversal: Sequence[bool] | None = None) -> XlaOp:
        lhs, rhs = self._op(lhs, "lhs"), self._op(rhs, "rhs")
        dn = conv_dimension_numbers(dimension_numbers, lhs.shape.rank)
        n = dn.num_spatial
        if rhs.shape.rank != n + 2 or lhs.shape.rank != n + 2:
            raise ProgramError(f"conv: operands {lhs.shape} and {rhs.shape} must have rank {n + 2}")
        strides = [int(s) for s in window_strides] if window_strides else [1] * n
        lhs_dilation = [int(d) for d in lhs_dilation] if lhs_dilation else [1] * n
        rhs_dilation = [int(d) for d in rhs_dilation] if rhs_dilation else [1] * n
        size = [rhs.shape.dimensions[d] for d in dn.kernel_spatial]
        in_sizes = [lhs.shape.dimensions[d] for d in dn.input_spatial]
        dilated = [(k - 1) * r + 1 if k else 0 for k, r in zip(size, rhs_dilation)]
        pads = padding_pairs(padding, in_sizes, dilated, strides, "conv")
        if not len(strides) == len(lhs_dilation) == len(rhs_dilation) == n:
            raise ProgramError(f"conv: strides and dilations must have {n} entries (one per spatial dimension)")
        window = make_window(n, size=size, stride=strides, pad=pads, lhs_dilate=lhs_dilation,
                             rhs_dilate=rhs_dilation, window_reversal=window_reversal)
        attrs = {"window": window, "dim_labels": dn.to_labels(),
                 "feature_group_count": int(feature_group_count), "batch_group_count": int(batch_group_count)}
        shape = None
        if preferred_element_type is not None:
            inferred = self._infer("convolution", [lhs, rhs], attrs)
            assert inferred is not None
            shape = inferred.with_element_type(as_type(preferred_element_type))
        return self._emit("convolution", [lhs, rhs], attrs, shape=shape)

    def conv(self, lhs: XlaOp, rhs: XlaOp, window_strides: Sequence[int], padding: Padding,
             feature_group_count: int = 1, batch_group_count: int = 1, dimension_numbers: Any = None,
             precision_config: Any = None, preferred_element_type: ElementType | None = None) -> XlaOp:
        return self.conv_general_dilated(lhs, rhs, window_strides, padding, None, None, dimension_numbers,
                                         feature_group_count, batch_group_count,
                                         preferred_element_type=preferred_element_type)

    def conv_with_general_padding(self, lhs: XlaOp, rhs: XlaOp, window_strides: Sequence[int],
                                  padding: Sequence[Sequence[int]], feature_group_count: int = 1,
                                  batch_group_count: int = 1, dimension_numbers: Any = None,
                                  precision_config: Any = None,
                                  preferred_element_type: ElementType | None = None) -> XlaOp:
        return self.conv_general_dilated(lhs, rhs, window_strides, padding, None, None, dimension_numbers,
                                         feature_group_count, batch_group_count,
                                         preferred_element_type=preferred_element_type)

    def conv_with_general_dimensions(self, lhs: XlaOp, rhs: XlaOp, window_strides: Sequence[int],
                                     padding: Padding, dimension_numbers: Any, feature_group_count: int = 1,
                                     batch_group_count: int = 1) -> XlaOp:
        return self.conv_general_dilated(lhs, rhs, window_strides, padding, None, None, dimension_numbers,
                                         feature_group_count, batch_group_count)
