"""Simulated hosts on one Linux machine: each host is a network, mount and UTS namespace (its own
address on a private bridge, its own /dev/shm, its own hostname) running its own Ray node, all
joined to the head on host 0; links optionally shaped (`shape`). Needs root and iproute2.

Shaping, with what a kernel may lack: `rate` is a token bucket (`tc` tbf) on both ends of each
link; `loss` drops that share of the packets arriving at each host (iptables' `statistic` match in
the host's namespace: the kernel's netfilter, not netem), so each direction loses it; `delay` holds
every packet back that long once per direction: the kernel's netem qdisc on the host's end where
the kernel has it, otherwise a delay line (replicas/cluster/delay_line.py: iptables' NFQUEUE in the
host's namespace queues what arrives over its link and a process of the cluster's, in that
namespace, lets each packet through once due), which `stop` ends with the host.

Only the namespaces' private addresses (10.213.0.2 ...) are used: the bridge has no address in
the machine's own namespace and the hosts have no route beyond it, so nothing they start is
reachable from outside and nothing they send leaves the bridge. A driver runs inside a host (as on
a real cluster's head node): `run_in(...)`, `replicas cluster run`.

State lives in `<base>/<name>/state.json`; `stop` ends every process in the hosts' namespaces and
removes the namespaces, the bridge and the directory."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from replicas.errors import ReplicasError

SUBNET = "10.213.0"  # host k is SUBNET.(k+2); every cluster has its own bridge, so they never meet
GCS_PORT = 6379
BASE = Path(os.environ.get("REPLICAS_HOSTS_DIR", "/tmp/rph"))  # short: Ray's socket paths stay < 108 bytes
START_SECONDS = 120.0
DELAY_LINE = Path(__file__).with_name("delay_line.py")
DELAY_QUEUE = 0  # the NFQUEUE number, in each host's own namespace


class HostsError(ReplicasError):
    """Simulated hosts cannot be made or used here (no root, no namespaces, a missing tool)."""


@dataclass
class Host:
    name: str  # hostname inside, and the netns name
    address: str
    veth: str  # the bridge's end of its link, in the machine's own namespace
    holder: int = 0  # pid of the process that keeps the mount and UTS namespaces
    delay_line: int = 0  # pid of the process delaying what arrives over its link (0: none)


@dataclass
class Cluster:
    name: str
    bridge: str
    hosts: list[Host]
    token_path: str
    shaping: dict[str, str] = field(default_factory=dict)

    @property
    def directory(self) -> Path:
        return BASE / self.name

    @property
    def address(self) -> str:
        return f"{self.hosts[0].address}:{GCS_PORT}"

    def host(self, which: int | str) -> Host:
        if isinstance(which, int) or str(which).isdigit():
            return self.hosts[int(which)]
        for h in self.hosts:
            if h.name == which:
                return h
        raise HostsError(f"cluster {self.name!r} has no host {which!r} (hosts: {[h.name for h in self.hosts]})")

    def env(self) -> dict[str, str]:
        """What a driver or a node of this cluster runs with: Ray's token authentication, the token."""
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": self.token_path, "RAY_ADDRESS": self.address,
                "RAY_USAGE_STATS_ENABLED": "0"}

    def save(self) -> None:
        (self.directory / "state.json").write_text(json.dumps(asdict(self), indent=1))


def load(name: str) -> Cluster:
    try:
        data = json.loads((BASE / name / "state.json").read_text())
    except FileNotFoundError:
        raise HostsError(f"no simulated cluster {name!r} (nothing in {BASE / name})") from None
    data["hosts"] = [Host(**h) for h in data["hosts"]]
    return Cluster(**data)


def names() -> list[str]:
    return sorted(p.parent.name for p in BASE.glob("*/state.json")) if BASE.is_dir() else []


def why_not_possible() -> str | None:
    """None when this machine can make simulated hosts; otherwise one line saying why not."""
    if sys.platform != "linux":
        return "simulated hosts need Linux namespaces"
    if os.geteuid() != 0:
        return "simulated hosts need root (network namespaces, a bridge, mounts)"
    for tool in ("ip", "nsenter", "unshare", "tc"):
        if shutil.which(tool) is None:
            return f"simulated hosts need `{tool}` (apt-get install iproute2 util-linux)"
    probe = f"rpq{secrets.token_hex(3)}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    if made.returncode != 0:
        return f"cannot make a network namespace here: {made.stderr.strip()}"
    return None


def _sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(argv), capture_output=True, text=True)
    if check and done.returncode != 0:
        raise HostsError(f"{' '.join(argv)}: {done.stderr.strip() or done.stdout.strip()}")
    return done


def _enter(host: Host) -> list[str]:
    return ["nsenter", "-t", str(host.holder), "--net", "--mount", "--uts", "--"]


