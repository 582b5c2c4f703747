"""A two-node Ray cluster on this machine's loopback (`replicas cluster start --local`): no
namespaces and no root, so it runs on any laptop. The head node has the custom resource `node1`,
the second node `node2`; both use Ray's token authentication unless `RAY_AUTH_MODE=disabled`.

Every port either node listens on lies in PORT .. PORT + PORT_SPAN - 1, so clusters with
different ports never collide, and `ray start` runs through `replicas.cluster.ray_loopback`, so
both nodes keep 127.0.0.1 and listen on loopback only. The cluster's directory (default
`/tmp/replicas-cluster`, kept short: Ray's Unix socket paths must stay under 108 bytes) holds the
nodes' temp dir, their logs and the address; `stop` ends exactly the processes that name it, never
another Ray on the machine."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from replicas.errors import ReplicasError

PORT_SPAN = 300
DEFAULT_PORT = 6390
DEFAULT_DIR = "/tmp/replicas-cluster"
START_SECONDS = 180.0  # a `ray start` on a loaded 2-core machine waits for its node to register
STOP_SECONDS = 5.0  # SIGTERM's grace before SIGKILL


def cluster_dir(path: str | None = None) -> Path:
    return Path(path or os.environ.get("REPLICAS_CLUSTER_DIR") or DEFAULT_DIR)


def cluster_port(port: int | None = None) -> int:
    return int(port or os.environ.get("REPLICAS_CLUSTER_PORT") or DEFAULT_PORT)


def _current_cluster_file() -> Path:
    """Where Ray's "auto" looks (after $RAY_ADDRESS) for the cluster to join: `ray start` writes it
    in its own temp dir, which is the cluster's here, so it is written where Ray's default looks."""
    tmp = os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp"
    return Path(tmp) / "ray" / "ray_current_cluster"


def _env() -> dict[str, str]:
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)  # a driver that joined another Ray exported it: this cluster is new
    env.setdefault("RAY_AUTH_MODE", "token")
    return env


def _ray(args: list[str], log: Path, env: dict[str, str]) -> None:
    with open(log, "wb") as out:
        done = subprocess.run([sys.executable, "-m", "replicas.cluster.ray_loopback", *args], env=env,
                              stdout=out, stderr=subprocess.STDOUT, timeout=START_SECONDS)
    if done.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-30:]
        raise ReplicasError(f"`ray {args[0]}` for the local cluster failed (exit {done.returncode}); "
                            f"the end of {log}:\n" + "\n".join(tail))


HEAD_PORTS = {"node-manager": 1, "object-manager": 2, "dashboard-agent-listen": 6, "dashboard-agent-grpc": 7,
              "runtime-env-agent": 8, "metrics-export": 9, "min-worker": 100, "max-worker": 199}
SECOND_PORTS = {"node-manager": 3, "object-manager": 4, "dashboard-agent-listen": 10, "dashboard-agent-grpc": 11,
                "runtime-env-agent": 12, "metrics-export": 13, "min-worker": 200, "max-worker": 299}


def _ports(port: int, offsets: dict[str, int]) -> list[str]:
    return [f"--{name}-port={port + offset}" for name, offset in offsets.items()]


def start(port: int | None = None, path: str | None = None, cpus: int = 1) -> str:
    """Start the head and the second node; return the head's address ("127.0.0.1:PORT")."""
    base, port = cluster_dir(path), cluster_port(port)
    if not 1024 <= port <= 65535 - PORT_SPAN:
        raise ReplicasError(f"--port {port}: the cluster needs ports {port}..{port + PORT_SPAN - 1}")
    if (base / "address").exists():
        raise ReplicasError(f"a local cluster already runs from {base} (at {(base / 'address').read_text().strip()}); "
                            "`replicas cluster stop --local` ends it")
    base.mkdir(parents=True, exist_ok=True)
    env = _env()
    if env["RAY_AUTH_MODE"] == "token":
        _ray(["get-auth-token", "--generate"], base / "token.log", env)
    address = f"127.0.0.1:{port}"
    common = ["--node-ip-address=127.0.0.1", f"--num-cpus={cpus}", "--disable-usage-stats"]
    try:
        _ray(["start", "--head", f"--port={port}", f"--temp-dir={base / 'ray'}", "--include-dashboard=false",
              '--resources={"node1": 1000}', *common, *_ports(port, HEAD_PORTS)], base / "head.log", env)
        _ray(["start", f"--address={address}", '--resources={"node2": 1000}', *common,
              *_ports(port, SECOND_PORTS)], base / "node2.log", env)
    except BaseException:
        stop(path)
        raise
    current = _current_cluster_file()
    current.parent.mkdir(parents=True, exist_ok=True)
    current.write_text(address)
    (base / "address").write_text(address)
    return address


def _processes_of(base: Path) -> list[int]:
    """The cluster's processes: those whose command line names its directory, and Ray's agents
    (which rename themselves "ray::...") holding a file in it open."""
    marker, found = str(base / "ray"), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if marker in cmdline:
                found.append(int(entry.name))
            elif cmdline.startswith("ray::") and any(
                    os.readlink(fd).startswith(marker) for fd in (entry / "fd").iterdir()):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _end(pids: list[int], sig: signal.Signals) -> list[int]:
    """Send `sig` to each process; return pidfds of those that still ran, to wait on."""
    handles = []
    for pid in pids:
        try:
            handle = os.pidfd_open(pid)
            signal.pidfd_send_signal(handle, sig)
            handles.append(handle)
        except ProcessLookupError:
            continue
    return handles


def _wait_all(handles: list[int], seconds: float) -> None:
    """Wait until every process whose pidfd is given has ended, or `seconds` have passed."""
    poller = select.poll()
    for handle in handles:
        poller.register(handle, select.POLLIN)
    deadline, left = time.monotonic() + seconds, set(handles)
    while left and (remaining := deadline - time.monotonic()) > 0:
        for handle, _ in poller.poll(remaining * 1000):
            poller.unregister(handle)
            left.discard(handle)
    for handle in handles:
        os.close(handle)


def stop(path: str | None = None) -> None:
    """End every process of the cluster (SIGTERM, then SIGKILL after a grace) and forget its address."""
    base = cluster_dir(path)
    _wait_all(_end(_processes_of(base), signal.SIGTERM), STOP_SECONDS)
    _wait_all(_end(_processes_of(base), signal.SIGKILL), STOP_SECONDS)
    address = base / "address"
    current = _current_cluster_file()
    try:
        if address.exists() and current.read_text() == address.read_text():
            current.unlink()
    except OSError:
        pass
    address.unlink(missing_ok=True)


def status(path: str | None = None) -> list[dict[str, str]]:
    base = cluster_dir(path)
    address = base / "address"
    return [{"address": address.read_text().strip() if address.exists() else "-", "dir": str(base),
             "processes": str(len(_processes_of(base)))}]
