"""Small JAX programs warm on replicas against XLA (`jax.jit` on CPU), same run.

A corpus of typical small programs (optimizer updates, attention, scans, linalg, random, small
SPMD steps; single-device and `shard_map` over 2 or 4 replicas) and one ~1,500-trip `fori_loop`
of small ops (a Langevin sampler drawing its noise with threefry), also as two independent chains,
one a replica. Each is jitted by JAX and by `rp.jax.jit` (threads and Ray backends), called until
warm, then timed as the best of `--calls` calls, the three interleaved round by round (the machine
is shared). A call's outputs are fetched
(`np.asarray`) on both sides. Also reported for single-device programs: the interpreter alone
(`Interpreter.run` on the compiled module: the per-instruction cost without any call path).

Goals (issue 30): median <= 2x XLA on threads, <= 3x on Ray; the 1,500-trip loop <= 20x.

    python bench/small_programs.py [--calls 5] [--rounds 3] [--only attention,adam] [--no-ray] [--verbose]
                                   [--compiled-loops auto|on|off]

On Ray the programs of one replica count share one job (its actors), as JAX's functions share the
devices: three jobs in all (1, 2 and 4 replicas), alive the whole run.

`--compiled-loops` sets `REPLICAS_COMPILED_LOOPS` (replicas' per-element loops as machine code):
`on` compiles a loop at its first call (the warm-up), so the timed calls run the machine code;
`auto`, the default, compiles once a loop's Python time would pay for it (a few calls of the
Langevin loop), in the background, so with few `--calls` some timed calls may still run Python.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from common import load_average  # noqa: E402
from small_corpus import CHAINS, LANGEVIN, PROGRAMS  # noqa: E402

import replicas as rp  # noqa: E402
from replicas.runtime.interpreter import Interpreter  # noqa: E402


def _fetch(out: Any) -> None:
    for leaf in jax.tree_util.tree_leaves(out):
        np.asarray(leaf)


def best(fn: Callable[[], Any], calls: int) -> float:
    t_best = float("inf")
    for _ in range(calls):
        t0 = time.perf_counter()
        _fetch(fn())
        t_best = min(t_best, time.perf_counter() - t0)
    return t_best


class Entry:
    """One program's callables: XLA, the interpreter alone (single device), threads, Ray."""

    def __init__(self, name: str, f: Callable[..., Any], args: list[Any], n: int, specs: Any,
                 backends: list[str]) -> None:
        self.name, self.n = name, n
        kw: dict[str, Any] = {}
        if n > 1:
            kw = {"num_replicas": n, "in_specs": specs[0], "out_specs": specs[1]}
            mesh = jax.sharding.Mesh(np.array(jax.devices()[:n]), ("x",))
            jf = jax.jit(_shard_map(f, mesh, specs[0], specs[1]))
        else:
            jf = jax.jit(f)
        self.xla = lambda: jf(*args)
        self.expected = [np.asarray(a) for a in jax.tree_util.tree_leaves(jf(*args))]
        self.calls: dict[str, Callable[[], Any]] = {"xla": self.xla}
        self.jitted: dict[str, Any] = {}  # backend -> its `rp.jax.jit` function
        self.errors: dict[str, str] = {}
        if n == 1:
            try:
                module = rp.jax.compile_jax(f, *args).module
                interp = Interpreter(module)
                flat = [np.asarray(a) for a in jax.tree_util.tree_leaves(list(args))]
                self.calls["interp"] = lambda: interp.run(flat)
            except Exception as e:  # noqa: BLE001 - a program replicas cannot run is reported, not fatal
                self.errors["interp"] = f"{type(e).__name__}: {e}"[:200]
        for backend in backends:
            try:
                rf = rp.jax.jit(f, backend=backend, **kw)
                got = [np.asarray(a) for a in jax.tree_util.tree_leaves(rf(*args))]
                for g, e in zip(got, self.expected):
                    if g.shape != e.shape or not np.allclose(g, e, rtol=1e-4, atol=1e-5, equal_nan=True):
                        raise AssertionError(f"result differs from XLA (max |d| {np.max(np.abs(g - e))})")
                self.calls[backend] = lambda rf=rf: rf(*args)
                self.jitted[backend] = rf
            except Exception as e:  # noqa: BLE001
                self.errors[backend] = f"{type(e).__name__}: {e}"[:200]


