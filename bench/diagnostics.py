"""Detection latency of deadlocks and collective mismatches, under threads and under Ray (goal: < 2 s).

For each buggy program of the test catalog (tests/buggy_programs.py) it reports:
- total: seconds from `rp.run` to the error (start-up included);
- latency: seconds from the moment the last replica became stuck (the latest start of an
  unfinished flight-recorder event, or for a mismatch the latest collective start) to the moment
  the error reached the caller: the time the diagnostics took.
The job timeout is 60 s, so an error in seconds was detected, not timed out.

    python bench/diagnostics.py [--backend threads ray] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from buggy_programs import BY_NAME, Case  # noqa: E402

import replicas as rp  # noqa: E402

PROGRAMS = ["send_done_cycle", "recv_without_send", "while_trip_count_depends_on_replica",
            "recv_before_all_reduce_lagging_replica", "branches_into_different_all_reduces",
            "mismatched_groups_one_replica_alone"]


def stuck_since_us(error: rp.ReplicasError) -> float | None:
    """When the last replica became stuck, from the report's flight-recorder events (wall clock, us)."""
    report = getattr(error, "report", None)
    report = getattr(report, "deadlock", report)  # a mismatch that showed as a deadlock carries one
    events: dict[Any, list[dict[str, Any]]] = getattr(report, "events", None) or {}
    starts = [ev["start_us"] for evs in events.values() for ev in evs if ev.get("end_us") is None]
    return max(starts) if starts else None


def measure(case: Case, backend: str) -> tuple[float, float | None, str]:
    module = rp.parse_hlo(case.hlo)
    t0 = time.perf_counter()
    try:
        rp.run(module, case.args(), num_replicas=case.num_replicas, timeout=60, backend=backend,
               infeed=case.infeed)
    except rp.ReplicasError as e:
        caught_us = time.time_ns() / 1000
        total = time.perf_counter() - t0
        since = stuck_since_us(e)
        return total, (caught_us - since) / 1e6 if since is not None else None, type(e).__name__
    return time.perf_counter() - t0, None, "no error"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", nargs="+", default=["threads", "ray"], choices=["threads", "ray"])
    parser.add_argument("--repeat", type=int, default=3)
    ns = parser.parse_args()
    print(f"{'backend':8} {'program':42} {'error':24} {'total s':>9} {'latency s':>10}")
    for backend in ns.backend:
        if backend == "ray":
            measure(BY_NAME["all_reduce_ok"], "ray")  # start Ray and its actors once, outside the numbers
        for name in PROGRAMS:
            case = BY_NAME[name]
            runs = [measure(case, backend) for _ in range(ns.repeat)]
            total = statistics.median(r[0] for r in runs)
            latencies = [r[1] for r in runs if r[1] is not None]
            latency = f"{statistics.median(latencies):10.3f}" if latencies else f"{'-':>10}"
            print(f"{backend:8} {name:42} {runs[0][2]:24} {total:9.3f} {latency}")
    print("goal: every error within 2 s (total, whatever the job timeout)")


if __name__ == "__main__":
    main()
