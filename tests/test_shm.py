"""The same-node shared-memory path under Ray: results, the release protocol, and no leftovers
under /dev/shm when a job finishes, is cancelled, times out or loses an actor."""

from __future__ import annotations

import gc
import mmap
import os
import pathlib
import secrets
import select
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import replicas as rp
from replicas.transport.shm import (
    MIN_BYTES,
    SHM_DIR,
    Inbox,
    Outbox,
    job_segments,
    mapped_segments,
    remove_orphaned_segments,
    segment_name,
)

SIZE = 65536  # f32 elements per replica: 256 KiB, so collective pieces are >= MIN_BYTES

COLLECTIVES = """\
HloModule shm_collectives, replica_count=4

add {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}}

ENTRY main {{
  x = f32[{e}] parameter(0)
  sum = f32[{e}] all-reduce(x), replica_groups={{}}, to_apply=add
  gathered = f32[{g}] all-gather(x), replica_groups={{}}, dimensions={{0}}
  scattered = f32[{q}] reduce-scatter(x), replica_groups={{}}, dimensions={{0}}, to_apply=add
  swapped = f32[{e}] all-to-all(x), replica_groups={{}}, dimensions={{0}}
  shifted = f32[{e}] collective-permute(x), source_target_pairs={{{{0,1}},{{1,2}},{{2,3}},{{3,0}}}}
  ROOT out = (f32[{e}], f32[{g}], f32[{q}], f32[{e}], f32[{e}]) tuple(sum, gathered, scattered, swapped, shifted)
}}
"""

# A large all-reduce, an outfeed saying it is done, then a loop that never ends.
STUCK_AFTER_COLLECTIVE = """\
HloModule stuck, replica_count=2

add {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}}

cond {{
  s = s32[] parameter(0)
  ROOT t = pred[] constant(true)
}}

body {{
  s = s32[] parameter(0)
  one = s32[] constant(1)
  ROOT n = s32[] add(s, one)
}}

ENTRY main {{
  x = f32[{e}] parameter(0)
  sum = f32[{e}] all-reduce(x), replica_groups={{}}, to_apply=add
  tok = token[] after-all()
  done = token[] outfeed(sum, tok)
  z = s32[] constant(0)
  w = s32[] while(z), condition=cond, body=body
  ROOT out = (f32[{e}], s32[]) tuple(sum, w)
}}
"""


# The same past the collective, then waiting for an infeed the host never sends: blocked, not looping
# (the killed driver's actors run until Ray ends them, seconds on a loaded machine).
WAITING_AFTER_COLLECTIVE = STUCK_AFTER_COLLECTIVE.replace("""  z = s32[] constant(0)
  w = s32[] while(z), condition=cond, body=body
""", """  in = (s32[], token[]) infeed(done)
  w = s32[] get-tuple-element(in), index=0
""")
assert WAITING_AFTER_COLLECTIVE != STUCK_AFTER_COLLECTIVE


def shm_sent(job: rp.Job) -> dict[int, dict[int, int]]:
    """Per replica, per destination: the messages its actor sent through shared memory (the board or
    its arena) in `job`."""
    import ray

    sent: dict[int, dict[int, int]] = {}
    for part in ray.get([a.shm_sent.remote() for a in job._backend._actors]):
        sent.update(part)
    return sent


def _inputs(n: int) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(7)
    return [[rng.standard_normal(SIZE).astype(np.float32)] for _ in range(n)]


