"""The fixed cost of a warm `rp.run`: a trivial program (one add) run again and again.

Anchors measured in the same run:
- threads: a direct in-process call of the program's compiled and bound interpreter
  (`Interpreter.run`), the floor of what any `rp.run` must do (goal: warm `rp.run` <= 5x it);
- Ray: a raw Ray actor round trip (`ray.get(actor.echo.remote(x))` of the same argument), the
  floor of any job that ships arguments to an actor and a result back (goal: <= 3 of them).

And the warm call of `rp.jax.jit` (a persistent job, runtime/session.py) at `--jit-replicas`
(default 4) replicas, its arguments resident (`rp.Array`s of the previous call):
- its fixed cost: the call less N direct calls of the per-device program (goals: threads <= 30 us,
  Ray <= 300 us);
- 1 MiB of host arguments that change every call (a new numpy array given to every replica), less
  the same call with that argument resident (goal on Ray: <= 1 ms extra);
- a resident 1 MiB output gathered by `np.asarray`, against a copy of 1 MiB; and passed to another
  jitted function (on Ray the same job: it stays where it is), and to one that takes it sharded (the
  actor cuts each replica's part), each less the same call given a host array.

Each number is the median of `--repeat` rounds of `--iterations` calls; the spread is min-max of
the rounds' medians. A call and its anchor alternate round by round (the machine is shared: load
changes within seconds), and the ratio is the median of the rounds' ratios, with their spread.
Load average is printed at the start and the end.

    python bench/warm_run.py [--iterations 200] [--repeat 5] [--replicas 1] [--jit-replicas 4] [--no-ray]
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


def median_per_call(fn: Callable[[], object], iterations: int) -> float:
    """The median seconds of one call over `iterations` calls (never 0: a call takes at least a
    microsecond, far above perf_counter's resolution)."""
    times = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def interleaved(call: Callable[[], object], anchor: Callable[[], object], iterations: tuple[int, int],
                repeat: int) -> tuple[list[float], list[float]]:
    """Per-round medians of `call` and `anchor` (`iterations` calls of each per round), alternating."""
    call(), anchor()
    calls, anchors = [], []
    for _ in range(repeat):
        calls.append(median_per_call(call, iterations[0]))
        anchors.append(median_per_call(anchor, iterations[1]))
    return calls, anchors


def fmt(rounds: list[float]) -> str:
    return f"{np.median(rounds) * 1e6:9.1f} us  ({min(rounds) * 1e6:.1f}-{max(rounds) * 1e6:.1f})"


def ratio(calls: list[float], anchors: list[float]) -> str:
    ratios = [c / a for c, a in zip(calls, anchors)]
    return f"{np.median(ratios):5.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=200)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--no-ray", action="store_true")
    p.add_argument("--jit-replicas", type=int, default=4, help="0: no rp.jax.jit rows")
    ns = p.parse_args()
    module = rp.parse_hlo(TRIVIAL)
    x = np.arange(4, dtype=np.float32)
    args = [x, x]
    n = ns.replicas
    print(f"load average: {load_average()}; {n} replica(s)")

    interp = Interpreter(compile_module(module))
    threads, direct = interleaved(lambda: rp.run(module, args, num_replicas=n, backend="threads"),
                                  lambda: interp.run(args), (ns.iterations, ns.iterations * 10), ns.repeat)
    print(f"direct Interpreter.run        {fmt(direct)}")
    print(f"rp.run threads (warm)         {fmt(threads)}   {ratio(threads, direct)} direct (goal <= 5x)")
    if ns.jit_replicas:
        jit_rows(ns, "threads", None)
    if not ns.no_ray:
        import ray

        from replicas.runtime.ray.backend import ensure_ray

        ensure_ray()
        try:
            actor = ray_echo_actor()
            on_ray, trip = interleaved(lambda: rp.run(module, args, num_replicas=n),
                                       lambda: ray.get(actor.echo.remote(x)),
                                       (max(ns.iterations // 4, 10), ns.iterations), ns.repeat)
            print(f"raw Ray actor round trip      {fmt(trip)}")
            print(f"rp.run Ray (warm)             {fmt(on_ray)}   {ratio(on_ray, trip)} round trips (goal <= 3)")
            if ns.jit_replicas:
                jit_rows(ns, "ray", trip)
        finally:
            ray.shutdown()
    print(f"load average at the end: {load_average()}")


def jit_rows(ns: argparse.Namespace, backend: str, trip: list[float] | None) -> None:
    """The warm `rp.jax.jit` call with resident arguments, and with 1 MiB of changed host arguments."""
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    import jax
    from jax.sharding import PartitionSpec as P

    n = ns.jit_replicas
    add = rp.jax.jit(lambda a, b: a + b, num_replicas=n, in_specs=(P("x"), P("x")), out_specs=P("x"),
                     backend=backend)
    x = np.arange(4 * n, dtype=np.float32)
    held = [add(x, x)]

    def resident() -> None:
        held[0] = add(held[0], held[0])

    program = next(iter(add._cache.values())).program  # noqa: SLF001 - the per-device program, for the floor
    interp = Interpreter(compile_module(program.module))
    shard = [np.arange(4, dtype=np.float32)] * 2
    calls, direct = interleaved(resident, lambda: interp.run(shard), (ns.iterations, ns.iterations * 10), ns.repeat)
    fixed = [c - n * d for c, d in zip(calls, direct)]
    goal = "30 us" if backend == "threads" else "300 us"
    print(f"jit {backend:7} N={n} resident   {fmt(calls)}   fixed cost {fmt(fixed)} (goal <= {goal})"
          + (f"  {ratio(calls, trip)} round trips" if trip else ""))

    big = np.ones(1 << 18, np.float32)  # 1 MiB, the same for every replica
    use = rp.jax.jit(lambda w, a: (w, a + w[0]), num_replicas=n, in_specs=(P(), P("x")),
                     out_specs=(P(), P("x")), backend=backend)
    kept_w, _ = use(big, x)  # resident from now on: the same job's own output

    fresh_ones = [big + 0, big + 1]  # made beforehand: the user's own work is not measured

    def changed() -> None:
        fresh_ones.reverse()
        use(fresh_ones[0], x)  # another host array than the last call's

    def kept() -> None:
        use(kept_w, x)

    fresh, stay = interleaved(changed, kept, (max(ns.iterations // 4, 10), max(ns.iterations // 4, 10)), ns.repeat)
    extra = [f - k for f, k in zip(fresh, stay)]
    print(f"jit {backend:7} N={n} 1 MiB host {fmt(fresh)}   extra {fmt(extra)} over resident (goal <= 1 ms)")

    # A resident 1 MiB output gathered (`np.asarray`: each array once, it keeps its value), against
    # a copy of the same bytes; and passed to another jitted function, against the same call given
    # a host array.
    count = max(ns.iterations // 4, 10)

    def fresh_outputs() -> list[object]:  # (an array gathers once: each measured call takes a new one)
        return [use(kept_w, x)[0] for _ in range(count)]

    floor = np.empty_like(big)
    fetches, copies = [], []
    for _ in range(ns.repeat):
        outs = fresh_outputs()
        fetches.append(median_per_call(lambda outs=outs: np.asarray(outs.pop()), count))
        copies.append(median_per_call(lambda: np.copyto(floor, big), count))
    print(f"jit {backend:7} N={n} fetch 1 MiB {fmt(fetches)}   {ratio(fetches, copies)} a 1 MiB copy")
    # Passed to another function (the same placement), and to one that takes it sharded (compiled
    # for a host array: its in_specs decide), each against the same call given a host array.
    for label, spec in (("another fn's", P()), ("resharded", P("x"))):
        other = rp.jax.jit(lambda w: w[:1], num_replicas=n, in_specs=(spec,), out_specs=spec, backend=backend)
        other(big)

        def changed_other(other=other) -> None:
            fresh_ones.reverse()
            other(fresh_ones[0])

        passed, host = [], []
        for _ in range(ns.repeat):
            outs = fresh_outputs()
            passed.append(median_per_call(lambda outs=outs, other=other: other(outs.pop()), count))
            host.append(median_per_call(changed_other, count))
        extra = [a - h for a, h in zip(passed, host)]
        print(f"jit {backend:7} N={n} {label} 1 MiB {fmt(passed)}   extra {fmt(extra)} over a host array")
        other.close()
    add.close()
    use.close()
    del jax


if __name__ == "__main__":
    main()
