"""How to move an array between two Ray actors of one node: the measurement behind
replicas/transport/shm.py (a benchmark, never a test).

    python bench/shm_mechanisms.py [--sizes 4KiB,1MiB,64MiB] [--messages 20] [--repeats 5]

Per message of each size, actor A hands an f32 buffer to actor B, which gets a numpy array it can
read (and touches its first and last element). Three mechanisms, the ObjectRef / descriptor
hand-off itself left out (it costs the same socket message for all three):
- object-store: A `ray.put`s the buffer (refs returned to the driver, which passes them on), B
  `ray.get`s it zero-copy and drops it (the owner A frees it when the driver's refs go);
- channel: `ray.experimental.channel.Channel(A, [(B, node)])`, a mutable shared-memory object:
  A `write`s, B `read`s; A and B run concurrently (a write waits until B read the last one);
  "value kept": B copies the value out, as it must to keep it past the next read;
- arena: replicas' `Outbox.put` in A (one copy into a reused /dev/shm block) and `Inbox.array` in
  B (a read-only view, released when dropped).
Messages go one at a time (B releases each before A sends the next: the steady state of a
collective loop). Times: A's side + B's side per message, measured inside the actors (channel:
wall time per message of the concurrent write/read loops).
Median and [min-max] over repetitions.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import fmt_time, load_average, parse_size, size_label  # noqa: E402


class Side:
    """One end (A or B) of every mechanism."""

    def __init__(self) -> None:
        self.outbox = None
        self.inbox = None

    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    # -- object store
    def put(self, nbytes: int) -> tuple[float, list]:
        import ray

        x = np.ones(nbytes // 4, np.float32)
        t0 = time.perf_counter()
        ref = ray.put(x)
        return time.perf_counter() - t0, [ref]

    def get(self, refs: list) -> float:
        import ray

        t0 = time.perf_counter()
        y = ray.get(refs[0])
        float(y[0]) + float(y[-1])
        del y
        return time.perf_counter() - t0

    # -- mutable-object channel
    def make_channel(self, readers: list, nbytes: int) -> Any:
        from ray.experimental.channel import Channel

        return Channel(None if readers is None else self._me(), readers, typ=nbytes + (1 << 16))

    def _me(self) -> Any:
        import ray

        return ray.get_runtime_context().current_actor

    def write(self, channel, nbytes: int, k: int) -> float:
        x = np.ones(nbytes // 4, np.float32)
        channel.ensure_registered_as_writer()
        channel.write(x)
        t0 = time.perf_counter()
        for _ in range(k):
            channel.write(x)
        return time.perf_counter() - t0

    def read(self, channel, k: int, keep: bool) -> float:
        channel.ensure_registered_as_reader()
        channel.read()
        t0 = time.perf_counter()
        for _ in range(k):
            y = channel.read()
            if keep:  # a read value is only valid until the next read: a kept array is a copy
                y = np.array(y)
            float(y[0]) + float(y[-1])
            del y
        return time.perf_counter() - t0

    # -- replicas' arena
    def open_arena(self, token: str, owner: int) -> None:
        from replicas.transport.shm import Inbox, Outbox

        self.outbox = Outbox(token, owner)
        self.inbox = Inbox(token)

    def arena_put(self, nbytes: int) -> tuple[float, Any]:
        x = np.ones(nbytes // 4, np.float32)  # a new array: never the one placed last (no reuse)
        t0 = time.perf_counter()
        ref = self.outbox.put(x)
        return time.perf_counter() - t0, ref

    def arena_get(self, ref: Any) -> float:
        t0 = time.perf_counter()
        y = self.inbox.array(ref)
        float(y[0]) + float(y[-1])
        del y
        return time.perf_counter() - t0



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="4KiB,1MiB,64MiB")
    parser.add_argument("--messages", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    import ray

    from replicas.runtime.ray.backend import ensure_ray
    from replicas.transport.shm import remove_job_segments

    ensure_ray()
    print(f"# moving one buffer between two actors of a node, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"load average {load_average()}")
    cls = ray.remote(Side).options(num_cpus=0, max_concurrency=4)
    a, b = cls.remote(), cls.remote()
    node = ray.get(b.node.remote())
    token = secrets.token_hex(8)
    ray.get(a.open_arena.remote(token, 0))
    ray.get(b.open_arena.remote(token, 1))
    k = args.messages
    rows = []
    try:
        for s in [parse_size(x) for x in args.sizes.split(",")]:
            samples: dict[str, list[float]] = {"object-store": [], "channel": [], "channel-kept": [], "arena": []}
            channel = ray.get(a.make_channel.remote([(b, node)], s))
            for _ in range(args.repeats):
                total = 0.0
                for _ in range(k):
                    put_time, refs = ray.get(a.put.remote(s))
                    total += put_time + ray.get(b.get.remote(refs))
                    del refs
                samples["object-store"].append(total / k)
                for name, keep in (("channel", False), ("channel-kept", True)):
                    w, r = a.write.remote(channel, s, k), b.read.remote(channel, k, keep)
                    samples[name].append(max(ray.get([w, r])) / k)
                total = 0.0
                for _ in range(k):
                    put_time, ref = ray.get(a.arena_put.remote(s))
                    total += put_time + ray.get(b.arena_get.remote(ref))
                samples["arena"].append(total / k)
            rows.append((s, samples))
    finally:  # the arenas go whatever happened (a failed run must not leave them under /dev/shm)
        remove_job_segments(token)
    print("| size | object store (put + get) | mutable channel (write/read) | channel, value kept (+ copy) "
          "| arena (put + view) |")
    print("|---|---|---|---|---|")
    for s, samples in rows:
        cells = []
        for name in ("object-store", "channel", "channel-kept", "arena"):
            v = samples[name]
            cells.append(f"{fmt_time(float(np.median(v)))} [{fmt_time(min(v))}-{fmt_time(max(v))}]")
        print(f"| {size_label(s)} | " + " | ".join(cells) + " |")
    print(f"(load average at end {load_average()})")
    ray.shutdown()


if __name__ == "__main__":
    main()
