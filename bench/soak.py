"""Soak: do long runs stay flat? Prints the RSS curve of the driver and of every replica actor.

    PYTHONPATH=$PWD python bench/soak.py [--jobs 200] [--collectives 10000] [--replicas 4]

Part 1 runs `--jobs` small jobs back to back (all-reduce + all-gather on 4 replicas, Ray) and samples
RSS every tenth job. Part 2 runs one job of `--collectives` all-reduces (a while loop) and samples
the actors' RSS as the count grows. The verdict compares the last samples with those after
warm-up (the first tenth): growth in MB, and per 100 jobs / per 10,000 collectives.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import replicas as rp

JOB = """\
HloModule soak, replica_count={n}

add {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}}

ENTRY main {{
  x = f32[256] parameter(0)
  s = f32[256] all-reduce(x), replica_groups={{}}, to_apply=add
  g = f32[{g}] all-gather(x), replica_groups={{}}, dimensions={{0}}
  ROOT t = (f32[256], f32[{g}]) tuple(s, g)
}}
"""

LOOP = """\
HloModule loop, replica_count={n}

add {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}}

cond {{
  p = (s32[], f32[64]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  k = s32[] constant({k})
  ROOT lt = pred[] compare(i, k), direction=LT
}}

body {{
  p = (s32[], f32[64]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  x = f32[64] get-tuple-element(p), index=1
  one = s32[] constant(1)
  j = s32[] add(i, one)
  s = f32[64] all-reduce(x), replica_groups={{}}, to_apply=add
  scale = f32[] constant(0.25)
  q = f32[64] broadcast(scale), dimensions={{}}
  y = f32[64] multiply(s, q)
  ROOT out = (s32[], f32[64]) tuple(j, y)
}}

ENTRY main {{
  x = f32[64] parameter(0)
  zero = s32[] constant(0)
  init = (s32[], f32[64]) tuple(zero, x)
  w = (s32[], f32[64]) while(init), condition=cond, body=body
  ROOT r = f32[64] get-tuple-element(w), index=1
}}
"""


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def actor_pids() -> list[int]:
    """The pids of the idle pooled replica actors (after a job) or of a running job's actors."""
    import ray

    from replicas.runtime.ray.backend import POOL

    actors = [a for group in POOL._idle.values() for a in group]  # noqa: SLF001 - a bench reads the pool
    return sorted(ray.get([a.__ray_call__.remote(lambda host: os.getpid()) for a in actors]))


def growth(samples: list[float]) -> float:
    """Median of the last fifth minus the median of the samples right after warm-up (the second tenth)."""
    n = len(samples)
    start = samples[max(1, n // 10): max(2, n // 5)]
    end = samples[-max(1, n // 5):]
    return float(np.median(end) - np.median(start))


def soak_jobs(jobs: int, n: int) -> dict[str, float]:
    module = rp.parse_hlo(JOB.format(n=n, g=256 * n))
    x = np.ones(256, np.float32)
    driver, actors = [], []
    print(f"-- {jobs} jobs back to back ({n} replicas, all-reduce + all-gather)")
    print(f"{'job':>6} {'driver MB':>10} {'actors MB (each)':>40}")
    for j in range(1, jobs + 1):
        rp.run(module, [x], num_replicas=n, timeout=60)
        if j % 10 == 0 or j == 1:
            pids = actor_pids()
            a = [rss_mb(p) for p in pids]
            driver.append(rss_mb(os.getpid()))
            actors.append(float(np.mean(a)) if a else float("nan"))
            print(f"{j:>6} {driver[-1]:>10.1f} {' '.join(f'{v:6.1f}' for v in a):>40}")
    return {"driver MB/100 jobs": growth(driver) * 100 / max(1, jobs * 0.7),
            "actor MB/100 jobs": growth(actors) * 100 / max(1, jobs * 0.7),
            "driver growth MB": growth(driver), "actor growth MB": growth(actors)}


def soak_collectives(count: int, n: int) -> dict[str, float]:
    import ray

    module = rp.parse_hlo(LOOP.format(n=n, k=count))
    job = rp.launch(module, [np.ones(64, np.float32)], num_replicas=n, timeout=3600)
    backend = job._backend  # noqa: SLF001 - a bench reads the actors of a running job
    pids = ray.get([a.__ray_call__.remote(lambda host: os.getpid()) for a in backend._actors])  # noqa: SLF001
    print(f"-- one job of {count} all-reduces ({n} replicas)")
    print(f"{'collectives':>12} {'actors MB (each)':>40}")
    samples: list[float] = []
    done_at: list[int] = []
    event = __import__("threading").Event()
    while not job.done():
        started = min(s.collectives_started for s in job.states())
        a = [rss_mb(p) for p in pids]
        samples.append(float(np.mean(a)))
        done_at.append(started)
        print(f"{started:>12} {' '.join(f'{v:6.1f}' for v in a):>40}")
        event.wait(1.0)
    job.result()
    per = growth(samples) * 10_000 / max(1, count * 0.7)
    return {"actor MB/10k collectives": per, "actor growth MB": growth(samples)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--collectives", type=int, default=10_000)
    parser.add_argument("--replicas", type=int, default=4)
    ns = parser.parse_args()
    import ray

    start = time.monotonic()
    print(f"load average {os.getloadavg()[0]:.1f}")
    try:
        jobs = soak_jobs(ns.jobs, ns.replicas)
        coll = soak_collectives(ns.collectives, ns.replicas)
    finally:
        ray.shutdown()
    print(f"-- verdict ({time.monotonic() - start:.0f} s, load average {os.getloadavg()[0]:.1f})")
    for k, v in {**jobs, **{f"loop {k}": v for k, v in coll.items()}}.items():
        print(f"{k:>32}: {v:+.2f}")


if __name__ == "__main__":
    main()
