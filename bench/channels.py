"""Send/Recv between two replicas next to anchors measured in the same run (a benchmark, never a test).

    python bench/channels.py [--sizes 4KiB,1MiB,64MiB] [--backend ray|threads|both] [--skip mpi]
                             [--repeats 5] [--budget 1.0]

One program, two replicas: a While loop whose body sends the buffer 0 -> 1 on channel 1 and
back 1 -> 0 on channel 2 (routes by `_xla_send_recv_source_target_pairs`); replica 0's next
buffer is what came back, so every iteration is one full round trip. Per-iteration time by
differencing two loop lengths, the longer one grown until the difference is ~`--budget` seconds
(`loop_length`); `--repeats` samples per cell, median and [min-max] shown, UNRELIABLE when the
spread exceeds the median. Anchors, interleaved with the replicas' samples: MPI Send/Recv
ping-pong (mpi4py under `mpiexec -n 2`, one batch per sample) and a raw Ray actor round trip of the
same buffer. Latency is the 4 KiB row; bandwidth the 64 MiB row (2 x bytes per round trip / time).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from collections.abc import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import (  # noqa: E402 - the bench folder is not a package
    BENCH_DIR,
    fmt_time,
    load_average,
    memory_floor,
    mpiexec_path,
    parse_size,
    ray_echo_actor,
    ray_round_trip,
    run_json_subprocess,
    size_label,
)
from crosscore import open_gauge  # noqa: E402

import replicas as rp  # noqa: E402

TO_1 = 'frontend_attributes={_xla_send_recv_source_target_pairs="{{0,1}}"}'
TO_0 = 'frontend_attributes={_xla_send_recv_source_target_pairs="{{1,0}}"}'

PING_PONG = """\
HloModule ping_pong, replica_count=2

cond {{
  st = (s32[], s32[], f32[{e}]) parameter(0)
  i = s32[] get-tuple-element(st), index=0
  k = s32[] get-tuple-element(st), index=1
  ROOT more = pred[] compare(i, k), direction=LT
}}

body {{
  st = (s32[], s32[], f32[{e}]) parameter(0)
  i = s32[] get-tuple-element(st), index=0
  k = s32[] get-tuple-element(st), index=1
  x = f32[{e}] get-tuple-element(st), index=2
  tok = token[] after-all()
  s1 = (f32[{e}], u32[], token[]) send(x, tok), channel_id=1, {to1}
  r1 = (f32[{e}], u32[], token[]) recv(tok), channel_id=1, {to1}
  d1 = (f32[{e}], token[]) recv-done(r1), channel_id=1, {to1}
  sd1 = token[] send-done(s1), channel_id=1, {to1}
  y = f32[{e}] get-tuple-element(d1), index=0
  t1 = token[] get-tuple-element(d1), index=1
  s2 = (f32[{e}], u32[], token[]) send(y, t1), channel_id=2, {to0}
  r2 = (f32[{e}], u32[], token[]) recv(t1), channel_id=2, {to0}
  d2 = (f32[{e}], token[]) recv-done(r2), channel_id=2, {to0}
  sd2 = token[] send-done(s2), channel_id=2, {to0}
  z = f32[{e}] get-tuple-element(d2), index=0
  one = s32[] constant(1)
  i2 = s32[] add(i, one)
  ROOT next = (s32[], s32[], f32[{e}]) tuple(i2, k, z)
}}

