"""Hostile sizes and bad arguments are refused up front, only ever with ProgramError, in bounded
time, memory (each refusal's allocations are measured) and message length (threads backend:
nothing here starts Ray)."""

from __future__ import annotations

import os
import resource

import numpy as np
import pytest

import replicas as rp
from replicas import limits
from replicas.hlo.serialize import module_to_bytes

ALL_REDUCE = """\
HloModule m, replica_count={n}

add {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}}

ENTRY main {{
  x = f32[4] parameter(0)
  ROOT y = f32[4] all-reduce(x), replica_groups={groups}, to_apply=add
}}
"""

MAX_MESSAGE = 600  # characters: an error about a hostile input is read, not scrolled


def all_reduce(n: int | str = 2, groups: str = "{{0,1}}") -> str:
    return ALL_REDUCE.format(n=n, groups=groups)


REFUSAL_BYTES = 16 << 20  # what refusing a hostile input may allocate, beyond 10 bytes per input byte


def refused(fn, *args, match: str | None = None, **kwargs) -> str:
    """`fn(*args)` raises ProgramError (matching `match`) with a short message, having allocated at
    most `REFUSAL_BYTES` plus 10 bytes per byte of its text arguments (tracemalloc's peak)."""
    import tracemalloc

    tracemalloc.start()
    try:
        with pytest.raises(rp.ProgramError, match=match) as info:
            fn(*args, **kwargs)
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    size = sum(len(a) for a in args if isinstance(a, (str, bytes)))
    assert peak <= REFUSAL_BYTES + 10 * size, f"refusing it allocated {peak} bytes (input {size} bytes)"
    text = str(info.value)
    assert len(text) < MAX_MESSAGE, text[:2000]
    return text


def test_default_ceilings_are_documented_numbers():
    now = limits.current()
    assert now.max_replicas == int(os.environ.get("REPLICAS_MAX_REPLICAS", limits.DEFAULT_MAX_REPLICAS))
    assert now.max_bytes >= 1 << 30 and now.max_nesting == 64


@pytest.mark.parametrize("count", [10**7, 2**64, 10**4000])
def test_a_huge_replica_count_is_refused_with_its_size(count):
    text = refused(rp.parse_hlo, all_reduce(count), match="replica_count")
    assert "ceiling of" in text and ("bits" in text or str(count) in text)


def test_missing_replicas_are_summarized_as_ranges():
    text = refused(rp.parse_hlo, all_reduce(4000, "{{0,1},{7,9}}"))
    assert "missing 2-6, 8, 10-3999" in text


def test_iota_groups_over_more_devices_than_the_ceiling_are_refused_before_expanding():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    refused(rp.parse_hlo, all_reduce(4, "[100000000,1]<=[100000000]"), match="iota replica groups")
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 50_000  # KiB


@pytest.mark.parametrize("shape", ["f32[999999999999]", "f32[99999999,99999999,99999999]", "pred[4611686018427387904]"])
def test_a_giant_declared_shape_is_refused_before_its_constant_is_read(shape):
    text = f"HloModule m\nENTRY e {{\n  ROOT c = {shape} constant({{1, 2, 3}})\n}}\n"
    message = refused(rp.parse_hlo, text, match="ceiling")
    assert "TiB" in message or "GiB" in message


@pytest.mark.parametrize("depth", [65, 490, 5000])
def test_deeply_nested_tuple_shapes_are_a_program_error(depth):
    shape = "(" * depth + "f32[]" + ")" * depth
    refused(rp.parse_hlo, f"HloModule m\nENTRY e {{\n  ROOT p = {shape} parameter(0)\n}}\n", match="nests deeper")
    refused(rp.Shape.parse, shape, match="nests deeper")


def test_a_msgpack_file_with_a_huge_replica_count_is_refused(tmp_path):
    module = rp.parse_hlo(all_reduce(2))
    module.attrs["replica_count"] = 2**64
    path = tmp_path / "m.msgpack"
    path.write_bytes(module_to_bytes(module))
    refused(rp.load, path, match="replica_count")


def test_configured_ceilings_apply_and_restore():
    previous = limits.configure(max_replicas=8, max_bytes=1 << 20)
    try:
        refused(rp.parse_hlo, all_reduce(16), match="ceiling of 8 replicas")
        refused(rp.parse_hlo, "HloModule m\nENTRY e {\n  ROOT p = f32[1000000] parameter(0)\n}\n", match="1 MiB")
    finally:
        limits.restore(previous)
    assert limits.current() == previous
    with pytest.raises(rp.ProgramError, match="max_bytes"):
        limits.configure(max_bytes=-1)


