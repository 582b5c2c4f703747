"""What the project starts on one machine listens on loopback only: the private local Ray that
`rp.run` starts (its GCS, raylet, agents, workers and the replicas' actors), and the two-node
cluster of `replicas cluster start --local` with replicas on both nodes (whose actors open TCP sockets to
each other). Ray alone would listen on every interface: see `runtime/ray/startup._loopback_node` and
replicas/cluster/ray_loopback.py."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterable

import numpy as np
import pytest
from test_runtime_ray import ALL_REDUCE

LISTEN = "0A"  # the socket state column of /proc/net/tcp{,6}


def listening_sockets() -> dict[int, tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]]:
    """Every listening TCP socket of this network namespace: inode -> (address, port)."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):  # a kernel without IPv6
            continue
        with open(table) as f:
            next(f)
            for line in f:
                fields = line.split()
                if fields[3] != LISTEN:
                    continue
                hex_address, hex_port = fields[1].split(":")
                raw = bytes.fromhex(hex_address)
                # The kernel prints each 32-bit word in host (little-endian) order.
                raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                address = ipaddress.ip_address(raw)  # 4 bytes: IPv4, 16: IPv6
                found[int(fields[9])] = (address, int(hex_port, 16))
    return found


def socket_inodes(pid: int) -> set[int]:
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    except OSError:
        pass  # the process ended meanwhile
    return inodes


def is_loopback(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def non_loopback_listeners(pids: Iterable[int]) -> list[str]:
    sockets = listening_sockets()
    wrong = []
    for pid in pids:
        for inode in socket_inodes(pid) & sockets.keys():
            address, port = sockets[inode]
            if not is_loopback(address):
                wrong.append(f"{command_of(pid)} (pid {pid}) listens on {address}:{port}")
    return wrong


def command_of(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")[:100].strip()
    except OSError:
        return "?"


def descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def holding_files_under(folder: str) -> set[int]:
    """Processes whose command line names `folder` or that hold a file open under it (Ray's agents
    and workers rename themselves, but keep their logs there)."""
    found = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        if folder in command_of(pid):
            found.add(pid)
            continue
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(folder):
                    found.add(pid)
                    break
        except OSError:
            continue
    return found


@pytest.mark.ray
def test_local_ray_listens_on_loopback_only(ray_session):
    import replicas as rp

    x = np.arange(4, dtype=np.float32)
    out = rp.run(ALL_REDUCE.format(n=2, size=4, gsize=8), [x], num_replicas=2, backend="ray", timeout=60)
    assert np.array_equal(out[0][0], 2 * x + 1)
    ours = descendants(os.getpid())
    assert len(ours) >= 3, "expected Ray's GCS, raylet and the actors among this process's descendants"
    assert non_loopback_listeners([os.getpid(), *ours]) == []


CROSS_NODE = """
import sys
import numpy as np
import replicas as rp

text = open(sys.argv[2]).read()
x = np.arange(8, dtype=np.float32)
job = rp.launch(rp.parse_hlo(text), [x], num_replicas=2, address=sys.argv[1],
                resources=[{"node1": 1}, {"node2": 1}], timeout=120)
assert len({s.node for s in job.states()}) == 2
total = job.result()[0][0]
assert np.array_equal(total, 2 * x + 1), total
"""


@pytest.mark.cluster
@pytest.mark.ray
def test_two_node_cluster_listens_on_loopback_only(tmp_path, two_node_cluster, cluster_driver):
    program = tmp_path / "ar.hlo"
    program.write_text(ALL_REDUCE.format(n=2, size=8, gsize=16))
    out = cluster_driver.run(CROSS_NODE, ["driver.py", two_node_cluster.address, str(program)])
    assert out.returncode == 0, out.stdout + out.stderr[-4000:]
    cluster = holding_files_under(two_node_cluster.settings["REPLICAS_CLUSTER_DIR"])
    assert len(cluster) >= 4, "expected the two nodes' GCS, raylets and agents"
    assert non_loopback_listeners(cluster | {cluster_driver.proc.pid}) == []
