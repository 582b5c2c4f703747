"""Nothing is left by a killed driver: a driver in a subprocess runs a job that waits on its infeed,
is killed with SIGKILL, and within 5 s the job's shared-memory segments are gone from /dev/shm,
nothing of it is in the temp dir, and no process of the local Ray it started is left (its reaper,
runtime/ray/reaper.py, included)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from replicas.runtime.ray.reaper import start_time
from replicas.transport.shm import PREFIX, SHM_DIR

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and /dev/shm")

WITHIN = 5.0  # seconds: the bound for the cleaning after the driver's death

DRIVER = """
import json, os, sys, time
import numpy as np
import replicas as rp

FED = '''
HloModule fed, replica_count=4

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
  tok = token[] after-all()
  in = (f32[4], token[]) infeed(tok)
  x = f32[4] get-tuple-element(in), index=0
  ROOT z = f32[4] all-reduce(x), replica_groups={}, to_apply=add
}
'''
backend = sys.argv[1]
options = dict(replicas_per_actor=2) if backend == "ray" else {}
job = rp.launch(rp.parse_hlo(FED), [], num_replicas=4, timeout=600, backend=backend, **options)
job.infeed(0, np.ones(4, np.float32))  # replica 0 reaches the all-reduce; the others wait on their infeed
deadline = time.monotonic() + 300
while sum(s.status == "blocked" for s in job.states()) < 4 and time.monotonic() < deadline:
    time.sleep(0.05)
report = {"pid": os.getpid(), "token": getattr(job._backend, "_token", None), "raylet": None, "session": None}
if backend == "ray":
    import ray
    node = ray._private.worker._global_node
    report["raylet"] = node.all_processes["raylet"][0].process.pid
    report["session"] = os.path.realpath(node.get_session_dir_path())
print(json.dumps(report), flush=True)
time.sleep(600)  # killed here, mid-job
"""


def _processes() -> dict[int, int]:
    """pid -> parent pid, of every process."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    out[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):
                pass
    return out


def _descendants(root: int) -> list[int]:
    parents = _processes()
    found, todo = [], [root]
    while todo:
        p = todo.pop()
        kids = [c for c, parent in parents.items() if parent == p]
        found.extend(kids)
        todo.extend(kids)
    return found


def _started_by_raylet(raylet: int) -> list[int]:
    mark = f"RAY_RAYLET_PID={raylet}".encode()
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if mark in f.read().split(b"\0"):
                        out.append(int(entry))
            except OSError:
                pass
    return out


def _holding_files_in(directory: str) -> list[int]:
    """Processes with a file of `directory` open (a Ray session's processes keep their logs there)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                links = [os.readlink(f"/proc/{entry}/fd/{fd}") for fd in os.listdir(f"/proc/{entry}/fd")]
            except OSError:
                continue
            if any(link.startswith(directory + "/") for link in links):
                out.append(int(entry))
    return out


def _running(pid: int, started: str) -> bool:
    """The process is still that one and has not exited (a zombie has exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return fields[19] == started and fields[0] not in ("Z", "X")


def _name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")[:80]
    except OSError:
        return "?"


def _mapped_segments(pid: int) -> set[str]:
    with open(f"/proc/{pid}/maps") as f:
        return {line.split(maxsplit=5)[-1].strip() for line in f if f" {SHM_DIR}/" in line}


def _ours(names: set[str]) -> set[str]:
    return {n for n in names if n.startswith(("rpl-", "rpw-"))}


def _kill_mid_job(backend: str, tmp_path) -> None:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    temp_before = _ours(set(os.listdir(tempfile.gettempdir())))
    driver = subprocess.Popen([sys.executable, str(script), backend], stdout=subprocess.PIPE, text=True,
                              cwd=tmp_path, start_new_session=True)
    try:
        line = driver.stdout.readline()
        assert line, f"the driver ended before its job was running (exit {driver.wait(60)})"
        report = json.loads(line)
        segments = {os.path.join(SHM_DIR, n) for n in os.listdir(SHM_DIR)
                    if report["token"] and n.startswith(f"{PREFIX}{report['token']}-")}
        segments |= _mapped_segments(report["pid"])
        watched = set(_descendants(report["pid"]))
        if report["raylet"] is not None:
            assert segments, "the Ray job made no segment: the test would prove nothing"
            watched |= set(_started_by_raylet(report["raylet"])) | set(_holding_files_in(report["session"]))
        watched_started = {p: start_time(p) for p in watched}
        watched_started = {p: s for p, s in watched_started.items() if s is not None}
        driver.send_signal(signal.SIGKILL)
        driver.wait(60)
        deadline = time.monotonic() + WITHIN
        left_segments, left_procs = segments, watched_started
        while time.monotonic() < deadline:
            left_segments = {p for p in segments if os.path.exists(p)}
            left_procs = {p: s for p, s in watched_started.items() if _running(p, s)}
            if not left_segments and not left_procs:
                break
            time.sleep(0.05)
        assert not left_segments, f"{sorted(left_segments)} still in {SHM_DIR} {WITHIN} s after the driver died"
        assert not left_procs, (f"{[(p, _name(p)) for p in left_procs]} still run {WITHIN} s after the driver "
                                f"died")
        assert _ours(set(os.listdir(tempfile.gettempdir()))) <= temp_before
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait(60)
        driver.stdout.close()


def test_a_killed_ray_driver_leaves_no_segment_file_or_ray_process(tmp_path):
    _kill_mid_job("ray", tmp_path)


def test_a_killed_threads_driver_leaves_no_segment_or_file(tmp_path):
    _kill_mid_job("threads", tmp_path)
