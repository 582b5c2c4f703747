"""`replicas cluster start|stop|status|run`: simulated hosts on this machine (replicas/cluster/hosts.py),
or with `--local` two Ray nodes on its loopback (replicas/cluster/local.py)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from typing import Any

HELP = """Simulated hosts on this Linux machine (root): each its own network, mount and UTS namespace
(an address 10.213.0.<k+2> on a private bridge, its own /dev/shm and hostname) and its own Ray node
with the custom resource host<k>, joined to the head on host 0, with Ray's token authentication.
A driver runs inside a host: `replicas cluster run -- replicas run program.hlo --address auto`.
With --local (any machine, no root): two Ray nodes on 127.0.0.1 (custom resources node1, node2),
which `--address auto` finds from this machine's own network."""


def add_cluster_parser(sub: Any, **kw: Any) -> None:
    p = sub.add_parser("cluster", help="start, stop, inspect simulated hosts on this machine, run a driver on one",
                       description=HELP, **kw)
    actions = p.add_subparsers(dest="action", required=True)
    kw.pop("description", None)
    start = actions.add_parser("start", help="start the hosts and their Ray nodes; prints the head's address", **kw)
    start.add_argument("--hosts", type=int, default=2, help="how many hosts (1-16)")
    start.add_argument("--cpus", type=int, default=1, help="Ray CPUs per host")
    start.add_argument("--rate", default=None, help="each link's bandwidth, as tc says it (1gbit, 100mbit)")
    start.add_argument("--delay", default=None,
                       help="each link's one-way delay (2ms; the kernel's netem, else the cluster's delay line)")
    start.add_argument("--loss", default=None, help="each link's packet loss, per direction (5%%; iptables)")
    for name, text in (("stop", "end every process of the hosts and remove them"),
                       ("status", "the hosts, their addresses, processes and links")):
        actions.add_parser(name, help=text, **kw)
    run = actions.add_parser("run", help="run a command inside a host (default the head's), as its driver", **kw)
    run.add_argument("--host", default="0", help="host number or name")
    run.add_argument("argv", nargs=argparse.REMAINDER, help="the command (after --)")
    for q in actions.choices.values():
        q.add_argument("--name", default="rp", help="the cluster's name (1-8 letters or digits)")
    for name in ("start", "stop", "status"):
        q = actions.choices[name]
        q.add_argument("--local", action="store_true",
                       help="two Ray nodes on this machine's loopback instead of simulated hosts (no root)")
        q.add_argument("--dir", default=None, help="--local: the cluster's directory "
                       "($REPLICAS_CLUSTER_DIR, default /tmp/replicas-cluster)")
    run.set_defaults(local=False)
    start.add_argument("--port", type=int, default=None, help="--local: the head's port; the cluster uses "
                       "PORT..PORT+299 ($REPLICAS_CLUSTER_PORT, default 6390)")


def cluster_command(ns: argparse.Namespace) -> int:
    from replicas.cluster import hosts, local

    if ns.local:
        if ns.action == "start" and (ns.rate or ns.delay or ns.loss):
            print("replicas cluster start --local: --rate, --delay and --loss shape the links of simulated hosts "
                  "(--hosts); the loopback is not shaped", file=sys.stderr)
            return 2
        if ns.action == "start":
            print(local.start(ns.port, ns.dir, cpus=ns.cpus))
        elif ns.action == "stop":
            local.stop(ns.dir)
        else:
            for row in local.status(ns.dir):
                print("  ".join(f"{k}={v}" for k, v in row.items()))
        return 0
    if ns.action == "start":
        cluster = hosts.start(ns.name, ns.hosts, cpus=ns.cpus, rate=ns.rate, delay=ns.delay, loss=ns.loss)
        print(cluster.address)
        return 0
    if ns.action == "stop":
        hosts.stop(ns.name)
        return 0
    if ns.action == "status":
        for row in hosts.status(ns.name):
            print("  ".join(f"{k}={v}" for k, v in row.items()))
        return 0
    argv = ns.argv[1:] if ns.argv[:1] == ["--"] else ns.argv
    if not argv:
        print("replicas cluster run: give the command after --", file=sys.stderr)
        return 2
    proc = hosts.run_in(hosts.load(ns.name), ns.host, argv)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        try:
            return proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            return 130
