"""Collectives on N replicas next to anchors measured in the same run (a benchmark, never a test).

    python bench/collectives.py [--replicas 4] [--sizes 4KiB,1MiB,16MiB,64MiB] [--ops all-reduce,...]
                                [--backend ray|threads|both] [--packing 1,2] [--skip jax,mpi,gloo,naive]
                                [--repeat 3] [--rounds 1] [--json out.json]
    python bench/collectives.py --memory [--iterations 10000]     # leak check under Ray
    python bench/collectives.py --startup 32                       # start time of 32 replicas only

Rows: op x per-replica input buffer (f32). Columns: replicas (the op K times in a While loop,
differenced), JAX (jit(shard_map) on N forced CPU devices, same looping), MPI (mpi4py under
`mpiexec -n N`), torch gloo (N processes), naive Ray (N actors ray.put their piece, each ray.gets
the others' and combines; driven round by round), raw Ray actor round trip of the buffer, and the
memory floor (np.copyto of the buffer). ratio = replicas / best peer (JAX, MPI, gloo, naive Ray).
See bench/README.md for the goals and the measured numbers.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import (  # noqa: E402 - the bench folder is not a package
    BENCH_DIR,
    OPS,
    NaiveRay,
    Timing,
    collective_program,
    fmt_time,
    iterations_for,
    load_average,
    memory_floor,
    mpi_anchor,
    parse_size,
    per_iteration,
    ray_echo_actor,
    ray_processes,
    ray_round_trip,
    rss_mib,
    run_json_subprocess,
    run_loop,
    size_label,
)
from crosscore import Gauge, open_gauge  # noqa: E402

import replicas as rp  # noqa: E402

PEERS = ("jax", "mpi", "gloo", "naive-ray")
TRIVIAL = """\
HloModule trivial, replica_count={n}

