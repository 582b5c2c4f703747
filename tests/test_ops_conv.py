"""convolution kernel vs jax.lax.conv_general_dilated: layouts, strides, padding (incl. negative),
dilations, window reversal, feature/batch groups, 1-3 spatial dims, dtypes."""

from __future__ import annotations

import jax
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opkit import run_op
from xla_oracle import lax_answer

from replicas.errors import ProgramError
from replicas.hlo.ir import make_window
from replicas.hlo.shape_inference.convolution import parse_dim_labels
from replicas.shapes import Shape


def labels_for(lhs_spec, rhs_spec, out_spec) -> str:
    def part(spec, a, b):
        chars = [""] * len(spec)
        chars[spec[0]] = a
        chars[spec[1]] = b
        for i, d in enumerate(spec[2:]):
            chars[d] = str(i)
        return "".join(chars)

    return f"{part(lhs_spec, 'b', 'f')}_{part(rhs_spec, 'o', 'i')}->{part(out_spec, 'b', 'f')}"


def random_spec(rng, rank):
    return tuple(int(d) for d in rng.permutation(rank))


def run_case(rng, *, n_spatial, batch, in_per_group, out_features, sizes, kernel, stride, pad, lhs_dil,
             rhs_dil, groups=1, batch_groups=1, dtype=np.float32, reversal=None, permute=True,
             preferred=None):
    rank = n_spatial + 2
    specs = [random_spec(rng, rank) if permute else tuple(range(rank)) for _ in range(3)]
    lhs_spec, rhs_spec, out_spec = specs
    in_features = in_per_group * groups
    lhs_canon = (batch, in_features, *sizes)
    rhs_canon = (out_features, in_per_group, *kernel)
    lhs_dims = [0] * rank
    rhs_dims = [0] * rank
    for i, d in enumerate(lhs_spec):
        lhs_dims[d] = lhs_canon[i]
    for i, d in enumerate(rhs_spec):
        rhs_dims[d] = rhs_canon[i]
    if np.dtype(dtype).kind in "iu":
        lhs = rng.integers(-5, 6, lhs_dims).astype(dtype)
        rhs = rng.integers(-5, 6, rhs_dims).astype(dtype)
    elif np.dtype(dtype).kind == "c":
        lhs = (rng.standard_normal(lhs_dims) + 1j * rng.standard_normal(lhs_dims)).astype(dtype)
        rhs = (rng.standard_normal(rhs_dims) + 1j * rng.standard_normal(rhs_dims)).astype(dtype)
    else:
        lhs = rng.standard_normal(lhs_dims).astype(dtype)
        rhs = rng.standard_normal(rhs_dims).astype(dtype)
    reversal = reversal or [False] * n_spatial
    rhs_for_jax = rhs
    flip = tuple(rhs_spec[2 + i] for i, r in enumerate(reversal) if r)
    if flip:
        rhs_for_jax = np.flip(rhs, flip)
    dn = jax.lax.ConvDimensionNumbers(lhs_spec, rhs_spec, out_spec)
    expected = lax_answer(jax.lax.conv_general_dilated,
        lhs, rhs_for_jax, window_strides=stride, padding=pad, lhs_dilation=lhs_dil, rhs_dilation=rhs_dil,
        dimension_numbers=dn, feature_group_count=groups, batch_group_count=batch_groups,
        preferred_element_type=preferred)
    window = make_window(n_spatial, size=list(kernel), stride=list(stride), pad=[tuple(p) for p in pad],
                         lhs_dilate=list(lhs_dil), rhs_dilate=list(rhs_dil), window_reversal=reversal)
    attrs = {"window": window, "dim_labels": labels_for(lhs_spec, rhs_spec, out_spec),
             "feature_group_count": groups, "batch_group_count": batch_groups}
    result_shape = Shape.array(Shape.of(expected).element_type, expected.shape)
    got = run_op("convolution", result_shape, [lhs, rhs], attrs)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    if np.dtype(expected.dtype).kind in "iub":
        np.testing.assert_array_equal(got, expected)
    else:
        tol = {np.float64: 1e-10, np.complex128: 1e-10}.get(expected.dtype.type, 2e-2 if expected.dtype.itemsize <= 2
                                                                                 else 1e-4)
        np.testing.assert_allclose(got.astype(np.float64 if expected.dtype.kind != "c" else np.complex128),
                                   expected.astype(np.float64 if expected.dtype.kind != "c" else np.complex128),
                                   rtol=tol, atol=tol * 10)