@pytest.mark.usefixtures("ray_session")
def test_collectives_through_shared_memory_equal_the_threads_backend_bitwise():
    import ray

    m = rp.parse_hlo(COLLECTIVES.format(e=SIZE, g=4 * SIZE, q=SIZE // 4))
    args = _inputs(4)
    want = rp.run(m, args, num_replicas=4, backend="threads")
    job = rp.launch(m, args, num_replicas=4, timeout=120, replicas_per_actor=1)  # every pair across actors
    token = job._backend._token
    got = job.result()
    for r in range(4):
        for a, b in zip(got[r], want[r]):
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
    sent = shm_sent(job)
    assert all(sent[r].get(d, 0) > 0 for r in range(4) for d in range(4) if d != r), sent
    assert job_segments(token) == []
    # The pooled actors unmapped the job's arenas too (not only unlinked them).
    mapped = ray.get([a.__ray_call__.remote(lambda host, t: mapped_segments(t), token)
                      for a in job._backend._actors])
    assert mapped == [0, 0, 0, 0]


@pytest.mark.usefixtures("ray_session")
def test_packed_actors_exchange_through_shared_memory_across_actors_only():
    m = rp.parse_hlo(COLLECTIVES.format(e=SIZE, g=4 * SIZE, q=SIZE // 4))
    args = _inputs(4)
    # Packed, the float reductions sum in-actor first ((x0 + x1) + (x2 + x3)): compare with threads
    # placed the same way.
    from replicas.runtime.compile import compile_module
    from replicas.runtime.job import Job
    from replicas.runtime.threads import ThreadBackend

    placed = ThreadBackend(compile_module(m), [list(a) for a in args], placement=[0, 0, 1, 1])
    want = Job(placed, None, timeout=120, host_may_send=False).result()
    job = rp.launch(m, args, num_replicas=4, timeout=120, replicas_per_actor=2)
    got = job.result()
    assert all(a.tobytes() == b.tobytes() for r in range(4) for a, b in zip(got[r], want[r]))
    sent = shm_sent(job)
    assert sent[0].get(1, 0) == 0 and sent[0].get(2, 0) > 0  # 0 and 1 share an actor: no copy at all


def test_a_block_stays_held_while_any_view_of_the_received_array_lives():
    token = "t" + np.random.default_rng().bytes(8).hex()
    outbox, inbox = Outbox(token, 0, capacity=1 << 22), Inbox(token)
    try:
        x = np.arange(MIN_BYTES // 4 * 2, dtype=np.float32)
        shared = outbox.encode((b"fingerprint", (x, np.zeros(3))))
        assert shared is not None
        fp, (y, small) = inbox.decode(shared)
        assert fp == b"fingerprint" and small.shape == (3,) and np.array_equal(y, x)
        assert not y.flags.writeable
        part = y[10:20].reshape(2, 5)
        del y
        gc.collect()
        held = outbox.in_use()
        assert held > x.nbytes
        again = outbox.put(x + 1)  # a held block is never written: the new one goes elsewhere
        assert again.offset != shared.value[1][0].offset
        assert np.array_equal(part, x[10:20].reshape(2, 5))
        del part
        gc.collect()
        assert outbox.in_use() == held  # only `again` (never delivered) is left
        first = outbox.put(x)
        assert first.offset == shared.value[1][0].offset  # the released block is reused
    finally:
        outbox.close()
        inbox.close()
    assert job_segments(token) == []


def test_one_array_sent_to_several_peers_is_copied_once_and_freed_after_the_last():
    token = "t" + np.random.default_rng().bytes(8).hex()
    outbox, inbox = Outbox(token, 0, capacity=1 << 22), Inbox(token)
    try:
        x = np.arange(MIN_BYTES // 4, dtype=np.float32)
        refs = [outbox.put(x, ("coll", 0, 1)) for _ in range(3)]
        assert {r.offset for r in refs} == {refs[0].offset} and [r.slot for r in refs] == [0, 1, 2]
        x_later = outbox.put(x, ("coll", 0, 2))  # another round: `x` may have changed in place
        assert x_later.offset != refs[0].offset
        inbox.array(x_later)  # received and dropped at once
        views = [inbox.array(r) for r in refs]
        del views[0]
        del views[0]
        gc.collect()
        assert outbox.in_use() > 0  # the third receiver still reads it
        assert outbox.put(x + 0).offset != refs[0].offset
        del views[0]
        gc.collect()
        assert outbox.put(x + 0).offset == refs[0].offset
    finally:
        outbox.close()
        inbox.close()


def test_the_next_jobs_arena_reuses_the_memory_and_ignores_late_releases():
    """An actor's arena memory outlives its job (fresh tmpfs pages cost 6-9x written ones): the
    next job's arena is the same unnamed file, and a view of the earlier job collected late
    never frees the block now at its place."""
    first, second = ("t" + np.random.default_rng().bytes(8).hex() for _ in range(2))
    outbox, inbox = Outbox(first, 0, capacity=1 << 22), Inbox(first)
    x = np.arange(MIN_BYTES // 4, dtype=np.float32)
    late = inbox.array(outbox.put(x))  # a receiver of the first job still holds this view
    outbox.close()
    inbox.close()
    again = Outbox(second, 0, capacity=1 << 22)
    try:
        assert again.name.rpartition("@")[2] == outbox.name.rpartition("@")[2]  # the same file
        ref = again.put(x + 1)
        assert ref.offset == 0 and again.in_use() > 0
        del late
        gc.collect()
        assert again.in_use() > 0  # the first job's release does not free the second job's block
        assert job_segments(first) == [] and job_segments(second) == []
    finally:
        again.close()


def test_a_full_arena_declines_and_frees_what_it_placed():
    token = "t" + np.random.default_rng().bytes(8).hex()
    outbox = Outbox(token, 0, capacity=MIN_BYTES * 3)
    try:
        x, y, z = (np.full(MIN_BYTES // 4, v, np.float32) for v in (1, 2, 3))
        assert outbox.encode((x, y, z)) is None  # headers make three blocks one too many
        assert outbox.in_use() == 0
        assert outbox.encode((x, y)) is not None
        assert outbox.encode((x, x, x), ("coll", 0, 0)) is None  # `y` was placed last; no room for `x`
    finally:
        outbox.close()


def _launch_stuck() -> rp.Job:
    m = rp.parse_hlo(STUCK_AFTER_COLLECTIVE.format(e=SIZE))
    return rp.launch(m, _inputs(2), num_replicas=2, timeout=None)


def _past_the_collective(job: rp.Job) -> None:
    for r in range(2):
        job.outfeed(r, timeout=60)
    assert len(job_segments(job._backend._token)) == 2  # a board per actor, in use (arenas are unnamed)


@pytest.mark.usefixtures("ray_session")
def test_cancel_removes_the_jobs_segments():
    job = _launch_stuck()
    _past_the_collective(job)
    job.cancel()
    assert job_segments(job._backend._token) == []


@pytest.mark.usefixtures("ray_session")
def test_timeout_removes_the_jobs_segments():
    m = rp.parse_hlo(STUCK_AFTER_COLLECTIVE.format(e=SIZE))
    job = rp.launch(m, _inputs(2), num_replicas=2, timeout=3)
    _past_the_collective(job)
    # The wait's timeout counts from the wait, past the collective, where both replicas loop (the
    # job's 3 s kept two cores busy for 3 s): the shorter of the two ends the job.
    with pytest.raises(rp.ExecutionTimeout, match="still running after 0.2 s"):
        job.result(timeout=0.2)
    assert job_segments(job._backend._token) == []


@pytest.mark.usefixtures("ray_session")
def test_what_a_late_launch_creates_for_an_ended_job_goes_when_the_next_job_ends():
    """A job's launch can reach an actor after the job ended (it failed or timed out while the call
    was on its way; 3 of 4 runs of the first 13 tests of test_faults_ray.py left a board behind): the
    segments the actor then creates are removed when the driver's next job ends."""
    m = rp.parse_hlo(COLLECTIVES.format(e=SIZE, g=4 * SIZE, q=SIZE // 4))
    ended = rp.launch(m, _inputs(4), num_replicas=4, timeout=120)
    ended.result()
    late = pathlib.Path(SHM_DIR) / segment_name(ended._backend._token, 0)
    late.write_bytes(bytes(64))  # as the late launch's arena
    rp.run(m, _inputs(4), num_replicas=4, timeout=120)
    assert not late.exists()


@pytest.mark.usefixtures("ray_session")
def test_a_killed_actor_leaves_no_segment_behind():
    import ray

    job = _launch_stuck()
    _past_the_collective(job)
    ray.kill(job._backend._actors[1], no_restart=True)
    with pytest.raises(rp.ReplicasError):
        job.result(timeout=60)
    # The dead actor's arena too: the surviving actor and the driver remove the job's segments.
    assert job_segments(job._backend._token) == []


KILLED_DRIVER = """
import sys
sys.path.insert(0, sys.argv[2])
import replicas as rp
import test_shm

m = rp.parse_hlo(test_shm.WAITING_AFTER_COLLECTIVE.format(e=test_shm.SIZE))
job = rp.launch(m, test_shm._inputs(2), num_replicas=2, timeout=None, address=sys.argv[1])
test_shm._past_the_collective(job)
print(job._backend._token, flush=True)
sys.stdin.readline()  # killed here
"""


@pytest.mark.usefixtures("ray_session")
def test_the_segments_of_a_killed_driver_that_joined_a_running_ray_are_removed_by_its_reaper():
    """A driver killed mid-job cannot remove its segments: its reaper (runtime/ray/reaper.py) does,
    within seconds, though the Ray it joined lives on (an older leftover, of a node the reaper is
    not on, is the next driver's sweep: the test below)."""
    import ray

    driver = subprocess.Popen([sys.executable, "-c", KILLED_DRIVER, ray.get_runtime_context().gcs_address,
                               str(pathlib.Path(__file__).parent)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert select.select([driver.stdout], [], [], 120)[0], "the driver printed no token within 120 s"
        token = driver.stdout.readline().strip()
        assert token and len(job_segments(token)) == 2
    finally:
        driver.kill()
        driver.wait()
    deadline = time.monotonic() + 5
    while job_segments(token):
        assert time.monotonic() < deadline, f"the killed driver's segments are left: {job_segments(token)}"
        threading.Event().wait(0.05)
    assert ray.is_initialized() and ray.cluster_resources()  # the Ray it joined was left alone


def test_only_old_segments_that_no_process_maps_are_removed():
    token = secrets.token_hex(8)
    paths = {kind: f"/dev/shm/rpl-{token}-{kind}" for kind in ("orphan", "mapped", "young")}
    for path in paths.values():
        with open(path, "wb") as f:
            f.truncate(4096)
    an_hour_ago = time.time() - 3600
    for kind in ("orphan", "mapped"):
        os.utime(paths[kind], (an_hour_ago, an_hour_ago))
    with open(paths["mapped"], "r+b") as f:
        mapping = mmap.mmap(f.fileno(), 4096)
    try:
        removed = remove_orphaned_segments()
        assert paths["orphan"] in removed
        assert os.path.exists(paths["mapped"]) and os.path.exists(paths["young"])
    finally:
        mapping.close()
        for path in paths.values():
            if os.path.exists(path):
                os.unlink(path)
