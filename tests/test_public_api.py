"""The public API takes programs and arguments in every form a user has, and fails with one clear
ReplicasError otherwise."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import replicas as rp
from replicas.errors import DeadlockError, ProgramError, ReplicasError

ALL_REDUCE = """\
HloModule ar, replica_count=2

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
  x = f32[3] parameter(0)
  ROOT r = f32[3] all-reduce(x), replica_groups={}, to_apply=add
}
"""

PAIRS = 'frontend_attributes={_xla_send_recv_source_target_pairs="{{0,1},{1,0}}"}'
DEADLOCK = f"""\
HloModule dl, replica_count=2

ENTRY main {{
  x = f32[] parameter(0)
  tok = token[] after-all()
  recv = (f32[], u32[], token[]) recv(tok), channel_id=1, {PAIRS}
  done = (f32[], token[]) recv-done(recv), channel_id=1
  ROOT v = f32[] get-tuple-element(done), index=0
}}
"""


@pytest.mark.parametrize("form", ["module", "path", "str_path", "text", "text_bytes", "msgpack_bytes"])
def test_run_takes_every_program_form_and_defaults_to_the_declared_count(form: str, tmp_path: Path) -> None:
    m = rp.parse_hlo(ALL_REDUCE)
    rp.save(m, tmp_path / "ar.hlo")
    rp.save(m, tmp_path / "ar.msgpack")
    program = {"module": m, "path": tmp_path / "ar.hlo", "str_path": str(tmp_path / "ar.hlo"), "text": ALL_REDUCE,
               "text_bytes": ALL_REDUCE.encode(),
               "msgpack_bytes": (tmp_path / "ar.msgpack").read_bytes()}[form]
    out = rp.run(program, [[1.0, 2.0, 3.0]], backend="threads")  # a Python list; 2 replicas: replica_count
    assert len(out) == 2
    np.testing.assert_array_equal(out[0], np.array([2, 4, 6], np.float32))


def test_array_likes_and_scalars_are_arguments() -> None:
    class ArrayLike:  # what a JAX array or a torch tensor offers
        def __array__(self, dtype=None, copy=None):
            return np.ones(3, np.float32)

    out = rp.run(ALL_REDUCE, [ArrayLike()], backend="threads")
    np.testing.assert_array_equal(out[1], np.full(3, 2, np.float32))


@pytest.mark.parametrize("bad,match", [
    ({"num_replicas": 0}, "num_replicas must be >= 1"),
    ({"num_replicas": -3}, "num_replicas must be >= 1"),
    ({"num_replicas": "2"}, "num_replicas"),
    ({"timeout": 0}, "timeout must be"),
    ({"timeout": "soon"}, "timeout must be"),
    ({"backend": "gpu"}, "backend must be one of"),
    ({"args": np.ones(3, np.float32)}, r"wrap a single value as \[x\]"),
])
def test_wrong_options_are_program_errors(bad: dict, match: str) -> None:
    kwargs = {"args": [np.ones(3, np.float32)], "backend": "threads", **bad}
    with pytest.raises(ProgramError, match=match):
        rp.run(ALL_REDUCE, **kwargs)


def test_wrong_program_types_are_program_errors() -> None:
    with pytest.raises(ProgramError, match="module must be a program"):
        rp.run(42, backend="threads")
    with pytest.raises(ReplicasError, match="nope.hlo"):
        rp.run("nope.hlo", backend="threads")


def test_check_and_verify_both_raise() -> None:
    with pytest.raises(DeadlockError):
        rp.check(DEADLOCK, [np.float32(0)])
    assert rp.check(ALL_REDUCE, [np.ones(3, np.float32)]) is None
    bad = rp.parse_hlo(ALL_REDUCE)
    bad.entry_computation.root = "nothing"
    with pytest.raises(ProgramError):
        rp.verify(bad)


def test_run_takes_every_launch_option() -> None:
    import inspect

    launch = set(inspect.signature(rp.launch).parameters)
    assert launch == set(inspect.signature(rp.run).parameters)


def test_exports() -> None:
    for name in ("Report", "MismatchReport", "ReplicaState", "BlockInfo", "Job", "unregister_custom_call",
                 "compile_module", "check", "verify", "jax"):
        assert getattr(rp, name) is not None
    assert "compile" not in rp.__all__
    rp.register_custom_call("front_test_double", lambda x: x * 2)
    rp.unregister_custom_call("front_test_double")
    from replicas.ops.custom_call import registered_custom_calls

    assert "front_test_double" not in registered_custom_calls()
