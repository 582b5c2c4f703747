"""Verifying, scheduling, kernel binding and code generation happen once per module content."""

from __future__ import annotations

import numpy as np
import pytest

import replicas as rp
from replicas.runtime import interpreter as interp_module
from replicas.runtime.compile import compile_module, module_fingerprint

ALL_REDUCE = """HloModule sum, replica_count=4
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}
ENTRY main {
  x = f32[8] parameter(0)
  r = u32[] replica-id()
  rf = f32[] convert(r)
  rb = f32[8] broadcast(rf), dimensions={}
  y = f32[8] add(x, rb)
  ROOT s = f32[8] all-reduce(y), replica_groups={{0,1,2,3}}, to_apply=add
}
"""


def test_equal_modules_share_one_executable_and_an_edit_compiles_again():
    first, second = rp.parse_hlo(ALL_REDUCE), rp.parse_hlo(ALL_REDUCE)
    assert module_fingerprint(first) == module_fingerprint(second)
    assert compile_module(first) is compile_module(second)
    second.computations["main"].instructions[4].opcode = "multiply"  # an edit in place: new content
    assert module_fingerprint(first) != module_fingerprint(second)
    assert compile_module(second) is not compile_module(first)


def test_a_constant_edit_changes_the_fingerprint():
    text = "HloModule c\nENTRY e {\n  ROOT k = f32[3] constant({1, 2, 3})\n}\n"
    a, b = rp.parse_hlo(text), rp.parse_hlo(text)
    b.computations["e"].instructions[0].attrs["literal"] = np.array([1, 2, 4], np.float32)
    assert module_fingerprint(a) != module_fingerprint(b)
    assert rp.evaluate(b).tolist() == [1, 2, 4]


def test_a_second_run_reuses_the_bound_interpreters(monkeypatch):
    module = rp.parse_hlo(ALL_REDUCE)
    x = np.arange(8, dtype=np.float32)
    want = 4 * x + 6
    for got in rp.run(module, [x], num_replicas=4, backend="threads"):
        np.testing.assert_array_equal(got, want)
    built = []
    original = interp_module.Interpreter.__init__

    def counting(self, *args, **kwargs):
        built.append(1)
        original(self, *args, **kwargs)

    monkeypatch.setattr(interp_module.Interpreter, "__init__", counting)
    for _ in range(3):
        for got in rp.run(rp.parse_hlo(ALL_REDUCE), [x], num_replicas=4, backend="threads"):
            np.testing.assert_array_equal(got, want)
    assert not built


FED_ADD = """HloModule fed_add
ENTRY main {
  x = f32[4] parameter(0)
  tok = token[] after-all()
  in = (f32[4], token[]) infeed(tok)
  v = f32[4] get-tuple-element(in), index=0
  ROOT s = f32[4] add(x, v)
}
"""


def test_a_module_edited_after_its_run_does_not_change_what_an_equal_module_computes():
    x = np.arange(4, dtype=np.float32)
    edited = rp.parse_hlo(FED_ADD)
    np.testing.assert_array_equal(rp.run(edited, [x], backend="threads", infeed=[[x]])[0], 2 * x)
    edited.computations["main"].instructions[-1].opcode = "multiply"  # after its executable was kept
    # While the first job holds the pooled interpreter, the second binds a new one: from the add.
    with rp.launch(rp.parse_hlo(FED_ADD), [x], backend="threads") as first:
        second = rp.launch(rp.parse_hlo(FED_ADD), [x], backend="threads")
        second.infeed(0, x)
        np.testing.assert_array_equal(second.result()[0], 2 * x)
        first.infeed(0, x)
        np.testing.assert_array_equal(first.result()[0], 2 * x)
    np.testing.assert_array_equal(rp.run(edited, [x], backend="threads", infeed=[[x]])[0], x * x)


@pytest.mark.usefixtures("ray_session")
@pytest.mark.ray
def test_pooled_interpreters_follow_a_new_placement_under_ray():
    module = rp.parse_hlo(ALL_REDUCE)
    x = np.arange(8, dtype=np.float32)
    for per_actor in (1, 2, 4, 1):
        for got in rp.run(module, [x], num_replicas=4, replicas_per_actor=per_actor):
            np.testing.assert_array_equal(got, 4 * x + 6)
