"""How long a job across two simulated hosts takes to end after host 1 breaks (a benchmark, never a test).

    sudo python bench/hosts_faults.py [--repeat 3] [--faults cut,freeze,kill] [--actor-per-replica]

Starts two hosts (replicas/cluster/hosts.py; root), runs a 4-replica all-reduce loop with replicas
1 and 3 on host 1 from a driver on host 0, breaks host 1 once the loop runs (link down, SIGSTOP of
every process, SIGKILL of its Ray node) and prints the seconds from the fault to the driver's error,
the error's first words, whether it names host 1's replicas (and the next job ran on host 0), and
what the hosts' /dev/shm hold afterwards. One pair of hosts for the cuts and freezes, a fresh pair
for each kill (the node stays dead). Each host's Ray CPUs are its share of this machine's cores, so
the runtime packs a host's replicas into one actor (their batched run is the loop: an all-reduce
spanning the hosts), as bench/hosts_collectives.py places them; `--actor-per-replica` gives each
host 2 CPUs instead (one replica an actor, unbatched)."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

from test_hosts import BROKEN, LONG, NEXT  # noqa: E402

from replicas.cluster import hosts  # noqa: E402


def once(cluster: hosts.Cluster, fault: str) -> tuple[float, str, bool, list[list[str]]]:
    proc = hosts.run_in(cluster, 0, [sys.executable, "-c", BROKEN, LONG, NEXT], stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdin is not None
    try:
        line = proc.stdout.readline()
        if line != "RUNNING\n":
            return float("nan"), line + (proc.stderr.read() if proc.stderr else "")[-500:], False, [[], []]
        {"cut": hosts.cut, "freeze": hosts.freeze, "kill": hosts.kill_node}[fault](cluster, 1)
        start = time.monotonic()
        proc.stdin.write("\n")
        proc.stdin.flush()
        error = proc.stdout.readline()
        seconds = time.monotonic() - start
        if fault == "cut":
            hosts.cut(cluster, 1, up=True)
        elif fault == "freeze":
            hosts.thaw(cluster, 1)
        out, _ = proc.communicate(timeout=240)
        ok = (f"replicas [1, 3] on host {cluster.hosts[1].address} " in error
              and out.splitlines() == ["NEXT [0.0, 2.0, 4.0, 6.0]"])  # and the next job ran on host 0
        return seconds, error.strip()[:110], ok, [hosts.shm_left(h) for h in cluster.hosts]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--faults", default="cut,freeze,kill")
    parser.add_argument("--actor-per-replica", action="store_true",
                        help="hosts of 2 Ray CPUs: one replica an actor (default: the runtime's packing)")
    ns = parser.parse_args()
    # A host's Ray CPUs: its share of this machine's cores (what the runtime packs its replicas by).
    cpus = 2 if ns.actor_per_replica else max(1, (os.cpu_count() or 2) // 2)
    placement = "one replica an actor" if ns.actor_per_replica else f"packed ({cpus} Ray CPU(s) a host)"
    print(f"# load average at start: {os.getloadavg()}; {placement}")
    name = f"b{os.getpid() % 10000}"
    cluster = None
    try:
        for fault in ns.faults.split(","):
            times = []
            for _ in range(ns.repeat):
                if cluster is None:
                    cluster = hosts.start(name, 2, cpus=cpus)
                seconds, error, ok, shm = once(cluster, fault)
                if fault == "kill":  # host 1's node stays dead: fresh hosts for the next
                    hosts.stop(name)
                    cluster = None
                times.append(seconds)
                left = "  ".join(f"host {k} /dev/shm {files or 'clean'}" for k, files in enumerate(shm))
                print(f"{fault:7s} {seconds:6.2f} s  {'host 1 named' if ok else 'WRONG'}  {left}  {error}", flush=True)
            print(f"{fault:7s} median {statistics.median(times):.2f} s, min {min(times):.2f}, max {max(times):.2f} "
                  f"(load {os.getloadavg()[0]:.0f})", flush=True)
    finally:
        hosts.stop(name)


if __name__ == "__main__":
    main()