def test_parse_dim_labels():
    labels = parse_dim_labels("b01f_01io->b01f")
    assert labels.input_batch == 0 and labels.input_feature == 3 and labels.input_spatial == [1, 2]
    assert labels.kernel_input_feature == 2 and labels.kernel_output_feature == 3 and labels.kernel_spatial == [0, 1]
    labels = parse_dim_labels("bf012_oi012->bf012")
    assert labels.input_spatial == [2, 3, 4] and labels.kernel_output_feature == 0
    with pytest.raises(ProgramError):
        parse_dim_labels("b01f_01io")
    with pytest.raises(ProgramError):
        parse_dim_labels("b02f_01io->b01f")


def test_nhwc_same():
    rng = np.random.default_rng(0)
    run_case(rng, n_spatial=2, batch=2, in_per_group=3, out_features=4, sizes=(7, 6), kernel=(3, 3),
             stride=(1, 1), pad=[(1, 1), (1, 1)], lhs_dil=(1, 1), rhs_dil=(1, 1), permute=False)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n_spatial=st.integers(1, 3), group_kind=st.sampled_from(["none", "feature",
                                                                                                 "batch"]))
def test_random_convolutions(seed, n_spatial, group_kind):
    rng = np.random.default_rng(seed)
    groups = int(rng.integers(2, 4)) if group_kind == "feature" else 1
    batch_groups = int(rng.integers(2, 4)) if group_kind == "batch" else 1
    sizes = tuple(int(s) for s in rng.integers(1, 7 if n_spatial < 3 else 5, n_spatial))
    kernel = tuple(int(k) for k in rng.integers(1, 4, n_spatial))
    stride = tuple(int(s) for s in rng.integers(1, 3, n_spatial))
    lhs_dil = tuple(int(s) for s in rng.integers(1, 3, n_spatial))
    rhs_dil = tuple(int(s) for s in rng.integers(1, 3, n_spatial))
    pad = []
    for n, dil in zip(sizes, lhs_dil):
        lo, hi = int(rng.integers(-2, 3)), int(rng.integers(-2, 3))
        dilated = (n - 1) * dil + 1
        pad.append((lo, max(hi, -dilated - lo)))  # jax rejects a padded extent below zero
    reversal = [bool(r) for r in rng.integers(0, 2, n_spatial)]
    out_features = int(rng.integers(1, 3)) * groups * batch_groups
    run_case(rng, n_spatial=n_spatial, batch=int(rng.integers(1, 3)) * batch_groups,
             in_per_group=int(rng.integers(1, 4)), out_features=out_features, sizes=sizes, kernel=kernel,
             stride=stride, pad=pad, lhs_dil=lhs_dil, rhs_dil=rhs_dil, groups=groups, batch_groups=batch_groups,
             reversal=reversal, dtype=np.float64)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16, np.int32, np.int8, np.complex64,
                                   np.complex128])
def test_dtypes(dtype):
    rng = np.random.default_rng(3)
    run_case(rng, n_spatial=2, batch=2, in_per_group=3, out_features=4, sizes=(5, 4), kernel=(2, 3),
             stride=(2, 1), pad=[(1, 0), (2, -1)], lhs_dil=(1, 2), rhs_dil=(2, 1), dtype=dtype)


def test_mixed_precision_bf16_to_f32():
    rng = np.random.default_rng(4)
    run_case(rng, n_spatial=1, batch=2, in_per_group=16, out_features=3, sizes=(9,), kernel=(3,), stride=(1,),
             pad=[(1, 1)], lhs_dil=(1,), rhs_dil=(1,), dtype=ml_dtypes.bfloat16, preferred=np.float32)


