"""gather / scatter kernels vs jax.lax on the dimension numbers jax produces (x[idx], x[:, idx],
take_along_axis, .at[].add/.set/.max/.min/.mul, batching dims) with repeated and out-of-bounds
indices, plus variadic and generic-computation scatter against a straightforward reference."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opkit import binary_computation, run_op
from xla_oracle import lax_answer

from replicas.errors import ProgramError
from replicas.hlo.ir import Computation, Instruction
from replicas.shapes import Shape

MODE_RAW_GATHER = jax.lax.GatherScatterMode.PROMISE_IN_BOUNDS  # plain HLO gather: XLA clamps
MODE_RAW_SCATTER = jax.lax.GatherScatterMode.FILL_OR_DROP  # plain HLO scatter: XLA skips OOB windows


def find_eqn(jaxpr, names):
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in names:
            return eqn
        for value in eqn.params.values():
            inner = getattr(value, "jaxpr", value)
            if hasattr(inner, "eqns"):
                found = find_eqn(inner, names)
                if found is not None:
                    return found
    return None


def abstract(shape, dtype):
    """An argument to trace with: its shape and dtype only (a jnp.zeros is a computation JAX
    compiles, one per shape)."""
    return jax.ShapeDtypeStruct(shape, dtype)


def traced(fn, *args, names):
    eqn = find_eqn(jax.make_jaxpr(fn)(*args).jaxpr, names)
    assert eqn is not None, f"no {names} in the jaxpr"
    return eqn


def random_array(rng, shape, dtype):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind in "iu":
        return rng.integers(0, 50, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def random_indices(rng, shape, bound, dtype=np.int32):
    """Mostly in-bounds indices with some out-of-bounds (negative and too large) ones and repeats."""
    return rng.integers(-2, bound + 3, shape).astype(dtype)


def gather_attrs(dn, slice_sizes, index_vector_dim):
    return {"offset_dims": list(dn.offset_dims), "collapsed_slice_dims": list(dn.collapsed_slice_dims),
            "start_index_map": list(dn.start_index_map), "operand_batching_dims": list(dn.operand_batching_dims),
            "start_indices_batching_dims": list(dn.start_indices_batching_dims),
            "slice_sizes": list(slice_sizes), "index_vector_dim": index_vector_dim, "indices_are_sorted": False}


def check_gather(operand, indices, dn, slice_sizes, *, move_index_vector_to=None):
    expected = lax_answer(jax.lax.gather, operand, indices, dn, tuple(slice_sizes), mode=MODE_RAW_GATHER)
    index_vector_dim = indices.ndim - 1
    ours_indices = indices
    if move_index_vector_to == "implicit" and indices.shape[-1] == 1:
        ours_indices = indices[..., 0]
        index_vector_dim = ours_indices.ndim
    elif move_index_vector_to is not None and move_index_vector_to != "implicit":
        ours_indices = np.moveaxis(indices, -1, move_index_vector_to)
        index_vector_dim = move_index_vector_to
        # Batching dims of the indices are numbered in the moved layout.
        batch_axes = [d for d in range(indices.ndim) if d != indices.ndim - 1]
        moved_axes = [d for d in range(indices.ndim) if d != move_index_vector_to]
        mapping = dict(zip(batch_axes, moved_axes))
        dn = dn._replace(start_indices_batching_dims=tuple(mapping[d] for d in dn.start_indices_batching_dims))
    shape = Shape.array(Shape.of(expected).element_type, expected.shape)
    got = run_op("gather", shape, [operand, np.ascontiguousarray(ours_indices)],
                 gather_attrs(dn, slice_sizes, index_vector_dim))
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


def jnp_gathers():
    """(name, operand shape, fn(x, idx), index shape, index bound)."""
    return [
        ("x[idx]", (7, 5), lambda x, i: x[i], (4,), 7),
        ("x[:, idx]", (4, 9), lambda x, i: x[:, i], (3, 2), 9),
        ("x[idx, :, idx2]", (5, 3, 6), lambda x, i: x[i, :, i], (4,), 5),
        ("take_along_axis", (4, 6), lambda x, i: jnp.take_along_axis(x, i, axis=1), (4, 3), 6),
        ("take_along_axis batched", (3, 4, 6), lambda x, i: jnp.take_along_axis(x, i, axis=2), (3, 4, 2), 6),
        ("x[..., idx2d]", (2, 3, 6), lambda x, i: x[..., i], (2, 2), 6),
        ("x[idx, 1:3]", (8, 5), lambda x, i: x[i, 1:3], (3,), 8),
        ("vmap take", (3, 7), jax.vmap(lambda x, i: x[i]), (3, 5), 7),
    ]


@pytest.mark.parametrize("case", jnp_gathers(), ids=lambda c: c[0])
@pytest.mark.parametrize("dtype", [np.float32, np.int8])
def test_gather_jax_variants(case, dtype):
    _name, op_shape, fn, idx_shape, bound = case
    rng = np.random.default_rng(0)
    operand = random_array(rng, op_shape, dtype)
    eqn = traced(fn, abstract(op_shape, np.float32), abstract(idx_shape, np.int32), names={"gather"})
    dn, slice_sizes = eqn.params["dimension_numbers"], eqn.params["slice_sizes"]
    indices_shape = eqn.invars[1].aval.shape
    for index_dtype, placement in [(np.int32, None), (np.int64, "implicit"), (np.uint32, 0)]:
        indices = random_indices(rng, indices_shape, max(op_shape))
        if index_dtype == np.uint32:
            indices = np.abs(indices)
        check_gather(operand, indices.astype(index_dtype), dn, slice_sizes, move_index_vector_to=placement)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_gather_random_dimension_numbers(seed):
    rng = np.random.default_rng(seed)
    rank = int(rng.integers(1, 4))
    op_shape = tuple(int(d) for d in rng.integers(1, 6, rank))
    dims = list(rng.permutation(rank))
    n_batching = int(rng.integers(0, 2)) if rank > 1 else 0
    operand_batching = sorted(int(d) for d in dims[:n_batching])
    rest = dims[n_batching:]
    n_index = int(rng.integers(1, len(rest) + 1))
    start_index_map = [int(d) for d in rest[:n_index]]
    collapsed = sorted(d for d in start_index_map if rng.integers(0, 2))
    slice_sizes = [1 if d in collapsed or d in operand_batching else int(rng.integers(0, op_shape[d] + 1))
                   for d in range(rank)]
    n_idx_batch = int(rng.integers(0, 3)) + n_batching
    idx_batch_shape = [int(d) for d in rng.integers(1, 4, n_idx_batch)]
    indices_batching = sorted(int(d) for d in rng.permutation(n_idx_batch)[:n_batching])
    for od, idim in zip(operand_batching, indices_batching):
        idx_batch_shape[idim] = op_shape[od]
    indices = random_indices(rng, (*idx_batch_shape, n_index), max(op_shape))
    n_offset = rank - len(collapsed) - n_batching
    out_rank = n_offset + n_idx_batch
    offset_dims = sorted(int(d) for d in rng.permutation(out_rank)[:n_offset])
    dn = jax.lax.GatherDimensionNumbers(offset_dims=tuple(offset_dims), collapsed_slice_dims=tuple(collapsed),
                                        start_index_map=tuple(start_index_map),
                                        operand_batching_dims=tuple(operand_batching),
                                        start_indices_batching_dims=tuple(indices_batching))
    operand = random_array(rng, op_shape, np.float64)
    check_gather(operand, indices, dn, slice_sizes,
                 move_index_vector_to=int(rng.integers(0, indices.ndim)))


@pytest.mark.parametrize("dtype", [np.bool_, ml_dtypes.bfloat16, np.complex128, np.uint64])
def test_gather_dtypes(dtype):
    rng = np.random.default_rng(10)
    operand = random_array(rng, (6, 4), dtype)
    dn = jax.lax.GatherDimensionNumbers(offset_dims=(1,), collapsed_slice_dims=(0,), start_index_map=(0,))
    check_gather(operand, random_indices(rng, (5, 1), 6), dn, (1, 3))


def test_gather_errors():
    x = np.zeros((4, 5), np.float32)
    i = np.zeros((3, 1), np.int32)
    attrs = {"offset_dims": [1], "collapsed_slice_dims": [0], "start_index_map": [0], "slice_sizes": [1, 9],
             "index_vector_dim": 1}
    with pytest.raises(ProgramError, match="slice size"):
        run_op("gather", "f32[3,9]", [x, i], attrs)
    attrs["slice_sizes"] = [1, 5]
    with pytest.raises(ProgramError, match="does not match the inferred shape"):
        run_op("gather", "f32[3,4]", [x, i], attrs)


# -- scatter -------------------------------------------------------------------------------------------------

def scatter_attrs(dn, index_vector_dim, comp_name):
    return {"update_window_dims": list(dn.update_window_dims), "inserted_window_dims": list(dn.inserted_window_dims),
            "scatter_dims_to_operand_dims": list(dn.scatter_dims_to_operand_dims),
            "input_batching_dims": list(dn.operand_batching_dims),
            "scatter_indices_batching_dims": list(dn.scatter_indices_batching_dims),
            "index_vector_dim": index_vector_dim, "to_apply": comp_name, "indices_are_sorted": False,
            "unique_indices": False}


def replace_computation(element_type: str) -> Computation:
    s = Shape.scalar(element_type)
    comp = Computation(f"replace_{element_type}")
    comp.add(Instruction("old", "parameter", s, [], {"parameter_number": 0}))
    comp.add(Instruction("new", "parameter", s, [], {"parameter_number": 1}))
    comp.root = "new"
    return comp


JAX_SCATTERS = {
    "add": jax.lax.scatter_add, "multiply": jax.lax.scatter_mul, "maximum": jax.lax.scatter_max,
    "minimum": jax.lax.scatter_min, "replace": jax.lax.scatter,
}


def check_scatter(kind, operand, indices, updates, dn):
    expected = lax_answer(JAX_SCATTERS[kind], operand, indices, updates, dn, mode=MODE_RAW_SCATTER)
    element_type = Shape.of(operand).element_type.value
    comp = replace_computation(element_type) if kind == "replace" else binary_computation(kind, element_type)
    got = run_op("scatter", Shape.of(operand), [operand, indices, updates],
                 scatter_attrs(dn, indices.ndim - 1, comp.name), [comp])
    assert got.dtype == expected.dtype
    if operand.dtype.kind in "fcV" and kind in ("add", "multiply"):
        np.testing.assert_allclose(got.astype(np.complex128), expected.astype(np.complex128), rtol=2e-2
                                   if operand.dtype.itemsize <= 2 else 1e-6)
    else:
        np.testing.assert_array_equal(got, expected)


def jnp_scatters():
    """(name, operand shape, fn(x, idx, upd) using .at, index shape, index bound)."""
    return [
        ("x.at[idx]", (7, 3), lambda x, i, u: x.at[i].add(u), (9,), (9, 3), 7),
        ("x.at[:, idx]", (3, 6), lambda x, i, u: x.at[:, i].add(u), (5,), (3, 5), 6),
        ("x.at[idx, idx]", (4, 5), lambda x, i, u: x.at[i, i].add(u), (8,), (8,), 5),
        ("x.at[idx] 2d idx", (6,), lambda x, i, u: x.at[i].add(u), (3, 4), (3, 4), 6),
        ("vmap x.at[idx]", (3, 6), jax.vmap(lambda x, i, u: x.at[i].add(u)), (3, 5), (3, 5), 6),
        ("dynamic_update_slice-like", (6, 6), lambda x, i, u: x.at[i, 1:4].add(u), (4,), (4, 3), 6),
    ]


@pytest.mark.parametrize("case", jnp_scatters(), ids=lambda c: c[0])
@pytest.mark.parametrize("kind", ["add", "multiply", "maximum", "minimum", "replace"])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_scatter_jax_variants(case, kind, dtype):
    _name, op_shape, fn, idx_shape, upd_shape, bound = case
    rng = np.random.default_rng(1)
    eqn = traced(fn, abstract(op_shape, np.float32), abstract(idx_shape, np.int32),
                 abstract(upd_shape, np.float32), names={"scatter-add"})
    dn = eqn.params["dimension_numbers"]
    indices = random_indices(rng, eqn.invars[1].aval.shape, bound)
    updates = random_array(rng, eqn.invars[2].aval.shape, dtype)
    operand = random_array(rng, op_shape, dtype)
    check_scatter(kind, operand, indices, updates, dn)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.bool_, np.uint8, np.complex64])
def test_scatter_dtypes(dtype):
    rng = np.random.default_rng(2)
    dn = jax.lax.ScatterDimensionNumbers(update_window_dims=(1,), inserted_window_dims=(0,),
                                         scatter_dims_to_operand_dims=(0,))
    operand = random_array(rng, (5, 3), dtype)
    indices = random_indices(rng, (12, 1), 5)
    updates = random_array(rng, (12, 3), dtype)
    kinds = {"c": ["add", "replace"], "b": ["replace"]}.get(np.dtype(dtype).kind,
                                                            ["add", "maximum", "minimum", "replace"])
    for kind in kinds:
        check_scatter(kind, operand, indices, updates, dn)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), kind=st.sampled_from(["add", "maximum", "replace"]))
def test_scatter_random_dimension_numbers(seed, kind):
    rng = np.random.default_rng(seed)
    rank = int(rng.integers(1, 4))
    op_shape = tuple(int(d) for d in rng.integers(1, 6, rank))
    dims = list(rng.permutation(rank))
    n_batching = int(rng.integers(0, 2)) if rank > 1 else 0
    operand_batching = sorted(int(d) for d in dims[:n_batching])
    rest = dims[n_batching:]
    n_index = int(rng.integers(1, len(rest) + 1))
    to_operand = [int(d) for d in rest[:n_index]]
    inserted = sorted(d for d in to_operand if rng.integers(0, 2))
    window_dims = [d for d in range(rank) if d not in inserted and d not in operand_batching]
    window_sizes = [int(rng.integers(0, op_shape[d] + 1)) for d in window_dims]
    n_idx_batch = int(rng.integers(0, 3)) + n_batching
    idx_batch_shape = [int(d) for d in rng.integers(1, 5, n_idx_batch)]
    indices_batching = sorted(int(d) for d in rng.permutation(n_idx_batch)[:n_batching])
    for od, idim in zip(operand_batching, indices_batching):
        idx_batch_shape[idim] = op_shape[od]
    indices = random_indices(rng, (*idx_batch_shape, n_index), max(op_shape))
    upd_rank = len(window_dims) + n_idx_batch
    update_window_dims = sorted(int(d) for d in rng.permutation(upd_rank)[:len(window_dims)])
    upd_shape = [0] * upd_rank
    scatter_positions = [d for d in range(upd_rank) if d not in update_window_dims]
    for d, size in zip(update_window_dims, window_sizes):
        upd_shape[d] = size
    for d, size in zip(scatter_positions, idx_batch_shape):
        upd_shape[d] = size
    dn = jax.lax.ScatterDimensionNumbers(update_window_dims=tuple(update_window_dims),
                                         inserted_window_dims=tuple(inserted),
                                         scatter_dims_to_operand_dims=tuple(to_operand),
                                         operand_batching_dims=tuple(operand_batching),
                                         scatter_indices_batching_dims=tuple(indices_batching))
    operand = random_array(rng, op_shape, np.float64)
    updates = random_array(rng, tuple(upd_shape), np.float64)
    check_scatter(kind, operand, indices, updates, dn)


def reference_scatter(operands, indices, updates, combine, update_window_dims, inserted, to_operand):
    """Element by element, in update order (index_vector_dim last, no batching dims): the test's oracle for
    computations jax cannot express."""
    results = [o.copy() for o in operands]
    op_shape = operands[0].shape
    window_dims = [d for d in range(len(op_shape)) if d not in inserted]
    scatter_dims = [d for d in range(updates[0].ndim) if d not in update_window_dims]
    window_sizes = [updates[0].shape[d] for d in update_window_dims]
    for upd_index in itertools.product(*[range(n) for n in updates[0].shape]):
        batch = tuple(upd_index[d] for d in scatter_dims)
        vector = indices[batch]
        start = [0] * len(op_shape)
        for k, d in enumerate(to_operand):
            start[d] = int(vector[k])
        size_of = dict(zip(window_dims, window_sizes))
        if any(not 0 <= start[d] <= op_shape[d] - size_of.get(d, 1) for d in range(len(op_shape))):
            continue
        target = list(start)
        for w, d in zip([upd_index[d] for d in update_window_dims], window_dims):
            target[d] += w
        target = tuple(target)
        new = combine(*[r[target] for r in results], *[u[upd_index] for u in updates])
        for r, v in zip(results, new):
            r[target] = v
    return results


def swap_computation() -> Computation:
    """(a0, a1, b0, b1) -> (b1, a0): neither a reducer nor a replace, and order-sensitive."""
    s = Shape.scalar("s32")
    comp = Computation("swap")
    for i, name in enumerate(["a0", "a1", "b0", "b1"]):
        comp.add(Instruction(name, "parameter", s, [], {"parameter_number": i}))
    comp.add(Instruction("r", "tuple", Shape.tuple([s, s]), ["b1", "a0"]))
    comp.root = "r"
    return comp


def test_variadic_generic_scatter_in_update_order():
    rng = np.random.default_rng(4)
    operands = [rng.integers(0, 100, (6, 2)).astype(np.int32) for _ in range(2)]
    indices = rng.integers(-1, 7, (20, 1)).astype(np.int32)
    updates = [rng.integers(100, 200, (20, 2)).astype(np.int32) for _ in range(2)]
    attrs = {"update_window_dims": [1], "inserted_window_dims": [0], "scatter_dims_to_operand_dims": [0],
             "index_vector_dim": 1, "to_apply": "swap"}
    shape = Shape.tuple([Shape.of(operands[0]), Shape.of(operands[1])])
    got = run_op("scatter", shape, [*operands, indices, *updates], attrs, [swap_computation()])
    expected = reference_scatter(operands, indices, updates, lambda a0, a1, b0, b1: (b1, a0), [1], [0], [0])
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g, e)


def test_variadic_replace_last_wins():
    rng = np.random.default_rng(5)
    operands = [rng.standard_normal(8).astype(np.float32), rng.integers(0, 9, 8).astype(np.int64)]
    indices = rng.integers(0, 8, (30, 1)).astype(np.int32)
    updates = [rng.standard_normal(30).astype(np.float32), rng.integers(0, 9, 30).astype(np.int64)]
    comp = Computation("replace2")
    for i, (name, t) in enumerate([("a0", "f32"), ("a1", "s64"), ("b0", "f32"), ("b1", "s64")]):
        comp.add(Instruction(name, "parameter", Shape.scalar(t), [], {"parameter_number": i}))
    comp.add(Instruction("r", "tuple", Shape.tuple([Shape.scalar("f32"), Shape.scalar("s64")]), ["b0", "b1"]))
    comp.root = "r"
    attrs = {"update_window_dims": [], "inserted_window_dims": [0], "scatter_dims_to_operand_dims": [0],
             "index_vector_dim": 1, "to_apply": "replace2"}
    got = run_op("scatter", Shape.tuple([Shape.of(o) for o in operands]), [*operands, indices, *updates], attrs,
                 [comp])
    expected = reference_scatter(operands, indices, updates, lambda a0, a1, b0, b1: (b0, b1), [], [0], [0])
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g, e)


def test_generic_subtract_scatter():
    rng = np.random.default_rng(6)
    operand = rng.standard_normal((5, 4))
    indices = rng.integers(-1, 6, (3, 7, 1)).astype(np.int64)
    updates = rng.standard_normal((3, 7, 4))
    attrs = {"update_window_dims": [2], "inserted_window_dims": [0], "scatter_dims_to_operand_dims": [0],
             "index_vector_dim": 2, "to_apply": "subtract_f64"}
    got = run_op("scatter", Shape.of(operand), [operand, indices, updates], attrs,
                 [binary_computation("subtract", "f64")])
    (expected,) = reference_scatter([operand], indices, [updates], lambda a, b: (a - b,), [2], [0], [0])
    np.testing.assert_allclose(got, expected, rtol=1e-12)


def test_scatter_large_repeated_add_matches_bincount():
    rng = np.random.default_rng(7)
    operand = np.zeros(1000, np.float64)
    indices = rng.integers(0, 1000, (100_000, 1)).astype(np.int32)
    updates = rng.standard_normal(100_000)
    attrs = {"update_window_dims": [], "inserted_window_dims": [0], "scatter_dims_to_operand_dims": [0],
             "index_vector_dim": 1, "to_apply": "add_f64"}
    got = run_op("scatter", Shape.of(operand), [operand, indices, updates], attrs, [binary_computation("add", "f64")])
    np.testing.assert_allclose(got, np.bincount(indices[:, 0], updates, minlength=1000), rtol=1e-9, atol=1e-9)


def test_scatter_errors():
    x = np.zeros((4, 5), np.float32)
    i = np.zeros((3, 1), np.int32)
    u = np.zeros((3, 5), np.float32)
    comp = binary_computation("add", "f32")
    attrs = {"update_window_dims": [1], "inserted_window_dims": [0], "scatter_dims_to_operand_dims": [0, 1],
             "index_vector_dim": 1, "to_apply": comp.name}
    with pytest.raises(ProgramError, match="scatter_dims_to_operand_dims"):
        run_op("scatter", "f32[4,5]", [x, i, u], attrs, [comp])
    attrs["scatter_dims_to_operand_dims"] = [0]
    with pytest.raises(ProgramError, match="scatter dimensions"):
        run_op("scatter", "f32[4,5]", [x, i, np.zeros((2, 5), np.float32)], attrs, [comp])


def test_empty_gathers_and_scatters():
    rng = np.random.default_rng(8)
    dn = jax.lax.GatherDimensionNumbers(offset_dims=(1,), collapsed_slice_dims=(0,), start_index_map=(0,))
    check_gather(rng.standard_normal((5, 3)), np.zeros((0, 1), np.int32), dn, (1, 3))
    check_gather(rng.standard_normal((5, 0)), rng.integers(0, 5, (4, 1)).astype(np.int32), dn, (1, 0))
    sdn = jax.lax.ScatterDimensionNumbers(update_window_dims=(1,), inserted_window_dims=(0,),
                                          scatter_dims_to_operand_dims=(0,))
    for kind in ("add", "replace"):
        check_scatter(kind, rng.standard_normal((5, 3)), np.zeros((0, 1), np.int32), np.zeros((0, 3)), sdn)
        check_scatter(kind, rng.standard_normal((5, 0)), np.zeros((2, 1), np.int32), np.zeros((2, 0)), sdn)


@pytest.mark.parametrize("reducer,combine", [("or", np.logical_or), ("and", np.logical_and),
                                             ("xor", np.logical_xor), ("add", np.logical_or)])
def test_pred_scatter_reducers(reducer, combine):
    rng = np.random.default_rng(9)
    operand = rng.integers(0, 2, 6).astype(bool)
    indices = rng.integers(-1, 7, (25, 1)).astype(np.int32)
    updates = rng.integers(0, 2, 25).astype(bool)
    comp = binary_computation(reducer, "pred")
    attrs = {"update_window_dims": [], "inserted_window_dims": [0], "scatter_dims_to_operand_dims": [0],
             "index_vector_dim": 1, "to_apply": comp.name}
    got = run_op("scatter", Shape.of(operand), [operand, indices, updates], attrs, [comp])
    (expected,) = reference_scatter([operand], indices, [updates], lambda a, b: (combine(a, b),), [], [0], [0])
    np.testing.assert_array_equal(got, expected)


def test_replace_with_unique_indices_promise():
    rng = np.random.default_rng(11)
    operand = rng.standard_normal((9, 2))
    indices = np.concatenate([rng.permutation(9)[:6], [-1, 9]]).reshape(8, 1).astype(np.int32)
    updates = rng.standard_normal((8, 2))
    dn = jax.lax.ScatterDimensionNumbers(update_window_dims=(1,), inserted_window_dims=(0,),
                                         scatter_dims_to_operand_dims=(0,))
    expected = lax_answer(jax.lax.scatter, operand, indices, updates, dn, unique_indices=True, mode=MODE_RAW_SCATTER)
    comp = replace_computation("f64")
    attrs = scatter_attrs(dn, 1, comp.name) | {"unique_indices": True}
    got = run_op("scatter", Shape.of(operand), [operand, indices, updates], attrs, [comp])
    np.testing.assert_array_equal(got, expected)
