"""The selector of collective algorithms (collectives/selector.py): which unit runs the leaders'
step under each placement and size, as the flight recorder shows it, and the units' results
against numpy."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from collective_kit import Comp, module, reducer

from replicas.collectives import algorithms, selector  # noqa: F401  (algorithms registers the units)
from replicas.runtime import batched
from replicas.runtime.compile import compile_module
from replicas.runtime.job import Job
from replicas.runtime.threads import ThreadBackend


def _recorded(placement: list[int], size: int) -> tuple[list, list[dict]]:
    n = len(placement)
    c = Comp("main")
    x = c.param(f"f32[{size * n}]")
    ar = c.op("all-reduce", f"f32[{size * n}]", [x], to_apply="add_f32", replica_groups=[])
    ag = c.op("all-gather", f"f32[{size * n * n}]", [x], dimensions=[0], replica_groups=[])
    rs = c.op("reduce-scatter", f"f32[{size}]", [x], to_apply="add_f32", replica_groups=[], dimensions=[0])
    a2a = c.op("all-to-all", f"f32[{size * n}]", [x], replica_groups=[], dimensions=[0])
    root = c.op("tuple", f"(f32[{size * n}], f32[{size * n * n}], f32[{size}], f32[{size * n}])", [ar, ag, rs, a2a])
    m = module(c.done(root), reducer("add", "f32"))
    args = [[np.arange(size * n, dtype=np.float32) * (r + 1)] for r in range(n)]
    backend = ThreadBackend(compile_module(m), args, placement=placement)
    out = Job(backend, None, timeout=60, host_may_send=False).result()
    xs = [a[0] for a in args]
    total = np.sum(xs, axis=0)
    for r, (ar_r, ag_r, rs_r, a2a_r) in enumerate(out):
        np.testing.assert_array_equal(ar_r, total)
        np.testing.assert_array_equal(ag_r, np.concatenate(xs))
        np.testing.assert_array_equal(rs_r, total[r * size:(r + 1) * size])
        np.testing.assert_array_equal(a2a_r, np.concatenate([x[r * size:(r + 1) * size] for x in xs]))
    events = backend.events()
    return out, [{e["opcode"]: e["algorithm"] for e in events[r] if e["kind"] == "collective"}
                 for r in range(n)]


@pytest.mark.parametrize(("placement", "sharded_from", "want"), [
    ([0, 0, 0, 0], None, {"all-reduce": "in-process", "all-gather": "in-process",
                          "reduce-scatter": "in-process", "all-to-all": "in-process"}),
    ([0, 0, 1, 1], None, {"all-reduce": "direct", "all-gather": "direct",
                          "reduce-scatter": "direct", "all-to-all": "direct"}),
    ([0, 1, 0, 1], 0, {"all-reduce": "reduce-scatter + all-gather", "all-gather": "direct",
                       "reduce-scatter": "direct", "all-to-all": "direct"}),
    (list(range(10)), None, {"all-reduce": "recursive doubling", "all-gather": "recursive doubling",
                             "reduce-scatter": "recursive doubling", "all-to-all": "direct"}),
])
def test_the_unit_that_ran_is_in_every_members_event(placement, sharded_from, want, monkeypatch):
    monkeypatch.setattr(batched, "ENABLED", False)  # the engine's units, not one batched interpreter
    if sharded_from is not None:
        monkeypatch.setattr(selector, "THRESHOLDS", replace(selector.THRESHOLDS, small_bytes=sharded_from))
    _, chosen = _recorded(placement, 3)
    assert chosen == [want] * len(placement)


def test_the_board_round_is_the_cheapest_where_it_applies_and_the_plan_ends_in_one_that_cannot_decline():
    on_board = selector.Situation(processes=2, nbytes=1 << 20, board=True, ufunc=True)
    for collective in ("all-reduce", "all-gather", "reduce-scatter", "all-to-all"):
        names = [u.name for u in selector.plan(collective, on_board)]
        assert names == ["board round", "direct"], collective
    large = selector.Situation(processes=2, nbytes=selector.THRESHOLDS.small_bytes, board=True, ufunc=True)
    assert [u.name for u in selector.plan("all-reduce", large)] == ["reduce-scatter + all-gather"]
    # A reduction that is not a ufunc cannot sum into a board buffer.
    custom = replace(on_board, ufunc=False)
    assert [u.name for u in selector.plan("all-reduce", custom)] == ["direct"]