def _ray() -> list[str]:
    """Ray's command line run by this interpreter: a node's workers run the interpreter that started
    it, so they import the packages the driver imports (a venv's `ray` script may name another
    interpreter: one copied from another venv keeps its shebang)."""
    return [sys.executable, "-m", "ray.scripts.scripts"]


def start(name: str, count: int = 2, *, cpus: int = 1, rate: str | None = None, delay: str | None = None,
          loss: str | None = None, object_store_bytes: int = 200 << 20) -> Cluster:
    """`count` hosts named `<name>-h<k>` (k from 0; the head on h0) with custom resources `host<k>`,
    linked through a bridge, each link shaped by `rate` (tbf), `delay` (netem or a delay line) and
    `loss` (iptables) if given (see the module doc)."""
    reason = why_not_possible()
    if reason is not None:
        raise HostsError(reason)
    if not (1 <= count <= 16):
        raise HostsError(f"hosts must be 1-16, got {count}")
    if len(name) > 8 or not name.isalnum():
        raise HostsError(f"a cluster name is 1-8 letters or digits (interface names are short), got {name!r}")
    if (BASE / name / "state.json").exists():
        raise HostsError(f"simulated cluster {name!r} exists: `replicas cluster stop --name {name}` first")
    shaping = {k: v for k, v in (("rate", rate), ("delay", delay), ("loss", loss)) if v}
    _check_shaping(shaping)
    directory = BASE / name
    directory.mkdir(parents=True, exist_ok=True)
    token = directory / "token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    cluster = Cluster(name, f"rpb{name}", [Host(f"{name}-h{k}", f"{SUBNET}.{k + 2}", f"rpv{name}{k}")
                                            for k in range(count)], str(token), shaping)
    cluster.save()
    try:
        _sh("ip", "link", "add", cluster.bridge, "type", "bridge")
        _sh("ip", "link", "set", cluster.bridge, "up")
        for host in cluster.hosts:
            _make_host(cluster, host)
        cluster.save()
        _start_ray(cluster, cpus, object_store_bytes)
    except BaseException:
        stop(name)
        raise
    return cluster