ENTRY main {{
  id = u32[] replica-id()
  ROOT out = u32[] add(id, id)
}}
"""


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- replicas ------------------------------------------------------------------------------------------

def parse_config(config: str) -> tuple[str, int | None]:
    """`ray`, `ray/2` (2 replicas per actor) or `threads` -> (backend, replicas per actor or None)."""
    backend, _, per = config.partition("/")
    return backend, int(per) if per else None


def warm_up(n: int, config: str) -> None:
    m = collective_program("all-reduce", 1024, n)
    for _ in range(2):
        run_loop(m, np.ones(1024, np.float32), 2, n, *parse_config(config))


def time_replicas(op: str, nbytes: int, n: int, config: str, repeat: int) -> Timing:
    elements = nbytes // 4
    # The loop's last result stays in the replicas (one element returns): see `collective_program`.
    module = collective_program(op, elements, n, result_elements=1)
    x = np.ones(elements, np.float32)
    k1, k2 = iterations_for(nbytes)
    return per_iteration(lambda k: run_loop(module, x, k, n, *parse_config(config)), k1, k2, repeat)


# -- startup -------------------------------------------------------------------------------------------

def startup_child(n: int) -> None:
    """In a fresh process: Ray start, then a trivial program on n replicas with a cold and a warm pool."""
    from replicas.runtime.ray.backend import ensure_ray

    module = rp.parse_hlo(TRIVIAL.format(n=n))
    t0 = time.perf_counter()
    ensure_ray()
    ray_init = time.perf_counter() - t0
    t0 = time.perf_counter()
    rp.run(module, num_replicas=n, timeout=600)
    cold = time.perf_counter() - t0
    warm = []
    for _ in range(3):
        t0 = time.perf_counter()
        rp.run(module, num_replicas=n, timeout=600)
        warm.append(time.perf_counter() - t0)
    print(json.dumps({"replicas": n, "ray_init": ray_init, "cold": cold, "warm": float(np.median(warm))}))


def measure_startup(n: int) -> tuple[dict | None, str]:
    return run_json_subprocess([sys.executable, os.path.abspath(__file__), "--startup-child", str(n)], 900)


# -- memory (leak check) -------------------------------------------------------------------------------

def memory_mode(n: int, iterations: int, large_iterations: int = 300) -> None:
    warm_up(n, "ray")
    module = collective_program("all-reduce", 1024, n)  # 4 KiB per replica
    x = np.ones(1024, np.float32)

    def snapshot() -> dict:
        raylet, actors = ray_processes()
        return {"driver_rss_mib": rss_mib(), "raylet_rss_mib": rss_mib(raylet) if raylet else float("nan"),
                "actors_rss_mib": sum(rss_mib(p) for p in actors),
                "actors_anon_mib": sum(rss_mib(p, "RssAnon") for p in actors), "actors": len(actors)}

    run_loop(module, x, 100, n, "ray")
    before = snapshot()
    t0 = time.perf_counter()
    run_loop(module, x, iterations, n, "ray")
    took = time.perf_counter() - t0
    middle = snapshot()
    run_loop(module, x, iterations, n, "ray")
    after = snapshot()
    print(f"{iterations} all-reduces of 4 KiB on {n} replicas in one While loop: {took:.1f} s "
          f"({took / iterations * 1e6:.0f} us each); load average {load_average()}")
    print(f"{'':24}{'before':>12}{'after run 1':>14}{'after run 2':>14}   (each run: {iterations})")
    for key in ("driver_rss_mib", "raylet_rss_mib", "actors_rss_mib", "actors_anon_mib"):
        print(f"{key:24}{before[key]:12.1f}{middle[key]:14.1f}{after[key]:14.1f}")
    print(f"(actor processes alive: {after['actors']}; flat from run 1 to run 2 = no leak)")
    # Large collectives take the same-node shared-memory path (replicas/transport/shm.py).
    large = collective_program("all-reduce", 1 << 20, n)  # 4 MiB per replica
    y = np.ones(1 << 20, np.float32)
    rounds = [snapshot()]
    for _ in range(2):
        run_loop(large, y, large_iterations, n, "ray")
        rounds.append(snapshot())
    print(f"then {large_iterations} all-reduces of 4 MiB, twice:")
    for key in ("driver_rss_mib", "raylet_rss_mib", "actors_rss_mib", "actors_anon_mib"):
        print(f"{key:24}" + "".join(f"{r[key]:14.1f}" for r in rounds))
    print("(raylet RSS includes the object store's touched shared-memory pages; the Ray here has no grpc "
          "module for `ray memory`)")


# -- the table -----------------------------------------------------------------------------------------

def run_anchors(args: argparse.Namespace, ops: list[str], sizes: list[int]) -> dict[str, dict]:
    """{anchor: {op: {size: seconds}}} for the subprocess anchors; messages printed."""
    out: dict[str, dict] = {}
    size_arg = ",".join(str(s) for s in sizes)
    if "jax" not in args.skip:
        log("JAX anchor")
        data, msg = run_json_subprocess([sys.executable, os.path.join(BENCH_DIR, "anchors_jax.py"),
                                         "--replicas", str(args.replicas), "--ops", ",".join(ops),
                                         "--sizes", size_arg, "--repeat", str(args.repeat)], 900)
        print(f"jax: {msg}" + (f" (jax {data['jax']})" if data else ""))
        out["jax"] = data["results"] if data else {}
        out["jax-samples"] = data.get("samples", {}) if data else {}
    if "mpi" not in args.skip:
        log("MPI anchor")
        data, msg = mpi_anchor(ops, sizes, args.replicas, 900)
        print(f"mpi: {msg}" + (f" ({data['mpi']})" if data else ""))
        out["mpi"] = data["results"] if data else {}
    if "gloo" not in args.skip:
        log("gloo anchor")
        if importlib.util.find_spec("torch") is None:
            data, msg = None, "skipped (not installed)"
        else:
            data, msg = run_json_subprocess([sys.executable, os.path.join(BENCH_DIR, "anchors_gloo.py"),
                                             "--replicas", str(args.replicas), "--ops", ",".join(ops),
                                             "--sizes", size_arg], 900)
        print(f"gloo: {msg}" + (f" (torch {data['torch']}; unsupported: {data['errors']})" if data else ""))
        out["gloo"] = data["results"] if data else {}
    return out


def table(args: argparse.Namespace) -> None:
    ops = args.ops.split(",")
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    n = args.replicas
    backends = ["ray", "threads"] if args.backend == "both" else [args.backend]
    if args.packing:  # one column per packing of the Ray actors
        backends = [c for b in backends for c in ([f"ray/{p}" for p in args.packing] if b == "ray" else [b])]
    print(f"# replicas collectives, {n} replicas, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{os.cpu_count()} cores, load average at start {load_average()}")
    gauge = open_gauge()  # forked before Ray's threads
    floors = {s: memory_floor(s) for s in sizes}
    rounds = []
    round_trip: dict[int, float] = {}
    for r in range(args.rounds):
        if args.rounds > 1:
            log(f"round {r + 1} of {args.rounds}")
        rounds.append(measure_round(args, ops, sizes, backends, floors, gauge, round_trip))
    if gauge is not None:
        gauge.close()
    rows = pooled(rounds, backends)
    startup = None
    if args.startup_replicas:
        log(f"start time of {args.startup_replicas} replicas (fresh Ray in a subprocess)")
        startup, msg = measure_startup(args.startup_replicas)
        if startup is None:
            print(f"startup: {msg}")
    print_table(rows, backends, n, startup, args.rounds)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "startup": startup, "load_average_end": load_average()}, f, indent=1,
                      default=lambda t: {"median": t.median, "spread": t.spread, "samples": t.samples})


def gauge_reading(gauge: Gauge | None) -> float | None:
    return None if gauge is None else gauge.read()


def start_ray(n: int, sizes: list[int], backends: list[str]) -> dict[int, float]:
    """Ray started and the backends warm; one raw Ray actor round trip per size."""
    from replicas.runtime.ray.backend import ensure_ray

    log("Ray start and warm-up")
    ensure_ray()
    if any(b.startswith("ray") for b in backends):
        from replicas.runtime.ray.placement import default_packing

        print(f"packing: `ray` = the default, {default_packing(n)} replica(s) per actor here; "
              f"`ray/k` = k replicas per actor")
    for b in backends:
        warm_up(n, b)
    echo = ray_echo_actor()
    return {s: ray_round_trip(echo, s, 50 if s <= (1 << 20) else 5) for s in sizes}


def measure_round(args: argparse.Namespace, ops: list[str], sizes: list[int], backends: list[str],
                  floors: dict[int, float], gauge: Gauge | None, round_trip: dict[int, float]) -> list[dict]:
    """One round: the anchors, then every row of the replicas; a row's `gauge` holds the cross-core
    gauge's readings around it (`crosscore.py`), `anchors-gauge` those around the anchors. The first
    round starts Ray and fills `round_trip` (raw Ray round trips by size) for the others."""
    n = args.replicas
    before = gauge_reading(gauge)
    anchors = run_anchors(args, ops, sizes)
    anchors_gauge = [g for g in (before, gauge_reading(gauge)) if g is not None]

    if not round_trip:  # the first round (after its anchors, on a machine without Ray yet)
        round_trip.update(start_ray(n, sizes, backends))
    naive = NaiveRay(n) if "naive" not in args.skip else None
    rows = []
    for op in ops:
        for s in sizes:
            row = {"op": op, "bytes": s, "floor": floors[s], "round_trip": round_trip[s],
                   "anchors-gauge": anchors_gauge}
            readings = [gauge_reading(gauge)]
            for b in backends:
                log(f"replicas[{b}] {op} {size_label(s)}")
                row[f"replicas-{b}"] = time_replicas(op, s, n, b, args.repeat)
                readings.append(gauge_reading(gauge))
            row["gauge"] = [g for g in readings if g is not None]
            for name in ("jax", "mpi", "gloo"):
                value = anchors.get(name, {}).get(op, {}).get(str(s))
                samples = anchors.get(name + "-samples", {}).get(op, {}).get(str(s))
                row[name] = Timing(samples) if samples else Timing([value]) if value is not None else None
            if naive is not None:
                log(f"naive Ray {op} {size_label(s)}")
                row["naive-ray"] = Timing([naive.time_op(op, s, 20 if s <= (1 << 20) else 3)])
            rows.append(row)
    if naive is not None:
        naive.close()
    return rows


def pooled(rounds: list[list[dict]], backends: list[str]) -> list[dict]:
    """The rounds' rows as one: every timed cell's samples together (its median is over all rounds),
    the gauge's readings together."""
    rows = []
    for same in zip(*rounds):
        row = dict(same[0])
        for key in [f"replicas-{b}" for b in backends] + list(PEERS):
            timings = [r[key] for r in same if isinstance(r.get(key), Timing)]
            row[key] = Timing([x for t in timings for x in t.samples]) if timings else None
        for key in ("gauge", "anchors-gauge"):
            row[key] = [g for r in same for g in r[key]]
        rows.append(row)
    return rows


