"""Two Ray nodes on one machine (`replicas cluster start --local`): replicas on the same node exchange
large pieces through shared memory, pairs across nodes never do (even though both nodes see the
same /dev/shm here), and the results are right. The driver joining the cluster runs in a
subprocess (the run's `cluster_driver`), since this test run's own process is attached to the shared
local Ray session."""

from __future__ import annotations

import json
import textwrap

import pytest
from test_channel_ring import exchange, route

DRIVER = textwrap.dedent("""
    import json, sys
    import numpy as np
    import ray
    import replicas as rp
    from replicas.runtime.compile import compile_module
    from replicas.runtime.job import Job
    from replicas.runtime.threads import ThreadBackend
    from replicas.transport.shm import job_segments

    m = rp.parse_hlo(open(sys.argv[2]).read())
    size = int(sys.argv[3])
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal(size).astype(np.float32) for _ in range(4)]
    # The threads backend told the same placement over the same nodes: the same reduction order (a
    # node's processes first, then node order: collectives/nodes.py).
    want = Job(ThreadBackend(compile_module(m), [[x] for x in xs], placement=[0, 1, 2, 3], nodes=[0, 1, 0, 1]),
               None, timeout=120, host_may_send=False).result()
    # One replica an actor (by default a node's replicas would share one): pairs of a node cross processes.
    placement = [{"node1": 1}, {"node2": 1}, {"node1": 1}, {"node2": 1}]
    job = rp.launch(m, [[x] for x in xs], num_replicas=4, address=sys.argv[1], resources=placement,
                    replicas_per_actor=1, timeout=120)
    nodes = {s.replica: s.node for s in job.states()}
    got = job.result()
    equal = all(a.tobytes() == b.tobytes() for r in range(4) for a, b in zip(got[r], want[r]))
    sent = {}
    for part in ray.get([a.shm_sent.remote() for a in job._backend._actors]):
        sent.update(part)
    report = {"equal": equal, "nodes": nodes, "left": job_segments(job._backend._token),
              "shm": {str(r): {str(d): n for d, n in v.items()} for r, v in sent.items()}}
    # Channels: same-node pairs through the channel rings, pairs across nodes over the sockets.
    m = rp.parse_hlo(open(sys.argv[4]).read())
    xs = [rng.standard_normal(1024).astype(np.float32) for _ in range(4)]
    want = rp.run(m, [[x] for x in xs], num_replicas=4, backend="threads")
    job = rp.launch(m, [[x] for x in xs], num_replicas=4, address=sys.argv[1], resources=placement,
                    replicas_per_actor=1, timeout=120)
    got = job.result()
    report["channels_equal"] = all(a.tobytes() == b.tobytes() for r in range(4) for a, b in zip(got[r], want[r]))
    sent = {}
    for part in ray.get([a.shm_sent.remote() for a in job._backend._actors]):
        sent.update(part)
    report["channels_shm"] = {str(r): {str(d): n for d, n in v.items()} for r, v in sent.items()}
    report["channels_left"] = job_segments(job._backend._token)
    print(json.dumps(report))
""")


# Each replica sends to a replica of the other node (channel 1) and of its own node (channel 2).
CHANNELS = "\n".join([
    "HloModule channels, replica_count=4", "ENTRY main {", "  x = f32[1024] parameter(0)",
    "  tok = token[] after-all()",
    *exchange("across", "x", "f32[1024]", 1, route((0, 1), (1, 0), (2, 3), (3, 2))),
    *exchange("within", "x", "f32[1024]", 2, route((0, 2), (2, 0), (1, 3), (3, 1))),
    "  ROOT out = (f32[1024], f32[1024]) tuple(across, within)", "}"])


@pytest.mark.cluster
def test_same_node_pairs_use_shared_memory_and_cross_node_pairs_do_not(tmp_path, two_node_cluster, cluster_driver):
    from test_shm import COLLECTIVES, SIZE

    program = tmp_path / "c.hlo"
    program.write_text(COLLECTIVES.format(e=SIZE, g=4 * SIZE, q=SIZE // 4))
    channels = tmp_path / "channels.hlo"
    channels.write_text(CHANNELS)
    out = cluster_driver.run(DRIVER, ["driver.py", two_node_cluster.address, str(program), str(SIZE), str(channels)])
    assert out.returncode == 0, out.stdout + out.stderr[-4000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["equal"]
    nodes = report["nodes"]
    assert nodes["0"] == nodes["2"] != nodes["1"] == nodes["3"]
    shm = report["shm"]
    for src in range(4):
        for dst in range(4):
            if src != dst:
                used = shm[str(src)].get(str(dst), 0)
                assert (used > 0) == (nodes[str(src)] == nodes[str(dst)]), (src, dst, shm)
    assert report["left"] == []
    assert report["channels_equal"] and report["channels_left"] == []
    for src in range(4):
        for dst in range(4):
            used = report["channels_shm"][str(src)].get(str(dst), 0)
            assert (used > 0) == (src != dst and nodes[str(src)] == nodes[str(dst)]), (src, dst, report)
