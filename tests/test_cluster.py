"""A real two-node Ray cluster on this machine (`replicas cluster start --local`): replicas placed on both
nodes through custom resources, collectives across them. The driver joining the cluster runs in a
subprocess (the run's `cluster_driver`), since this test run's own process is attached to the shared
local Ray session."""

from __future__ import annotations

import textwrap

import pytest

pytestmark = [pytest.mark.cluster, pytest.mark.ray]

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


def test_collectives_across_two_nodes(tmp_path, two_node_cluster, cluster_driver):
    from test_runtime_ray import ALL_REDUCE

    program = tmp_path / "ar.hlo"
    program.write_text(ALL_REDUCE.format(n=4, size=8, gsize=32))
    out = cluster_driver.run(DRIVER, ["driver.py", two_node_cluster.address, str(program)])
    assert out.returncode == 0, out.stdout + out.stderr[-4000:]
    assert "NODES 2" in out.stdout
