"""Shared pieces of the benchmarks: the looped HLO programs, timing by differencing, the Ray anchors
(a raw actor round trip, a naive put/get collective) and the memory floor.

Timing a program by differencing: a While loop runs the measured operation K times inside one
program, so T(K2) - T(K1) over K2 - K1 is the time of one operation with the job's start and stop
cancelled out.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import replicas as rp

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
OPS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")

LOOP = """\
HloModule bench_{name}, replica_count={n}

add {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}}

cond {{
  st = (s32[], s32[], f32[{e}], f32[{out}]) parameter(0)
  i = s32[] get-tuple-element(st), index=0
  k = s32[] get-tuple-element(st), index=1
  ROOT more = pred[] compare(i, k), direction=LT
}}

body {{
  st = (s32[], s32[], f32[{e}], f32[{out}]) parameter(0)
  i = s32[] get-tuple-element(st), index=0
  k = s32[] get-tuple-element(st), index=1
  x = f32[{e}] get-tuple-element(st), index=2
{op}
  one = s32[] constant(1)
  i2 = s32[] add(i, one)
  ROOT next = (s32[], s32[], f32[{e}], f32[{out}]) tuple(i2, k, {carry}, y)
}}

ENTRY main {{
  x = f32[{e}] parameter(0)
  k = s32[] parameter(1)
  zero = s32[] constant(0)
  fzero = f32[] constant(0)
  y0 = f32[{out}] broadcast(fzero), dimensions={{}}
  init = (s32[], s32[], f32[{e}], f32[{out}]) tuple(zero, k, x, y0)
  loop = (s32[], s32[], f32[{e}], f32[{out}]) while(init), condition=cond, body=body
  {root}y = f32[{out}] get-tuple-element(loop), index=3
{tail}}}
"""


def collective_program(op: str, elements: int, n: int, result_elements: int | None = None) -> rp.Module:
    """A While loop running `op` on an f32[elements] buffer per replica k times (k = parameter 1).

    Same-shape collectives feed their result back as the next operand (so no iteration can be
    skipped); all-gather and reduce-scatter keep the operand and carry their result beside it.
    `result_elements`: the program returns only the first elements of the last result (a job's
    return of a large result through Ray's object store is a per-job cost whose page faults vary
    from job to job by more than the 64 MiB rows' differenced time: bench/LOG-2026.md, "large")."""
    e = elements
    if op == "all-reduce":
        out, carry = e, "y"
        body = "  y = f32[{e}] all-reduce(x), replica_groups={{}}, to_apply=add"
    elif op == "all-gather":
        out, carry = e * n, "x"
        body = "  y = f32[{out}] all-gather(x), replica_groups={{}}, dimensions={{0}}"
    elif op == "reduce-scatter":
        out, carry = e // n, "x"
        body = "  y = f32[{out}] reduce-scatter(x), replica_groups={{}}, dimensions={{0}}, to_apply=add"
    elif op == "all-to-all":
        out, carry = e, "y"
        body = "  y = f32[{e}] all-to-all(x), replica_groups={{}}, dimensions={{0}}"
    elif op == "collective-permute":
        out, carry = e, "y"
        pairs = ",".join(f"{{{r},{(r + 1) % n}}}" for r in range(n))
        body = "  y = f32[{e}] collective-permute(x), source_target_pairs={{" + pairs.replace("{", "{{").replace(
            "}", "}}") + "}}"
    else:
        raise ValueError(op)
    root, tail = "ROOT ", ""
    if result_elements is not None:
        root = ""
        tail = f"  ROOT first = f32[{result_elements}] slice(y), slice={{[0:{result_elements}]}}\n"
    text = LOOP.format(name=op.replace("-", "_"), n=n, e=e, out=out, carry=carry,
                       op=body.format(e=e, out=out), root=root, tail=tail)
    return rp.parse_hlo(text)


def run_loop(module: rp.Module, x: np.ndarray, k: int, n: int, backend: str,
             replicas_per_actor: int | None = None) -> float:
    args = [x, np.asarray(k, np.int32)]
    packing = {"replicas_per_actor": replicas_per_actor} if backend == "ray" else {}
    t0 = time.perf_counter()
    rp.run(module, args, num_replicas=n, backend=backend, timeout=600, **packing)
    return time.perf_counter() - t0


@dataclass
class Timing:
    """Seconds per operation: the median of several differenced measurements, and their spread."""

    samples: list[float]

    @property
    def median(self) -> float:
        return float(np.median(self.samples))

    @property
    def spread(self) -> float:
        return max(self.samples) - min(self.samples)

    @property
    def unreliable(self) -> bool:
        """The noise is larger than the value: the number says little (the machine was busy)."""
        return self.median <= 0 or self.spread > self.median

    def text(self) -> str:
        """`1.23 ms ±0.05 ms` (half the spread), with `?` when unreliable; never a bare zero."""
        if self.median <= 0:
            return "<noise ?"
        if len(self.samples) == 1:
            return fmt_time(self.median)
        return f"{fmt_time(self.median)} ±{fmt_time(self.spread / 2)}" + (" ?" if self.unreliable else "")


MIN_SIGNAL_S = 0.25  # the differenced time T(k2) - T(k1) must be at least this (well above start-up jitter)


def per_iteration(run: Callable[[int], float], k1: int, k2: int, repeat: int = 3) -> Timing:
    """(T(k2) - T(k1)) / (k2 - k1), measured `repeat` times (pairs run back to back).

    When the first pair's difference is below MIN_SIGNAL_S, k2 grows (up to 16x) until it is not:
    a short difference of two noisy runs can come out at zero or below, which is no measurement."""
    for _ in range(5):
        t1, t2 = run(k1), run(k2)
        if t2 - t1 >= MIN_SIGNAL_S:
            break
        if k2 >= 16 * max(k1, 1) * 4:
            break
        k2 = k1 + (k2 - k1) * 4
    samples = [(t2 - t1) / (k2 - k1)]
    for _ in range(repeat - 1):
        t1, t2 = run(k1), run(k2)
        samples.append((t2 - t1) / (k2 - k1))
    return Timing(samples)


# -- sizes and formatting -----------------------------------------------------------------------------

_UNITS = {"": 1, "b": 1, "k": 1024, "kib": 1024, "kb": 1024, "m": 1 << 20, "mib": 1 << 20, "mb": 1 << 20,
          "g": 1 << 30, "gib": 1 << 30}


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise argparse_error(f"bad size {text!r} (e.g. 4KiB, 1MiB)")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


def argparse_error(msg: str) -> Exception:
    import argparse

    return argparse.ArgumentTypeError(msg)


def size_label(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1024)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def fmt_time(seconds: float | None) -> str:
    """Nanoseconds below a microsecond: a 4 KiB copy is real work, never "0 us"."""
    if seconds is None:
        return "-"
    if 0 < seconds < 1e-6:
        return f"{seconds * 1e9:.0f} ns"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def iterations_for(nbytes: int) -> tuple[int, int]:
    """(k1, k2) for differencing: many iterations for small buffers, few for big ones."""
    if nbytes <= 64 * 1024:
        return 20, 220
    if nbytes <= 2 << 20:
        return 5, 45
    if nbytes <= 16 << 20:
        return 2, 8
    return 1, 4


# -- subprocess anchors --------------------------------------------------------------------------------

def run_json_subprocess(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> tuple[Any, str]:
    """Run an anchor script printing one JSON line last; (parsed JSON or None, message)."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:.0f} s"
    except FileNotFoundError as e:
        return None, f"skipped (not installed): {e}"
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return None, f"failed (exit {proc.returncode}): {' | '.join(tail)}"
    data = json.loads(lines[-1])
    if data.get("skipped"):
        return None, f"skipped ({data['skipped']})"
    return data, "ok"


def mpiexec_path() -> str | None:
    """mpiexec from the venv (pip's mpich) or PATH."""
    candidate = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.path.exists(candidate):
        return candidate
    from shutil import which

    return which("mpiexec")


def mpi_anchor(ops: list[str], sizes: list[int], n: int, timeout: float = 600) -> tuple[dict | None, str]:
    if importlib.util.find_spec("mpi4py") is None:
        return None, "skipped (not installed)"
    mpiexec = mpiexec_path()
    if mpiexec is None:
        return None, "skipped (not installed): no mpiexec"
    cmd = [mpiexec, "-n", str(n), sys.executable, os.path.join(BENCH_DIR, "anchors_mpi.py"),
           "--ops", ",".join(ops), "--sizes", ",".join(str(s) for s in sizes)]
    return run_json_subprocess(cmd, timeout)


# -- Ray anchors ---------------------------------------------------------------------------------------

class EchoActor:
    """A bare Ray actor: echo returns the array it got (the raw actor round trip)."""

    def echo(self, x: np.ndarray) -> np.ndarray:
        return x

    def ping(self) -> bool:
        return True


class NaiveMember:
    """One member of the naive Ray collective: put your pieces in the object store, get the peers'."""

    def __init__(self, rank: int, n: int) -> None:
        self.rank, self.n = rank, n
        self.x: np.ndarray | None = None

    def load(self, x: np.ndarray) -> None:
        self.x = np.array(x)

    def put(self, op: str) -> list:
        import ray

        x, n = self.x, self.n
        if op in ("all-reduce", "all-gather", "collective-permute"):
            return [ray.put(x)]
        return [ray.put(c) for c in np.split(x, n)]  # reduce-scatter, all-to-all: one piece per member

    def collect(self, op: str, refs: list[list]) -> int:
        import ray

        n, r = self.n, self.rank
        if op == "all-reduce":
            parts = ray.get([refs[j][0] for j in range(n) if j != r])
            out = self.x.copy()
            for p in parts:
                out += p
        elif op == "all-gather":
            parts = ray.get([refs[j][0] for j in range(n) if j != r])
            parts.insert(r, self.x)
            out = np.concatenate(parts)
        elif op == "reduce-scatter":
            parts = ray.get([refs[j][r] for j in range(n) if j != r])
            out = np.split(self.x, n)[r].copy()
            for p in parts:
                out += p
        elif op == "all-to-all":
            parts = ray.get([refs[j][r] for j in range(n) if j != r])
            parts.insert(r, np.split(self.x, n)[r])
            out = np.concatenate(parts)
        else:  # collective-permute: from the previous member of the ring
            out = np.array(ray.get(refs[(r - 1) % n][0]))
        if out.shape == self.x.shape:
            self.x = out
        return int(out.size)


def ray_echo_actor() -> Any:
    import ray

    actor = ray.remote(EchoActor).options(num_cpus=0).remote()
    ray.get(actor.ping.remote())
    return actor


def ray_round_trip(actor: Any, nbytes: int, iterations: int) -> float:
    """Seconds per ray.get(actor.echo.remote(buffer)) of an nbytes float32 buffer (median of runs)."""
    import ray

    x = np.ones(nbytes // 4, np.float32)
    ray.get(actor.echo.remote(x))
    times = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        ray.get(actor.echo.remote(x))
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


class NaiveRay:
    """N actors doing a collective by ray.put / ray.get, driven round by round from the driver."""

    def __init__(self, n: int) -> None:
        import ray

        cls = ray.remote(NaiveMember).options(num_cpus=0)
        self.members = [cls.remote(r, n) for r in range(n)]
        self.n = n

    def time_op(self, op: str, nbytes: int, iterations: int) -> float:
        import ray

        x = np.ones(nbytes // 4, np.float32)
        ray.get([m.load.remote(x) for m in self.members])

        def once() -> None:
            refs = ray.get([m.put.remote(op) for m in self.members])
            ray.get([m.collect.remote(op, refs) for m in self.members])

        once()
        times = []
        for _ in range(iterations):
            t0 = time.perf_counter()
            once()
            times.append(time.perf_counter() - t0)
        return float(np.median(times))

    def close(self) -> None:
        import ray

        for m in self.members:
            ray.kill(m)


def memory_floor(nbytes: int, iterations: int = 20) -> float:
    """Seconds for np.copyto of an nbytes buffer into another (the machine's copy bandwidth)."""
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    times = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def load_average() -> str:
    try:
        return " ".join(f"{v:.1f}" for v in os.getloadavg())
    except OSError:
        return "?"


# -- processes and memory ------------------------------------------------------------------------------

def rss_mib(pid: int | str = "self", field: str = "VmRSS") -> float:
    """A process's resident memory (VmRSS; RssAnon: its private heap only, without the shared
    object-store and /dev/shm pages it has mapped)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _children(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of the processes whose parent is `pid`."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid == pid:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    out.append((int(entry), f.read().replace(b"\0", b" ").decode(errors="replace")))
        except (OSError, ValueError, IndexError):
            continue
    return out


def ray_processes() -> tuple[int | None, list[int]]:
    """This driver's raylet (it hosts the object store) and its replica actor processes."""
    raylets = [p for p, cmd in _children(os.getpid()) if "raylet/raylet" in cmd]
    if not raylets:
        return None, []
    return raylets[0], [p for p, cmd in _children(raylets[0]) if cmd.startswith("ray::ReplicaHost")]
