"""Replicas on separate (simulated) hosts: two network, mount and UTS namespaces on a private bridge,
each its own Ray node with token authentication (replicas/cluster/hosts.py). The driver runs inside
host 0, as on a real head node. Values equal the threads backend's byte for byte with replicas
spread over the hosts (one per actor; two per actor: the same bits every run, close to
the threads backend's); `resources=` places them per host; a cut link, a
frozen host and a killed node end a running job naming that host's replicas, no hang, nothing of
Ray's on the driver's stdout, and the next job runs on the host that is left; no host's /dev/shm
keeps anything. Skipped, with one line saying why, where namespaces cannot be made (not root, no
iproute2)."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import textwrap

import pytest
from test_runtime_ray import ALL_REDUCE
from test_shm_cluster import CHANNELS

from replicas.cluster import hosts

pytestmark = [pytest.mark.hosts]


@pytest.fixture(scope="module")
def cluster():
    reason = hosts.why_not_possible()
    if reason is not None:
        pytest.skip(f"no simulated hosts here: {reason}")
    name = f"t{secrets.token_hex(2)}"
    made = hosts.start(name, 2, cpus=2)
    try:
        yield made
    finally:
        hosts.stop(name)
        assert hosts.names().count(name) == 0


def run_driver(cluster: hosts.Cluster, script: str, *args: str, timeout: float = 240) -> str:
    proc = hosts.run_in(cluster, 0, [sys.executable, "-c", script, *args], stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out + err[-4000:]
    return out


CORRECT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import ray
    import replicas as rp
    from replicas.cluster.address import gcs_address, probe

    report = {"auth": probe(gcs_address("auto"), 30).auth}
    rng = np.random.default_rng(5)
    cases = {"all_reduce": (sys.argv[1], [{"host0": 1}, {"host1": 1}] * 2, 1),
             "packed": (sys.argv[1], [{"host0": 1}] * 2 + [{"host1": 1}] * 2, 2),
             "channels": (sys.argv[2], [{"host0": 1}, {"host1": 1}] * 2, 1),
             "large": (sys.argv[3], [{"host0": 1}, {"host1": 1}] * 2, 1)}
    for name, (text, placement, per_actor) in cases.items():
        m = rp.parse_hlo(text)
        shape = m.entry_computation.parameters[0].shape.dimensions
        xs = [rng.standard_normal(shape).astype(np.float32) for _ in range(4)]
        want = rp.run(m, [[x] for x in xs], num_replicas=4, backend="threads")
        runs = []
        for _ in range(2):  # twice: the same bits every time
            job = rp.launch(m, [[x] for x in xs], num_replicas=4, address="auto", resources=placement,
                            replicas_per_actor=per_actor, timeout=180)
            nodes = {s.replica: s.node for s in job.states()}
            runs.append(job.result())
        got = runs[0]
        where = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
        report[name] = {"equal": all(a.tobytes() == b.tobytes() for r in range(4) for a, b in zip(got[r], want[r])),
                        "close": all(np.allclose(a, b, rtol=1e-5) for r in range(4) for a, b in zip(got[r], want[r])),
                        "repeat": all(a.tobytes() == b.tobytes() for r in range(4) for a, b in zip(got[r], runs[1][r])),
                        "hosts": [where[nodes[r]] for r in range(4)]}
    print(json.dumps(report))
""")


def test_values_across_hosts_equal_one_machines(cluster: hosts.Cluster) -> None:
    large = 1 << 19  # 2 MiB a replica (8 MiB gathered): streamed between the hosts' actors over their own sockets
    out = run_driver(cluster, CORRECT, ALL_REDUCE.format(n=4, size=4096, gsize=4 * 4096), CHANNELS,
                     ALL_REDUCE.format(n=4, size=large, gsize=4 * large))
    report = json.loads(out.strip().splitlines()[-1])
    h0, h1 = (h.address for h in cluster.hosts)
    assert report["auth"] == "token"
    assert report["all_reduce"] == {"equal": True, "close": True, "repeat": True, "hosts": [h0, h1, h0, h1]}
    assert report["channels"] == {"equal": True, "close": True, "repeat": True, "hosts": [h0, h1, h0, h1]}
    assert report["large"] == {"equal": True, "close": True, "repeat": True, "hosts": [h0, h1, h0, h1]}
    # Two replicas per actor: the same bits every run, but not the threads backend's (each actor sums
    # its pair first: another order of the float additions), so close to them, not equal.
    packed = report["packed"]
    assert (packed["close"], packed["repeat"], packed["hosts"]) == (True, True, [h0, h0, h1, h1])
    assert [hosts.shm_left(h) for h in cluster.hosts] == [[], []]


