"""Replicas on separate (simulated) hosts: two network, mount and UTS namespaces on a private bridge,
each its own Ray node with token authentication (replicas/cluster/hosts.py). The driver runs inside
host 0, as on a real head node. Values equal the threads backend's byte for byte when it is told
the same placement over the same nodes (one and two replicas per actor, N=4 and N=8, every
collective, a streamed all-reduce), the same bits every run, also over links shaped in rate, delay
and loss; `resources=` places them per host; a cut link, a frozen host and a killed node end a
running job naming that host's replicas, no hang, nothing of Ray's on the driver's stdout, and the
next job runs on the host that is left; no host's /dev/shm keeps anything. Skipped, with one line
saying why, where namespaces cannot be made (not root, no iproute2)."""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import sys
import textwrap

import pytest
from test_collectives_hierarchy import program
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


# Large all-to-alls (what a node leader forwards is received into its arena, collectives/forwarding.py;
# the second one receives into the same blocks again), a ring permute and a large all-gather (streamed
# between node leaders one piece per process).
ROUTED = """\
HloModule routed, replica_count={n}

ENTRY main {{
  x = f32[{size}] parameter(0)
  a = f32[{size}] all-to-all(x), replica_groups={{}}, dimensions={{0}}
  b = f32[{size}] all-to-all(a), replica_groups={{}}, dimensions={{0}}
  p = f32[{size}] collective-permute(b), source_target_pairs={{{pairs}}}
  g = f32[{gathered}] all-gather(p), replica_groups={{}}, dimensions={{0}}
  ROOT t = (f32[{size}], f32[{gathered}]) tuple(b, g)
}}
"""


# A reduce-scatter of partials too large for the same-node board (4 MiB a slot): they reach the node
# leader as messages in the form the board would have held; beside it an all-to-all of chunks its
# node's processes exchange directly.
SCATTERED = """\
HloModule scattered, replica_count={n}

add {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}}

ENTRY main {{
  x = f32[{size}] parameter(0)
  r = f32[{part}] reduce-scatter(x), replica_groups={{}}, dimensions={{0}}, to_apply=add
  a = f32[{size}] all-to-all(x), replica_groups={{}}, dimensions={{0}}
  ROOT t = (f32[{part}], f32[{size}]) tuple(r, a)
}}
"""


def routed(n: int, size: int) -> str:
    return ROUTED.format(n=n, size=size, gathered=n * size, pairs=",".join(f"{{{r},{(r + 1) % n}}}" for r in range(n)))


