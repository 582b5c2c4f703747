"""A node lost before a job starts, on a real two-node Ray cluster of this machine
(`replicas cluster start --local`, loopback only): replicas placed on it end the job within its timeout,
naming the resource no live node has, and the next job on the surviving node works. The driver
joining the cluster runs in a subprocess (this run's own process is attached to the shared
local Ray session)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.cluster, pytest.mark.ray]


def _stop_second_node(port: int) -> None:
    """End the second node's raylet (`replicas cluster start --local` gives it node-manager port PORT + 3)."""
    found = subprocess.run(["pgrep", "-f", f"raylet.*--node_manager_port={port + 3}"], capture_output=True,
                           text=True)
    pids = [int(p) for p in found.stdout.split()]
    assert pids, "the second node's raylet is not running"
    for pid in pids:
        os.kill(pid, signal.SIGTERM)


DRIVER = textwrap.dedent("""
    import sys
    import threading

    import numpy as np
    import ray

    import replicas as rp
    from replicas.runtime.ray.backend import ensure_ray

    HLO = '''HloModule m, replica_count=2
    add {
      a = f32[] parameter(0)
      b = f32[] parameter(1)
      ROOT s = f32[] add(a, b)
    }
    ENTRY main {
      x = f32[4] parameter(0)
      ROOT z = f32[4] all-reduce(x), replica_groups={}, to_apply=add
    }
    '''
    m = rp.parse_hlo(HLO)
    x = np.arange(4, dtype=np.float32)
    # Joins the cluster while both nodes live (as a job given the address would, without the two
    # actors it would start: ~1 CPU s each, never used below).
    ensure_ray(sys.argv[1])
    print("READY", flush=True)
    sys.stdin.readline()  # the test stops the second node, then writes a line
    ends = threading.Event()
    for _ in range(600):  # until the cluster knows the node is gone (bounded: 60 s)
        if sum(1 for n in ray.nodes() if n["Alive"]) == 1:
            break
        ends.wait(0.1)
    try:
        rp.run(m, [x], num_replicas=2, resources=[{"node1": 1}, {"node2": 1}], timeout=20)
        print("NO ERROR")
    except rp.ReplicasError as e:
        print("ERROR", type(e).__name__, str(e).replace(chr(10), " "))
    out = rp.run(m, [x], num_replicas=2, resources=[{"node1": 1}, {"node1": 1}], timeout=120)
    print("NEXT", out[0].tolist())
""")


def test_a_node_lost_before_the_job_starts_is_named_within_the_timeout(two_node_cluster_to_break, tmp_path):
    cluster = two_node_cluster_to_break
    port = int(cluster.settings["REPLICAS_CLUSTER_PORT"])
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    proc = subprocess.Popen([sys.executable, str(driver), cluster.address], env=cluster.env(), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert select.select([proc.stdout], [], [], 240)[0], "the driver printed nothing within 240 s"
        assert proc.stdout.readline().strip() == "READY", proc.stderr.read()[-4000:] if proc.poll() else ""
        _stop_second_node(port)
        out, err = proc.communicate("go\n", timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out + err[-4000:]
    error = next(line for line in out.splitlines() if line.startswith(("ERROR", "NO ERROR")))
    assert error.startswith("ERROR ReplicaFailure") and "no node has node2=1" in error, error
    assert "NEXT [0.0, 2.0, 4.0, 6.0]" in out
