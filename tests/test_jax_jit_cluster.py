"""`rp.jax.jit` on a real two-node Ray cluster (`replicas cluster start --local`): a persistent job
whose replicas are on both nodes. The driver's node is reached through the doorbell in shared
memory, the other node by one actor call per call; host arguments that change every call travel to
the other node with that call (through Ray), and resident outputs stay where they were computed on
both nodes. The driver joining the cluster runs in a subprocess (the run's `cluster_driver`)."""

from __future__ import annotations

import textwrap

import pytest

pytestmark = [pytest.mark.cluster, pytest.mark.ray]

DRIVER = textwrap.dedent("""
    import os
    import sys

    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    import jax
    import numpy as np
    from jax.sharding import PartitionSpec as P

    import replicas as rp

    placement = [{"node1": 1}, {"node2": 1}, {"node1": 1}, {"node2": 1}]

    def step(w, x):  # w replicated and carried; x a new host array every call, sharded
        return w + jax.lax.psum(x.sum(), "x"), x * 2

    f = rp.jax.jit(step, num_replicas=4, in_specs=(P(), P("x")), out_specs=(P(), P("x")), address=sys.argv[1],
                   resources=placement, timeout=120)
    w, want = np.zeros(3, np.float32), np.zeros(3, np.float32)
    for i in range(4):
        x = np.arange(8, dtype=np.float32) + i  # changes every call: travels to both nodes
        w, doubled = f(w, x)
        want = want + x.sum()
        assert np.array_equal(np.asarray(doubled), x * 2), (i, np.asarray(doubled))
    assert np.array_equal(np.asarray(w), want), (np.asarray(w), want)
    (compiled,) = f._cache.values()
    backend = compiled.session.devices._backend
    nodes = {s.node for s in backend.states()}
    print("NODES", len(nodes), "ACTORS", len(backend._actors))
    print("CALLS", backend.calls["doorbell"], backend.calls["call"])
    f.close()
""")


def test_a_jitted_loop_across_two_nodes(two_node_cluster, cluster_driver):
    out = cluster_driver.run(DRIVER, ["driver.py", two_node_cluster.address])
    assert out.returncode == 0, out.stdout + out.stderr[-4000:]
    # the replicas of each node share an actor (they ask for the same resources)
    assert "NODES 2 ACTORS 2" in out.stdout, out.stdout
    # every call rang the doorbell for the driver's node and made one actor call to the other's actor
    assert "CALLS 4 4" in out.stdout, out.stdout