def test_int8_to_int32():
    rng = np.random.default_rng(5)
    run_case(rng, n_spatial=2, batch=1, in_per_group=4, out_features=2, sizes=(4, 4), kernel=(2, 2),
             stride=(1, 1), pad=[(0, 0), (0, 0)], lhs_dil=(1, 1), rhs_dil=(1, 1), dtype=np.int8,
             preferred=np.int32)


def test_depthwise_many_groups():
    rng = np.random.default_rng(6)
    run_case(rng, n_spatial=2, batch=2, in_per_group=1, out_features=64, sizes=(6, 6), kernel=(3, 3),
             stride=(1, 1), pad=[(1, 1), (1, 1)], lhs_dil=(1, 1), rhs_dil=(1, 1), groups=32)


def test_empty_and_cropped_to_nothing():
    rng = np.random.default_rng(7)
    run_case(rng, n_spatial=1, batch=0, in_per_group=2, out_features=3, sizes=(5,), kernel=(2,), stride=(1,),
             pad=[(0, 0)], lhs_dil=(1,), rhs_dil=(1,))
    run_case(rng, n_spatial=1, batch=2, in_per_group=0, out_features=3, sizes=(5,), kernel=(2,), stride=(1,),
             pad=[(0, 0)], lhs_dil=(1,), rhs_dil=(1,))
    run_case(rng, n_spatial=1, batch=2, in_per_group=2, out_features=3, sizes=(3,), kernel=(2,), stride=(1,),
             pad=[(-2, -1)], lhs_dil=(1,), rhs_dil=(1,))
    run_case(rng, n_spatial=2, batch=1, in_per_group=2, out_features=1, sizes=(3, 2), kernel=(2, 2),
             stride=(1, 1), pad=[(2, 2), (-3, 3)], lhs_dil=(1, 1), rhs_dil=(1, 1))


def test_bad_attributes_raise_program_error():
    lhs = np.zeros((1, 4, 4, 3), np.float32)
    rhs = np.zeros((3, 3, 3, 2), np.float32)
    window = make_window(2, size=[3, 3])
    with pytest.raises(ProgramError, match="dim_labels"):
        run_op("convolution", "f32[1,2,2,2]", [lhs, rhs], {"window": window, "dim_labels": "b01f_01io"})
    with pytest.raises(ProgramError, match="does not match the inferred shape"):
        run_op("convolution", "f32[1,3,3,2]", [lhs, rhs], {"window": window, "dim_labels": "b01f_01io->b01f"})
    with pytest.raises(ProgramError, match="input feature size"):
        run_op("convolution", "f32[1,2,2,2]", [lhs, rhs], {"window": window, "dim_labels": "b01f_01io->b01f",
                                                           "feature_group_count": 3})


@pytest.mark.parametrize("n_spatial", [1, 2, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64])
def test_stride_one_wide_input_path(n_spatial, dtype):
    """Stride 1, >= 16 input features, no groups: the kernel's shifted-taps path (no im2col copy)."""
    rng = np.random.default_rng(8 + n_spatial)
    sizes = (24, 20, 12)[:n_spatial]
    kernel = (3, 2, 3)[:n_spatial]
    pad = [(1, 1), (0, 2), (-1, 1)][:n_spatial]
    run_case(rng, n_spatial=n_spatial, batch=2, in_per_group=17, out_features=5, sizes=sizes, kernel=kernel,
             stride=(1,) * n_spatial, pad=pad, lhs_dil=(1,) * n_spatial, rhs_dil=(2, 1, 1)[:n_spatial],
             reversal=[True, False, True][:n_spatial], dtype=dtype)
    run_case(rng, n_spatial=n_spatial, batch=3, in_per_group=16, out_features=4, sizes=sizes, kernel=kernel,
             stride=(1,) * n_spatial, pad=[(1, 1)] * n_spatial, lhs_dil=(1,) * n_spatial,
             rhs_dil=(1,) * n_spatial, dtype=dtype, permute=False)
