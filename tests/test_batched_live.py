"""Batched replicas' live states (`runtime/batched_live.py`): while their process's batched run
computes them, `job.states()` counts the run's collectives as they happen and the running replica
names the instruction the run executes, and `job.progress()` shows both, as for unbatched replicas.
The jobs run a loop of all-reduces long enough to be seen running; each test cancels its job once
it saw what it waits for (a job that ends first fails the test)."""

from __future__ import annotations

import re
import threading
import time

import numpy as np
import pytest

import replicas as rp
from replicas.records import BATCHED_OPCODE

LOOP = """\
HloModule loop, replica_count={n}

add {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}}

cond {{
  s = (s32[], f32[8], s32[]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  k = s32[] get-tuple-element(s), index=2
  ROOT lt = pred[] compare(i, k), direction=LT
}}

body {{
  s = (s32[], f32[8], s32[]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  x = f32[8] get-tuple-element(s), index=1
  k = s32[] get-tuple-element(s), index=2
  y = f32[8] all-reduce(x), replica_groups={{}}, to_apply=add
  half = f32[8] constant({{0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5}})
  z = f32[8] multiply(y, half)
  one = s32[] constant(1)
  j = s32[] add(i, one)
  ROOT t = (s32[], f32[8], s32[]) tuple(j, z, k)
}}

ENTRY main {{
  x = f32[8] parameter(0)
  k = s32[] parameter(1)
  zero = s32[] constant(0)
  s = (s32[], f32[8], s32[]) tuple(zero, x, k)
  w = (s32[], f32[8], s32[]) while(s), condition=cond, body=body
  ROOT y = f32[8] get-tuple-element(w), index=1
}}
"""
# What a running replica of the loop may be executing, as its state names it.
RUNNING = re.compile(r"%(i|x|k|y|z|j|t|s|lt|w) \((get-tuple-element|all-reduce|multiply|add|tuple|compare|"
                     r"while|parameter)\)")
TRIPS = np.asarray(2**31 - 1, np.int32)  # far more than any test waits for: each cancels its job
WAIT = 120.0  # seconds a test polls the running job before it fails (the job's own timeout is longer)


def launch(n: int, **options) -> rp.Job:
    xs = [np.full(8, r, np.float32) for r in range(n)]
    return rp.launch(rp.parse_hlo(LOOP.format(n=n)), [[x, TRIPS] for x in xs], num_replicas=n, timeout=300,
                     **options)


def seen_running(job: rp.Job, n: int, batched_members: int) -> tuple[list, rp.Progress]:
    """The states and progress of the first poll that shows the batched run at work: every replica
    counting collectives, one of them running an instruction of the loop, `batched_members` blocked
    in their batched run (they run batched), and the progress naming the instruction."""
    event = threading.Event()
    end = time.monotonic() + WAIT
    states: list = []
    while time.monotonic() < end and not job.done():
        states = job.states()
        progress = job.progress()
        in_run = [s for s in states if s.status == "blocked" and s.block is not None
                  and s.block.opcode == BATCHED_OPCODE]
        running = [s for s in states if s.status == "running" and s.instruction and RUNNING.fullmatch(s.instruction)]
        if (len(states) == n and all(s.collectives_started > 0 for s in states) and running
                and len(in_run) == batched_members and progress.collective > 0 and progress.instruction):
            return states, progress
        event.wait(0.01)  # polling the running job's states; the loop never ends by itself
    pytest.fail(f"the batched run was not seen at work: {[s.to_dict() for s in states]}")


def test_threads_batched_replicas_count_collectives_and_name_their_instruction():
    n = 4
    with launch(n, backend="threads") as job:
        states, progress = seen_running(job, n, n - 1)
        assert RUNNING.fullmatch(progress.instruction), progress
        # Counted as they happen, never taken back while the run goes on.
        later = job.states()
        assert all(b.collectives_started >= a.collectives_started for a, b in zip(states, later))


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("per", [4, 2], ids=["one actor", "two actors spanning"])
def test_packed_actors_batched_replicas_count_collectives_and_name_their_instruction(per):
    n = 4
    with launch(n, replicas_per_actor=per) as job:
        # Each actor's batched run: one thread runs its members' program, the others wait in it.
        states, progress = seen_running(job, n, n - n // per)
        if per == n:
            assert RUNNING.fullmatch(progress.instruction), progress
        else:  # the spanning all-reduce's leader waits for the other actor as an unbatched one does
            assert RUNNING.fullmatch(progress.instruction) or progress.instruction.startswith("%y (all-reduce #")
