"""The fixed cost of a warm `rp.run`: a trivial program (one add) run again and again.

Anchors measured in the same run:
- threads: a direct in-process call of the program's compiled and bound interpreter
  (`Interpreter.run`), the floor of what any `rp.run` must do (goal: warm `rp.run` <= 5x it);
- Ray: a raw Ray actor round trip (`ray.get(actor.echo.remote(x))` of the same argument), the
  floor of any job that ships arguments to an actor and a result back (goal: <= 3 of them).

Each number is the median of `--repeat` rounds of `--iterations` calls; the spread is min-max of
the rounds' medians. Load average is printed: the machine is shared.

    python bench/warm_run.py [--iterations 200] [--repeat 5] [--replicas 1] [--no-ray]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import load_average, ray_echo_actor  # noqa: E402

import replicas as rp  # noqa: E402
from replicas.runtime.compile import compile_module  # noqa: E402
from replicas.runtime.interpreter import Interpreter  # noqa: E402

TRIVIAL = """HloModule trivial
ENTRY main {
  x = f32[4] parameter(0)
  y = f32[4] parameter(1)
  ROOT s = f32[4] add(x, y)
}
"""


def per_call(fn: Callable[[], object], iterations: int, repeat: int) -> tuple[float, float, float]:
    """(median, min, max) over `repeat` rounds of the median seconds per call."""
    fn()
    rounds = []
    for _ in range(repeat):
        times = []
        for _ in range(iterations):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        rounds.append(float(np.median(times)))
    return float(np.median(rounds)), min(rounds), max(rounds)


def fmt(t: tuple[float, float, float]) -> str:
    return f"{t[0] * 1e6:9.1f} us  ({t[1] * 1e6:.1f}-{t[2] * 1e6:.1f})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=200)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--no-ray", action="store_true")
    ns = p.parse_args()
    module = rp.parse_hlo(TRIVIAL)
    x = np.arange(4, dtype=np.float32)
    args = [x, x]
    n = ns.replicas
    print(f"load average: {load_average()}; {n} replica(s)")

    interp = Interpreter(compile_module(module))
    direct = per_call(lambda: interp.run(args), ns.iterations * 10, ns.repeat)
    threads = per_call(lambda: rp.run(module, args, num_replicas=n, backend="threads"), ns.iterations, ns.repeat)
    print(f"direct Interpreter.run        {fmt(direct)}")
    print(f"rp.run threads (warm)         {fmt(threads)}   {threads[0] / direct[0]:6.1f}x direct (goal <= 5x)")
    if ns.no_ray:
        return
    import ray

    from replicas.runtime.ray_backend import ensure_ray

    ensure_ray()
    try:
        actor = ray_echo_actor()
        trip = per_call(lambda: ray.get(actor.echo.remote(x)), ns.iterations, ns.repeat)
        on_ray = per_call(lambda: rp.run(module, args, num_replicas=n), max(ns.iterations // 4, 10), ns.repeat)
        print(f"raw Ray actor round trip      {fmt(trip)}")
        print(f"rp.run Ray (warm)             {fmt(on_ray)}   {on_ray[0] / trip[0]:6.1f} round trips (goal <= 3)")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
