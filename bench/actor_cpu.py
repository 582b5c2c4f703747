"""CPU time and wall time per collective on N replicas (4 unless told), by differencing two loop lengths (a benchmark).

    python bench/actor_cpu.py [--op all-reduce] [--size 4KiB] [--k 100,700] [--repeat 2] [--backend ray]
                              [--replicas-per-actor 2] [--replicas 4]

The program is `collective_program` (the op K times in a While loop). CPU = utime + stime of the
replica actor processes (Ray) or of this process (threads), read from /proc before and after each
job; (CPU(K2) - CPU(K1)) / (K2 - K1) cancels the job's start and stop. CPU time is what a loaded
machine inflates least: use it to compare two versions of the code run one after the other (run
this script from each checkout, PYTHONPATH set to it). Linux only.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import collective_program, load_average, parse_size  # noqa: E402
from suite_cpu import machine_cpu  # noqa: E402

import replicas as rp  # noqa: E402


def cpu_and_faults(pids: list[int]) -> tuple[float, int]:
    """(utime + stime in seconds, minor page faults) summed over `pids`."""
    ticks = faults = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])
        faults += int(fields[7])
    return ticks / os.sysconf("SC_CLK_TCK"), faults


def switches(pids: list[int]) -> tuple[int, int]:
    """(voluntary, involuntary) context switches summed over every thread of `pids`: a wake-up of a
    sleeping thread is one voluntary switch of it (a futex or GIL wait), a preemption an involuntary one."""
    voluntary = involuntary = 0
    for pid in pids:
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/status") as f:
                    for line in f:
                        if line.startswith("voluntary_ctxt_switches"):
                            voluntary += int(line.split()[1])
                        elif line.startswith("nonvoluntary_ctxt_switches"):
                            involuntary += int(line.split()[1])
            except FileNotFoundError:  # a thread that ended meanwhile
                pass
    return voluntary, involuntary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--op", default="all-reduce")
    parser.add_argument("--size", default="4KiB")
    parser.add_argument("--k", default="100,700", help="the two loop lengths")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--backend", choices=["ray", "threads"], default="ray")
    parser.add_argument("--replicas-per-actor", type=int, default=None, help="packing (Ray; default: the runtime's)")
    parser.add_argument("--replicas", type=int, default=4)
    args = parser.parse_args()
    nbytes = parse_size(args.size)
    k1, k2 = (int(k) for k in args.k.split(","))
    n = args.replicas
    module = collective_program(args.op, nbytes // 4, n)
    x = np.ones(nbytes // 4, np.float32)
    pids = [os.getpid()]

    def run(k: int) -> None:
        nonlocal pids
        operands = [x, np.asarray(k, np.int32)]
        if args.backend == "threads":
            rp.run(module, operands, num_replicas=n, backend="threads", timeout=600)
            return
        import ray

        job = rp.launch(module, operands, num_replicas=n, timeout=600, replicas_per_actor=args.replicas_per_actor)
        pids = ray.get([a.__ray_call__.remote(lambda host: os.getpid()) for a in job._backend._actors])
        job.result()

    def measured(k: int) -> tuple[float, float, int, int, int, float]:
        (c0, f0), (v0, i0), (b0, _), t0 = cpu_and_faults(pids), switches(pids), machine_cpu(), time.perf_counter()
        run(k)
        (c1, f1), (v1, i1), (b1, _) = cpu_and_faults(pids), switches(pids), machine_cpu()
        return c1 - c0, time.perf_counter() - t0, f1 - f0, v1 - v0, i1 - i0, b1 - b0

    run(2)
    print(f"# {args.op} {args.size}, {n} replicas, {args.backend}, {len(pids)} process(es), "
          f"load average {load_average()}")
    for _ in range(args.repeat):
        cpu1, wall1, faults1, vol1, inv1, busy1 = measured(k1)
        cpu2, wall2, faults2, vol2, inv2, busy2 = measured(k2)
        per = k2 - k1
        others = (busy2 - busy1) - (cpu2 - cpu1)  # the machine's busy time beyond the actors' (this driver's too)
        print(f"wall {(wall2 - wall1) / per * 1e6:.0f} us/op, CPU {(cpu2 - cpu1) / per * 1e6:.0f} us/op "
              f"({(cpu2 - cpu1) / per / n * 1e6:.1f} us per replica), "
              f"minor page faults {(faults2 - faults1) / per / len(pids):.0f} per op per process, "
              f"context switches {(vol2 - vol1) / per:.1f} voluntary + {(inv2 - inv1) / per:.1f} involuntary per op, "
              f"others {others / per * 1e6:.0f} us/op",
              flush=True)
    if args.backend == "ray":
        import ray

        ray.shutdown()


if __name__ == "__main__":
    main()