X = np.zeros(4, np.float32)
BAD_ARGUMENTS = {
    "args is an int": (dict(args=5), "args must be a list"),
    "args is a str": (dict(args="abc"), "args must be a list"),
    "args is an array": (dict(args=np.zeros((2, 4), np.float32)), r"wrap a single value as \[x\]"),
    "args is a dict": (dict(args={"x": X}), "args must be a list"),
    "num_replicas is a str": (dict(num_replicas="2"), "num_replicas must be an integer"),
    "num_replicas is a float": (dict(num_replicas=2.0), "num_replicas must be an integer"),
    "num_replicas is 2**70": (dict(num_replicas=2**70), "exceeds the ceiling"),
    "num_replicas is 0": (dict(num_replicas=0), ">= 1"),
    "timeout is a str": (dict(timeout="1"), "timeout must be"),
    "timeout is nan": (dict(timeout=float("nan")), "timeout must be"),
    "timeout is negative": (dict(timeout=-1), "timeout must be"),
    "infeed is an int": (dict(infeed=3), "infeed must be a list"),
    "infeed holds ints": (dict(infeed=[1, 2]), r"infeed\[0\]"),
    "resources holds ints": (dict(resources=[1, 2]), r"resources\[0\]"),
    "resources is a str": (dict(resources="ab"), "resources must be a list"),
    "resources has a negative amount": (dict(resources=[{"GPU": -1}, {}]), r"resources\[0\]"),
    "trace into a missing directory": (dict(trace="/nonexistent/dir/t.json"), "does not exist"),
    "trace is an int": (dict(trace=5), "trace must be a file path"),
    "backend is a list": (dict(backend=["threads"]), "backend must be"),
    "replicas_per_actor is a str": (dict(replicas_per_actor="2"), "replicas_per_actor"),
    "strict is a str": (dict(strict="no"), "strict must be"),
    "module is None": (dict(module=None), "module must be"),
    "module is a missing path": (dict(module="program.hlo"), "program.hlo"),
    "a list argument of the wrong length": (dict(args=[[0.0] * 10**6]), "got a list of 1000000"),
    "a nested list argument": (dict(args=[[[[[[0.0]]]]] * 4]), "argument 0"),
}


@pytest.mark.parametrize("case", sorted(BAD_ARGUMENTS))
def test_bad_arguments_to_run_are_program_errors_naming_the_argument(case):
    overrides, match = BAD_ARGUMENTS[case]
    kwargs = dict(module=rp.parse_hlo(all_reduce(2)), args=[X], num_replicas=2, backend="threads", timeout=30)
    kwargs.update(overrides)
    module = kwargs.pop("module")
    refused(rp.run, module, match=match, **kwargs)


def test_a_job_too_big_for_the_byte_ceiling_is_refused_before_it_starts():
    module = rp.parse_hlo("HloModule m\nENTRY e {\n  ROOT p = f32[100000000] parameter(0)\n}\n")
    text = refused(rp.run, module, [np.zeros(1, np.float32)], num_replicas=4000, backend="threads")
    assert "4000 replicas each holding %p" in text and "per job" in text


def test_a_good_trace_path_still_works(tmp_path):
    out = tmp_path / "t.json"
    rp.run(rp.parse_hlo(all_reduce(2)), [X], num_replicas=2, backend="threads", trace=str(out))
    assert out.stat().st_size > 0


def test_a_trace_that_cannot_be_written_after_the_job_keeps_the_results(tmp_path):
    out = tmp_path / "gone" / "t.json"
    out.parent.mkdir()
    job = rp.launch(rp.parse_hlo(all_reduce(2)), [X], num_replicas=2, backend="threads", trace=str(out))
    out.parent.rmdir()  # checked at launch, removed before the job ends
    with pytest.warns(RuntimeWarning, match="was not written"):
        results = job.result()
    np.testing.assert_array_equal(results[0], 2 * X)


def test_load_refuses_a_special_file(tmp_path):
    link = tmp_path / "zero.hlo"
    link.symlink_to("/dev/zero")
    refused(rp.load, link, match="not a regular file")


class _RaisingArray:
    def __array__(self, dtype=None, copy=None):
        raise RuntimeError("this object refuses to become an array")


def test_an_argument_whose_array_conversion_raises_is_a_program_error():
    text = "HloModule m\nENTRY e {\n  p = f32[1] parameter(0)\n  ROOT n = f32[1] negate(p)\n}\n"
    message = refused(rp.run, text, [[_RaisingArray()]], num_replicas=1, backend="threads")
    assert "refuses to become an array" in message


CAPPED = r'''
import resource, sys
for line in open("/proc/self/status"):
    if line.startswith("VmSize:"):
        size = int(line.split()[1]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (size + (2 << 30),) * 2)
import replicas as rp
try:
    rp.run("HloModule m\nENTRY e {\n  ROOT i = f32[1073741824] iota(), iota_dimension=0\n}\n", [],
           num_replicas=1, backend="threads")
except rp.ProgramError as e:
    print("ProgramError", e)
'''


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux's /proc")
def test_under_an_address_space_cap_a_program_that_cannot_fit_is_refused_before_it_runs():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", CAPPED], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("ProgramError") and "f32[1073741824]" in done.stdout, done.stdout
