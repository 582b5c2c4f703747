"""Long runs stay flat (slow): after warm-up, more jobs and more collectives do not grow the driver
or the pooled actors by more than a clear-leak threshold. bench/soak.py prints the full curve."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import replicas as rp

sys.path.insert(0, str(Path(__file__).parent.parent / "bench"))
from soak import JOB, LOOP, actor_pids, rss_mb  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.usefixtures("ray_session")]

# A leak of 60 KB per job, or of 1 KB per collective, crosses these; allocator noise does not.
JOB_LEAK_MB = 3.0  # over 50 jobs
LOOP_LEAK_MB = 4.0  # over ~4500 collectives, once the flight recorder's ring is full


def test_jobs_back_to_back_leave_driver_and_actors_flat():
    n = 2
    module = rp.parse_hlo(JOB.format(n=n, g=256 * n))
    x = np.ones(256, np.float32)
    for _ in range(20):  # warm-up: pool, caches, allocator arenas
        rp.run(module, [x], num_replicas=n, timeout=60)
    pids = actor_pids()
    before = [rss_mb(p) for p in pids], rss_mb(os.getpid())
    for _ in range(50):
        rp.run(module, [x], num_replicas=n, timeout=60)
    assert actor_pids() == pids  # the same pooled actors ran every job
    after = [rss_mb(p) for p in pids], rss_mb(os.getpid())
    grown = [b - a for a, b in zip(before[0], after[0])]
    assert max(grown) < JOB_LEAK_MB, f"actors grew {grown} MB over 50 jobs"
    assert after[1] - before[1] < JOB_LEAK_MB, f"the driver grew {after[1] - before[1]:.1f} MB over 50 jobs"


def test_thousands_of_collectives_in_one_job_leave_the_actors_flat():
    import ray

    n = 2
    ring = 256  # the flight recorder keeps this many events per replica: full after warm-up
    # Long enough that the samples below lie thousands of collectives apart on a fast machine too
    # (at 6000, one ran 2,600 collectives past the first mark before it was seen).
    module = rp.parse_hlo(LOOP.format(n=n, k=12000))
    job = rp.launch(module, [np.ones(64, np.float32)], num_replicas=n, timeout=600, trace_events=ring)
    backend = job._backend  # noqa: SLF001 - the test reads the running job's actors
    pids = ray.get([a.__ray_call__.remote(lambda host: os.getpid()) for a in backend._actors])  # noqa: SLF001
    event = threading.Event()

    def collectives() -> int:
        return min(s.collectives_started for s in job.states())

    while collectives() < 1000 and not job.done():
        event.wait(0.02)
    before = [rss_mb(p) for p in pids]
    start = collectives()
    while collectives() < 11500 and not job.done():
        event.wait(0.05)
    after = [rss_mb(p) for p in pids]
    count = collectives() - start
    job.result()
    grown = [b - a for a, b in zip(before, after)]
    assert count > 3000
    assert max(grown) < LOOP_LEAK_MB, f"actors grew {grown} MB over {count} collectives"
