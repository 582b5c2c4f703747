"""A real two-node Ray cluster on this machine (cluster/local_cluster.sh): replicas placed on both
nodes through custom resources, collectives across them. The driver joining the cluster runs in a
subprocess, since this test run's own process is attached to the shared local Ray session."""

from __future__ import annotations

import os
import pathlib
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PORT_SPAN = 300  # local_cluster.sh uses PORT .. PORT + 299

pytestmark = [pytest.mark.cluster, pytest.mark.ray]


def _free_port_block() -> int:
    """A base port whose whole block is free now, so two runs on one machine do not collide."""
    for _ in range(50):
        base = random.randrange(20000, 60000 - PORT_SPAN, 10)
        try:
            for port in range(base, base + PORT_SPAN):
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                    sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError(f"no free block of {PORT_SPAN} ports on 127.0.0.1")

DRIVER = textwrap.dedent("""
    import sys
    import numpy as np
    import ray
    import replicas as rp

    text = open(sys.argv[2]).read()
    m = rp.parse_hlo(text)
    x = np.arange(8, dtype=np.float32)
    placement = [{"node1": 1}, {"node2": 1}, {"node1": 1}, {"node2": 1}]
    job = rp.launch(m, [x], num_replicas=4, address=sys.argv[1], resources=placement, timeout=120)
    nodes = {s.node for s in job.states()}
    results = job.result()
    for total, gathered, _ in results:
        assert np.array_equal(total, 4 * x + 6), total
        assert np.array_equal(gathered, np.concatenate([x + r for r in range(4)]))
    print("NODES", len(nodes))
""")


def test_collectives_across_two_nodes(tmp_path):
    from test_runtime_ray import ALL_REDUCE

    program = tmp_path / "ar.hlo"
    program.write_text(ALL_REDUCE.format(n=4, size=8, gsize=32))
    # Ray's unix socket paths must stay under 108 bytes: a short directory, not pytest's tmp_path.
    cluster_dir = tempfile.mkdtemp(prefix="rpc-", dir="/tmp")
    env = dict(os.environ, RAY=str(pathlib.Path(sys.executable).parent / "ray"),
               REPLICAS_CLUSTER_DIR=cluster_dir, RAY_AUTH_MODE="disabled")
    env.pop("RAY_ADDRESS", None)  # set by this process's own Ray session
    port = str(_free_port_block())
    script = ROOT / "cluster" / "local_cluster.sh"
    started = subprocess.run(["bash", str(script), "start", port], env=env, capture_output=True, text=True,
                             timeout=180)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        address = started.stdout.strip().splitlines()[-1]
        driver = tmp_path / "driver.py"
        driver.write_text(DRIVER)
        out = subprocess.run([sys.executable, str(driver), address, str(program)], env=env, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr[-4000:]
        assert "NODES 2" in out.stdout
    finally:
        subprocess.run(["bash", str(script), "stop", port], env=env, capture_output=True, timeout=60)
        shutil.rmtree(cluster_dir, ignore_errors=True)
