"""What XLA's HLO parser accepts and the package took for errors, found by parsing a broad sample
of XLA's own test modules (bench/LOG-2026.md, "Parser coverage"): each case against the value XLA
gives (worked out by hand from XLA's semantics where the case is this small)."""

from __future__ import annotations

import numpy as np

import replicas as rp
from replicas.hlo.printer import print_module

INDEX_COMMENTS = """HloModule m
ENTRY e {
  ROOT c = f32[3,2,1]{2,1,0} constant({ { /*i0=0*/ {1}, {2} }, { /*i0=1*/ {3}, {4} }, { /*i0=2*/ {5}, {6} } })
}
"""

EMPTY_WITH_COMMENTS = """HloModule m
ENTRY e {
  ROOT c = f32[2,0,3] constant({ { /*i0=0*/ }, { /*i0=1*/ } })
}
"""

SCALAR_WINDOWS = """HloModule m
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
ge {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT g = pred[] compare(a, b), direction=GE
}
ENTRY e {
  x = f32[] parameter(0)
  one = f32[] constant(1)
  two = f32[] constant(2)
  rw = f32[] reduce-window(x, one), to_apply=add
  ss = f32[] select-and-scatter(x, one, two), select=ge, scatter=add
  ROOT t = (f32[], f32[]) tuple(rw, ss)
}
"""

CUSTOM_CALL_LITERALS = """HloModule m
ENTRY e {
  x = f32[2] parameter(0)
  a = f32[2] custom-call(x), custom_call_target="scaled", literal=f32[] 0.5
  ROOT b = f32[2] custom-call(a), custom_call_target="scaled", literal=( s32[2]{0} {1, 2}, pred[2]{0} {1, 0} )
}
"""


def test_index_comments_inside_nested_literals_are_skipped():
    np.testing.assert_array_equal(rp.evaluate(rp.parse_hlo(INDEX_COMMENTS)).reshape(-1), [1, 2, 3, 4, 5, 6])
    assert rp.evaluate(rp.parse_hlo(EMPTY_WITH_COMMENTS)).shape == (2, 0, 3)


def test_reduce_window_and_select_and_scatter_of_a_scalar_need_no_window():
    rw, ss = rp.evaluate(rp.parse_hlo(SCALAR_WINDOWS), [np.float32(42)])
    assert float(rw) == 43.0  # the init combined with the one element
    assert float(ss) == 3.0  # the init plus the one source value, scattered to the only element


def test_a_custom_calls_literal_attribute_is_kept_for_it_and_printed_back():
    module = rp.parse_hlo(CUSTOM_CALL_LITERALS)
    a, b = module.entry_computation.instructions[1:]
    shape, value = a.attrs["custom_call_literal"]
    assert str(shape) == "f32[]" and float(value) == 0.5
    shape, (ints, flags) = b.attrs["custom_call_literal"]
    assert str(shape) == "(s32[2]{0}, pred[2]{0})"
    assert ints.tolist() == [1, 2] and flags.tolist() == [True, False]
    again = rp.parse_hlo(print_module(module))
    assert again.entry_computation.instructions[2].attrs["custom_call_literal"][1][0].tolist() == [1, 2]


AFTER_VALUES = """HloModule m
ENTRY e {
  p = f32[] parameter(0)
  neg = f32[] negate(p)
  t = token[] after-all(neg)
  q = f32[] add-dependency(p, t)
  ROOT s = f32[] add(neg, q)
}
"""

PERMUTE_FORMS = """HloModule m, replica_count=2
ENTRY e {
  a = f32[4] parameter(0)
  b = f32[4] parameter(1)
  ROOT r = (f32[4], f32[4]) collective-permute(a, b), source_target_pairs={{0,1},{1,0}}
}
"""

SCAN = """HloModule m
step {
  c = f32[] parameter(0)
  x = f32[] parameter(1)
  s = f32[] add(c, x)
  ROOT t = (f32[], f32[]) tuple(s, s)
}
ENTRY e {
  xs = f32[4] parameter(0)
  init = f32[] constant(0)
  ROOT r = (f32[4], f32[]) scan(xs, init), dimensions={0}, num_carries=1, is_reverse=true,
    is_associative=true, to_apply=step
}
"""


def test_after_all_orders_after_values_too():
    assert float(rp.evaluate(rp.parse_hlo(AFTER_VALUES), [np.float32(3)])) == 0.0


def test_forms_xla_parses_but_no_kernel_runs_are_refused_by_name():
    import pytest

    with pytest.raises(rp.ProgramError, match="combined form"):
        rp.parse_hlo(PERMUTE_FORMS)
    with pytest.raises(rp.ProgramError, match="scan is not supported"):
        rp.parse_hlo(SCAN)
    assert rp.parse_hlo(SCAN, verify=False).entry_computation.root_instruction.attrs["num_carries"] == 1


SHORT_FORM = """HloModule test
ENTRY test {
  add = add(f32[3] parameter(0), f32[3] parameter(1))
  ROOT root = tuple(add, add(add, add), sqrt(f32[3] broadcast(f32[] parameter(2))))
}
"""


def test_xla_short_form_nests_instructions_and_infers_shapes():
    module = rp.parse_hlo(SHORT_FORM)
    names = [inst.name for inst in module.entry_computation.instructions]
    assert names == ["parameter.anon", "parameter.anon.1", "add", "add.anon", "parameter.anon.2",
                     "broadcast.anon", "sqrt.anon", "root"]
    x, y = np.arange(3, dtype=np.float32), np.ones(3, np.float32)
    total, twice, root = rp.evaluate(module, [x, y, np.float32(4)])
    np.testing.assert_array_equal(total, x + y)
    np.testing.assert_array_equal(twice, 2 * (x + y))
    np.testing.assert_array_equal(root, [2, 2, 2])


def test_short_form_nesting_is_bounded():
    import pytest

    deep = "negate(" * 200 + "f32[] parameter(0)" + ")" * 200
    with pytest.raises(rp.ProgramError, match="nest deeper"):
        rp.parse_hlo(f"HloModule m\nENTRY e {{\n  ROOT r = {deep}\n}}\n")


ASYNC_SUGAR = """HloModule m
ENTRY e {
  p = f32[3] parameter(0)
  s = ((f32[3]), f32[3], s32[]) custom-call-start(p), async_execution_thread="side", custom_call_target="twice"
  u = ((f32[3]), f32[3], s32[]) custom-call-update(s)
  ROOT d = f32[3] custom-call-done(u)
}, execution_thread="main"
"""

STRING_OVER_LINES = '''HloModule m, origin_recovery_table={
  {"c"} : {"c__ovp0"},
  "
    HloModule recovery
    ENTRY e { ROOT p = s32[] parameter(0) }
  "
}
ENTRY e {
  ROOT c = s32[] constant(7)
}
'''


def test_async_short_form_wraps_the_op_in_a_computation():
    from replicas.ops.custom_call import unregister_custom_call

    rp.register_custom_call("twice", lambda x: 2 * x)
    try:
        module = rp.parse_hlo(ASYNC_SUGAR)
        assert module.entry_computation.instructions[1].opcode == "async-start"
        np.testing.assert_array_equal(rp.evaluate(module, [np.arange(3, dtype=np.float32)]), [0, 2, 4])
    finally:
        unregister_custom_call("twice")


def test_a_quoted_attribute_value_may_span_lines():
    assert int(rp.evaluate(rp.parse_hlo(STRING_OVER_LINES))) == 7
