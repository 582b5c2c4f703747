"""Every replica-group form XLA's parser takes (explicit lists, `{}`, iota, the mesh form with named
axes, device order and sub-axes) parses to the same groups, prints back in the form it was given
(text -> module -> text -> module, equal), and runs: an all-gather of each device's id returns
exactly its group, in the group's order."""

from __future__ import annotations

import numpy as np
import pytest

import replicas as rp
from replicas.errors import ProgramError
from replicas.runtime.compile import compile_module

PROGRAM = """
HloModule forms, replica_count=1, num_partitions=8

ENTRY main {{
  id = u32[] partition-id()
  v = f32[] convert(id)
  one = f32[1]{{0}} reshape(v)
  ROOT ag = f32[{size}]{{0}} all-gather(one), channel_id=1, replica_groups={groups}, use_global_device_ids=true, dimensions={{0}}
}}
"""  # noqa: E501

FORMS = {
    "explicit": ("{{0,1,2,3},{4,5,6,7}}", [[0, 1, 2, 3], [4, 5, 6, 7]]),
    "empty": ("{}", []),
    "iota": ("[2,4]<=[4,2]T(1,0)", [[0, 2, 4, 6], [1, 3, 5, 7]]),
    "iota_plain": ("[4,2]<=[8]", [[0, 1], [2, 3], [4, 5], [6, 7]]),
    "mesh": ("mesh['axis_0'=4,'axis_1'=2] {'axis_0'}", [[0, 2, 4, 6], [1, 3, 5, 7]]),
    "mesh_size_one_axis": ("mesh['axis_0'=8,'axis_1'=1] {'axis_0'}", [list(range(8))]),
    "mesh_device_ids": ("mesh['axis_0'=4,'axis_1'=2], device_ids=([2,2,2]T(0,2,1)) {'axis_0'}",
                        [[0, 1, 4, 5], [2, 3, 6, 7]]),
    "mesh_listed_device_ids": ("mesh[a=2,b=4], device_ids=(7,6,5,4,3,2,1,0) {b}", [[7, 6, 5, 4], [3, 2, 1, 0]]),
    "mesh_axes_in_order_named": ("mesh['a'=2,'b'=4] {'b','a'}", [[0, 4, 1, 5, 2, 6, 3, 7]]),
    "mesh_sub_axis": ("mesh['a'=8] {'a':(2)2}", [[0, 2], [1, 3], [4, 6], [5, 7]]),
    "mesh_two_sub_axes": ("mesh['a'=8] {'a':(1)2,'a':(4)2}", [[0, 1, 4, 5], [2, 3, 6, 7]]),
    "mesh_no_axes": ("mesh['a'=2,'b'=4] {}", [[i] for i in range(8)]),
}


@pytest.mark.parametrize("name", FORMS)
def test_each_form_parses_prints_back_and_runs(name: str) -> None:
    text, groups = FORMS[name]
    size = len(groups[0]) if groups else 8
    module = rp.parse_hlo(PROGRAM.format(groups=text, size=size))
    gather = module.computations[module.entry].by_name["ag"]
    assert gather.attrs["replica_groups"] == groups
    text_once = module.to_hlo_text()
    assert f"replica_groups={' '.join(text.split())}," in text_once  # printed back in the form it was given
    again = rp.parse_hlo(text_once)
    assert again == module and again.to_hlo_text() == text_once
    results = rp.run(module, [], backend="threads", timeout=60)
    for device, got in enumerate(results):
        mine = next((g for g in groups if device in g), list(range(8)))
        np.testing.assert_array_equal(got, np.array(mine, np.float32))


def test_jax_text_with_the_mesh_form_runs_as_xla_prints_it() -> None:
    """The line JAX 0.10 writes for `x.sum(0)` of a row-sharded array (issue 31's first failure)."""
    text = """
HloModule jit_sum, num_partitions=4

%region_0.0.clone (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %add = f32[] add(%a, %b)
}

ENTRY %main (x: f32[2,4]) -> f32[4] {
  %x = f32[2,4]{1,0} parameter(0)
  %zero = f32[] constant(0)
  %partial = f32[4]{0} reduce(%x, %zero), dimensions={0}, to_apply=%region_0.0.clone
  ROOT %all-reduce = f32[4]{0} all-reduce(%partial), channel_id=1, replica_groups=mesh['axis_0'=4,'axis_1'=1] {'axis_0'}, use_global_device_ids=true, to_apply=%region_0.0.clone, metadata={op_name="jit(<lambda>)/reduce_sum" stack_frame_id=2}
}
"""  # noqa: E501
    x = np.arange(32, dtype=np.float32).reshape(8, 4)
    results = rp.run(text, [[x[2 * p:2 * p + 2]] for p in range(4)], backend="threads", timeout=60)
    for got in results:
        np.testing.assert_array_equal(got, x.sum(0))


@pytest.mark.parametrize("groups,message", [
    ("mesh['a'=4,'b'=2] {'c'}", "not an axis of the mesh"),
    ("mesh['a'=8] {'a':(3)2}", "does not split"),
    ("mesh['a'=8] {'a','a':(1)2}", "overlap"),
    ("mesh['a'=4,'a'=2] {'a'}", "twice"),
    ("mesh['a'=4,'b'=2], device_ids=(0,0,1,2,3,4,5,6) {'a'}", "device_ids"),
    ("mesh['a'=4,'b'=2], device_ids=([4]) {'a'}", "holds 4 devices"),
    ("mesh['a'=4,'b'=2] 'a'", "expected mesh"),
    ("mesh['a'=99999999999] {'a'}", "ceiling"),
])
def test_bad_mesh_forms_are_program_errors(groups: str, message: str) -> None:
    with pytest.raises(ProgramError, match=message) as info:
        rp.parse_hlo(PROGRAM.format(groups=groups, size=4))
    assert "replica_groups" in str(info.value)


def test_groups_the_job_does_not_have_are_refused_before_any_kernel_runs() -> None:
    """The verifier checks replica groups against the job's replicas (kernels trust it): groups that
    leave a replica out or name one the job lacks, and, in an SPMD job, cross-replica groups (no
    channel_id) naming a replica other than 0, are errors naming the instruction."""
    two = PROGRAM.format(groups="{{0,1,2,3},{4,5,6,7}}", size=4)
    executable = compile_module(rp.parse_hlo(two.replace(", replica_count=1, num_partitions=8", "")))
    with pytest.raises(ProgramError, match="ag.*replica_groups"):
        rp.run(executable, [], num_replicas=6, backend="threads", timeout=60)
    spmd = PROGRAM.format(groups="{{0,1}}", size=2).replace(", channel_id=1", "").replace(
        ", use_global_device_ids=true", "")
    with pytest.raises(ProgramError, match="ag.*replica_groups.*out of range for 1 replicas"):
        rp.run(spmd, [], backend="threads", timeout=60)


def test_a_large_compact_form_stays_one_short_line_and_groups_changed_in_place_print_as_lists() -> None:
    module = rp.parse_hlo(PROGRAM.format(groups="[512,8]<=[8,512]T(1,0)", size=8).replace(
        "num_partitions=8", "num_partitions=4096"))
    line = next(x for x in module.to_hlo_text().splitlines() if "all-gather" in x)
    assert "replica_groups=[512,8]<=[8,512]T(1,0)," in line and len(line) < 300
    groups = module.computations[module.entry].by_name["ag"].attrs["replica_groups"]
    groups[0][0], groups[0][1] = groups[0][1], groups[0][0]
    assert "replica_groups={{512,0,1024," in module.to_hlo_text()
