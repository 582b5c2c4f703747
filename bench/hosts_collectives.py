"""Collectives across two simulated hosts, next to gloo and MPI placed on the same hosts (a
benchmark, never a test; needs root and iproute2, as `replicas cluster` does).

    sudo python bench/hosts_collectives.py [--replicas 4,8] [--sizes 4KiB,1MiB,16MiB,64MiB]
                                           [--ops all-reduce,...] [--repeat 3] [--rounds 1] [--skip gloo,mpi]
                                           [--rate 1gbit] [--delay 1ms] [--loss 5%] [--per-actor 1]

Two hosts (replicas/cluster/hosts.py: each its own network, mount and UTS namespace and Ray node);
replica r runs on host r % 2 (`resources`), packed into actors as the runtime chooses
(`--per-actor K`: K replicas an actor instead). The driver runs inside host 0 and times the op
K times in a While loop on an operand the program makes (`made_inside`), differenced ((T(K2) -
T(K1)) / (K2 - K1): the job's start and its results cancel), `--repeat` times, median and spread.
Anchors in the same run, half the ranks on each host, in that host's namespaces: torch.distributed
gloo (one process per rank, rank r on host r % 2, over the hosts' addresses) and MPI (mpi4py under
MPICH's mpiexec, pip's `mpich`, whose launcher enters the hosts' namespaces, so each host's ranks
share a hostname and a /dev/shm as on real hosts and MPICH uses shared memory within a host, TCP
between them: UCX's own shared-memory transports, which reach across simulated hosts of one kernel,
are turned off). ratio = replicas / the best of gloo and MPI. With `--rate`/`--delay`/`--loss` the
links are shaped (replicas/cluster/hosts.py: tbf; netem where the kernel has it, else the cluster's
delay line; iptables) and a model column gives the link's bound for the op: its bytes over the
busiest host's link at the shaped rate, plus one one-way delay per message round across the link
(stated per op in `model_seconds`; loss is not in the model).
The replicas' connections between hosts run CUBIC (`REPLICAS_TCP_CONGESTION`), gloo's and MPI's
the system's default congestion control.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import (  # noqa: E402 - the bench folder is not a package
    BENCH_DIR,
    OPS,
    Timing,
    collective_program,
    fmt_time,
    iterations_for,
    load_average,
    mpiexec_path,
    parse_size,
    per_iteration,
    size_label,
)

# -- the replicas column: a driver inside host 0 ----------------------------------------------------------

# Iterations a differenced sample spans at least: a job's start across hosts varies by more than a
# few large collectives take on a loaded machine.
MIN_DIFFERENCED = 10


def made_inside(module, elements: int):
    """`module` with its operand made in the program (an iota) from a scalar parameter: a job's
    arguments of up to 64 MiB a replica went through Ray's object store of each simulated host (a
    few hundred MiB, spilled to disk beyond), a per-job cost whose spread passed the differenced
    time of the large rows."""
    import replicas as rp

    text = module.to_hlo_text()
    lines = text.splitlines()
    entry = next(k for k, line in enumerate(lines) if line.startswith("ENTRY"))
    at = next(k for k in range(entry, len(lines)) if "parameter(0)" in lines[k])
    name = lines[at].split("=")[0].strip()
    lines[at:at + 1] = ["  scalar = f32[] parameter(0)",
                        f"  {name} = f32[{elements}] iota(), iota_dimension=0"]
    return rp.parse_hlo("\n".join(lines))


def child_replicas(n: int, ops: list[str], sizes: list[int], repeat: int, per_actor: int | None) -> dict:
    import numpy as np

    import replicas as rp

    placement = [{f"host{r % 2}": 1} for r in range(n)]
    results: dict[str, dict[str, list[float]]] = {}
    for op in ops:
        results[op] = {}
        for nbytes in sizes:
            elements = nbytes // 4
            module = made_inside(collective_program(op, elements, n, result_elements=min(elements, 16)), elements)
            x = np.ones((), np.float32)

            def run(k: int, module: rp.Module = module, x: np.ndarray = x) -> float:
                t0 = time.perf_counter()
                rp.run(module, [x, np.asarray(k, np.int32)], num_replicas=n, address="auto",
                       resources=placement, replicas_per_actor=per_actor, timeout=600)
                return time.perf_counter() - t0

            run(1)  # actors, binding, connections
            k1, k2 = iterations_for(nbytes)
            k2 = max(k2, k1 + MIN_DIFFERENCED)
            results[op][str(nbytes)] = per_iteration(run, k1, k2, repeat).samples
    return {"results": results}


# -- anchors --------------------------------------------------------------------------------------------

def gloo_anchor(cluster, n: int, ops: list[str], sizes: list[int], timeout: float) -> tuple[dict | None, str]:
    from replicas.cluster import hosts

    try:
        import torch  # noqa: F401
    except ImportError:
        return None, "skipped (torch not installed)"
    master = f"{cluster.hosts[0].address}:29533"
    procs = []
    for rank in range(n):
        argv = [sys.executable, os.path.join(BENCH_DIR, "anchors_gloo.py"), "--rank", str(rank),
                "--replicas", str(n), "--master", master, "--ops", ",".join(ops),
                "--sizes", ",".join(str(s) for s in sizes)]
        env = dict(os.environ, GLOO_SOCKET_IFNAME="eth0")
        procs.append(hosts.run_in(cluster, rank % 2, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=env))
    outs = []
    for proc in procs:
        try:
            outs.append(proc.communicate(timeout=timeout))
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            return None, f"timed out after {timeout:.0f} s"
    if any(p.returncode for p in procs):
        return None, f"exit codes {[p.returncode for p in procs]}: {outs[0][1].strip()[-300:]}"
    return json.loads(outs[0][0].strip().splitlines()[-1]), ""


LAUNCHER = """#!/bin/sh
# MPICH's ssh launcher, for simulated hosts: `launcher [options] HOST COMMAND` runs COMMAND inside
# the namespaces of the host whose address is HOST.
while [ "${1#-}" != "$1" ]; do shift; done
host="$1"; shift
case "$host" in
%s
  *) echo "no simulated host $host" >&2; exit 2 ;;
