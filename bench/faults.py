"""How fast faults and deadlocks become errors (Ray and threads), median and spread of repeats.

    PYTHONPATH=$PWD python bench/faults.py [--repeats 5]

- deadlock: a replica skips the last all-reduce; time from the job's start to DeadlockError minus
  the time of the same job without the planted deadlock (the anchor, measured in the same run).
- actor exit / segfault / ray.kill: time from the fault (stamped by the dying custom call, or by the
  driver's kill) to the ReplicaFailure naming the replica.
- custom call raising: the same, to the ReplicaFailure.
- a peer message over what the program expects: time from a key holder's send of a 1 MiB piece of
  a 16-byte all-reduce to the ReplicaFailure naming the sender.
- a resource no node has: time from `rp.run` to the ReplicaFailure (the anchor: a healthy run).
- a full node: time from `rp.run(timeout=2)` to the ExecutionTimeout naming the short resource, while
  a placeholder actor holds every free CPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time

import numpy as np

import replicas as rp
from replicas.ops.custom_call import unregister_custom_call

DEADLOCK = """\
HloModule planted, replica_count={n}

add {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}}

done {{
  p = f32[8] parameter(0)
  ROOT q = f32[8] copy(p)
}}

again {{
  p = f32[8] parameter(0)
  ROOT q = f32[8] all-reduce(p), replica_groups={{}}, to_apply=add
}}

ENTRY main {{
  x = f32[8] parameter(0)
  id = u32[] replica-id()
  a1 = f32[8] all-reduce(x), replica_groups={{}}, to_apply=add
  victim = u32[] constant({victim})
  skip = pred[] compare(id, victim), direction=EQ
  ROOT out = f32[8] conditional(skip, a1, a1), true_computation=done, false_computation=again
}}
"""

# Both replicas wait in an infeed nobody feeds: a job that stays up until the fault being timed.
WAITS_FOR_INFEED = DEADLOCK.format(n=2, victim=2).replace(
    "x = f32[8] parameter(0)",
    "x = f32[8] parameter(0)\n  tok = token[] after-all()\n  in = (f32[8], token[]) infeed(tok)")

CALL = """\
HloModule call, replica_count=2

ENTRY main {
  x = f32[8] parameter(0)
  id = u32[] replica-id()
  ROOT y = f32[8] custom-call(x, id), custom_call_target="fault"
}
"""

X = np.ones(8, np.float32)


def stamp_and(action: str, path: str):
    def fault(x, rid):
        if int(rid) == 1:
            with open(path, "w") as f:
                f.write(repr(time.time()))
            if action == "exit":
                os._exit(3)
            if action == "segfault":
                import ctypes

                ctypes.string_at(0)
            raise ValueError("planted")
        return x

    return fault


def fault_latency(action: str) -> float:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "t")
        rp.register_custom_call("fault", stamp_and(action, path))
        try:
            rp.run(rp.parse_hlo(CALL), [X], num_replicas=2, timeout=60)
        except rp.ReplicaFailure as e:
            assert e.replica == 1, e
            return time.time() - float(open(path).read())
        finally:
            unregister_custom_call("fault")
        raise AssertionError("no ReplicaFailure")


def kill_latency() -> float:
    import ray

    m = rp.parse_hlo(WAITS_FOR_INFEED)
    job = rp.launch(m, [X], num_replicas=2, timeout=60)
    event = threading.Event()
    while job.states()[0].status != "blocked":
        event.wait(0.05)
    killed = time.time()
    ray.kill(job._backend._actor_of[0], no_restart=True)  # noqa: SLF001 - the fault being timed
    try:
        job.result()
    except rp.ReplicaFailure as e:
        assert e.replica == 0, e
        return time.time() - killed
    raise AssertionError("no ReplicaFailure")


def hostile_message_latency() -> float:
    from replicas.runtime.ray.backend import _AUTHKEY
    from replicas.transport.wire import Wire, WireError

    m = rp.parse_hlo(WAITS_FOR_INFEED)
    job = rp.launch(m, [X], num_replicas=2, timeout=60)
    backend = job._backend  # noqa: SLF001 - the fault being timed
    address = backend._get([backend._actor_of[0].wire_address.remote(_AUTHKEY)])[0]
    insider = Wire(lambda m: None, _AUTHKEY, address["node"])
    sent = time.time()
    try:
        insider.send(address, (backend._token, 0, 1, ("coll", 0, 0), np.zeros(1 << 18, np.float32)))
    except WireError:
        pass
    try:
        job.result()
    except rp.ReplicaFailure as e:
        assert "replica 1 sent" in str(e), e
        return time.time() - sent
    finally:
        insider.close()
    raise AssertionError("no ReplicaFailure")


def unplaceable_latency() -> float:
    start = time.monotonic()
    try:
        rp.run(rp.parse_hlo(CALL.replace('custom-call(x, id), custom_call_target="fault"', "copy(x)")), [X],
               num_replicas=2, resources=[{"no_such_accelerator": 1}, {}], timeout=60)
    except rp.ReplicaFailure:
        return time.monotonic() - start
    raise AssertionError("no ReplicaFailure")


def full_node_latency(timeout: float = 2.0) -> float:
    import ray

    holder = ray.remote(num_cpus=ray.available_resources().get("CPU", 0))(_Holder).remote()
    ray.get(holder.ping.remote())
    start = time.monotonic()
    try:
        rp.run(rp.parse_hlo(CALL.replace('custom-call(x, id), custom_call_target="fault"', "copy(x)")), [X],
               num_replicas=2, resources=[{"CPU": 1}, {"CPU": 1}], timeout=timeout)
    except rp.ExecutionTimeout as e:
        assert "asks for CPU=1" in str(e), e
        return time.monotonic() - start
    finally:
        ray.kill(holder, no_restart=True)
    raise AssertionError("no ExecutionTimeout")


class _Holder:
    def ping(self) -> bool:
        return True


def deadlock_latency(backend: str, n: int) -> float:
    def timed(victim: int) -> float:
        start = time.monotonic()
        try:
            rp.run(rp.parse_hlo(DEADLOCK.format(n=n, victim=victim)), [X], num_replicas=n, backend=backend,
                   timeout=60)
        except rp.DeadlockError:
            pass
        return time.monotonic() - start

    anchor = timed(n)  # nobody skips: the same job without the deadlock
    return timed(0) - anchor


def main() -> None:
    import ray

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    ns = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}")
    rows = {
        "deadlock found (threads, 4)": lambda: deadlock_latency("threads", 4),
        "deadlock found (ray, 4)": lambda: deadlock_latency("ray", 4),
        "actor os._exit -> ReplicaFailure": lambda: fault_latency("exit"),
        "actor segfault -> ReplicaFailure": lambda: fault_latency("segfault"),
        "custom call raises -> ReplicaFailure": lambda: fault_latency("raise"),
        "ray.kill(actor) -> ReplicaFailure": kill_latency,
        "peer message over bound -> ReplicaFailure": hostile_message_latency,
        "resource no node has -> ReplicaFailure": unplaceable_latency,
        "full node, timeout=2 -> ExecutionTimeout": full_node_latency,
    }
    try:
        for name, fn in rows.items():
            fn()  # warm-up: actors started, module compiled
            times = sorted(fn() for _ in range(ns.repeats))
            print(f"{name:>40}: median {statistics.median(times):.2f} s  (min {times[0]:.2f}, max {times[-1]:.2f}, "
                  f"n={len(times)})")
    finally:
        ray.shutdown()
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
