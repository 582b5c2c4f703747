"""`rp.run` of one replica of a program that cannot wait, on threads, runs in the caller's thread
without a ThreadBackend or Job (`threads.run_alone`): the same results, types and errors as the
job path (`rp.launch(...).result()`, which always builds them), and the general path for
everything else."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import replicas as rp
from replicas.errors import DeadlockError, ProgramError, ReplicaFailure
from replicas.runtime import threads
from replicas.runtime.compile import module_fingerprint
from replicas.runtime.job import replica_error

ADD = """HloModule add
ENTRY main {
  x = f32[4] parameter(0)
  y = f32[4] parameter(1)
  ROOT s = f32[4] add(x, y)
}
"""

# A tuple of an int reduction, a bool compare, a scalar and a constant: result types beyond one array.
MIXED = """HloModule mixed
sum {
  a = s32[] parameter(0)
  b = s32[] parameter(1)
  ROOT c = s32[] add(a, b)
}
ENTRY main {
  i = s32[2,3] parameter(0)
  f = f64[] parameter(1)
  z = s32[] constant(0)
  r = s32[2] reduce(i, z), dimensions={1}, to_apply=sum
  two = s32[2] constant({2, 2})
  gt = pred[2] compare(r, two), direction=GT
  k = bf16[3] constant({1.5, -2, 0.25})
  ROOT t = (s32[2], pred[2], f64[], (bf16[3])) tuple(r, gt, f, (bf16[3]) tuple(k))
}
"""

# Both operands may be shorter than 4: operands of different lengths fail inside the add kernel.
DYNAMIC_ADD = """HloModule dyn
ENTRY main {
  x = f32[<=4] parameter(0)
  y = f32[<=4] parameter(1)
  ROOT s = f32[<=4] add(x, y)
}
"""

RESHAPE = """HloModule dr
ENTRY main {
  a = s32[6] parameter(0)
  s0 = s32[] parameter(1)
  s1 = s32[] parameter(2)
  ROOT r = s32[<=3,<=3] dynamic-reshape(a, s0, s1)
}
"""

FED = """HloModule fed
ENTRY main {
  tok = token[] after-all()
  in = (f32[4], token[]) infeed(tok)
  ROOT v = f32[4] get-tuple-element(in), index=0
}
"""

X = np.arange(4, dtype=np.float32)


@pytest.fixture
def backends(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per ThreadBackend built."""
    built: list[int] = []
    original = threads.ThreadBackend.__init__

    def counting(self: Any, executable: Any, args: list, **kwargs: Any) -> None:
        built.append(len(args))
        original(self, executable, args, **kwargs)

    monkeypatch.setattr(threads.ThreadBackend, "__init__", counting)
    return built


def both(module: rp.Module, args: Any, **kwargs: Any) -> tuple[Any, Any]:
    """(rp.run's outcome, the job path's outcome): a result list or the exception raised."""
    outcomes = []
    for go in (lambda: rp.run(module, args, backend="threads", **kwargs),
               lambda: rp.launch(module, args, backend="threads", **kwargs).result()):
        try:
            outcomes.append(go())
        except Exception as e:  # noqa: BLE001 - compared below
            outcomes.append(e)
    return outcomes[0], outcomes[1]