def _shard_map(f: Callable[..., Any], mesh: Any, in_specs: Any, out_specs: Any) -> Callable[..., Any]:
    try:
        from jax import shard_map
    except ImportError:
        from jax.experimental.shard_map import shard_map
    return shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs)  # as rp.jax.jit does


def measure(entries: list[Entry], calls: int, rounds: int, warm: float = 0.0) -> dict[str, dict[str, float]]:
    """Per program, per column: the best call over all rounds (columns interleaved per round), after
    one warm-up call per column, or calls for `warm` seconds (a loop compiled once it has run a while)."""
    times: dict[str, dict[str, float]] = {e.name: {} for e in entries}
    for e in entries:
        for fn in e.calls.values():
            start = time.perf_counter()
            _fetch(fn())
            while time.perf_counter() - start < warm:
                _fetch(fn())
    for _ in range(rounds):
        for e in entries:
            for column, fn in e.calls.items():
                t = best(fn, calls)
                times[e.name][column] = min(times[e.name].get(column, t), t)
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--only", default="")
    p.add_argument("--no-ray", action="store_true")
    p.add_argument("--no-loop", action="store_true")
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--compiled-loops", choices=["auto", "on", "off"], default=None)
    ns = p.parse_args()
    if ns.compiled_loops:  # before any loop is bound, and before Ray starts (its actors inherit it)
        os.environ["REPLICAS_COMPILED_LOOPS"] = ns.compiled_loops
    backends = ["threads"] + ([] if ns.no_ray else ["ray"])
    wanted = {w for w in ns.only.split(",") if w}
    programs = [(name, *rest) for name, *rest in PROGRAMS if not wanted or name in wanted]
    print(f"load average before: {load_average()}; {len(programs)} programs; backends {', '.join(backends)}; "
          f"compiled loops {os.environ.get('REPLICAS_COMPILED_LOOPS', 'auto')}")
    entries = [Entry(name, f, args, n, specs, backends) for name, f, args, n, specs in programs]
    times = measure(entries, ns.calls, ns.rounds)
    columns = ["interp", *backends]
    ratios: dict[str, dict[str, float]] = {c: {} for c in columns}
    if ns.verbose:
        print(f"{'program':24} {'n':>2} {'xla us':>9}" + "".join(f" {c + ' x':>10}" for c in columns))
    for e in entries:
        t = times[e.name]
        row = f"{e.name:24} {e.n:>2} {t['xla'] * 1e6:9.1f}"
        for c in columns:
            if c in t:
                ratios[c][e.name] = t[c] / t["xla"]
                row += f" {ratios[c][e.name]:9.2f}x"
            else:
                row += f" {'-':>10}"
        if ns.verbose:
            print(row)
    for e in entries:
        for c, err in e.errors.items():
            print(f"  {e.name} on {c}: {err}")
    print(f"\n{'column':8} {'programs':>8} {'median':>8} {'worst':>22}")
    for c in columns:
        r = ratios[c]
        if r:
            worst = max(r, key=r.get)
            print(f"{c:8} {len(r):>8} {np.median(list(r.values())):7.2f}x {r[worst]:8.1f}x ({worst})")
    for name, f, args, n, specs in [] if ns.no_loop else [LANGEVIN, CHAINS]:
        start = time.perf_counter()
        loop = Entry(name, f, args, n, specs, backends)
        print(f"{name}: compiled and first calls {time.perf_counter() - start:.1f} s")
        # Warm as a sampler that runs on: replicas compile a loop after a few calls (`ops/machine`).
        t = measure([loop], max(2, ns.calls // 2), ns.rounds, warm=2.0)[name]
        text = ", ".join(f"{c} {t[c] / t['xla']:.1f}x" for c in columns if c in t)
        from replicas.ops.machine.loops import compiled_loops

        print(f"{name}: xla {t['xla'] * 1e3:.2f} ms; {text} ({compiled_loops()} loops as machine code in this "
              "process)")
        for c, err in loop.errors.items():
            print(f"  {name} on {c}: {err}")
    print(f"load average after: {load_average()}")
    if not ns.no_ray:
        import ray

        ray.shutdown()


if __name__ == "__main__":
    main()
