"""Send/Recv between two replicas next to anchors measured in the same run (a benchmark, never a test).

    python bench/channels.py [--sizes 4KiB,64MiB] [--backend ray|threads|both] [--skip mpi]

One program, two replicas: a While loop whose body sends the buffer 0 -> 1 on channel 1 and
back 1 -> 0 on channel 2 (routes by `_xla_send_recv_source_target_pairs`); replica 0's next
buffer is what came back, so every iteration is one full round trip. Per-iteration time by
differencing two loop lengths. Anchors: a raw Ray actor round trip of the same buffer, and MPI
Send/Recv ping-pong (mpi4py under `mpiexec -n 2`). Latency is the 4 KiB row; bandwidth the
64 MiB row (2 x bytes moved per round trip / time).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import (  # noqa: E402 - the bench folder is not a package
    BENCH_DIR,
    fmt_time,
    load_average,
    memory_floor,
    mpiexec_path,
    parse_size,
    per_iteration,
    ray_echo_actor,
    ray_round_trip,
    run_json_subprocess,
    size_label,
)

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


def iterations_for(nbytes: int) -> tuple[int, int]:
    if nbytes <= 64 * 1024:
        return 20, 220
    if nbytes <= 2 << 20:
        return 5, 45
    return 1, 5


def time_replicas(nbytes: int, backend: str) -> float:
    elements = nbytes // 4
    module = ping_pong_program(elements)
    x = np.ones(elements, np.float32)

    def run(k: int) -> float:
        t0 = time.perf_counter()
        out = rp.run(module, [x, np.asarray(k, np.int32)], num_replicas=2, backend=backend, timeout=600)
        took = time.perf_counter() - t0
        if k and not np.array_equal(out[0], x):
            raise SystemExit("ping-pong returned other data than it sent")
        return took

    run(2)
    k1, k2 = iterations_for(nbytes)
    return per_iteration(run, k1, k2, repeat=2 if nbytes <= (16 << 20) else 1)


def mpi_pingpong(sizes: list[int]) -> tuple[dict | None, str]:
    if importlib.util.find_spec("mpi4py") is None:
        return None, "skipped (not installed)"
    mpiexec = mpiexec_path()
    if mpiexec is None:
        return None, "skipped (not installed): no mpiexec"
    data, msg = run_json_subprocess([mpiexec, "-n", "2", sys.executable, os.path.join(BENCH_DIR, "anchors_mpi.py"),
                                     "--pingpong", "--sizes", ",".join(str(s) for s in sizes)], 600)
    return (data["results"]["pingpong"] if data else None), msg


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="4KiB,64MiB")
    parser.add_argument("--backend", choices=["ray", "threads", "both"], default="ray")
    parser.add_argument("--skip", default="", help="anchors to leave out: mpi")
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    backends = ["ray", "threads"] if args.backend == "both" else [args.backend]
    print(f"# replicas send/recv ping-pong, 2 replicas, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{os.cpu_count()} cores, load average at start {load_average()}")
    mpi = None
    if "mpi" not in args.skip:
        mpi, msg = mpi_pingpong(sizes)
        print(f"mpi: {msg}")
    from replicas.runtime.ray_backend import ensure_ray

    ensure_ray()
    echo = ray_echo_actor()
    rows = []
    for s in sizes:
        row = {"bytes": s, "round_trip": ray_round_trip(echo, s, 50 if s <= (1 << 20) else 5),
               "floor": memory_floor(s), "mpi": (mpi or {}).get(str(s))}
        for b in backends:
            row[b] = time_replicas(s, b)
        rows.append(row)
    cols = [f"replicas-{b}" for b in backends] + ["mpi", "ray-round-trip", "copy-floor"]
    head = f"{'size':>9}" + "".join(f"{c:>16}" for c in cols) + f"{'bandwidth':>14}{'vs ray rt':>11}{'vs mpi':>9}"
    print()
    print("round trip 0 -> 1 -> 0 per iteration")
    print(head)
    print("-" * len(head))
    for row in rows:
        t = row[backends[0]]
        bandwidth = 2 * row["bytes"] / t / (1 << 20) if t else float("nan")
        vs_mpi = f"{t / row['mpi']:.1f}x" if row["mpi"] else "-"
        values = [row[b] for b in backends] + [row["mpi"], row["round_trip"], row["floor"]]
        print(f"{size_label(row['bytes']):>9}" + "".join(f"{fmt_time(v):>16}" for v in values)
              + f"{bandwidth:>9.1f} MiB/s{t / row['round_trip']:>10.1f}x{vs_mpi:>9}")
    print(f"(load average at end {load_average()}; bandwidth = 2 x size per round trip)")


if __name__ == "__main__":
    main()