LONG = """HloModule loop, replica_count=4
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
cond {
  p = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(2000000000)
  ROOT lt = pred[] compare(i, n), direction=LT
}
body {
  p = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  x = f32[4] get-tuple-element(p), index=1
  one = s32[] constant(1)
  i2 = s32[] add(i, one)
  y = f32[4] all-reduce(x), replica_groups={}, to_apply=add
  q = f32[4] constant({0.25, 0.25, 0.25, 0.25})
  y2 = f32[4] multiply(y, q)
  ROOT t = (s32[], f32[4]) tuple(i2, y2)
}
ENTRY main {
  x = f32[4] parameter(0)
  z = s32[] constant(0)
  init = (s32[], f32[4]) tuple(z, x)
  w = (s32[], f32[4]) while(init), condition=cond, body=body
  ROOT r = f32[4] get-tuple-element(w), index=1
}
"""

# A job across both hosts runs until the test breaks host 1 (a line on stdin), then a job on host 0.
BROKEN = textwrap.dedent("""
    import sys
    import numpy as np
    import replicas as rp

    m = rp.parse_hlo(sys.argv[1])
    x = np.arange(4, dtype=np.float32)
    job = rp.launch(m, [x], num_replicas=4, address="auto", timeout=600,
                    resources=[{"host0": 1}, {"host1": 1}] * 2)
    while min(s.collectives_started for s in job.states()) < 20:  # all running, messages moving
        job._backend.wait(0.2)
    print("RUNNING", flush=True)
    sys.stdin.readline()
    try:
        job.result()
        print("NO ERROR")
    except rp.ReplicasError as e:
        print("ERROR", type(e).__name__, str(e).replace(chr(10), " "))
    m = rp.parse_hlo(sys.argv[2])
    out = rp.run(m, [x], num_replicas=2, resources=[{"host0": 1}] * 2, timeout=180)
    print("NEXT", out[0].tolist())
""")

NEXT = """HloModule next, replica_count=2
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
ENTRY main {
  x = f32[4] parameter(0)
  ROOT z = f32[4] all-reduce(x), replica_groups={}, to_apply=add
}
"""


@pytest.mark.parametrize("fault", ["cut", "freeze", "kill"])  # in this order: the kill leaves host 1 without Ray
def test_a_broken_host_ends_the_job_naming_its_replicas(cluster: hosts.Cluster, fault: str) -> None:
    proc = hosts.run_in(cluster, 0, [sys.executable, "-c", BROKEN, LONG, NEXT], stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdin is not None
    try:
        assert proc.stdout.readline() == "RUNNING\n", proc.stderr.read() if proc.stderr else ""
        {"cut": hosts.cut, "freeze": hosts.freeze, "kill": hosts.kill_node}[fault](cluster, 1)
        proc.stdin.write("\n")
        proc.stdin.flush()
        error = proc.stdout.readline()
        if fault == "cut":
            hosts.cut(cluster, 1, up=True)
        elif fault == "freeze":
            hosts.thaw(cluster, 1)
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert error.startswith("ERROR ReplicaFailure"), error + err[-3000:]
    if fault == "kill":  # Ray reports the first actor it finds dead, the others of its host go with it
        assert f"replicas [1, 3] on host {cluster.hosts[1].address} lost: replica " in error, error
    else:  # the replicas' own liveness (replicas/cluster/liveness.py)
        assert f"replicas [1, 3] on host {cluster.hosts[1].address} stopped answering" in error, error
    assert out.splitlines() == ["NEXT [0.0, 2.0, 4.0, 6.0]"], out + err[-3000:]  # nothing of Ray's
    assert hosts.shm_left(cluster.hosts[0]) == []