CORRECT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import ray
    import replicas as rp
    from replicas.cluster.address import gcs_address, probe
    from replicas.runtime.compile import compile_module
    from replicas.runtime.job import Job
    from replicas.runtime.threads import ThreadBackend

    report = {"auth": probe(gcs_address("auto"), 30).auth}
    rng = np.random.default_rng(5)
    for name, text, hosts_of, per_actor in json.loads(sys.argv[1]):
        m = rp.parse_hlo(text)
        n = len(hosts_of)
        placement = [r // per_actor for r in range(n)]  # the actors, in replica order
        xs = [[rng.standard_normal(p.shape.dimensions).astype(p.shape.dtype) for p in m.entry_computation.parameters]
              for _ in range(n)]
        # The threads backend told the same placement over the same nodes: the same reduction order.
        want = Job(ThreadBackend(compile_module(m), xs, placement=placement, nodes=hosts_of), None,
                   timeout=120, host_may_send=False).result()
        one = rp.run(m, xs, num_replicas=n, backend="threads")
        runs = []
        for _ in range(2):  # twice: the same bits every time
            job = rp.launch(m, xs, num_replicas=n, address="auto", resources=[{f"host{h}": 1} for h in hosts_of],
                            replicas_per_actor=per_actor, timeout=180)
            nodes = {s.replica: s.node for s in job.states()}
            runs.append(job.result())
        got = runs[0]
        where = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
        report[name] = {"equal": all(a.tobytes() == b.tobytes() for r in range(n) for a, b in zip(got[r], want[r])),
                        "close": all(np.allclose(a, b, rtol=1e-4, atol=1e-4) for r in range(n)
                                     for a, b in zip(got[r], one[r])),
                        "repeat": all(a.tobytes() == b.tobytes() for r in range(n) for a, b in zip(got[r], runs[1][r])),
                        "hosts": [where[nodes[r]] for r in range(n)]}
    # What the liveness check asks of actors that answered: whom their wires read bytes from lately.
    from replicas.runtime.ray.backend import POOL
    idle = [a for actors in POOL._idle.values() for a in actors]
    report["heard"] = sorted({host for heard in ray.get([a.heard.remote() for a in idle]) for host in heard})
    print(json.dumps(report))
""")


def test_values_across_hosts_equal_one_machines(cluster: hosts.Cluster) -> None:
    """Every collective across the hosts gives the bits of the threads backend told the same placement
    over the same nodes (a node's processes meet first: collectives/nodes.py), the same bits every
    run, close to one process's; one and two replicas per actor, N=4 and N=8."""
    large = 3 << 19  # 6 MiB a replica: streamed between the hosts' node leaders in chunks
    everything = program(8, []).to_hlo_text()  # all-reduce, all-gather, reduce-scatter, all-to-all, broadcast
    cases = [("all_reduce", ALL_REDUCE.format(n=4, size=4096, gsize=4 * 4096), [0, 1, 0, 1], 1),
             ("packed", ALL_REDUCE.format(n=4, size=4096, gsize=4 * 4096), [0, 0, 1, 1], 2),
             ("channels", CHANNELS, [0, 1, 0, 1], 1),
             ("large", ALL_REDUCE.format(n=4, size=large, gsize=4 * large), [0, 1, 0, 1], 1),
             ("every_8_packed", everything, [0, 0, 1, 1] * 2, 2),
             ("every_8", everything, [0, 1] * 4, 1),
             ("routed", routed(4, 1 << 20), [0, 1, 0, 1], 1),
             ("routed_8", routed(8, 1 << 18), [0, 1] * 4, 1),
             ("scattered", SCATTERED.format(n=4, size=3 << 19, part=3 << 17), [0, 1, 0, 1], 1)]
    out = run_driver(cluster, CORRECT, json.dumps(cases), timeout=600)
    report = json.loads(out.strip().splitlines()[-1])
    h = [x.address for x in cluster.hosts]
    assert report.pop("auth") == "token"
    assert report.pop("heard") == sorted(h)  # each host's actors heard the other's, by its address
    for name, _, hosts_of, _ in cases:
        assert report[name] == {"equal": True, "close": True, "repeat": True, "hosts": [h[k] for k in hosts_of]}, name
    assert [hosts.shm_left(x) for x in cluster.hosts] == [[], []]


def dropped(host: hosts.Host) -> int:
    """Packets the host's loss rule dropped so far."""
    rules = subprocess.run(["ip", "netns", "exec", host.name, "iptables", "-L", "INPUT", "-v", "-x", "-n"],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    return sum(int(line.split()[0]) for line in rules if " DROP " in f" {line} ")


# Connections to a port nobody listens on across the link: each is refused after one round trip
# (a SYN there, a reset back), which crosses each direction's delay once.
REFUSED = textwrap.dedent("""
    import socket, sys, time
    seconds = []
    for _ in range(5):
        t0 = time.perf_counter()
        try:
            socket.create_connection((sys.argv[1], 9), timeout=30).close()
        except ConnectionRefusedError:
            seconds.append(time.perf_counter() - t0)
    print(min(seconds))
""")


def test_shaped_lossy_delayed_links_give_the_same_values(cluster: hosts.Cluster) -> None:
    """Links of 1 gbit, 2 ms each way and 5% of the packets lost each way: the values are the same
    bits (TCP resends), a round trip across a link takes at least the two delays (netem, or where the
    kernel has none the cluster's delay line, which holds every packet at least that long); unshaped
    again, no delay line or rule is left."""
    if shutil.which("iptables") is None:
        pytest.skip("no iptables here (apt-get install iptables): lossy links cannot be made")
    with pytest.raises(hosts.HostsError, match="up to 1 s with its unit"):
        hosts.reshape(cluster, delay="2")
    hosts.reshape(cluster, rate="1gbit", delay="2ms", loss="5%")
    lines = [x.delay_line for x in cluster.hosts]
    try:
        size = 1 << 18  # 1 MiB a replica
        cases = [("lossy", ALL_REDUCE.format(n=4, size=size, gsize=4 * size), [0, 1, 0, 1], 1)]
        report = json.loads(run_driver(cluster, CORRECT, json.dumps(cases), timeout=600).strip().splitlines()[-1])
        h0, h1 = (x.address for x in cluster.hosts)
        assert report["lossy"] == {"equal": True, "close": True, "repeat": True, "hosts": [h0, h1, h0, h1]}
        assert all(dropped(x) > 0 for x in cluster.hosts)
        assert float(run_driver(cluster, REFUSED, h1).strip().splitlines()[-1]) >= 2 * 0.002
        assert [row["delay_line"] for row in hosts.status(cluster.name)] == ["running" if p else "-" for p in lines]
    finally:
        hosts.reshape(cluster)
    assert all(dropped(x) == 0 for x in cluster.hosts)  # the rule is gone
    assert not any(p in hosts.pids_in(x) for p, x in zip(lines, cluster.hosts) if p)  # so are the delay lines
    assert all(x.delay_line == 0 for x in hosts.load(cluster.name).hosts)


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
    import time
    import numpy as np
    import replicas as rp

    m = rp.parse_hlo(sys.argv[1])
    x = np.arange(4, dtype=np.float32)
    per = int(sys.argv[3]) if len(sys.argv) > 3 else None  # 2: each host's replicas in one actor, batched
    job = rp.launch(m, [x], num_replicas=4, address="auto", timeout=600,
                    resources=[{"host0": 1}, {"host1": 1}] * 2, replicas_per_actor=per)
    bound = time.monotonic() + 180  # (not a measure: the test fails instead of waiting for ever)
    while min(s.collectives_started for s in job.states()) < 20:  # all running, messages moving
        if time.monotonic() > bound:
            print("NOT COUNTING", [s.to_dict() for s in job.states()], flush=True)
            sys.exit(1)
        job._backend.wait(0.2)
    if per == 2:  # replicas 2 and 3 wait in their actor's batched run (its first member runs it)
        assert sorted(s.replica for s in job.states() if s.block and s.block.opcode == "batched") == [2, 3]
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


# In this order: the kill leaves host 1 without Ray. "packed": each host's replicas share one actor
# (their loop a batched run whose all-reduce spans the hosts).
@pytest.mark.parametrize(("fault", "packed"), [("cut", False), ("cut", True), ("freeze", False), ("freeze", True),
                                               ("kill", False)], ids=["cut", "cut packed", "freeze", "freeze packed",
                                                                     "kill"])
def test_a_broken_host_ends_the_job_naming_its_replicas(cluster: hosts.Cluster, fault: str, packed: bool) -> None:
    argv = [sys.executable, "-c", BROKEN, LONG, NEXT, *(["2"] if packed else [])]
    proc = hosts.run_in(cluster, 0, argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                        text=True)
    assert proc.stdout is not None and proc.stdin is not None
    try:
        assert proc.stdout.readline() == "RUNNING\n", proc.stderr.read() if proc.stderr else ""
        reapers = {"cut": hosts.cut, "freeze": hosts.freeze, "kill": hosts.kill_node}[fault](cluster, 1)
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
    if fault == "kill":  # the killed node's actors' reapers remove what they left on their host
        assert reapers and hosts.wait_gone(reapers, 30)
        assert hosts.shm_left(cluster.hosts[1]) == []
