"""Memory known before running: the peak live bytes of a replica come from the schedule, rp.run
refuses a program whose peak times its replicas is over REPLICAS_MAX_BYTES (naming the instruction
where it is reached), and a kernel allocates no more than its result and declared temporary."""

from __future__ import annotations

import json
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
import json, resource, sys
import replicas as rp
from replicas.runtime.compile import compile_module
from replicas.runtime.memory import peak_bytes
out = []
for text in json.loads(sys.argv[1]):
    module = rp.parse_hlo(text)
    peak = peak_bytes(compile_module(module, num_replicas=1)).bytes
    rp.run(module, [], num_replicas=1, backend="threads")  # warm: imports, pools, threads
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    rp.run(module, [], num_replicas=1, backend="threads")
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out.append([peak, after - before])
print(json.dumps(out))
'''

# Each program's first run starts from the process's high-water mark of its warm-up, so the second
# run's growth is what it adds beyond it; the sweep runs the largest first.
SWEEP = [
    "HloModule m\nENTRY e {\n  ROOT i = f32[33554432] iota(), iota_dimension=0\n}\n",
    "HloModule m\nENTRY e {\n  ROOT i = bf16[4096,8192] iota(), iota_dimension=1\n}\n",
    "HloModule m\nENTRY e {\n  i = s32[8388608] iota(), iota_dimension=0\n  ROOT n = s32[8388608] negate(i)\n}\n",
]
MARGIN = 48 * MIB


def test_measured_growth_stays_within_the_computed_peak():
    done = subprocess.run([sys.executable, "-c", WORKER, json.dumps(SWEEP)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    for text, (peak, growth) in zip(SWEEP, json.loads(done.stdout)):
        assert growth <= peak + MARGIN, (text, peak, growth)
