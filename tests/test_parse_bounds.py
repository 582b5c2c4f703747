"""Parsing is bounded by its input: HLO text of up to 100 MiB, or a dense program of many small instructions, is
read within 10 times its size of memory (plus a fixed allowance), a hostile .msgpack module is refused once
its decoded objects pass their budget (16 times its size plus 64 MiB), in a subprocess under an address-space
cap; a program over REPLICAS_MAX_PROGRAM_BYTES is refused before it is read."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import replicas as rp
from replicas import limits
from replicas.hlo.msgpack_bounds import ModuleReader as _ModuleReader

# Each case builds its input (`n` bytes, about) in the subprocess, so that the input is not counted:
# the peak resident memory is reset (/proc/self/clear_refs) after the input is built.
WORKER = r'''
import gc, json, resource, struct, sys, time
import msgpack
from replicas.hlo.text import parse_hlo
from replicas.hlo.serialize import MAGIC, FORMAT_VERSION, module_from_bytes
from replicas.errors import ProgramError

ENTRY = "HloModule m\nENTRY e {\n  p = f32[] parameter(0)\n"

def hlo(n, kind):
    if kind == "comment":
        return ENTRY + "/*" + "x" * n + "*/\n  ROOT r = f32[] negate(p)\n}\n"
    if kind == "string":
        return ENTRY + '  ROOT r = f32[] custom-call(p), custom_call_target="' + "x" * n + '"\n}\n'
    if kind == "escapes":
        return ENTRY + '  ROOT r = f32[] custom-call(p), custom_call_target="' + "\\\\" * (n // 2) + '"\n}\n'
    if kind == "braces":
        return ENTRY + '  ROOT r = f32[] custom-call(p), custom_call_target="t", backend_config={' + "x" * n + "}\n}\n"
    if kind == "stars":
        return ENTRY + "/*" + "*" * n + "*/\n  ROOT r = f32[] negate(p)\n}\n"
    if kind == "constant":
        k = n // 3
        return "HloModule m\nENTRY e {\n  ROOT c = f32[%d] constant({%s})\n}\n" % (k, ",".join(["12"] * k))
    if kind == "operands":
        k = n // 3
        return ENTRY + "  ROOT t = f32[] custom-call(%s), custom_call_target=\"t\"\n}\n" % ", ".join(["p"] * k)
    if kind in ("dense", "dense-short"):  # many small instructions, named as XLA prints them or shortest
        a = "add." if kind == "dense" else "a"
        lines = [ENTRY, f"  {a}0 = f32[] negate(p)\n", f"  {a}1 = f32[] negate(p)\n"]
        i, size = 2, sum(map(len, lines))
        while size < n:
            lines.append(f"  {a}{i} = f32[] add({a}{i - 1}, {a}{i - 2})\n")
            size += len(lines[-1])
            i += 1
        return "".join(lines) + f"  ROOT r = f32[] negate({a}{i - 1})\n}}\n"
    raise ValueError(kind)

def packed(n, kind):
    inst = {"name": "x", "opcode": "tuple", "shape": ["tuple", []], "operands": [], "attrs": {}, "line": None}
    insts = [inst]
    if kind == "msgpack-operands":
        inst["operands"] = [[]] * n
    elif kind == "msgpack-nested-operands":
        inst["operands"] = [[[[[]]]]] * (n // 5)
    elif kind == "msgpack-attribute":
        inst["attrs"] = {"a": [[]] * n}
    elif kind == "msgpack-many-small":
        insts = [dict(inst, name=f"x{i}", attrs={"a": [[]] * 3000}) for i in range(n // 3000)]
    body = {"name": "m", "entry": "e", "attrs": {},
            "computations": [{"name": "e", "root": "x", "is_fusion": False, "instructions": insts}]}
    return struct.pack("<8sH", MAGIC, FORMAT_VERSION) + msgpack.packb(body)

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)

out = []
cases = json.loads(sys.argv[1])
largest = max(n for _, n in cases)
resource.setrlimit(resource.RLIMIT_AS, (status("VmSize") + 14 * largest + (512 << 20),) * 2)
for kind, n in cases:
    data = packed(n, kind) if kind.startswith("msgpack") else hlo(n, kind)
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = status("VmRSS")
    t0 = time.process_time()
    try:
        module_from_bytes(data) if kind.startswith("msgpack") else parse_hlo(data)
        outcome = "ok"
    except ProgramError as e:
        outcome = "ProgramError"
    out.append([kind, len(data), status("VmHWM") - base, outcome, time.process_time() - t0])
    del data
print(json.dumps(out))
'''

MIB = 1 << 20
ALLOWANCE = 48 * MIB  # pages of the interpreter and of imported modules touched for the first time
BUDGET_PER_BYTE, BUDGET_FLOOR = _ModuleReader.BUDGET_PER_BYTE, _ModuleReader.BUDGET_FLOOR
CASES = [("comment", 100 * MIB), ("string", 100 * MIB), ("braces", 16 * MIB), ("stars", 4 * MIB),
         ("escapes", 2 * MIB), ("constant", MIB), ("operands", MIB), ("dense", 8 * MIB), ("dense-short", 8 * MIB),
         ("msgpack-operands", 16 * MIB), ("msgpack-nested-operands", 8 * MIB),
         ("msgpack-attribute", 4 * MIB), ("msgpack-many-small", 4 * MIB)]


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux's /proc")
def test_parsing_takes_at_most_ten_times_its_input():
    done = subprocess.run([sys.executable, "-c", WORKER, json.dumps(CASES)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout)
    assert [r[0] for r in results] == [c[0] for c in CASES]
    for kind, size, growth, outcome, _ in results:
        if kind.startswith("msgpack"):  # refused once its decoded objects pass their budget
            bound = (BUDGET_PER_BYTE + 1) * size + BUDGET_FLOOR + ALLOWANCE
        else:
            bound = 10 * size + ALLOWANCE
        assert growth <= bound, (kind, size, growth, outcome)
    outcomes = {kind: outcome for kind, _, _, outcome, _ in results}
    # Comments, strings and constants are legal; the msgpack cases are hostile and refused.
    assert all(outcomes[k] == "ok" for k in ("comment", "string", "constant", "dense", "dense-short")), outcomes
    assert all(outcomes[k] == "ProgramError" for k in outcomes if k.startswith("msgpack")), outcomes


def test_a_program_over_the_size_ceiling_is_refused_before_it_is_read(tmp_path):
    previous = limits.configure(max_program_bytes=1000)
    try:
        text = "HloModule m\n" + "/*" + "x" * 2000 + "*/\nENTRY e { ROOT c = f32[] constant(1) }\n"
        with pytest.raises(rp.ProgramError, match="REPLICAS_MAX_PROGRAM_BYTES"):
            rp.parse_hlo(text)
        path = tmp_path / "big.hlo"
        path.write_text(text)
        with pytest.raises(rp.ProgramError, match="max_program_bytes"):
            rp.load(path)
        small = rp.parse_hlo("HloModule m\nENTRY e { ROOT c = f32[] constant(1) }\n")
        from replicas.hlo.serialize import module_from_bytes, module_to_bytes

        data = module_to_bytes(small) + b"\0" * 1000
        with pytest.raises(rp.ProgramError, match="ceiling"):
            module_from_bytes(data)
    finally:
        limits.restore(previous)


def test_rank_over_64_is_refused_by_the_parser():
    dims = ",".join(["1"] * 65)
    with pytest.raises(rp.ProgramError, match="rank 65"):
        rp.parse_hlo(f"HloModule m\nENTRY e {{ ROOT p = f32[{dims}] parameter(0) }}\n")
