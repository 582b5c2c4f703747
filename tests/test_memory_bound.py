"""Memory known before running: the peak live bytes of a replica come from the schedule, rp.run
refuses a program whose peak times its replicas is over REPLICAS_MAX_BYTES (naming the instruction
where it is reached), and a kernel allocates no more than its result and declared temporary."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import replicas as rp
from replicas import limits
from replicas.runtime.compile import compile_module
from replicas.runtime.memory import peak_bytes

MIB = 1 << 20

CHAIN = """\
HloModule chain
ENTRY e {
  p = f32[262144] parameter(0)
  a = f32[262144] add(p, p)
  b = f32[262144] multiply(a, a)
  c = f32[262144] subtract(b, p)
  ROOT d = f32[262144] negate(c)
}
"""


def test_the_peak_of_straight_line_code_is_where_most_values_are_alive():
    peak = peak_bytes(compile_module(rp.parse_hlo(CHAIN)))
    # First at %b: p (read again by c) and a are alive while b is written: three 1 MiB values.
    assert (peak.bytes, peak.instruction.name) == (3 * MIB, "b"), peak


def test_rp_run_refuses_a_program_whose_peak_is_over_the_ceiling_naming_the_instruction():
    text = "HloModule m\nENTRY e {\n  ROOT i = f32[1073741824] iota(), iota_dimension=0\n}\n"
    # The value alone fits (4 GiB); with iota's declared temporary it does not.
    previous = limits.configure(max_bytes=(4 << 30) + MIB)
    try:
        with pytest.raises(rp.ProgramError, match=r"%i \(iota\).*1 replicas in one process") as info:
            rp.run(text, [], num_replicas=1, backend="threads")
        assert "REPLICAS_MAX_BYTES" in str(info.value)
    finally:
        limits.restore(previous)


WORKER = r'''
import gc, json, sys
import numpy as np
import replicas as rp
from replicas.runtime.compile import compile_module
from replicas.runtime.memory import peak_bytes

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

def arguments(module):
    rng = np.random.default_rng(0)
    out = []
    for p in module.entry_computation.parameters:
        dims, dtype = tuple(p.shape.dimensions), p.shape.dtype
        out.append(rng.integers(0, dims[0], dims).astype(dtype) if dtype.kind == "i" else
                   rng.random(dims).astype(dtype))
    return out

out = []
for text in json.loads(sys.argv[1]):
    module = rp.parse_hlo(text)
    peak = peak_bytes(compile_module(module, num_replicas=1))
    args = arguments(module)
    rp.run(module, args, num_replicas=1, backend="threads")  # warm: imports, pools, threads
    gc.collect()
    # The arguments are alive already: count them into the growth as the peak counts them.
    held = sum(a.nbytes for a in args)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the high-water mark starts again from the resident memory now
    before = status("VmRSS")
    rp.run(module, args, num_replicas=1, backend="threads")
    out.append([peak.bytes, status("VmHWM") - before + held])
print(json.dumps(out))
'''

N = 1 << 21
CMP = "cmp {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT l = pred[] compare(a, b), direction=LT\n}\n"
SWEEP = [
    "HloModule m\nENTRY e {\n  ROOT i = f32[33554432] iota(), iota_dimension=0\n}\n",
    "HloModule m\nENTRY e {\n  ROOT i = bf16[4096,8192] iota(), iota_dimension=1\n}\n",
    "HloModule m\nENTRY e {\n  i = s32[8388608] iota(), iota_dimension=0\n  ROOT n = s32[8388608] negate(i)\n}\n",
    # Kernels that build temporaries: each is within its declared temporary (runtime/memory.py).
    f"HloModule m\nENTRY e {{\n  a = f32[] constant(0)\n  b = f32[] constant(1)\n"
    f"  ROOT r = f32[{4 * N}] rng(a, b), distribution=rng_uniform\n}}\n",
    f"HloModule m\nENTRY e {{\n  a = f32[] constant(0)\n  b = f32[] constant(1)\n"
    f"  ROOT r = f32[{4 * N}] rng(a, b), distribution=rng_normal\n}}\n",
    f"HloModule m\nENTRY e {{\n  k = u64[2] constant({{1, 2}})\n"
    f"  ROOT r = (u64[2], u32[{N}]) rng-bit-generator(k), algorithm=rng_default\n}}\n",
    f"HloModule m\n{CMP}ENTRY e {{\n  p = f32[{N}] parameter(0)\n"
    f"  ROOT s = f32[{N}] sort(p), dimensions={{0}}, to_apply=cmp\n}}\n",
    f"HloModule m\nENTRY e {{\n  o = f32[{N}] parameter(0)\n  i = s32[{N},1] parameter(1)\n"
    f"  ROOT g = f32[{N}] gather(o, i), offset_dims={{}}, collapsed_slice_dims={{0}}, start_index_map={{0}}, "
    f"index_vector_dim=1, slice_sizes={{1}}\n}}\n",
]
MARGIN = 16 * MIB


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux's /proc")
def test_measured_growth_stays_within_the_computed_peak():
    # A fixed mmap threshold: large blocks go back to the system when freed, so a warm run's freed
    # arrays do not hide the next run's (glibc raises the threshold after a large free otherwise).
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072")
    done = subprocess.run([sys.executable, "-c", WORKER, json.dumps(SWEEP)], capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    for text, (peak, growth) in zip(SWEEP, json.loads(done.stdout)):
        assert growth <= peak + MARGIN, (text, peak, growth)


IOTA_MIB = "HloModule m\nENTRY e {\n  ROOT i = f32[262144] iota(), iota_dimension=0\n}\n"


def _ceiling_between(replicas_fit: int) -> int:
    """A ceiling that holds `replicas_fit` replicas of IOTA_MIB in one process, not twice as many."""
    peak = peak_bytes(compile_module(rp.parse_hlo(IOTA_MIB))).bytes
    return peak * replicas_fit + peak // 2


def test_every_replica_of_the_threads_backend_counts_against_the_ceiling():
    previous = limits.configure(max_bytes=_ceiling_between(2))
    try:
        assert len(rp.run(IOTA_MIB, [], num_replicas=2, backend="threads")) == 2
        with pytest.raises(rp.ProgramError, match=r"%i \(iota\).*4 replicas in one process"):
            rp.run(IOTA_MIB, [], num_replicas=4, backend="threads")
    finally:
        limits.restore(previous)


@pytest.mark.usefixtures("ray_session")
def test_on_ray_the_replicas_of_one_actor_count_against_the_ceiling():
    previous = limits.configure(max_bytes=_ceiling_between(2))
    try:
        # Four replicas, two per actor: each process holds two.
        assert len(rp.run(IOTA_MIB, [], num_replicas=4, replicas_per_actor=2)) == 4
        with pytest.raises(rp.ProgramError, match=r"%i \(iota\).*4 replicas in one process"):
            rp.run(IOTA_MIB, [], num_replicas=4, replicas_per_actor=4)
    finally:
        limits.restore(previous)
