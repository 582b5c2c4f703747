"""The GIL's switch interval is raised while many replica threads run in a process, and Python's
own comes back when they end (tuning/gil_slice.py)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import replicas as rp
from replicas.tuning import gil_slice

PROGRAM = """\
HloModule seen, replica_count={n}

add {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}}

ENTRY main {{
  x = f32[1] parameter(0)
  y = f32[1] all-reduce(x), replica_groups={{}}, to_apply=add
  ROOT z = f64[1] custom-call(y), custom_call_target="switch_interval_seen"
}}
"""


def seen_intervals(n: int) -> list[float]:
    """Each replica's view of the switch interval, in its thread after the all-reduce: every thread
    of the job has started by then, and none has ended."""
    rp.register_custom_call("switch_interval_seen", lambda y: np.full(1, sys.getswitchinterval()))
    try:
        results = rp.run(PROGRAM.format(n=n), [np.zeros(1, np.float32)], num_replicas=n, backend="threads",
                         timeout=120)
    finally:
        rp.unregister_custom_call("switch_interval_seen")
    return sorted({float(r[0]) for r in results})


@pytest.mark.parametrize("setting, n, expected", [(None, gil_slice.MANY * 2, gil_slice.SLICE),
                                                  ("20", gil_slice.MANY * 2, 0.02),
                                                  ("0", gil_slice.MANY * 2, None),
                                                  (None, 4, None)])
def test_the_interval_is_raised_while_many_replica_threads_run(monkeypatch, setting, n, expected):
    before = sys.getswitchinterval()
    if setting is None:
        monkeypatch.delenv(gil_slice.ENV, raising=False)
    else:
        monkeypatch.setenv(gil_slice.ENV, setting)
    assert seen_intervals(n) == [pytest.approx(expected if expected is not None else before)]
    assert sys.getswitchinterval() == before and not gil_slice.raised()
