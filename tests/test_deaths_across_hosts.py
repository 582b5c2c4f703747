"""Deaths across two simulated hosts, away from the driver's: a driver killed (SIGKILL) while its job
runs leaves no segment in any host's /dev/shm (Ray ends the driver's actors on every node, and each
actor that made segments holds a reaper of its own, runtime/ray/reaper.py, that unlinks its jobs'
segments on its node once the actor is gone); an actor that dies on the other host is named with
the instruction it died in, which the job's surviving actors on that host read from the slots it
published (transport/where.py), not with the driver's last poll. Skipped, with one line saying why,
where namespaces cannot be made."""

from __future__ import annotations

import json
import signal
import sys
import textwrap
import time

import pytest
from test_faults_ray import FED_THEN_CALL
from test_hosts import (
    LONG,
    cluster,  # noqa: F401 - the module's simulated hosts
    run_driver,
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


DIES_IN_A_CUSTOM_CALL = textwrap.dedent("""
    import json, os, sys, time
    import numpy as np
    import replicas as rp

    def fault(x, rid):  # defined in the driver's script: sent to the actors by value
        if int(rid) == 1:
            os._exit(3)
        return x

    rp.register_custom_call("fault", fault)
    m = rp.parse_hlo(sys.argv[1])
    job = rp.launch(m, [], num_replicas=4, address="auto", timeout=120, resources=[{"host0": 1}, {"host1": 1}] * 2)
    while job.states()[1].status != "blocked":  # the driver's last poll: replica 1 in its infeed
        job._backend.wait(0.1)
    job.infeed(1, np.arange(4, dtype=np.float32))
    try:
        job.result()
        print(json.dumps({"error": None}))
    except rp.ReplicaFailure as e:
        print(json.dumps({"error": type(e).__name__, "replica": e.replica, "instruction": e.instruction,
                          "message": str(e)}))
""")


def test_an_actor_dead_on_another_host_is_named_with_the_instruction_it_died_in(cluster: hosts.Cluster) -> None:  # noqa: F811
    """Replica 1 (on host 1, with replica 3's actor beside it) was polled blocked in its infeed, then
    fed, and died in the custom call %y at once: the error names %y."""
    program = FED_THEN_CALL.replace("replica_count=2", "replica_count=4")
    out = json.loads(run_driver(cluster, DIES_IN_A_CUSTOM_CALL, program).strip().splitlines()[-1])
    assert out["error"] == "ReplicaFailure" and out["replica"] == 1, out
    assert out["instruction"].startswith("%y (custom-call"), out
    assert "replica 1 died while running %y (custom-call" in out["message"], out
