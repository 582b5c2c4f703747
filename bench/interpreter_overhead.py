"""Interpreter overhead: a While loop of a few scalar instructions, against the same numpy calls made directly.

The program (built from the IR, run by one replica's interpreter in this process):

    state = (i: s32[], x: f32[])
    while i < N:            # condition: get-tuple-element, constant, compare
        i = i + 1           # body: 2 get-tuple-element, 3 constant, add, multiply, add, tuple
        x = x * 0.5 + 1

The anchor runs the same numpy functions (np.less, np.add, np.multiply) on 0-d arrays in a plain
Python loop, in the same process and run. Reported: microseconds per interpreted instruction, the
anchor's microseconds per numpy call, and the ratio of the two loops' times (goal: <= 3x).

    python bench/interpreter_overhead.py [--iterations 100000] [--repeat 3]

`--corpus` instead measures the interpreter alone (`Interpreter.run`, one replica, no call path) on
the single-device programs of `small_corpus.py` and its 1,500-trip Langevin loop, against `jax.jit`
(XLA on CPU) in the same process, rounds interleaved: the best call of each with the per-element
loops as machine code (`ops/machine`, compiled at their first call), as Python code
(`REPLICAS_COMPILED_LOOPS=off`), and with the per-element Python code of small fusions and loops
(`ops/python_elements.py`) turned off. Results must be the same bits all three ways (checked).

    python bench/interpreter_overhead.py --corpus [--calls 7] [--rounds 3] [--only adam,langevin_1500]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from replicas.hlo.ir import Computation, Instruction, Module
from replicas.runtime.interpreter import Interpreter
from replicas.shapes import Shape

STATE = Shape.parse("(s32[], f32[])")
S32 = Shape.parse("s32[]")
F32 = Shape.parse("f32[]")
PRED = Shape.parse("pred[]")


def _computation(name: str, insts: list[Instruction], root: str) -> Computation:
    comp = Computation(name)
    comp.add(Instruction("s", "parameter", STATE, [], {"parameter_number": 0}))
    for inst in insts:
        comp.add(inst)
    comp.root = root
    return comp


def build_module(iterations: int) -> tuple[Module, int]:
    """The loop module and the number of instructions one iteration runs (condition + body)."""
    cond = _computation("cond", [
        Instruction("i", "get-tuple-element", S32, ["s"], {"index": 0}),
        Instruction("n", "constant", S32, [], {"literal": np.asarray(iterations, np.int32)}),
        Instruction("lt", "compare", PRED, ["i", "n"], {"comparison_direction": "LT"}),
    ], "lt")
    body = _computation("body", [
        Instruction("i", "get-tuple-element", S32, ["s"], {"index": 0}),
        Instruction("x", "get-tuple-element", F32, ["s"], {"index": 1}),
        Instruction("one", "constant", S32, [], {"literal": np.asarray(1, np.int32)}),
        Instruction("half", "constant", F32, [], {"literal": np.asarray(0.5, np.float32)}),
        Instruction("onef", "constant", F32, [], {"literal": np.asarray(1.0, np.float32)}),
        Instruction("i1", "add", S32, ["i", "one"]),
        Instruction("xh", "multiply", F32, ["x", "half"]),
        Instruction("x1", "add", F32, ["xh", "onef"]),
        Instruction("out", "tuple", STATE, ["i1", "x1"]),
    ], "out")
    main = Computation("main")
    main.add(Instruction("i0", "parameter", S32, [], {"parameter_number": 0}))
    main.add(Instruction("x0", "parameter", F32, [], {"parameter_number": 1}))
    main.add(Instruction("s0", "tuple", STATE, ["i0", "x0"]))
    main.add(Instruction("w", "while", STATE, ["s0"], {"condition": "cond", "body": "body"}))
    main.root = "w"
    module = Module("interpreter_overhead")
    for comp in (cond, body, main):
        module.add(comp)
    module.entry = "main"
    per_iteration = (len(cond.instructions) - 1) + (len(body.instructions) - 1)
    return module, per_iteration


def direct_numpy(iterations: int) -> tuple[np.ndarray, np.ndarray]:
    """The anchor: the loop's arithmetic as direct numpy calls (4 per iteration)."""
    i = np.asarray(0, np.int32)
    x = np.asarray(0.0, np.float32)
    n = np.asarray(iterations, np.int32)
    one = np.asarray(1, np.int32)
    half = np.asarray(0.5, np.float32)
    onef = np.asarray(1.0, np.float32)
    less, add, multiply = np.less, np.add, np.multiply
    while less(i, n):
        i = add(i, one)
        x = add(multiply(x, half), onef)
    return np.asarray(i), np.asarray(x)


