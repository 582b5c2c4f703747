"""A driver killed (SIGKILL) while its job runs across two simulated hosts leaves no segment in any
host's /dev/shm: Ray ends the driver's actors on every node, and each actor that made segments
holds a reaper of its own (runtime/ray/reaper.py) that unlinks its jobs' segments on its node once
the actor is gone. Skipped, with one line saying why, where namespaces cannot be made."""

from __future__ import annotations

import signal
import sys
import textwrap
import time

import pytest
from test_hosts import (
    LONG,
    cluster,  # noqa: F401 - the module's simulated hosts
)

from replicas.cluster import hosts

pytestmark = [pytest.mark.hosts]

WITHIN = 5.0  # seconds from the driver's death until every host's /dev/shm is empty

DRIVER = textwrap.dedent("""
    import sys
    import numpy as np
    import replicas as rp

    job = rp.launch(rp.parse_hlo(sys.argv[1]), [np.arange(4, dtype=np.float32)], num_replicas=4, address="auto",
                    timeout=600, resources=[{"host0": 1}, {"host1": 1}] * 2)
    while min(s.collectives_started for s in job.states()) < 20:  # all running, segments made
        job._backend.wait(0.2)
    print("RUNNING", flush=True)
    sys.stdin.readline()
""")


def test_a_killed_driver_leaves_no_segment_on_any_host(cluster: hosts.Cluster) -> None:  # noqa: F811
    driver = hosts.run_in(cluster, 0, [sys.executable, "-c", DRIVER, LONG], stdin=-1, stdout=-1, text=True)
    try:
        assert driver.stdout.readline().strip() == "RUNNING", f"the driver ended first (exit {driver.wait(60)})"
        assert any(hosts.shm_left(h) for h in cluster.hosts[1:]), "no segment on host 1: the test would prove nothing"
        driver.send_signal(signal.SIGKILL)
        driver.wait(60)
        deadline = time.monotonic() + WITHIN
        left = [hosts.shm_left(h) for h in cluster.hosts]
        while any(left) and time.monotonic() < deadline:
            time.sleep(0.1)
            left = [hosts.shm_left(h) for h in cluster.hosts]
        assert not any(left), f"{left} still in the hosts' /dev/shm {WITHIN} s after the driver died"
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait(60)