def _make_host(cluster: Cluster, host: Host) -> None:
    _sh("ip", "netns", "add", host.name)
    _sh("ip", "link", "add", host.veth, "type", "veth", "peer", "name", "eth0", "netns", host.name)
    _sh("ip", "link", "set", host.veth, "master", cluster.bridge)
    _sh("ip", "link", "set", host.veth, "up")
    inside = ["ip", "-n", host.name]
    _sh(*inside, "addr", "add", f"{host.address}/24", "dev", "eth0")
    _sh(*inside, "link", "set", "eth0", "up")
    _sh(*inside, "link", "set", "lo", "up")
    # The holder: new mount and UTS namespaces inside the netns, a private /dev/shm and the
    # hostname; it says "ready" once both are in place and then sleeps until `stop`.
    script = (f"mount -t tmpfs -o size=2g,mode=1777 tmpfs /dev/shm && hostname {host.name} "
              "&& echo ready && exec sleep infinity")
    holder = subprocess.Popen(["ip", "netns", "exec", host.name, "unshare", "--mount", "--uts",
                               "--propagation", "private", "sh", "-c", script],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert holder.stdout is not None
    if holder.stdout.readline().strip() != "ready":
        raise HostsError(f"host {host.name}: {holder.stderr.read() if holder.stderr else ''}".strip())
    host.holder = holder.pid  # `ip netns exec` execs unshare, which execs sh, which execs sleep
    shape(cluster, host)


def shape(cluster: Cluster, host: Host) -> None:
    """Both directions of the host's link shaped as `cluster.shaping` says (nothing: unshaped)."""
    rate, delay, loss = (cluster.shaping.get(k) for k in ("rate", "delay", "loss"))
    inside = ["ip", "netns", "exec", host.name]
    netem = False
    for where, device in ((inside, "eth0"), ([], host.veth)):
        _sh(*where, "tc", "qdisc", "del", "dev", device, "root", check=False)
        if delay and device == "eth0":  # the host's end only: each direction leaves one host once
            netem = _sh(*where, "tc", "qdisc", "add", "dev", device, "root", "netem", "delay", delay,
                        *(["rate", rate] if rate else []), check=False).returncode == 0
        if rate and not (netem and device == "eth0"):
            _sh(*where, "tc", "qdisc", "add", "dev", device, "root", "tbf", "rate", rate, "burst", "256kb",
                "latency", "50ms")
    if loss or delay or shutil.which("iptables") is not None:
        if delay and not netem and shutil.which("iptables") is None:
            raise HostsError("a link delay needs the kernel's netem qdisc (sch_netem) or iptables' NFQUEUE "
                             "target (apt-get install iptables); this machine has neither")
        _sh(*inside, "iptables", "-F", "INPUT", check=bool(loss))
        _sh(*inside, "iptables", "-t", "raw", "-F", "PREROUTING", check=bool(delay and not netem))
    _end_delay_line(host)
    if loss:
        _sh(*inside, "iptables", "-A", "INPUT", "-i", "eth0", "-m", "statistic", "--mode", "random",
            "--probability", f"{loss_fraction(loss):.6f}", "-j", "DROP")
    if delay and not netem:
        _start_delay_line(cluster, host, delay_seconds(delay))
        _sh(*inside, "iptables", "-t", "raw", "-A", "PREROUTING", "-i", "eth0", "-j", "NFQUEUE",
            "--queue-num", str(DELAY_QUEUE))


def _start_delay_line(cluster: Cluster, host: Host, seconds: float) -> None:
    """The host's delay line started in its namespaces and bound to its queue (it says "ready")."""
    log = cluster.directory / f"{host.name}-delay.log"
    with open(log, "w") as errors:
        line = subprocess.Popen([*_enter(host), sys.executable, "-I", str(DELAY_LINE), str(DELAY_QUEUE),
                                 repr(seconds)], stdout=subprocess.PIPE, stderr=errors, text=True,
                                start_new_session=True)
    assert line.stdout is not None
    ready = line.stdout.readline().strip() == "ready"
    line.stdout.close()
    if not ready:
        line.kill()
        line.wait()
        raise HostsError(f"host {host.name}: its link's delay line did not start: {log.read_text().strip()[-2000:]}")
    host.delay_line = line.pid  # nsenter execs the interpreter


def _end_delay_line(host: Host) -> None:
    """The host's delay line ended (the kernel drops what it held: TCP sends it again)."""
    pid, host.delay_line = host.delay_line, 0
    if not pid or pid not in pids_in(host):  # gone already (or a pid reused elsewhere)
        return
    os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
    deadline = time.monotonic() + 10  # its queue is free once it is gone
    while pid in pids_in(host) and time.monotonic() < deadline:
        time.sleep(0.01)


def delay_seconds(text: str) -> float:
    """A delay as tc says it (`2ms`, `500us`, `0.1s`) in seconds; HostsError for anything else or
    outside (0, 1 s]."""
    units = {"us": 1e-6, "usec": 1e-6, "ms": 1e-3, "msec": 1e-3, "s": 1.0, "sec": 1.0}
    number = text.rstrip("abcdefghijklmnopqrstuvwxyz")
    try:
        value = float(number) * units[text[len(number):]]
    except (ValueError, KeyError):
        value = -1.0
    if not 0 < value <= 1:
        raise HostsError(f"a link delay is a time up to 1 s with its unit, as tc says it (2ms, 500us), got {text!r}")
    return value


def loss_fraction(text: str) -> float:
    """`5%` (or `0.05`) as a fraction; HostsError for anything else or outside [0, 1)."""
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1:
        raise HostsError(f"a packet loss is a share like 5% (or 0.05), got {text!r}")
    return value


def reshape(cluster: Cluster, rate: str | None = None, delay: str | None = None, loss: str | None = None) -> None:
    """Every link of a running cluster shaped anew (all None: unshaped), as `start` would."""
    cluster.shaping = {k: v for k, v in (("rate", rate), ("delay", delay), ("loss", loss)) if v}
    _check_shaping(cluster.shaping)
    for host in cluster.hosts:
        shape(cluster, host)
    cluster.save()


def _check_shaping(shaping: dict[str, str]) -> None:
    """Refuse, before anything is made, shaping this machine cannot do."""
    if "delay" in shaping:
        delay_seconds(shaping["delay"])
    if "loss" in shaping:
        loss_fraction(shaping["loss"])
        if shutil.which("iptables") is None:
            raise HostsError("a packet loss needs iptables (apt-get install iptables) and the kernel's statistic match")


def _start_ray(cluster: Cluster, cpus: int, object_store_bytes: int) -> None:
    env = dict(os.environ, **cluster.env())
    env.pop("RAY_ADDRESS")
    procs = []
    for k, host in enumerate(cluster.hosts):
        argv = [*_enter(host), *_ray(), "start", f"--node-ip-address={host.address}", f"--num-cpus={cpus}",
                f"--resources={json.dumps({f'host{k}': 1000})}", f"--temp-dir={cluster.directory / f'h{k}'}",
                f"--object-store-memory={object_store_bytes}", "--disable-usage-stats"]
        if k == 0:
            argv += ["--head", f"--port={GCS_PORT}", "--include-dashboard=false"]
        else:
            argv += [f"--address={cluster.address}"]
        log = open(cluster.directory / f"h{k}.log", "w")
        procs.append((host, subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)))
        if k == 0:  # the others join it: the head first
            _wait_started(cluster, *procs.pop())
    for host, proc in procs:
        _wait_started(cluster, host, proc)


