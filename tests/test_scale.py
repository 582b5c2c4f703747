"""256 and 1024 replicas on both backends: numpy's results bit for bit, and a planted deadlock
reported (not waited for). Marked slow; each job is cancelled if this process and its replica
actors together pass a memory cap, so a regression fails instead of taking the machine down.
The replica ceiling's tests are fast: a pod's count is allowed, and a job whose threads the
machine's task table cannot hold is refused before any starts."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
from buggy_programs import loop_the_last_replica_skips

import replicas as rp
from replicas import limits
from replicas.errors import ProgramError, ResourceExhausted

MEMORY_CAP_MIB = 4096

PROGRAM = """\
HloModule scale, replica_count={n}

add {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}}

ENTRY main {{
  x = f32[16] parameter(0)
  sum = f32[16] all-reduce(x), replica_groups={{}}, to_apply=add
  pairs = f32[16] all-reduce(x), replica_groups={groups}, to_apply=add
  gathered = f32[{g}] all-gather(x), replica_groups={{}}, dimensions={{0}}
  ROOT out = (f32[16], f32[16], f32[{g}]) tuple(sum, pairs, gathered)
}}
"""

ALL_REDUCE = """\
HloModule all_reduce

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
  x = f32[16] parameter(0)
  ROOT sum = f32[16] all-reduce(x), replica_groups={}, to_apply=add
}
"""


def _rss_mib(pid: int | str) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class MemoryCap:
    """Cancels `job` once this process plus `pids()` (its replica actors) pass the cap."""

    def __init__(self, job: rp.Job, pids: list[int]) -> None:
        self.job, self.pids, self.peak = job, pids, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            self.peak = max(self.peak, _rss_mib("self") + sum(_rss_mib(p) for p in self.pids))
            if self.peak > MEMORY_CAP_MIB:
                self.job.cancel()
                return

    def __enter__(self) -> MemoryCap:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        assert self.peak <= MEMORY_CAP_MIB, f"{self.peak:.0f} MiB: over the {MEMORY_CAP_MIB} MiB cap"


def actor_pids(job: rp.Job) -> list[int]:
    backend = job._backend  # noqa: SLF001 - the test watches the actors' memory
    actors = getattr(backend, "_actors", None)
    if not actors:
        return []
    import ray

    return ray.get([a.__ray_call__.remote(lambda host: os.getpid()) for a in actors])


def run_capped(module: rp.Module, args: list, n: int, backend: str) -> list:
    job = rp.launch(module, args, n, backend=backend, timeout=300)  # seconds normally; a slowed host took 50
    job._host_may_send = False  # noqa: SLF001 - as rp.run: nothing comes from the host
    with job, MemoryCap(job, actor_pids(job)):
        return job.result()


@pytest.fixture(params=["threads", pytest.param("ray", marks=pytest.mark.ray)])
def backend(request: pytest.FixtureRequest) -> str:
    if request.param == "ray":
        request.getfixturevalue("ray_session")
    return request.param


@pytest.mark.slow
@pytest.mark.parametrize("n", [256, 1024])
def test_many_replicas_give_numpy_results_bitwise(n, backend):
    groups = "{" + ",".join(f"{{{r},{r + 1}}}" for r in range(0, n, 2)) + "}"
    m = rp.parse_hlo(PROGRAM.format(n=n, g=16 * n, groups=groups))
    xs = [np.arange(16, dtype=np.float32) + r for r in range(n)]  # integer-valued: sums are exact
    out = run_capped(m, [[x] for x in xs], n, backend)
    total = np.sum(xs, axis=0, dtype=np.float64).astype(np.float32)
    gathered = np.concatenate(xs)
    for r, (s, pair, g) in enumerate(out):
        assert s.tobytes() == total.tobytes(), f"replica {r}"
        assert pair.tobytes() == (xs[r & ~1] + xs[r | 1]).tobytes(), f"replica {r}"
        assert g.tobytes() == gathered.tobytes(), f"replica {r}"


# On Ray only: test_reports_at_scale finds the same planted deadlock among 1024 threads (its
# report's blocked replicas, the text, the memory), and test_affinity the While loop's on threads.
@pytest.mark.slow
@pytest.mark.parametrize("backend", [pytest.param("ray", marks=pytest.mark.ray)], indirect=True)
def test_a_deadlock_among_1024_replicas_is_reported(backend):
    n = 1024
    m = rp.parse_hlo(loop_the_last_replica_skips(n, elements=4, trips=3))
    with pytest.raises(rp.DeadlockError) as info:
        run_capped(m, [np.ones(4, np.float32)], n, backend)
    text = str(info.value)
    assert f"replica {n - 1} finished without any collective and never reached all-reduce #0" in text
    assert len(info.value.report.blocked) == n - 1


def test_the_default_replica_ceiling_covers_a_pod():
    assert limits.DEFAULT_MAX_REPLICAS >= 8960  # a TPU v5p pod's chips
    assert limits.check_replicas(8192) == 8192
    with pytest.raises(ProgramError, match=f"exceeds the ceiling of {limits.current().max_replicas} replicas"):
        limits.check_replicas(limits.current().max_replicas + 1)


def test_a_job_the_task_table_cannot_hold_is_refused_before_any_thread_starts(backend):
    """On Ray, when the cluster is this machine's one node, before any actor starts."""
    room = limits.task_room()
    if room is None:
        pytest.skip("no task table to read (not Linux)")
    n = max(room[0], 0) + 16384  # beyond any room other processes' ending tasks could leave meanwhile
    m = rp.parse_hlo(ALL_REDUCE)
    if backend == "ray":  # idle actors in the pool for every group: the job would start without asking Ray
        rp.run(m, [np.zeros(16, np.float32)], num_replicas=4, backend="ray", replicas_per_actor=1, timeout=60)
    before = threading.active_count()
    previous = limits.configure(max_replicas=n)
    try:
        where = "on threads" if backend == "threads" else "on this machine's Ray node"
        with pytest.raises(ResourceExhausted, match=f"a job of {n} replicas {where} needs {n} threads") as info:
            rp.run(m, [np.zeros(16, np.float32)], num_replicas=n, backend=backend, timeout=60)
    finally:
        limits.restore(previous)
    assert info.value.resource == "threads" and "task table" in str(info.value)
    assert threading.active_count() == before
