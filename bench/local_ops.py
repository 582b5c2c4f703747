"""Local kernels vs the anchors, measured in the same run: dot, max-pool reduce-window, sort, reduce.

    python bench/local_ops.py [--repeat N]

Each op runs as a one-instruction module through the real interpreter (the kernel plus the
interpreter's per-instruction overhead) and is compared with `jax.jit` on CPU (the anchor) and,
for dot, with a bare `np.matmul`. Times are the best of N runs; ratios > 1 mean we are slower.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

from replicas.hlo.ir import Computation, Instruction, Module, make_window  # noqa: E402
from replicas.runtime.compile import compile_module  # noqa: E402
from replicas.runtime.interpreter import Interpreter  # noqa: E402
from replicas.shapes import Shape  # noqa: E402


def scalar_computation(name: str, opcode: str, element_type: str, **attrs: Any) -> Computation:
    s = Shape.scalar(element_type)
    comp = Computation(name)
    comp.add(Instruction("a", "parameter", s, [], {"parameter_number": 0}))
    comp.add(Instruction("b", "parameter", s, [], {"parameter_number": 1}))
    out = Shape.scalar("pred") if opcode == "compare" else s
    comp.add(Instruction("r", opcode, out, ["a", "b"], attrs))
    comp.root = "r"
    return comp


def one_op(
    opcode: str,
    result: Shape,
    operands: list[np.ndarray],
    attrs: dict[str, Any],
    computations: list[Computation] = (),
) -> Callable[[], Any]:
    """A bound interpreter running `opcode` on `operands`: returns a no-argument runner."""
    module = Module(f"bench_{opcode.replace('-', '_')}")
    for c in computations:
        module.add(c)
    entry = Computation("main")
    for i, value in enumerate(operands):
        entry.add(Instruction(f"p{i}", "parameter", Shape.of(value), [], {"parameter_number": i}))
    entry.add(Instruction("op", opcode, result, [f"p{i}" for i in range(len(operands))], attrs))
    entry.root = "op"
    module.add(entry)
    module.entry = "main"
    interpreter = Interpreter(compile_module(module))
    return lambda: interpreter.run(operands)


def best_time(fn: Callable[[], Any], repeat: int) -> float:
    fn()  # warm-up (jax compiles here)
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        if hasattr(out, "block_until_ready"):
            out.block_until_ready()
        best = min(best, time.perf_counter() - start)
    return best


def report(name: str, ours: float, anchors: dict[str, float]) -> None:
    parts = [f"ours {ours * 1e3:9.2f} ms"]
    for anchor, t in anchors.items():
        parts.append(f"{anchor} {t * 1e3:9.2f} ms (ratio {ours / t:5.2f})")
    print(f"{name:<34} " + "   ".join(parts))


def bench_dot(rng: np.random.Generator, repeat: int) -> None:
    a = rng.standard_normal((1024, 1024), dtype=np.float32)
    b = rng.standard_normal((1024, 1024), dtype=np.float32)
    ours = one_op(
        "dot",
        Shape.array("f32", (1024, 1024)),
        [a, b],
        {
            "lhs_contracting_dims": [1],
            "rhs_contracting_dims": [0],
            "lhs_batch_dims": [],
            "rhs_batch_dims": [],
        },
    )
    jitted = jax.jit(jnp.dot)
    ja, jb = jnp.asarray(a), jnp.asarray(b)
    anchors = {
        "numpy": best_time(lambda: np.matmul(a, b), repeat),
        "jax.jit": best_time(lambda: jitted(ja, jb), repeat),
    }
    report("dot f32 1024^3", best_time(ours, repeat), anchors)


def bench_max_pool(rng: np.random.Generator, repeat: int) -> None:
    x = rng.standard_normal((8, 112, 112, 64), dtype=np.float32)
    init = np.asarray(-np.inf, np.float32)
    window = make_window(4, size=[1, 2, 2, 1], stride=[1, 2, 2, 1])
    ours = one_op(
        "reduce-window",
        Shape.array("f32", (8, 56, 56, 64)),
        [x, init],
        {"to_apply": "max", "window": window},
        [scalar_computation("max", "maximum", "f32")],
    )
    jitted = jax.jit(lambda v: lax.reduce_window(v, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID"))
    jx = jnp.asarray(x)
    anchors = {"jax.jit": best_time(lambda: jitted(jx), repeat)}
    report("max-pool 2x2/2 8x112x112x64", best_time(ours, repeat), anchors)


def bench_sort(rng: np.random.Generator, repeat: int) -> None:
    x = rng.standard_normal(1 << 20).astype(np.float32)
    less = scalar_computation("less", "compare", "f32", comparison_direction="LT")
    attrs = {"dimensions": [0], "is_stable": True, "to_apply": "less"}
    ours = one_op("sort", Shape.of(x), [x], attrs, [less])
    jitted = jax.jit(lambda v: lax.sort(v))
    jx = jnp.asarray(x)
    report("sort f32 1M", best_time(ours, repeat), {"jax.jit": best_time(lambda: jitted(jx), repeat)})


def bench_reduce(rng: np.random.Generator, repeat: int) -> None:
    x = rng.standard_normal(1 << 24).astype(np.float32)
    ours = one_op(
        "reduce",
        Shape.scalar("f32"),
        [x, np.asarray(0, np.float32)],
        {"to_apply": "add", "dimensions": [0]},
        [scalar_computation("add", "add", "f32")],
    )
    jitted = jax.jit(jnp.sum)
    jx = jnp.asarray(x)
    report("reduce add f32 16M", best_time(ours, repeat), {"jax.jit": best_time(lambda: jitted(jx), repeat)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    platform = jax.devices()[0].platform
    print(f"jax {jax.__version__} on {platform}, numpy {np.__version__}, best of {args.repeat}")
    for bench in (bench_dot, bench_max_pool, bench_sort, bench_reduce):
        bench(rng, args.repeat)


if __name__ == "__main__":
    main()