def _wait_started(cluster: Cluster, host: Host, proc: subprocess.Popen) -> None:
    try:
        code = proc.wait(timeout=START_SECONDS)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = -1
    if code != 0:
        k = cluster.hosts.index(host)
        tail = (cluster.directory / f"h{k}.log").read_text()[-2000:]
        raise HostsError(f"Ray did not start on {host.name} ({host.address}):\n{tail}")


def pids_in(host: Host) -> list[int]:
    """Every process in the host's network namespace (its Ray node, drivers run in it, the holder)."""
    try:
        target = os.stat(f"/run/netns/{host.name}").st_ino
    except FileNotFoundError:
        return []
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{entry}/ns/net").st_ino == target:
                    found.append(int(entry))
    return found


def signal_host(cluster: Cluster, which: int | str, sig: int, *, keep_holder: bool = True,
                spare: Sequence[int] = ()) -> list[int]:
    """`sig` to every process of the host but (`keep_holder`) its holder and its link's delay line,
    and those in `spare`."""
    host = cluster.host(which)
    pids = [p for p in pids_in(host)
            if not (keep_holder and p in (host.holder, host.delay_line)) and p not in spare]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    return pids


def freeze(cluster: Cluster, which: int | str) -> None:
    """Every process of the host stopped (SIGSTOP): a host that hangs without closing anything."""
    signal_host(cluster, which, signal.SIGSTOP)


def thaw(cluster: Cluster, which: int | str) -> None:
    signal_host(cluster, which, signal.SIGCONT)


def kill_node(cluster: Cluster, which: int | str) -> list[int]:
    """The host's Ray node and everything it runs killed (the host itself stays), but the replicas'
    reapers: they leave Ray's process tree on purpose, to remove what the node's killed actors left
    in the host's /dev/shm (runtime/ray/reaper.py). Their pids (`wait_gone` waits for their sweep)."""
    reapers = [p for p in pids_in(cluster.host(which)) if _is_reaper(p)]
    signal_host(cluster, which, signal.SIGKILL, spare=reapers)
    return reapers


def _is_reaper(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"replicas/runtime/ray/reaper.py" in f.read()
    except OSError:
        return False


def wait_gone(pids: list[int], timeout: float) -> bool:
    """Whether the processes `pids` all ended within `timeout` s."""
    deadline = time.monotonic() + timeout
    while any(os.path.exists(f"/proc/{pid}") for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def cut(cluster: Cluster, which: int | str, up: bool = False) -> None:
    """The host's link down (a pulled cable: nothing is closed, packets just stop), or up again."""
    _sh("ip", "link", "set", cluster.host(which).veth, "up" if up else "down")


def shm_left(host: Host) -> list[str]:
    """The files in the host's own /dev/shm."""
    done = _sh(*_enter(host), "ls", "-A", "/dev/shm", check=False)
    return done.stdout.split()


def run_in(cluster: Cluster, which: int | str, argv: list[str], **kwargs) -> subprocess.Popen:
    """`argv` started inside the host, with the cluster's Ray settings (RAY_ADDRESS, the token)."""
    env = dict(kwargs.pop("env", None) or os.environ, **cluster.env())
    return subprocess.Popen([*_enter(cluster.host(which)), *argv], env=env, **kwargs)


def stop(name: str) -> None:
    """Every process in the hosts ended, the namespaces, links, bridge and state removed."""
    try:
        cluster = load(name)
    except HostsError:
        return
    hosts = cluster.hosts
    for host in hosts:
        for pid in pids_in(host):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)  # stopped (frozen) processes too
    deadline = time.monotonic() + 10
    while any(pids_in(h) for h in hosts) and time.monotonic() < deadline:
        time.sleep(0.05)
    for host in hosts:
        _sh("ip", "netns", "del", host.name, check=False)
        _sh("ip", "link", "del", host.veth, check=False)
    _sh("ip", "link", "del", cluster.bridge, check=False)
    shutil.rmtree(cluster.directory, ignore_errors=True)
    with contextlib.suppress(OSError):  # the last cluster leaves no folder behind (another's stays)
        BASE.rmdir()


def status(name: str) -> list[dict[str, object]]:
    cluster = load(name)
    rows = []
    for host in cluster.hosts:
        pids = pids_in(host)
        link = _sh("ip", "-br", "link", "show", host.veth, check=False).stdout.split()
        line = "-" if not host.delay_line else "running" if host.delay_line in pids else "gone"
        rows.append({"host": host.name, "address": host.address, "processes": len(pids),
                     "link": link[1] if len(link) > 1 else "gone", "shaping": cluster.shaping or "none",
                     "delay_line": line})
    return rows