def kernels_only(interp: Interpreter, iterations: int):
    """The loop's bound kernels called by hand, in schedule order, without the interpreter: splits the
    interpreter's time into kernel cost and dispatch overhead. None if the interpreter's internals
    (BoundComputation._steps) changed."""
    cond_steps = getattr(interp.computation("cond"), "_steps", None)
    body_steps = getattr(interp.computation("body"), "_steps", None)
    if cond_steps is None or body_steps is None:
        return None
    by_name = {step[4].name: step[0] for step in cond_steps}
    c_i, c_n, c_lt = by_name["i"], by_name["n"], by_name["lt"]
    by_name = {step[4].name: step[0] for step in body_steps}
    b_i, b_x, b_one, b_half, b_onef = by_name["i"], by_name["x"], by_name["one"], by_name["half"], by_name["onef"]
    b_i1, b_xh, b_x1, b_out = by_name["i1"], by_name["xh"], by_name["x1"], by_name["out"]

    def run() -> tuple:
        state = (np.asarray(0, np.int32), np.asarray(0.0, np.float32))
        while c_lt(c_i(state), c_n()):
            i, x = b_i(state), b_x(state)
            state = b_out(b_i1(i, b_one()), b_x1(b_xh(x, b_half()), b_onef()))
        return state

    return run


