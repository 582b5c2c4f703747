"""A machine that refuses a job a resource ends it with a ResourceExhausted (a ReplicaFailure of
replicas.errors) naming the resource, and whatever the job had started is stopped: its threads
end (the process's thread count is back where it was).

Each exhausting case runs in a subprocess of its own with the limit set there (the test process
keeps its own limits)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

ALL_REDUCE_512 = r'''
import json, os, resource, sys, threading
import numpy as np
import replicas as rp
from replicas.errors import ResourceExhausted

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

m = rp.parse_hlo("""HloModule m
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}
ENTRY e {
  p = f32[4] parameter(0)
  ROOT r = f32[4] all-reduce(p), replica_groups={}, to_apply=add
}
""")
x = np.ones(4, np.float32)
rp.run(m, [x], num_replicas=2, backend="threads")  # imports and first pools, before the limit
before = threading.active_count()
limit = sys.argv[1]
if limit == "address-space":  # room for a few dozen 8 MiB thread stacks, not for 512
    room = status("VmSize") + (384 << 20)
    resource.setrlimit(resource.RLIMIT_AS, (room, resource.getrlimit(resource.RLIMIT_AS)[1]))
elif limit == "processes":  # a user's processes and threads (root is exempt)
    # A user of its own (no account needed): RLIMIT_NPROC counts every process of the user, so a
    # shared one (nobody) would count other tests' processes too.
    os.setgid(200000 + os.getpid())
    os.setuid(200000 + os.getpid())
    resource.setrlimit(resource.RLIMIT_NPROC, (before + 40, before + 40))
out = {"before": before}
try:
    rp.run(m, [x], num_replicas=512, backend="threads", timeout=60)
    out["outcome"] = "ran"
except ResourceExhausted as e:
    out.update(outcome="ResourceExhausted", resource=e.resource, message=str(e))
except BaseException as e:
    out.update(outcome=type(e).__name__, message=str(e))
out["after"] = threading.active_count()
out["threads"] = [t.name for t in threading.enumerate()]
print(json.dumps(out))
'''


def _run(limit: str) -> dict:
    env = {"MALLOC_ARENA_MAX": "1", "PATH": "/usr/bin:/bin", "HOME": "/tmp"}
    done = subprocess.run([sys.executable, "-c", ALL_REDUCE_512, limit], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("limit", ["address-space", "processes"])
def test_a_thread_that_cannot_start_ends_the_job_naming_threads_and_stops_the_others(limit):
    import os

    if limit == "processes" and os.geteuid() != 0:
        pytest.skip("becomes another user to be held by RLIMIT_NPROC (root is exempt)")
    out = _run(limit)
    assert out["outcome"] == "ResourceExhausted", out
    assert out["resource"] == "threads", out
    assert "could not start" in out["message"] and "were stopped" in out["message"], out
    assert out["after"] == out["before"], out  # every replica thread it had started has ended


CUSTOM_CALLS = r'''
import errno, json, os, resource, subprocess, sys, threading
import numpy as np
import replicas as rp
from replicas.errors import ResourceExhausted

def opens(x):
    with open("/dev/null"):
        return x

def spawns(x):
    subprocess.run(["/bin/true"], check=True)
    return x

rp.register_custom_call("opens", opens)
rp.register_custom_call("spawns", spawns)
text = """HloModule m
ENTRY e {
  p = f32[4] parameter(0)
  ROOT r = f32[4] custom-call(p), custom_call_target="%s"
}
"""
x = np.ones(4, np.float32)
case = sys.argv[1]
target = "opens" if case in ("file descriptors", "program file") else "spawns"
path = "program.hlo"  # in the test's own temporary directory, the cwd
with open(path, "w") as f:
    f.write(text % target)
m = rp.parse_hlo(text % target)
rp.run(path, [x], num_replicas=2, backend="threads")  # warm: imports, two idle worker threads
before = threading.active_count()
held = []
if case in ("file descriptors", "program file"):  # every descriptor up to a low limit is taken
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    try:
        while True:
            held.append(os.open("/dev/null", os.O_RDONLY))
    except OSError as e:
        assert e.errno == errno.EMFILE
else:  # this user may start no process or thread at all (root is exempt)
    # A user of its own (no account needed): RLIMIT_NPROC counts every process of the user, so a
    # shared one (nobody) would count other tests' processes too. A limit of one, not the count
    # now: the pool's idle workers may end meanwhile and leave room under it.
    os.setgid(200000 + os.getpid())
    os.setuid(200000 + os.getpid())
    resource.setrlimit(resource.RLIMIT_NPROC, (1, 1))
out = {"before": before}
try:
    rp.run(path if case == "program file" else m, [x], num_replicas=2, backend="threads", timeout=60)
    out["outcome"] = "ran"
except ResourceExhausted as e:
    out.update(outcome="ResourceExhausted", resource=e.resource, replica=e.replica, instruction=e.instruction,
               message=str(e))
except BaseException as e:
    out.update(outcome=type(e).__name__, message=str(e))
for fd in held:
    os.close(fd)
os.unlink(path) if os.getuid() == 0 else None
out["after"] = threading.active_count()
print(json.dumps(out))
'''


@pytest.mark.parametrize("case", ["file descriptors", "program file", "processes"])
def test_a_replica_refused_a_descriptor_or_a_process_ends_the_job_naming_it(case, tmp_path):
    import os

    if case == "processes" and os.geteuid() != 0:
        pytest.skip("becomes another user to be held by RLIMIT_NPROC (root is exempt)")
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp"}
    done = subprocess.run([sys.executable, "-c", CUSTOM_CALLS, case], capture_output=True, text=True, timeout=120,
                          env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["outcome"] == "ResourceExhausted", out
    if case == "processes":
        # RLIMIT_NPROC counts threads too: when the pool's idle workers have ended meanwhile, the
        # job's own thread is what is refused first (named "threads"); else the custom call's child.
        assert out["resource"] in ("processes", "threads"), out
    else:
        assert out["resource"] == "file descriptors", out
    if case != "program file" and out["resource"] != "threads":  # a replica's kernel: named with its instruction
        assert out["replica"] in (0, 1) and out["instruction"].startswith("%r (custom-call"), out
    assert out["after"] == out["before"], out  # the threads it started ended


FULL_SHM = r'''
import json, sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import replicas as rp
from test_runtime_ray import ALL_REDUCE

n, size = 4, 1 << 18  # 1 MiB a replica: four boards' worth of writes into a /dev/shm of 2 MiB
m = rp.parse_hlo(ALL_REDUCE.format(n=n, size=size, gsize=n * size))
xs = [[np.random.default_rng(r).standard_normal(size).astype(np.float32)] for r in range(n)]
want = rp.run(m, xs, num_replicas=n, backend="threads")
got = rp.run(m, xs, num_replicas=n, replicas_per_actor=1, timeout=120)
print(json.dumps({"equal": all(np.array_equal(a, b) for r in range(n) for a, b in zip(got[r], want[r]))}))
'''


def test_a_full_dev_shm_is_no_crash_on_ray(tmp_path):
    # /dev/shm backs the board's sparse segments page by page: a page first written when it is full
    # killed the actor with SIGBUS. Now each page is allocated before it is written, and a collective
    # that finds no room sends its bytes over the fabric (its own memory) instead.
    import os
    import shutil

    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("mounts a small /dev/shm of its own in a mount namespace (needs root and unshare)")
    here = os.path.dirname(os.path.abspath(__file__))
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                           'mount -t tmpfs -o size=2m tmpfs /dev/shm && exec "$0" -c "$1" "$2"',
                           sys.executable, FULL_SHM, here], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {"equal": True}, done.stdout[-2000:]


@pytest.mark.usefixtures("ray_session")
def test_an_actor_refused_a_descriptor_ends_the_job_naming_it_on_ray():
    import numpy as np

    import replicas as rp
    from replicas.errors import ResourceExhausted

    def refused_a_descriptor(x):  # defined here: Ray sends it to the actors by value
        """Runs its process out of file descriptors under a lowered limit (and gives them back)."""
        import os
        import resource

        limits = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 8, limits[1]))
        held = []
        try:
            while True:  # ends with EMFILE: what the job is to name
                held.append(os.open("/dev/null", os.O_RDONLY))
        finally:
            for fd in held:
                os.close(fd)
            resource.setrlimit(resource.RLIMIT_NOFILE, limits)

    rp.register_custom_call("refused_a_descriptor", refused_a_descriptor)
    try:
        m = rp.parse_hlo("HloModule m\nENTRY e {\n  p = f32[4] parameter(0)\n"
                         '  ROOT r = f32[4] custom-call(p), custom_call_target="refused_a_descriptor"\n}\n')
        with pytest.raises(ResourceExhausted) as info:
            rp.run(m, [np.ones(4, np.float32)], num_replicas=2, timeout=120)
    finally:
        rp.unregister_custom_call("refused_a_descriptor")
    assert info.value.resource == "file descriptors", info.value
    assert info.value.replica in (0, 1) and info.value.instruction.startswith("%r (custom-call"), info.value