esac
exec nsenter -t "$holder" --net --mount --uts -- sh -c "$*"
"""


def mpi_anchor(cluster, n: int, ops: list[str], sizes: list[int], timeout: float) -> tuple[dict | None, str]:
    from replicas.cluster import hosts

    mpiexec = mpiexec_path()
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return None, "skipped (mpi4py not installed)"
    if mpiexec is None:
        return None, "skipped (no mpiexec)"
    folder = tempfile.mkdtemp(prefix="rph-mpi-")
    try:
        launcher = os.path.join(folder, "launcher")
        cases = "\n".join(f"  {h.address}) holder={h.holder} ;;" for h in cluster.hosts)
        with open(launcher, "w") as f:
            f.write(LAUNCHER % cases)
        os.chmod(launcher, 0o755)
        h0, h1 = (h.address for h in cluster.hosts)
        argv = [mpiexec, "-launcher", "ssh", "-launcher-exec", launcher, "-iface", "eth0",
                "-hosts", f"{h0}:1,{h1}:1", "-n", str(n),  # half the ranks on each host
                sys.executable, os.path.join(BENCH_DIR, "anchors_mpi.py"), "--ops", ",".join(ops),
                "--sizes", ",".join(str(s) for s in sizes)]
        # The simulated hosts share one kernel (and its PID and IPC namespaces): UCX's shared-memory
        # transports (cma, sysv) reach across them and MPI's bytes between hosts would never cross the
        # network. TCP only between hosts, as ours and gloo's; within a host MPICH keeps its own.
        env = dict(os.environ, UCX_TLS="tcp,self")
        proc = hosts.run_in(cluster, 0, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            return None, f"timed out after {timeout:.0f} s"
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        if proc.returncode or not lines:
            return None, f"exit {proc.returncode}: {err.strip()[-300:]}"
        return json.loads(lines[-1]), ""
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# -- the table ------------------------------------------------------------------------------------------

def model_seconds(op: str, nbytes: int, n: int, rate_bps: float | None, delay_s: float) -> float | None:
    """The shaped link's bound: the bytes the busiest host must send over its link at `rate_bps`,
    plus one one-way delay per message round across the link. Half the replicas are on each host;
    per op, the bytes a host sends to the other: all-reduce its partial sums of the whole buffer
    (or half of them twice: reduce-scatter + all-gather between the hosts); all-gather its replicas'
    buffers once; reduce-scatter the other host's shards of its partial sums, half the buffer;
    all-to-all half of each of its replicas' buffers; collective-permute (r -> r + 1) each of its
    replicas' buffer. Rounds: every op can cross in one (the two hosts' transfers at once), and no
    iteration of the timed loop starts before the last one's bytes arrived, so each op pays one
    delay at least; the replicas' node leaders take exactly that one round between two hosts
    (collectives/nodes.py), a stream's chunks following each other without waiting for a reply.
    Where several replicas' streams share a link, one's bytes can cross while another's wait out
    the delay: a cell can come in a little under the model."""
    if rate_bps is None:
        return None
    half = n // 2
    sent = {"all-reduce": nbytes, "all-gather": half * nbytes, "reduce-scatter": nbytes / 2,
            "all-to-all": half * nbytes / 2, "collective-permute": half * nbytes}[op]
    return sent * 8 / rate_bps + delay_s


def rate_bits(text: str | None) -> float | None:
    if text is None:
        return None
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "bit": 1.0}
    for unit, scale in units.items():
        if text.endswith(unit):
            return float(text[: -len(unit)]) * scale
    raise SystemExit(f"--rate {text!r}: give it as tc does (100mbit, 1gbit)")


def anchor_time(anchor: dict | None, op: str, nbytes: int) -> float | None:
    if anchor is None:
        return None
    return anchor.get("results", {}).get(op, {}).get(str(nbytes))


def _replicas_round(cluster, n: int, a: argparse.Namespace) -> dict:
    from replicas.cluster import hosts

    argv = [sys.executable, os.path.abspath(__file__), "--child", "--n", str(n), "--ops", a.ops,
            "--sizes", a.sizes, "--repeat", str(a.repeat), "--per-actor", str(a.per_actor)]
    proc = hosts.run_in(cluster, 0, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=a.timeout)
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if proc.returncode or not lines:
        raise SystemExit(f"the replicas' driver failed (exit {proc.returncode}): {err[-2000:]}")
    return json.loads(lines[-1])["results"]


def _measure(cluster, n: int, ops: list[str], sizes: list[int], a: argparse.Namespace, skip: set[str]) -> None:
    """`--rounds` rounds of the replicas, gloo and MPI in turn (a slow period of the machine then
    falls on every column alike); a cell is the median over every round's samples, and the ratio's
    range is that of the rounds' own ratios."""
    from replicas.cluster import hosts

    mine: dict[tuple[str, int], list[float]] = {}
    anchors: dict[tuple[str, str, int], list[float]] = {}
    per_round: list[dict[tuple[str, int], float]] = []
    notes = {"gloo": "skipped", "mpi": "skipped"}
    started = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    loads = [load_average().split()[0]]  # the last minute's, around each round
    for _ in range(a.rounds):
        got = _replicas_round(cluster, n, a)
        ratios: dict[tuple[str, int], float] = {}
        results = {}
        for which, measure in (("gloo", gloo_anchor), ("mpi", mpi_anchor)):
            if which not in skip:
                results[which], note = measure(cluster, n, ops, sizes, a.timeout)
                notes[which] = note or "ran"
        for op in ops:
            for nbytes in sizes:
                samples = got[op][str(nbytes)]
                mine.setdefault((op, nbytes), []).extend(samples)
                peers = []
                for which, anchor in results.items():
                    t = anchor_time(anchor, op, nbytes)
                    if t:
                        anchors.setdefault((which, op, nbytes), []).append(t)
                        peers.append(t)
                if peers:
                    ratios[(op, nbytes)] = Timing(samples).median / min(peers)
        per_round.append(ratios)
        loads.append(load_average().split()[0])
    links = ", ".join(filter(None, (a.rate, a.delay, a.loss and f"loss {a.loss}"))) or "unshaped"
    ended = time.strftime("%H:%M UTC", time.gmtime())
    print(f"\nN={n} over 2 hosts ({started}-{ended}; {a.rounds} round(s), load {' -> '.join(loads)}; links {links}); "
          f"gloo: {notes['gloo']}; MPI: {notes['mpi']}")
    print("| op | size | replicas | gloo | MPI | ratio (rounds) | link model | vs model |")
    print("|---|---|---|---|---|---|---|---|")
    for op in ops:
        for nbytes in sizes:
            timing = Timing(mine[(op, nbytes)])
            cols = {w: anchors.get((w, op, nbytes)) for w in ("gloo", "mpi")}
            best = [Timing(v).median for v in cols.values() if v]
            ratio = "-"
            if best:
                rs = [r[(op, nbytes)] for r in per_round if (op, nbytes) in r]
                ratio = f"{timing.median / min(best):.2f}x" + (f" ({min(rs):.2f}-{max(rs):.2f})" if len(rs) > 1 else "")
            model = model_seconds(op, nbytes, n, rate_bits(a.rate), hosts.delay_seconds(a.delay) if a.delay else 0.0)
            versus = f"{timing.median / model:.2f}x" if model else "-"
            print(f"| {op} | {size_label(nbytes)} | {timing.text()} | "
                  f"{Timing(cols['gloo']).text() if cols['gloo'] else '-'} | "
                  f"{Timing(cols['mpi']).text() if cols['mpi'] else '-'} | "
                  f"{ratio} | {fmt_time(model) if model else '-'} | {versus} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", default="4,8")
    parser.add_argument("--sizes", default="4KiB,1MiB,16MiB,64MiB")
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--repeat", type=int, default=3, help="differenced samples per cell and round")
    parser.add_argument("--rounds", type=int, default=1,
                        help="the replicas and the anchors measured this many times in turn")
    parser.add_argument("--skip", default="", help="anchors to leave out: gloo,mpi")
    parser.add_argument("--rate", default=None, help="shape each link: its bandwidth, as tc says it (1gbit)")
    parser.add_argument("--delay", default=None, help="shape each link: one-way delay (2ms; netem or the delay line)")
    parser.add_argument("--loss", default=None, help="shape each link: packet loss each way (5%%; iptables)")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--per-actor", type=int, default=0, help="replicas an actor (0: the runtime's packing)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    a = parser.parse_args()
    ops = a.ops.split(",")
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    if a.child:
        print(json.dumps(child_replicas(a.n, ops, sizes, a.repeat, a.per_actor or None)), flush=True)
        return

    from replicas.cluster import hosts

    reason = hosts.why_not_possible()
    if reason is not None:
        raise SystemExit(f"no simulated hosts here: {reason}")
    skip = set(filter(None, a.skip.split(",")))
    ns = [int(v) for v in a.replicas.split(",")]
    name = f"b{secrets.token_hex(2)}"
    # Each host's Ray CPUs are its share of this machine's cores (what the runtime packs a host's replicas by).
    cluster = hosts.start(name, 2, cpus=max(1, (os.cpu_count() or 2) // 2), rate=a.rate, delay=a.delay, loss=a.loss)
    try:
        for n in ns:
            _measure(cluster, n, ops, sizes, a, skip)
    finally:
        hosts.stop(name)


if __name__ == "__main__":
    main()
