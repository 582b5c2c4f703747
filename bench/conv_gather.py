"""Convolution, gather and scatter-add kernels vs jax.jit on CPU, measured in the same run.

    python bench/conv_gather.py [--repeat N]

Prints per case the median time of our kernel (run through the interpreter, one instruction), the
median of the jitted jax function, and their ratio (ours / jax; lower is better).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from replicas.hlo.ir import Computation, Instruction, Module, make_window
from replicas.runtime.compile import compile_module
from replicas.runtime.interpreter import Interpreter
from replicas.shapes import Shape


def one_op(opcode: str, result: Shape, operands: list[np.ndarray], attrs: dict[str, Any],
           computations: list[Computation] = ()) -> Callable[[], Any]:
    module = Module(f"bench_{opcode}")
    for comp in computations:
        module.add(comp)
    entry = Computation("main")
    names = []
    for i, value in enumerate(operands):
        entry.add(Instruction(f"p{i}", "parameter", Shape.of(value), [], {"parameter_number": i}))
        names.append(f"p{i}")
    entry.add(Instruction("op", opcode, result, names, attrs))
    entry.root = "op"
    module.add(entry)
    module.entry = "main"
    interp = Interpreter(compile_module(module))
    return lambda: interp.run(operands)


def add_computation() -> Computation:
    s = Shape.scalar("f32")
    comp = Computation("add_f32")
    comp.add(Instruction("a", "parameter", s, [], {"parameter_number": 0}))
    comp.add(Instruction("b", "parameter", s, [], {"parameter_number": 1}))
    comp.add(Instruction("r", "add", s, ["a", "b"]))
    comp.root = "r"
    return comp


def median_time(fn: Callable[[], Any], repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def cases() -> list[tuple[str, Callable[[], Any], Callable[[], Any], Callable[[Any, Any], None]]]:
    rng = np.random.default_rng(0)
    out = []

    # conv2d NHWC 8x56x56x64, 3x3x64x64, stride 1, SAME.
    x = rng.standard_normal((8, 56, 56, 64)).astype(np.float32)
    w = rng.standard_normal((3, 3, 64, 64)).astype(np.float32)
    conv_jax = jax.jit(lambda a, b: jax.lax.conv_general_dilated(
        a, b, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")))
    window = make_window(2, size=[3, 3], pad=[(1, 1), (1, 1)])
    ours = one_op("convolution", Shape.array("f32", (8, 56, 56, 64)), [x, w],
                  {"window": window, "dim_labels": "b01f_01io->b01f"})
    out.append(("conv2d 8x56x56x64 3x3x64x64 SAME", ours, lambda: conv_jax(x, w).block_until_ready(),
                lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-3)))

    # gather: 1M row lookups of a (100000, 8) table (x[idx]).
    table = rng.standard_normal((100_000, 8)).astype(np.float32)
    idx = rng.integers(0, 100_000, (1_000_000, 1)).astype(np.int32)
    gather_jax = jax.jit(lambda t, i: t[i[:, 0]])
    attrs = {"offset_dims": [1], "collapsed_slice_dims": [0], "start_index_map": [0], "operand_batching_dims": [],
             "start_indices_batching_dims": [], "slice_sizes": [1, 8], "index_vector_dim": 1}
    ours = one_op("gather", Shape.array("f32", (1_000_000, 8)), [table, idx], attrs)
    out.append(("gather 1M rows of f32[100000,8]", ours, lambda: gather_jax(table, idx).block_until_ready(),
                lambda a, b: np.testing.assert_array_equal(a, b)))

    # scatter-add: 1M scalar updates into f32[100000] (x.at[idx].add(u)), many repeats.
    target = np.zeros(100_000, np.float32)
    updates = rng.standard_normal(1_000_000).astype(np.float32)
    scatter_jax = jax.jit(lambda t, i, u: t.at[i[:, 0]].add(u))
    attrs = {"update_window_dims": [], "inserted_window_dims": [0], "scatter_dims_to_operand_dims": [0],
             "input_batching_dims": [], "scatter_indices_batching_dims": [], "index_vector_dim": 1,
             "to_apply": "add_f32"}
    ours = one_op("scatter", Shape.array("f32", (100_000,)), [target, idx, updates], attrs, [add_computation()])
    out.append(("scatter-add 1M into f32[100000]", ours,
                lambda: scatter_jax(target, idx, updates).block_until_ready(),
                lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-3)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    print(f"{'case':40s} {'ours ms':>10s} {'jax ms':>10s} {'ratio':>8s}")
    for name, ours, theirs, check in cases():
        check(np.asarray(ours()), np.asarray(theirs()))
        t_ours = median_time(ours, args.repeat)
        t_jax = median_time(theirs, args.repeat)
        print(f"{name:40s} {t_ours * 1e3:10.2f} {t_jax * 1e3:10.2f} {t_ours / t_jax:8.2f}")


if __name__ == "__main__":
    main()