def assert_same_value(a: Any, b: Any) -> None:
    assert type(a) is type(b)
    if isinstance(a, tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same_value(x, y)
        return
    assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def assert_same_error(a: BaseException, b: BaseException) -> None:
    assert type(a) is type(b) and str(a) == str(b)
    assert {k: str(v) for k, v in vars(a).items()} == {k: str(v) for k, v in vars(b).items()}


def test_a_one_replica_program_that_cannot_wait_runs_without_a_job(backends: list[int]) -> None:
    module = rp.parse_hlo(ADD)
    assert rp.run(module, [X, X], backend="threads")[0].tolist() == (2 * X).tolist()
    assert backends == []
    # What can wait, several replicas, and what a job records or shows take the job path.
    rp.run(module, [X, X], num_replicas=2, backend="threads")
    rp.run(module, [X, X], backend="threads", record_every_instruction=True)
    rp.run(module, [X, X], backend="threads", progress=True)
    rp.run(module, [X, X], backend="threads", infeed=[[]])
    rp.run(rp.parse_hlo(FED), [], backend="threads", infeed=[[X]])
    assert backends == [2, 1, 1, 1, 1]


def test_results_and_their_types_are_those_of_the_job_path(backends: list[int]) -> None:
    cases = [(ADD, [X, [1.0, 2.0, 3.0, 4.0]]),  # a Python list converted to the parameter's type
             (MIXED, [np.arange(6, dtype=np.int32).reshape(2, 3), 2.5]),
             (RESHAPE, [np.arange(6, dtype=np.int32), 2, 3]),
             (DYNAMIC_ADD, [X[:3], X[:3]])]
    for text, args in cases:
        fast, job = both(rp.parse_hlo(text), args)
        assert type(fast) is list and len(fast) == len(job) == 1
        assert_same_value(fast[0], job[0])
    assert backends == [1] * len(cases)  # only the job path built one


@pytest.mark.parametrize("text, args, kwargs, error", [
    (DYNAMIC_ADD, [X[:2], X[:3]], {}, ReplicaFailure),  # the add kernel raises ValueError
    (RESHAPE, [np.arange(6, dtype=np.int32), 2, 2], {}, ProgramError),  # refused at run time
    (ADD, [X], {}, ProgramError),  # an argument missing
    (ADD, [X, X.astype(np.float64)], {}, ProgramError),  # argument 1's type
    (ADD, [X, X[:3]], {}, ProgramError),  # argument 1's shape
    (ADD, X, {}, ProgramError),  # not a list
    (ADD, [X, X], {"timeout": -1}, ProgramError),
    (ADD, [X, X], {"trace_events": 0}, ProgramError),
    (ADD, [X, X], {"strict": "yes"}, ProgramError),
    (ADD.replace("HloModule add", "HloModule add, replica_count=2"), [X, X], {"num_replicas": 1}, ProgramError),
])
def test_errors_are_those_of_the_job_path(text: str, args: Any, kwargs: dict, error: type) -> None:
    fast, job = both(rp.parse_hlo(text), args, **kwargs)
    assert isinstance(fast, error)
    assert_same_error(fast, job)


def test_options_made_once_are_still_checked_by_type_and_every_time_they_fail() -> None:
    # Warm runs reuse the options they were given before: `strict=1` equals `strict=True` but is
    # refused, and options that failed are refused again, never remembered as checked.
    module = rp.parse_hlo(ADD)
    rp.run(module, [X, X], backend="threads", strict=True)
    for _ in range(2):
        with pytest.raises(ProgramError, match="strict must be True or False"):
            rp.run(module, [X, X], backend="threads", strict=1)
        with pytest.raises(ProgramError, match="trace_events"):
            rp.run(module, [X, X], backend="threads", trace_events=0)
    assert rp.run(module, [X, X], backend="threads", strict=True)[0].tolist() == (2 * X).tolist()


def test_what_a_replica_raises_becomes_the_same_error_on_both_paths() -> None:
    # run_alone and Job._failure share replica_error: an interrupt inside the replica's run is that
    # replica's failure, a ReplicasError (already naming its instruction) is raised as it is.
    own = ProgramError("refused")
    assert replica_error(0, own) is own
    wrapped = replica_error(0, KeyboardInterrupt())
    assert isinstance(wrapped, ReplicaFailure) and str(wrapped) == "replica 0 failed: KeyboardInterrupt: "


def test_a_module_edited_in_place_runs_its_new_content() -> None:
    module = rp.parse_hlo(ADD)
    assert rp.run(module, [X, X], backend="threads")[0].tolist() == (X + X).tolist()
    module.computations["main"].instructions[2].opcode = "multiply"
    assert rp.run(module, [X, X], backend="threads")[0].tolist() == (X * X).tolist()
    constant = rp.parse_hlo("HloModule c\nENTRY e {\n  ROOT k = f32[3] constant({1, 2, 3})\n}\n")
    assert rp.run(constant, [], backend="threads")[0].tolist() == [1, 2, 3]
    constant.computations["e"].instructions[0].attrs["literal"][2] = 4  # the array itself, in place
    assert rp.run(constant, [], backend="threads")[0].tolist() == [1, 2, 4]


def test_a_custom_calls_literal_is_fingerprinted_by_its_bytes() -> None:
    def module(last: int) -> rp.Module:
        values = ", ".join(["0"] * 1999 + [str(last)])  # numpy's repr would elide the middle
        return rp.parse_hlo(f"""HloModule cc
ENTRY e {{
  x = f32[] parameter(0)
  ROOT y = f32[] custom-call(x), custom_call_target="t", literal=s32[2000] {{{values}}}
}}
""")
    assert module_fingerprint(module(1)) != module_fingerprint(module(2))
    assert module_fingerprint(module(1)) == module_fingerprint(module(1))


def test_a_lone_replica_waiting_for_its_infeed_is_still_a_deadlock() -> None:
    with pytest.raises(DeadlockError):
        rp.run(rp.parse_hlo(FED), [], backend="threads", timeout=30)
