"""Where a command's CPU goes, by process (for the test suite's time, issue #12). Linux only.

    python bench/suite_cpu.py [--json out.json] -- python -m pytest [args]

Runs the command as a child subreaper (PR_SET_CHILD_SUBREAPER), so the processes it leaves behind
(Ray's daemons, `ray start`'s nodes) stay in its tree and are reaped here. Samples utime + stime of
every process of the tree from /proc every 0.2 s and prints the total per kind of process (xdist
workers, Ray workers, each Ray daemon, subprocesses), the tree's CPU by rusage, the machine's busy
CPU over the run (/proc/stat) and the load average before and after. A process that lives less than
a sample is missed by the breakdown (rusage counts it, unless its parent ignores SIGCHLD, as the
raylet does with its workers: the sampled total can exceed rusage). On a machine others use, CPU
seconds of the tree compare runs better than wall time, though load still inflates them (spinning
waits, thread hand-offs): compare two versions back to back.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import json
import os
import re
import resource
import sys
import time

CLK = os.sysconf("SC_CLK_TCK")
PR_SET_CHILD_SUBREAPER = 36


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the machine since boot."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:9]]
    idle = ticks[3] + ticks[4]
    return (sum(ticks) - idle) / CLK, sum(ticks) / CLK


def tree_of(root: int) -> dict[tuple[int, str], tuple[float, int]]:
    """(pid, start time) -> (utime + stime in seconds, parent pid) of every descendant of `root`."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    info: dict[int, tuple[str, float, int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        pid, parent = int(name), int(fields[1])
        children[parent].append(pid)
        info[pid] = (fields[19], (int(fields[11]) + int(fields[12])) / CLK, parent)
    found: dict[tuple[int, str], tuple[float, int]] = {}
    stack = [root]
    while stack:
        for pid in children.get(stack.pop(), ()):
            start, cpu, parent = info[pid]
            found[(pid, start)] = (cpu, parent)
            stack.append(pid)
    return found


def command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline") as f:
            return f.read().replace("\0", " ").strip()
    except OSError:
        return "?"


DAEMONS = (("dashboard/agent.py", "ray dashboard agent"), ("ray::DashboardAgent", "ray dashboard agent"),
           ("runtime_env/agent", "ray runtime_env agent"), ("ray::RuntimeEnvAgent", "ray runtime_env agent"),
           ("dashboard.py", "ray dashboard head"), ("log_monitor", "ray log_monitor"),
           ("monitor.py", "ray autoscaler monitor"), ("ray.scripts.scripts start", "ray start (cli)"))


def kind(command: str) -> str:
    """What a process is, from its command line (Ray renames its workers and agents)."""
    program = command.split(" ")[0]
    if program.endswith("/raylet/raylet"):
        return "ray raylet"
    if "gcs_server" in program:
        return "ray gcs_server"
    for part, name in DAEMONS:
        if part in command:
            return name
    if "default_worker.py" in command or command.startswith("ray::"):
        return "ray worker"
    if "exec(eval(sys.stdin" in command:
        return "pytest-xdist worker"
    if "-m pytest" in command:
        return "pytest (controller)"
    return "other: " + re.sub(r"\s+", " ", command)[:70]


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write every process's CPU and command line here")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    options = parser.parse_args()
    command = options.command[1:] if options.command[:1] == ["--"] else options.command
    if not command:
        parser.error("no command")
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
    load_before, (busy0, total0), start = load(), machine_cpu(), time.monotonic()
    child = os.fork()
    if child == 0:
        os.execvp(command[0], command)
    seen: dict[tuple[int, str], tuple[float, int, str]] = {}
    status, ended = None, None
    while True:
        tree = tree_of(os.getpid())
        for key, (cpu, parent) in tree.items():
            line = seen[key][2] if key in seen else command_line(key[0])
            seen[key] = (cpu, parent, line)
        while True:  # reap the command and whatever it left behind
            try:
                pid, code = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid == child:
                status, ended = os.waitstatus_to_exitcode(code), time.monotonic()
        if ended is not None and (not tree or time.monotonic() - ended > 60):
            if tree:
                print(f"left running after 60 s: {sorted({kind(v[2]) for v in seen.values()})}", file=sys.stderr)
            break
        time.sleep(0.2)
    wall = time.monotonic() - start
    busy1, total1 = machine_cpu()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    by_kind: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    for cpu, _, line in seen.values():
        by_kind[kind(line)] += cpu
        count[kind(line)] += 1
    out = sys.stderr
    print(f"\nwall {wall:.1f} s, exit {status}; tree CPU {usage.ru_utime + usage.ru_stime:.1f} s (rusage), "
          f"{sum(by_kind.values()):.1f} s sampled over {len(seen)} processes; machine busy "
          f"{busy1 - busy0:.1f} of {total1 - total0:.1f} CPU s; load {load_before} -> {load()}", file=out)
    for name, cpu in by_kind.most_common():
        print(f"  {cpu:7.1f} s  x{count[name]:<4d} {name}", file=out)
    if options.json:
        with open(options.json, "w") as f:
            json.dump({"wall": wall, "processes": [{"pid": pid, "cpu": cpu, "parent": parent, "command": line}
                                                   for (pid, _), (cpu, parent, line) in seen.items()]}, f)
    return status or 0


if __name__ == "__main__":
    sys.exit(main())
