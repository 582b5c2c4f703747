"""Reports that fit a terminal at 1024 replicas (threads): replicas in the same situation share a
line, ranges are compressed, the wait-for graph is summarized, event tails only for the replicas
the diagnosis names; `rp.run` and `rp.check` give the same text; a mismatch names both sides.

`rp.check` is compared with `rp.run` at CHECKED replicas, not 1024: both run the same threads job
(`checker.find_problem` launches it as `rp.run` does), so the comparison needs no 1024-replica job
of its own (two of them cost ~4 CPU s); CHECKED is past `threads.ABORT_INLINE`, so the job's abort
takes the large jobs' path, and its ranges are compressed as at 1024."""

from __future__ import annotations

import re
import resource

import numpy as np
import pytest

import replicas as rp
from replicas.errors import CollectiveMismatchError, DeadlockError

N = 1024
CHECKED = 128
REDUCERS = """
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

max {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT m = f32[] maximum(a, b)
}
"""


def last_replica_differs(on_last: str, on_others: str, n: int = N) -> str:
    """Replica n-1 runs `on_last`, every other replica `on_others` (bodies map p = f32[4] to f32[4])."""
    return f"""HloModule one_culprit, replica_count={n}
{REDUCERS}
on_last {{
  p = f32[4] parameter(0)
  {on_last}
}}

on_others {{
  p = f32[4] parameter(0)
  {on_others}
}}

ENTRY main {{
  x = f32[4] parameter(0)
  id = u32[] replica-id()
  last = u32[] constant({n - 1})
  is_last = pred[] compare(id, last), direction=EQ
  ROOT out = f32[4] conditional(is_last, x, x), true_computation=on_last, false_computation=on_others
}}
"""


def deadlock(n: int = N) -> str:
    return last_replica_differs("ROOT n = f32[4] negate(p)",
                                "ROOT r = f32[4] all-reduce(p), replica_groups={}, to_apply=add", n)


def mismatch(n: int = N) -> str:
    return last_replica_differs("ROOT ar_b = f32[4] all-reduce(p), replica_groups={}, to_apply=max",
                                "ROOT ar_a = f32[4] all-reduce(p), replica_groups={}, to_apply=add", n)


X = [np.zeros(4, np.float32)]


def without_event_times(text: str) -> str:
    return text.split("last events")[0]


@pytest.mark.slow
def test_a_one_culprit_deadlock_at_1024_replicas_fits_a_terminal() -> None:
    with pytest.raises(DeadlockError) as info:
        rp.run(deadlock(), X, backend="threads", timeout=300)
    text = f"DeadlockError: {info.value}"
    assert len(text.splitlines()) < 40 and len(text) < 4000, text
    assert "replicas 0-1022: blocked in %r (all-reduce #0) in on_others waiting for replica 1023" in text
    assert "replica 1023 finished without any collective and never reached all-reduce #0 (%r)" in text
    assert "replicas 0-1022 -> replica 1023  [all] in %r" in text
    assert "last events of replicas [0, 1023]" in text
    report = info.value.report
    as_dict = report.to_dict()  # ~2 CPU s at 1024 replicas (dataclasses.asdict of every record): once
    assert len(as_dict["wait_for_all"]) == 1023 and len(as_dict["replicas"]) == N
    assert sorted(report.blocked) == list(range(N - 1))  # test_scale's threads case checked this too
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss < 4 << 20  # KiB: under 4 GiB
    with pytest.raises(DeadlockError) as ran:
        rp.run(deadlock(CHECKED), X, backend="threads", timeout=300)
    with pytest.raises(DeadlockError) as checked:
        rp.check(deadlock(CHECKED), X, timeout=300)
    assert f"replicas 0-{CHECKED - 2}: blocked in %r (all-reduce #0)" in str(checked.value)
    assert without_event_times(str(checked.value)) == without_event_times(str(ran.value))