ENTRY main {{
  x = f32[{e}] parameter(0)
  k = s32[] parameter(1)
  zero = s32[] constant(0)
  init = (s32[], s32[], f32[{e}]) tuple(zero, k, x)
  loop = (s32[], s32[], f32[{e}]) while(init), condition=cond, body=body
  ROOT z = f32[{e}] get-tuple-element(loop), index=2
}}
"""


def ping_pong_program(elements: int) -> rp.Module:
    return rp.parse_hlo(PING_PONG.format(e=elements, to1=TO_1, to0=TO_0))


def time_replicas(nbytes: int, backend: str, repeats: int, budget: float) -> list[float]:
    """Seconds per round trip, one sample per repetition: (T(k2) - T(1)) / (k2 - 1), with k2 sized
    by `loop_length` so that the difference is about `budget` seconds (well above the noise of a
    job's start and stop, which differencing cancels)."""
    elements = nbytes // 4
    module = ping_pong_program(elements)
    x = np.ones(elements, np.float32)

    def run(k: int) -> float:
        t0 = time.perf_counter()
        out = rp.run(module, [x, np.asarray(k, np.int32)], num_replicas=2, backend=backend, timeout=600)
        took = time.perf_counter() - t0
        if not np.array_equal(out[0], x):
            raise SystemExit("ping-pong returned other data than it sent")
        return took

    run(2)
    k2 = loop_length(run, budget)
    samples = []
    for _ in range(repeats):
        for _attempt in range(3):  # a sample the noise made <= 0 is measured again, never reported
            sample = (run(k2) - run(1)) / (k2 - 1)
            if sample > 0:
                samples.append(sample)
                break
    return samples


def loop_length(run: Callable[[int], float], budget: float, most: int = 100_000) -> int:
    """Iterations k whose job takes about `budget` s longer than a one-iteration job.

    Why not one pilot of a fixed length: its difference from a one-iteration job was a few
    milliseconds at 1 MiB (10 round trips), below the jitter of a job's start under Ray, so the
    estimate per round trip came out near zero now and then and the sample loop was sized to the
    cap, minutes long (a run that seemed to stall, 2026-11-26). Here k grows fourfold until the
    difference is at least a quarter of the budget, so start-up jitter moves the estimate by a
    bounded fraction whatever the size."""
    one = min(run(1), run(1))
    k = 10
    while True:
        extra = run(k) - one
        if extra >= budget / 4 or k >= most:
            return int(min(max(k, k * budget / max(extra, 1e-9)), most))
        k = min(4 * k, most)


def mpi_pingpong(sizes: list[int]) -> tuple[dict | None, str]:
    if importlib.util.find_spec("mpi4py") is None:
        return None, "skipped (not installed)"
    mpiexec = mpiexec_path()
    if mpiexec is None:
        return None, "skipped (not installed): no mpiexec"
    data, msg = run_json_subprocess([mpiexec, "-n", "2", sys.executable, os.path.join(BENCH_DIR, "anchors_mpi.py"),
                                     "--pingpong", "--sizes", ",".join(str(s) for s in sizes)], 600)
    return (data["results"]["pingpong"] if data else None), msg


def summary(samples: list[float]) -> str:
    """median [min - max], marked unreliable when the spread is larger than the median."""
    if not samples:
        return "-"
    med, lo, hi = float(np.median(samples)), min(samples), max(samples)
    mark = " UNRELIABLE" if lo <= 0 or hi - lo > med else ""
    return f"{fmt_time(med)} [{fmt_time(lo)}-{fmt_time(hi)}]{mark}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="4KiB,1MiB,64MiB")
    parser.add_argument("--backend", choices=["ray", "threads", "both"], default="ray")
    parser.add_argument("--skip", default="", help="anchors to leave out: mpi")
    parser.add_argument("--repeats", type=int, default=5, help="samples per cell (median and range shown)")
    parser.add_argument("--budget", type=float, default=1.0, help="seconds of measured work per sample")
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    backends = ["ray", "threads"] if args.backend == "both" else [args.backend]
    print(f"# replicas send/recv ping-pong, 2 replicas, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{os.cpu_count()} cores, load average at start {load_average()}")
    gauge = open_gauge()  # forked before Ray's threads
    gauge_readings = []
    from replicas.runtime.ray.backend import ensure_ray

    ensure_ray()
    echo = ray_echo_actor()
    samples: dict[tuple[str, int], list[float]] = {}
    # Repetitions interleave the anchors and replicas, so a change of load hits both alike.
    for rep in range(args.repeats):
        if gauge is not None:
            gauge_readings.append(gauge.read())
        if "mpi" not in args.skip:
            mpi, msg = mpi_pingpong(sizes)
            if mpi is None:
                print(f"mpi: {msg}")
            for s in sizes:
                if mpi and mpi.get(str(s)):
                    samples.setdefault(("mpi", s), []).append(mpi[str(s)])
        for s in sizes:
            samples.setdefault(("ray-round-trip", s), []).append(
                ray_round_trip(echo, s, 50 if s <= (1 << 20) else 5))
            for b in backends:
                samples.setdefault((b, s), []).extend(time_replicas(s, b, 1, args.budget))
        print(f"repetition {rep + 1}/{args.repeats} done (load {load_average()})", file=sys.stderr, flush=True)
    floors = {s: memory_floor(s) for s in sizes}
    cols = [f"replicas-{b}" for b in backends] + ["mpi", "ray-round-trip"]
    print()
    print(f"round trip 0 -> 1 -> 0, median [min-max] of {args.repeats} samples")
    head = ("| size | " + " | ".join(cols) + " | copy floor | bandwidth | vs mpi |")
    print(head)
    print("|---" * (len(cols) + 4) + "|")
    for s in sizes:
        t = float(np.median(samples[(backends[0], s)]))
        mpi_t = samples.get(("mpi", s))
        vs_mpi = f"{t / float(np.median(mpi_t)):.2f}x" if mpi_t else "-"
        bandwidth = 2 * s / t / (1 << 20)
        cells = [summary(samples.get((c, s), [])) for c in backends + ["mpi", "ray-round-trip"]]
        print(f"| {size_label(s)} | " + " | ".join(cells)
              + f" | {fmt_time(floors[s])} | {bandwidth:.0f} MiB/s | {vs_mpi} |")
    print(f"(load average at end {load_average()}; bandwidth = 2 x size per round trip of replicas-{backends[0]})")
    if gauge is not None:
        gauge.close()
        print(f"cross-core gauge at the start of each repetition: {', '.join(fmt_time(g) for g in gauge_readings)} "
              f"(bench/crosscore.py: a slow period reads several times the usual)")


if __name__ == "__main__":
    main()
