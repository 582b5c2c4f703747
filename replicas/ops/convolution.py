"""convolution: XLA's general convolution (ConvGeneralDilated) as im2col + one batched matmul.

Steps, all vectorized: transpose lhs to (batch, spatial..., feature) and rhs to
(spatial..., in, out); reverse the kernel where `window_reversal` says so; dilate and pad (or crop,
for negative padding) the lhs in one copy into a zero buffer; take the strided, rhs-dilated
windows with `sliding_window_view`; then one matmul with the groups (feature groups or batch
groups) as its batch dimension. Finally transpose to the output `dim_labels` order.

Accumulation follows `dot`: floats narrower than f32 in f32, f64 in f64, integers in int64 (wrap
to the result type), complex in complex; pred is "any (a and b)".
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from replicas.hlo.ir import Instruction
from replicas.hlo.shape_inference.convolution import parse_dim_labels
from replicas.ops.elementwise_util import quiet
from replicas.ops.registry import KernelContext, kernel


def _compute_dtype(dtypes: list[np.dtype]) -> np.dtype:
    kinds = {d.kind for d in dtypes}
    if "c" in kinds:
        wide = any(d in (np.complex128, np.float64) for d in dtypes)
        return np.dtype(np.complex128 if wide else np.complex64)
    if "f" in kinds or "V" in kinds:
        return np.dtype(np.float64 if any(d == np.float64 for d in dtypes) else np.float32)
    if any(d == np.uint64 for d in dtypes):
        return np.dtype(np.uint64)
    return np.dtype(np.int64)


def _floating(dtype: np.dtype) -> bool:
    # ml_dtypes floats (bf16, f8) report kind "V".
    return dtype.kind in "fcV"


@kernel("convolution")
def make_convolution(inst: Instruction, ctx: KernelContext) -> Callable[..., np.ndarray]:
    lhs_shape, rhs_shape = ctx.operand_shapes(inst)
    dn = parse_dim_labels(inst.attrs["dim_labels"])  # the verifier's dimension numbers
    n_spatial = dn.num_spatial
    window = inst.attrs.get("window") or {}
    pad = [tuple(p) for p in window.get("pad", [(0, 0)] * n_spatial)]
    stride = list(window.get("stride", [1] * n_spatial))
    lhs_dilate = list(window.get("lhs_dilate", [1] * n_spatial))
    rhs_dilate = list(window.get("rhs_dilate", [1] * n_spatial))
    reversal = list(window.get("window_reversal", [False] * n_spatial))
    groups = int(inst.attrs.get("feature_group_count", 1))
    batch_groups = int(inst.attrs.get("batch_group_count", 1))

    ld, rd = lhs_shape.dimensions, rhs_shape.dimensions
    batch, in_features = ld[dn.input_batch], ld[dn.input_feature]
    out_features = rd[dn.kernel_output_feature]
    in_spatial = [ld[d] for d in dn.input_spatial]
    kernel_spatial = [rd[d] for d in dn.kernel_spatial]
    total_groups = groups * batch_groups

    # Geometry per spatial dim: dilated+padded input extent, dilated kernel extent, output extent.
    padded = []
    out_spatial = []
    for n, k, (lo, hi), s, l_dil, r_dil in zip(in_spatial, kernel_spatial, pad, stride, lhs_dilate, rhs_dilate):
        dilated = (n - 1) * l_dil + 1 if n > 0 else 0
        extent = max(lo + dilated + hi, 0)
        span = (k - 1) * r_dil + 1 if k > 0 else 0
        padded.append(extent)
        out_spatial.append((extent - span) // s + 1 if extent >= span and k > 0 else 0)
    out_batch = batch // batch_groups
    canonical_out = [out_batch, *out_spatial, out_features]
    out_dims = inst.shape.dimensions

    lhs_perm = [dn.input_batch, *dn.input_spatial, dn.input_feature]
    rhs_perm = [*dn.kernel_spatial, dn.kernel_input_feature, dn.kernel_output_feature]
    # canonical out axis order is (batch, spatial..., feature); output axis d takes canonical axis out_perm[d].
    canonical_of = [0] + [1 + i for i in range(n_spatial)] + [n_spatial + 1]
    out_positions = [dn.output_batch, *dn.output_spatial, dn.output_feature]
    out_perm = [0] * (n_spatial + 2)
    for canon, pos in zip(canonical_of, out_positions):
        out_perm[pos] = canon

    out_dtype = inst.shape.dtype
    compute = _compute_dtype([lhs_shape.dtype, rhs_shape.dtype, out_dtype])
    is_pred = out_dtype == np.bool_
    flip_axes = tuple(i for i, r in enumerate(reversal) if r)
    needs_copy = any(l_dil != 1 or lo != 0 or hi != 0 for l_dil, (lo, hi) in zip(lhs_dilate, pad))
    # Source slice (in the undilated input) and destination slice (in the padded buffer) per dim.
    src_slices, dst_slices = [], []
    for n, (lo, _hi), l_dil, extent in zip(in_spatial, pad, lhs_dilate, padded):
        first = -(lo // l_dil) if lo < 0 else 0  # ceil(-lo / l_dil): the first element not cropped
        last = min(n - 1, (extent - 1 - lo) // l_dil) if extent > 0 else -1
        if last < first:
            src_slices.append(slice(0, 0))
            dst_slices.append(slice(0, 0))
        else:
            src_slices.append(slice(first, last + 1))
            dst_slices.append(slice(lo + first * l_dil, lo + last * l_dil + 1, l_dil))
    window_span = [(k - 1) * r + 1 for k, r in zip(kernel_spatial, rhs_dilate)]
    spatial_axes = tuple(range(1, n_spatial + 1))
    window_select = ((slice(None),) + tuple(slice(None, o * s, s) for o, s in zip(out_spatial, stride))
                     + (slice(None),) + tuple(slice(None, None, r) for r in rhs_dilate))
    kernel_numel = math.prod(kernel_spatial)
    empty = math.prod(out_dims) == 0 or math.prod(ld) == 0 or math.prod(rd) == 0
    in_per_group = in_features // groups
    out_per_group = out_features // total_groups
    rows = out_batch * math.prod(out_spatial)  # output positions per group
    # Stride-1 ungrouped convolutions with enough input features skip the im2col copy: over the
    # flattened padded input, each kernel tap is a contiguous row shift (see _shifted_taps).
    use_shifts = (total_groups == 1 and all(s == 1 for s in stride) and in_features >= 16
                  and compute.kind in "fc" and math.prod(padded) <= 1.5 * math.prod(out_spatial))
    tap_shifts = _tap_shifts(padded, kernel_spatial, rhs_dilate) if use_shifts else []

    def convolution(lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        if empty:
            return np.zeros(out_dims, dtype=out_dtype)
        x = lhs.transpose(lhs_perm).astype(compute, copy=False)
        w = rhs.transpose(rhs_perm).astype(compute, copy=False)
        if flip_axes:
            w = np.flip(w, flip_axes)
        if needs_copy:
            buf = np.zeros([x.shape[0], *padded, x.shape[-1]], dtype=compute)
            buf[(slice(None), *dst_slices, slice(None))] = x[(slice(None), *src_slices, slice(None))]
            x = buf
        if use_shifts:
            with quiet():
                full = _shifted_taps(np.ascontiguousarray(x), w.reshape(kernel_numel, in_features, out_features),
                                     tap_shifts)
            result = full[(slice(None), *(slice(0, o) for o in out_spatial), slice(None))]
            return _finish(result)
        # (N, out..., C, k...) strided view; the copy happens once, in the reshape below.
        windows = sliding_window_view(x, window_span, axis=spatial_axes)[window_select]
        with quiet():
            if total_groups == 1:
                order = [0, *range(1, n_spatial + 1), *range(n_spatial + 2, 2 * n_spatial + 2), n_spatial + 1]
                patches = windows.transpose(order).reshape(rows, kernel_numel * in_features)
                result = patches @ w.reshape(kernel_numel * in_features, out_features)
            elif groups > 1:
                # (N, out..., G, I, k...) -> (G, N, out..., k..., I)
                grouped = windows.reshape(*windows.shape[:n_spatial + 1], groups, in_per_group,
                                          *windows.shape[n_spatial + 2:])
                order = [n_spatial + 1, 0, *range(1, n_spatial + 1),
                         *range(n_spatial + 3, 2 * n_spatial + 3), n_spatial + 2]
                patches = grouped.transpose(order).reshape(groups, rows, kernel_numel * in_per_group)
                kernels = w.reshape(kernel_numel * in_per_group, groups, out_per_group).transpose(1, 0, 2)
                result = np.matmul(patches, kernels)  # (G, rows, O/G)
                result = result.transpose(1, 0, 2).reshape(rows, out_features)
            else:
                # (B*N', out..., C, k...) -> (B, N', out..., k..., C)
                grouped = windows.reshape(batch_groups, out_batch, *windows.shape[1:])
                order = [0, 1, *range(2, n_spatial + 2), *range(n_spatial + 3, 2 * n_spatial + 3), n_spatial + 2]
                patches = grouped.transpose(order).reshape(batch_groups, rows, kernel_numel * in_features)
                kernels = w.reshape(kernel_numel * in_features, batch_groups, out_per_group).transpose(1, 0, 2)
                result = np.matmul(patches, kernels)
                result = result.transpose(1, 0, 2).reshape(rows, out_features)
        return _finish(result.reshape(canonical_out))

    def _finish(result: np.ndarray) -> np.ndarray:
        if out_perm != list(range(n_spatial + 2)):
            result = result.transpose(out_perm)
        if is_pred:
            return np.ascontiguousarray(result != 0)
        if not _floating(out_dtype) and compute.kind == "f":
            return np.ascontiguousarray(result).astype(np.int64).astype(out_dtype)
        return np.ascontiguousarray(result).astype(out_dtype, copy=False)

    return convolution


def _tap_shifts(padded: list[int], kernel: list[int], rhs_dilate: list[int]) -> list[int]:
    """Row offset of every kernel tap (row-major over the kernel) in the flattened padded input."""
    row_strides = [math.prod(padded[i + 1:]) for i in range(len(padded))]
    return [sum(k * r * st for k, r, st in zip(tap, rhs_dilate, row_strides))
            for tap in itertools.product(*[range(k) for k in kernel])]


def _shifted_taps(x: np.ndarray, taps: np.ndarray, shifts: list[int]) -> np.ndarray:
    """Stride-1 convolution of contiguous x (N, P..., C) with taps (K, C, O), on the full padded grid.

    Output row r (a position of the flattened (N, P...) grid) sums x[r + shift_k] @ taps[k]; rows
    whose window leaves its image are garbage, and the caller crops them away.
    """
    flat = x.reshape(-1, x.shape[-1])
    total = flat.shape[0]
    valid = total - max(shifts)
    out = np.zeros((total, taps.shape[-1]), dtype=np.result_type(x, taps))
    acc = out[:valid]
    for k, shift in enumerate(shifts):
        if k == 0:
            np.matmul(flat[shift:shift + valid], taps[0], out=acc)
        else:
            acc += flat[shift:shift + valid] @ taps[k]
    return out.reshape(*x.shape[:-1], taps.shape[-1])