def best_of(repeat: int, fn) -> tuple[float, object]:
    best = float("inf")
    result = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def corpus(calls: int, rounds: int, only: set[str]) -> None:
    """The corpus mode (see the module's docstring)."""
    import os
    import sys

    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import jax
    from common import load_average
    from small_corpus import LANGEVIN, PROGRAMS

    import replicas as rp
    import replicas.ops.control_flow as control_flow

    hooks = (control_flow.compile_fusion, control_flow.compile_loop)

    def interpreter(module: rp.Module, per_element: bool, machine: bool = False) -> Interpreter:
        if not per_element:
            control_flow.compile_fusion = control_flow.compile_loop = lambda *a, **k: None
        saved = os.environ.get("REPLICAS_COMPILED_LOOPS")
        os.environ["REPLICAS_COMPILED_LOOPS"] = "on" if machine else "off"  # read as loops are bound
        try:
            return Interpreter(module)
        finally:
            control_flow.compile_fusion, control_flow.compile_loop = hooks
            if saved is None:
                del os.environ["REPLICAS_COMPILED_LOOPS"]
            else:
                os.environ["REPLICAS_COMPILED_LOOPS"] = saved

    print(f"load average before: {load_average()}")
    print(f"{'program':22} {'xla us':>9} {'machine':>9} {'x xla':>8} {'python':>9} {'x xla':>8} "
          f"{'no per-element':>15} {'x xla':>8}")
    ratios: dict[str, list[float]] = {"machine": [], "on": [], "off": []}
    for name, f, args, n, _ in [*PROGRAMS, LANGEVIN]:
        if n != 1 or (only and name not in only):
            continue
        module = rp.jax.compile_jax(f, *args).module
        flat = [np.asarray(a) for a in jax.tree_util.tree_leaves(list(args))]
        jitted = jax.jit(f)
        machine, on, off = interpreter(module, True, True), interpreter(module, True), interpreter(module, False)
        got, python, want = (jax.tree_util.tree_leaves(i.run(flat)) for i in (machine, on, off))
        for other, what in ((python, "the per-element code"), (got, "the machine code")):
            if any(np.asarray(a).tobytes() != np.asarray(b).tobytes() for a, b in zip(other, want)):
                raise SystemExit(f"{name}: {what} and the numpy kernels differ")
        k = max(2, calls // 3) if name == LANGEVIN[0] else calls
        runs = {"xla": lambda j=jitted, a=args: jax.block_until_ready(j(*a)),
                "machine": lambda i=machine, a=flat: i.run(a),
                "on": lambda i=on, a=flat: i.run(a), "off": lambda i=off, a=flat: i.run(a)}
        best = dict.fromkeys(runs, float("inf"))
        for _ in range(rounds):
            for column, fn in runs.items():
                best[column] = min(best[column], best_of(k, fn)[0])
        if name != LANGEVIN[0]:
            for column in ratios:
                ratios[column].append(best[column] / best["xla"])
        print(f"{name:22} {best['xla'] * 1e6:9.1f} {best['machine'] * 1e6:9.1f} {best['machine'] / best['xla']:7.2f}x "
              f"{best['on'] * 1e6:9.1f} {best['on'] / best['xla']:7.2f}x "
              f"{best['off'] * 1e6:15.1f} {best['off'] / best['xla']:7.2f}x", flush=True)
    if ratios["on"]:
        print(f"median of {len(ratios['on'])} programs (Langevin apart): {np.median(ratios['machine']):.2f}x with "
              f"machine-code loops, {np.median(ratios['on']):.2f}x with Python ones, without per-element code "
              f"{np.median(ratios['off']):.2f}x")
    print(f"load average after: {load_average()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--corpus", action="store_true")
    parser.add_argument("--calls", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    if args.corpus:
        corpus(args.calls, args.rounds, {w for w in args.only.split(",") if w})
        return
    n = args.iterations

    module, per_iteration = build_module(n)
    interp = Interpreter(module)  # compiles and binds once; the loop below is pure execution
    start = [np.asarray(0, np.int32), np.asarray(0.0, np.float32)]
    interp_time, (i, x) = best_of(args.repeat, lambda: interp.run(start))
    direct_time, (di, dx) = best_of(args.repeat, lambda: direct_numpy(n))
    kernels = kernels_only(interp, n)
    kernel_time = best_of(args.repeat, kernels)[0] if kernels is not None else None
    if int(i) != n or int(di) != n or float(x) != float(dx):
        raise SystemExit(f"results differ: interpreter ({i}, {x}), numpy ({di}, {dx})")

    numpy_calls = 4
    us_per_instruction = interp_time / (n * per_iteration) * 1e6
    us_per_numpy_call = direct_time / (n * numpy_calls) * 1e6
    print(f"while loop, {n} iterations, {per_iteration} instructions per iteration (best of {args.repeat})")
    print(f"  interpreter : {interp_time:8.3f} s  {interp_time / n * 1e6:7.2f} us/iteration  "
          f"{us_per_instruction:6.3f} us/instruction")
    print(f"  numpy direct: {direct_time:8.3f} s  {direct_time / n * 1e6:7.2f} us/iteration  "
          f"{us_per_numpy_call:6.3f} us/numpy call ({numpy_calls} per iteration)")
    if kernel_time is not None:
        print(f"  kernels only: {kernel_time:8.3f} s  {kernel_time / n * 1e6:7.2f} us/iteration  (the bound kernels "
              f"called by hand; interpreter dispatch = {(interp_time - kernel_time) / (n * per_iteration) * 1e6:.3f} "
              "us/instruction)")
    print(f"  ratio (interpreter / numpy, same loop): {interp_time / direct_time:.2f}x  (goal <= 3x)")


if __name__ == "__main__":
    main()