def seconds(value: Timing | float | None) -> float | None:
    return value.median if isinstance(value, Timing) else value


def cell(value: Timing | float | None) -> str:
    return value.text() if isinstance(value, Timing) else fmt_time(value)


def print_table(rows: list[dict], backends: list[str], n: int, startup: dict | None, rounds: int = 1) -> None:
    """Times per op: median ±half the spread of the repetitions (of every round), `?` where the
    spread exceeds the median (unreliable: the machine was busier than the op is long). One ratio per
    replicas column. `gauge`: the slowest cross-core gauge reading around the row, `!` when over twice
    the run's median reading (a slow period of the machine, bench/crosscore.py)."""
    cols = [f"replicas-{b}" for b in backends] + list(PEERS) + ["round_trip", "floor"]
    head = (f"{'op':20}{'size':>9}" + "".join(f"{c:>24}" for c in cols)
            + "".join(f"{'ratio ' + b:>14}" for b in backends) + f"{'best peer':>11}{'gauge':>10}")
    readings = [g for row in rows for g in row["gauge"] + row["anchors-gauge"]]
    usual = float(np.median(readings)) if readings else None
    print()
    print(head)
    print("-" * len(head))
    for row in rows:
        # A peer whose differenced time came out at or below zero measured nothing: no ratio against it.
        peers = {p: seconds(row.get(p)) for p in PEERS if (seconds(row.get(p)) or 0) > 0}
        best = min(peers, key=peers.get) if peers else None
        ratios = []
        for b in backends:
            timing = row[f"replicas-{b}"]
            ratio = f"{timing.median / peers[best]:.1f}x" if best and timing.median > 0 else "-"
            ratios.append(ratio + ("?" if best and timing.unreliable else ""))
        slowest = max(row["gauge"], default=None)
        mark = "!" if slowest is not None and slowest > 2 * usual else " "
        print(f"{row['op']:20}{size_label(row['bytes']):>9}" + "".join(f"{cell(row.get(c)):>24}" for c in cols)
              + "".join(f"{r:>14}" for r in ratios) + f"{best or '-':>11}{fmt_time(slowest):>9}{mark}")
    print(f"(load average at end {load_average()}; ± is half the spread of the repetitions"
          f"{f' of {rounds} rounds' if rounds > 1 else ''}, ? marks a spread larger than the median; "
          f"gauge: the slowest cross-core reading around the row, ! over twice the median reading)")
    anchors = sorted(g for g in rows[0]["anchors-gauge"]) if rows else []
    if anchors:
        print(f"cross-core gauge around the anchors: {', '.join(fmt_time(g) for g in anchors)}; "
              f"the median reading of the run {fmt_time(usual)}")
    print()
    for row in rows:
        main = seconds(row[f"replicas-{backends[0]}"])
        if row["op"] == "all-reduce" and row["bytes"] == 64 << 20:
            print(f"64 MiB all-reduce / memory floor (np.copyto of 64 MiB, {fmt_time(row['floor'])}): "
                  f"{main / row['floor']:.1f}x (goal <= 4x)")
        if row["op"] == "all-reduce" and row["bytes"] == 4096:
            mpi = seconds(row.get("mpi"))
            versus = f"; vs MPI {fmt_time(mpi)}: {main / mpi:.1f}x (goal <= 3x)" if mpi else ""
            print(f"4 KiB all-reduce {fmt_time(main)} vs one raw Ray actor round trip {fmt_time(row['round_trip'])}: "
                  f"{main / row['round_trip']:.1f}x{versus}")
    if startup:
        print(f"start of {startup['replicas']} replicas (trivial program): Ray init {startup['ray_init']:.1f} s, "
              f"cold pool {startup['cold']:.1f} s, warm pool {startup['warm']:.2f} s (goal < 10 s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--sizes", default="4KiB,1MiB,16MiB,64MiB")
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--backend", choices=["ray", "threads", "both"], default="ray")
    parser.add_argument("--packing", default="", help="Ray replicas per actor, one column each (e.g. 1,2); "
                        "default: the runtime's default packing")
    parser.add_argument("--skip", default="", help="anchors to leave out: jax,mpi,gloo,naive")
    parser.add_argument("--startup-replicas", type=int, default=32, help="0 to skip the start-time measurement")
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument("--repeat", type=int, default=3, help="differenced measurements per cell (median shown)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="measure the anchors and the replicas' rows this many times in turn (a cell's "
                        "median is over every round: a slow period of the machine then hits every column alike)")
    parser.add_argument("--memory", action="store_true", help="leak check: many small all-reduces under Ray")
    parser.add_argument("--iterations", type=int, default=10_000)
    parser.add_argument("--startup", type=int, help="only measure the start time of this many replicas")
    parser.add_argument("--startup-child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.skip = set(filter(None, args.skip.split(",")))
    args.packing = [int(p) for p in args.packing.split(",") if p]
    if args.rounds < 1 or args.repeat < 1:
        parser.error("--rounds and --repeat take a number of at least 1")
    for op in args.ops.split(","):
        if op not in OPS:
            parser.error(f"unknown op {op!r}; choose from {', '.join(OPS)}")
    if args.startup_child:
        startup_child(args.startup_child)
    elif args.startup:
        data, msg = measure_startup(args.startup)
        print(json.dumps(data) if data else msg)
    elif args.memory:
        memory_mode(args.replicas, args.iterations)
    else:
        table(args)


if __name__ == "__main__":
    main()