@pytest.mark.slow
def test_a_mismatch_at_1024_replicas_shows_the_diff_and_both_sides() -> None:
    with pytest.raises(CollectiveMismatchError) as info:
        rp.run(mismatch(), X, backend="threads", timeout=300)
    text = str(info.value)
    assert len(text.splitlines()) < 40, text
    assert "- replica 0 %ar_a: reduction = add(f32)" in text or "+ replica 0 %ar_a: reduction = add(f32)" in text
    assert "replicas 0-1022 ran %ar_a as collective #0" in text
    assert "replica 1023 ran %ar_b as collective #0" in text
    report = info.value.report
    assert isinstance(report, rp.MismatchReport)
    assert report.sides == [list(range(N - 1)), [N - 1]] or report.sides == [[N - 1], list(range(N - 1))]
    assert report.to_dict()["collective"] == 0
    with pytest.raises(CollectiveMismatchError) as ran:
        rp.run(mismatch(CHECKED), X, backend="threads", timeout=300)
    with pytest.raises(CollectiveMismatchError) as checked:
        rp.check(mismatch(CHECKED), X, timeout=300)
    # A side names the replicas whose flight recorders held the collective when the mismatch was
    # found (on a loaded machine one may not have reached it yet: "replicas 0-62, 64-126"), and
    # which side is "-" depends on which replica found it first.
    named = [RAN_AR_A.search(str(e.value)) for e in (checked, ran)]
    assert all(named) and all(set(replica_range(m.group(1))) <= set(range(CHECKED - 1)) for m in named)
    assert sides(checked.value) == sides(ran.value) == ["ran %ar_a", "replica 127 ran %ar_b as collective #0"]


RAN_AR_A = re.compile(r"replicas? ([\d, -]+) ran %ar_a as collective #0")


def sides(error: BaseException) -> list[str]:
    """A mismatch report's two side lines, without their sign and the replicas that ran %ar_a."""
    lines = [line for line in str(error).splitlines() if line.startswith(("- side: ", "+ side: "))]
    return sorted(RAN_AR_A.sub("ran %ar_a", line[len("- side: "):]) for line in lines)


def replica_range(text: str) -> list[int]:
    """ "0-62, 64-126" -> [0, ..., 62, 64, ..., 126] (the reports' compressed ranges)."""
    out: list[int] = []
    for part in text.split(", "):
        first, _, last = part.partition("-")
        out += range(int(first), int(last or first) + 1)
    return out


def recv_ring(n: int) -> str:
    """Every replica receives from its predecessor before it sends: a 256-replica wait-for cycle."""
    pairs = "{" + ",".join(f"{{{i},{(i + 1) % n}}}" for i in range(n)) + "}"
    route = f'frontend_attributes={{_xla_send_recv_source_target_pairs="{pairs}"}}'
    return f"""HloModule ring, replica_count={n}

ENTRY main {{
  x = f32[] parameter(0)
  tok = token[] after-all()
  recv = (f32[], u32[], token[]) recv(tok), channel_id=1, {route}
  got = (f32[], token[]) recv-done(recv), channel_id=1
  send = (f32[], u32[], token[]) send(x, tok), channel_id=1, {route}
  sent = token[] send-done(send), channel_id=1
  ROOT v = f32[] get-tuple-element(got), index=0
}}
"""


@pytest.mark.slow
def test_a_256_replica_cycle_reads_as_one_pattern() -> None:
    with pytest.raises(DeadlockError) as info:
        rp.run(recv_ring(256), [np.float32(1)], backend="threads", timeout=300)
    text = str(info.value)
    assert len(text.splitlines()) < 40, text
    assert "replica 0 waits in %got (recv-done, channel 1) for data from replica 255" in text
    assert "(and 255 more like it)" in text
    assert "cycle: 0 -> 255 -> 254" in text and "(256 replicas)" in text
    assert info.value.report.cycles[0][:3] == [0, 255, 254] and len(info.value.report.edges) == 256


@pytest.mark.slow
def test_a_one_culprit_deadlock_at_8192_replicas_fits_a_terminal() -> None:
    # A pod's worth of replicas (issue 32): the same text as at 1024, in this process under 4 GiB.
    n = 8192
    with pytest.raises(DeadlockError) as info:
        rp.run(deadlock(n), X, backend="threads", timeout=600)
    text = f"DeadlockError: {info.value}"
    assert len(text.splitlines()) < 40 and len(text) < 4000, text
    assert f"replicas 0-{n - 2}: blocked in %r (all-reduce #0) in on_others waiting for replica {n - 1}" in text
    assert f"replica {n - 1} finished without any collective and never reached all-reduce #0 (%r)" in text
    assert f"replicas 0-{n - 2} -> replica {n - 1}  [all] in %r" in text
    assert sorted(info.value.report.blocked) == list(range(n - 1))
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss < 4 << 20  # KiB: under 4 GiB
