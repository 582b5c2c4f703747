"""Scale: a 1 KiB all-reduce in a While loop on N = 1024 ... 8192 replicas, next to JAX (a benchmark, never a test).

    python bench/scale.py [--replicas 1024,2048,4096,8192] [--backends threads,ray] [--skip-jax]
                          [--jax-max 2048] [--deadlock 8192] [--repeat 3] [--k2 40] [--memory-cap-gib 4]

Per all-reduce: the program runs the all-reduce K times in a While loop (K1 = 10 and K2 = 40,
`--k2`; K2 grown when the difference is too short to measure), and (T(K2) - T(K1)) / (K2 - K1)
cancels the job's start and stop; each (K1, K2) pair is repeated and the median ± half the spread
of the differences is shown, with "?" when the spread exceeds the median (unreliable); "per
replica" is the median over N (flat when the cost grows linearly). JAX runs the same loop
(shard_map + psum in a fori_loop) on N forced CPU devices, up to `--jax-max` (its CPU backend
refuses more devices than ~2048 in one process: "Multiprocess computations aren't
implemented"). Every configuration runs in
its own process (fresh memory, fresh Ray), whose peak RSS (driver + replica actors, sampled
every 0.1 s) is reported; a run whose RSS passes the memory cap is stopped and reported as such.
The deadlock row plants a deadlock (the last replica skips the loop's all-reduce and finishes)
and measures the time from the moment the last replica blocked (its flight recorder's
timestamp) to the DeadlockError.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The planted deadlock is the test catalog's (tests/buggy_programs.py).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

from buggy_programs import loop_the_last_replica_skips  # noqa: E402
from common import (  # noqa: E402 - the bench folder is not a package
    Timing,
    collective_program,
    load_average,
    per_iteration,
    ray_processes,
    rss_mib,
)

ELEMENTS = 256  # f32: 1 KiB per replica
K1 = 10

# -- memory ----------------------------------------------------------------------------------------------

def replica_actor_pids() -> list[int]:
    """Ray's ReplicaHost worker processes on this machine (this child's session is the only one it
    starts; others' sessions on a shared machine are told apart by the raylet's parent)."""
    return ray_processes()[1]


class PeakRss:
    """Samples driver + replica actors RSS every 0.1 s; calls `over_cap()` when the cap is passed."""

    def __init__(self, cap_mib: float, with_actors: bool) -> None:
        self.peak = 0.0
        self.cap = cap_mib
        self.with_actors = with_actors
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            total = rss_mib()
            if self.with_actors:
                total += sum(rss_mib(p) for p in replica_actor_pids())
            self.peak = max(self.peak, total)
            if total > self.cap:
                print(json.dumps({"error": f"over the memory cap: {total:.0f} MiB"}), flush=True)
                os._exit(3)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak


# -- children (one configuration each) --------------------------------------------------------------------

def child_replicas(n: int, backend: str, repeat: int, cap_mib: float, k2: int) -> dict:
    import numpy as np

    import replicas as rp

    monitor = PeakRss(cap_mib, backend == "ray")
    module = collective_program("all-reduce", ELEMENTS, n)
    x = np.ones(ELEMENTS, np.float32)

    def run(k: int) -> float:
        t0 = time.perf_counter()
        out = rp.run(module, [x, np.asarray(k, np.int32)], num_replicas=n, backend=backend, timeout=900)
        took = time.perf_counter() - t0
        with np.errstate(over="ignore"):  # ones summed k times: inf once f32 overflows, as in XLA
            want = np.float32(n) ** np.float32(k)
        assert out[-1][0] == want, f"wrong result {out[-1][0]} != {want}"
        return took

    t0 = time.perf_counter()
    run(1)  # Ray start, actors, first binding
    first = time.perf_counter() - t0
    per = per_iteration(run, K1, k2, repeat).samples
    peak = monitor.stop()
    if backend == "ray":
        import ray

        ray.shutdown()
    return {"per_op": per, "peak_rss_mib": peak, "first_run_s": first}


def child_jax(n: int, repeat: int, k2: int) -> dict:
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={n}"
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:n]), ("r",))

    def local(x, k):
        return lax.fori_loop(0, k[0], lambda i, v: lax.psum(v, "r"), x)

    fn = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P("r"), P("r")), out_specs=P("r"), check_vma=False))
    x = jax.device_put(jnp.ones(ELEMENTS * n, jnp.float32), NamedSharding(mesh, P("r")))

    def run(k: int) -> float:
        ks = jax.device_put(jnp.full((n,), k, jnp.int32), NamedSharding(mesh, P("r")))
        t0 = time.perf_counter()
        fn(x, ks).block_until_ready()
        return time.perf_counter() - t0

    run(1)  # compiles (k is data)
    return {"per_op": per_iteration(run, K1, k2, repeat).samples, "jax": jax.__version__}


def child_deadlock(n: int, backend: str, cap_mib: float) -> dict:
    import numpy as np

    import replicas as rp

    monitor = PeakRss(cap_mib, backend == "ray")
    module = rp.parse_hlo(loop_the_last_replica_skips(n, elements=ELEMENTS, trips=10))
    try:
        rp.run(module, [np.ones(256, np.float32)], num_replicas=n, backend=backend, timeout=900)
        raise SystemExit("the planted deadlock was not reported")
    except rp.DeadlockError as e:
        raised_us = time.time_ns() / 1000
        report = e.report
        first_line = str(e).splitlines()[0][:160]
    starts = [ev["start_us"] for evs in report.events.values() for ev in evs if ev.get("kind") == "collective"]
    blocked = [s.replica for s in report.states if s.status == "blocked"]
    peak = monitor.stop()
    if backend == "ray":
        import ray

        ray.shutdown()
    return {"detect_s": (raised_us - max(starts)) / 1e6, "blocked": len(blocked), "peak_rss_mib": peak,
            "first_line": first_line}


# -- the driver -------------------------------------------------------------------------------------------

def spawn(args: list[str], timeout: float) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-2:])
        return {"error": f"exit {proc.returncode}: {tail[-300:]}"}
    return json.loads(lines[-1])


def cell(result: dict, jax_per_op: float | None = None, n: int | None = None) -> str:
    if "error" in result:
        return result["error"][:40]
    timing = Timing(result["per_op"])
    text = timing.text()
    if jax_per_op and timing.median > 0:
        text += f" ({timing.median / jax_per_op:.2f}x)"
    if n:
        text += f" {timing.median / n * 1e6:.1f} us/replica"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", default="1024,2048,4096,8192")
    parser.add_argument("--backends", default="threads,ray")
    parser.add_argument("--skip-jax", action="store_true")
    parser.add_argument("--jax-max", type=int, default=2048, help="the largest N the JAX anchor runs")
    parser.add_argument("--deadlock", type=int, default=8192, help="0 to skip the planted deadlock")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--k2", type=int, default=40, help="the longer loop's trips (K1 = 10)")
    parser.add_argument("--memory-cap-gib", type=float, default=4.0)
    parser.add_argument("--timeout", type=float, default=1200, help="per configuration, seconds")
    parser.add_argument("--child", choices=["replicas", "jax", "deadlock"], help=argparse.SUPPRESS)
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    a = parser.parse_args()
    cap = a.memory_cap_gib * 1024
    if a.child == "replicas":
        print(json.dumps(child_replicas(a.n, a.backend, a.repeat, cap, a.k2)), flush=True)
        return
    if a.child == "jax":
        print(json.dumps(child_jax(a.n, a.repeat, a.k2)), flush=True)
        return
    if a.child == "deadlock":
        print(json.dumps(child_deadlock(a.n, a.backend, cap)), flush=True)
        return
    backends = a.backends.split(",")
    print(f"# scale: 1 KiB all-reduce in a While loop, per all-reduce = (T(K2) - T({K1})) / (K2 - {K1}), "
          f"median ± half the spread of {a.repeat}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{os.cpu_count()} cores, load average at start {load_average()}", flush=True)
    head = f"{'N':>5} {'JAX':>26}" + "".join(f" {'replicas ' + b:>52}" for b in backends) \
        + "".join(f" {'peak RSS ' + b:>16}" for b in backends)
    print(head)
    print("-" * len(head), flush=True)
    for n in (int(v) for v in a.replicas.split(",")):
        jax = None
        if not a.skip_jax and n <= a.jax_max:
            jax = spawn(["--child", "jax", "--n", str(n), "--repeat", str(a.repeat), "--k2", str(a.k2)], a.timeout)
        jax_med = Timing(jax["per_op"]).median if jax and "per_op" in jax else None
        rows = {}
        for b in backends:  # one at a time: a large N on both backends at once would share the memory cap
            rows[b] = spawn(["--child", "replicas", "--backend", b, "--n", str(n), "--repeat", str(a.repeat),
                             "--memory-cap-gib", str(a.memory_cap_gib), "--k2", str(a.k2)], a.timeout)
        line = f"{n:>5} {cell(jax) if jax else '-':>26}" + "".join(f" {cell(rows[b], jax_med, n):>52}"
                                                                   for b in backends)
        line += "".join(f" {rows[b].get('peak_rss_mib', float('nan')):>12.0f} MiB" for b in backends)
        print(line, flush=True)
    if a.deadlock:
        for b in backends:
            d = spawn(["--child", "deadlock", "--backend", b, "--n", str(a.deadlock),
                       "--memory-cap-gib", str(a.memory_cap_gib)], a.timeout)
            if "error" in d:
                print(f"deadlock at N={a.deadlock} ({b}): {d['error']}")
            else:
                print(f"deadlock at N={a.deadlock} ({b}): detected {d['detect_s']:.2f} s after the last replica "
                      f"blocked ({d['blocked']} blocked; peak RSS {d['peak_rss_mib']:.0f} MiB): {d['first_line']}")
    if not a.skip_jax and any(int(v) > a.jax_max for v in a.replicas.split(",")):
        print(f"(JAX: no anchor above N={a.jax_max}: its CPU backend refuses more devices in one process)")
    print(f"(load average at end {load_average()})")


if __name__ == "__main__":
    main()
