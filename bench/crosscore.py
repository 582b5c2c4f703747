"""A gauge of the machine: how long a 1 MiB buffer takes to go from one core to the other and back
(a benchmark's instrument, never a test).

Why (bench/LOG-2026.md, "Slow periods of the machine"): on this virtual machine there are periods of
seconds in which copying data that the other core wrote takes 3-5x its usual time, while copies of
a core's own data keep their speed. Every collective of replicas in two processes crosses cores
that way, and so do JAX's threads and MPI's ranks: a row measured in such a period is slower for a
reason outside the code measured. Read the gauge next to a measurement to know.

Two processes, one pinned to each of two CPUs, share a 1 MiB buffer: one copies its array in, the
other copies it out, back and forth; a reading is the mean time of such a round (two 1 MiB copies
and two hand-offs through a shared word). The processes sleep on a pipe between readings.

    python bench/crosscore.py [--seconds 30] [--every 0.25]   # the gauge over time
"""

from __future__ import annotations

import argparse
import mmap
import os
import sys
import time

import numpy as np

ELEMENTS = 1 << 18  # float32: 1 MiB
ROUNDS = 100  # per reading: ~11 ms on a quiet machine


class Gauge:
    """Two forked processes on two CPUs and their shared buffer; `read()` -> seconds per round. Fork
    before the caller starts threads (Ray, JAX): the children are created in `__init__`."""

    def __init__(self, cpus: tuple[int, int] | None = None) -> None:
        allowed = sorted(os.sched_getaffinity(0))
        if len(allowed) < 2:
            raise RuntimeError("the gauge needs two CPUs")
        cpus = cpus or (allowed[0], allowed[1])
        self._shared = mmap.mmap(-1, mmap.PAGESIZE + 4 * ELEMENTS)  # anonymous and shared with the children
        self._requests: list[int] = []
        self._replies: list[int] = []
        self._pids: list[int] = []
        for role, cpu in enumerate(cpus):
            request_r, request_w = os.pipe()
            reply_r, reply_w = os.pipe()
            pid = os.fork()
            if pid == 0:
                for fd in (request_w, reply_r, *self._requests, *self._replies):  # the others' pipes stay theirs
                    os.close(fd)
                try:
                    os.sched_setaffinity(0, {cpu})
                    self._serve(role, request_r, reply_w)
                finally:
                    os._exit(0)
            os.close(request_r)
            os.close(reply_w)
            self._requests.append(request_w)
            self._replies.append(reply_r)
            self._pids.append(pid)

    def _serve(self, role: int, requests: int, replies: int) -> None:
        turn = np.frombuffer(self._shared, np.int64, count=1)
        buffer = np.frombuffer(self._shared, np.float32, count=ELEMENTS, offset=mmap.PAGESIZE)
        mine = np.ones(ELEMENTS, np.float32)
        while os.read(requests, 1) == b"r":
            start = time.perf_counter()
            for _ in range(ROUNDS):
                while turn[0] != role:  # the other process's copy is not done yet
                    pass
                if role == 0:
                    np.copyto(buffer, mine)
                else:
                    np.copyto(mine, buffer)
                turn[0] = 1 - role
            elapsed = time.perf_counter() - start
            os.write(replies, f"{elapsed / ROUNDS!r}\n".encode())

    def read(self) -> float:
        """Seconds per round trip of the buffer (its two copies and two hand-offs)."""
        np.frombuffer(self._shared, np.int64, count=1)[0] = 0
        for fd in self._requests:
            os.write(fd, b"r")
        times = [float(_read_line(fd)) for fd in self._replies]
        return times[0]

    def close(self) -> None:
        for fd in self._requests:
            os.close(fd)  # the children's read returns b"": they exit
        for pid in self._pids:
            os.waitpid(pid, 0)
        for fd in self._replies:
            os.close(fd)
        self._requests = self._replies = self._pids = []


def open_gauge() -> Gauge | None:
    """A `Gauge`, or None (and why, printed) where this machine cannot have one."""
    try:
        return Gauge()
    except (RuntimeError, OSError) as e:  # one CPU, or no fork
        print(f"cross-core gauge: not available ({e})")
        return None


def _read_line(fd: int) -> bytes:
    line = b""
    while not line.endswith(b"\n"):
        chunk = os.read(fd, 64)
        if not chunk:
            raise RuntimeError("a gauge process ended")
        line += chunk
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--every", type=float, default=0.25, help="seconds between readings")
    args = parser.parse_args()
    gauge = Gauge()
    try:
        end = time.monotonic() + args.seconds
        readings = []
        while time.monotonic() < end:
            reading = gauge.read()
            readings.append(reading)
            print(f"{time.strftime('%H:%M:%S')} {reading * 1e6:7.0f} us per round", flush=True)
            time.sleep(args.every)
    finally:
        gauge.close()
    readings.sort()
    print(f"min {readings[0] * 1e6:.0f} us, median {readings[len(readings) // 2] * 1e6:.0f} us, "
          f"max {readings[-1] * 1e6:.0f} us over {len(readings)} readings", file=sys.stderr)


if __name__ == "__main__":
    main()
