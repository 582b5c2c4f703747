"""Structure-aware mutations for the fuzz tests and the targets they feed (see test_fuzz.py).

Each target takes bytes (what a file could hold) and either accepts them or raises ProgramError;
`run_target` turns anything else (RecursionError, MemoryError, KeyError, an allocation over
`ALLOCATION_BUDGET`) into an AssertionError naming the input's kind.
"""

from __future__ import annotations

import io
import re
import tracemalloc
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
from test_hlo_text_fuzz import SEEDS as TEXT_SEEDS

from replicas.errors import ProgramError
from replicas.hlo.serialize import DECODE_EXPANSION

# Bytes a hostile input may make us allocate beyond decoding what it holds: a small file declaring
# huge things stays within this. Decoding itself may take DECODE_EXPANSION bytes per input byte (the
# worst is a run of one-byte empty maps; bounded by the ceiling in serialize.py), so an input of n
# bytes may allocate ALLOCATION_BUDGET + DECODE_EXPANSION * n in all.
ALLOCATION_BUDGET = 64 << 20
CORPUS = Path(__file__).parent / "fuzz_corpus"

# The syntax seeds of test_hlo_text_fuzz, and one of collectives and data movement that verifies.
HLO_SEEDS = [*TEXT_SEEDS, """HloModule collectives, replica_count=4

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %add = f32[] add(%a, %b)
}

ENTRY %main (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  %ar = f32[8]{0} all-reduce(%p), replica_groups=[2,2]<=[4], to_apply=%sum
  %ag = f32[16]{0} all-gather(%p), replica_groups={{0,1},{2,3}}, dimensions={0}
  %r = f32[2,4]{1,0} reshape(%ar)
  %b = f32[3,2,4]{2,1,0} broadcast(%r), dimensions={1,2}
  %io = s32[6]{0} iota(), iota_dimension=0
  ROOT %cp = f32[8]{0} collective-permute(%ar), source_target_pairs={{0,1},{1,2},{2,3},{3,0}}
}
"""]

_TOKEN = re.compile(r'\s+|"(?:[^"\\]|\\.)*"|[A-Za-z_%][\w.\-]*|-?[0-9]+(?:\.[0-9]+)?|.', re.S)
NUMBERS = ["0", "-1", "-2147483649", "2147483648", "18446744073709551616", "999999999999", "1" + "0" * 40,
           "9" * 5000, "nan", "-inf", "1e308", "0x10"]
SHAPES = ["f32[999999999999]", "pred[4611686018427387904,4611686018427387904]", "f32[]", "token[]",
          "(" * 70 + "f32[]" + ")" * 70, "(" * 2000 + "f32[]" + ")" * 2000, "s32[<=3]", "f32[-1]",
          "f32[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]", "u4[7]"]
SYNTAX = list('{}()[],=%:"/*<>-_x\n ') + ["ROOT", "ENTRY", "HloModule", "{...}", "nan", "{" * 3000,
                                           "}" * 50, "replica_groups={{0,1}}", "[9999999,1]<=[9999999]"]
ATTRIBUTES = [", unknown_attribute=1", ", replica_groups=[1000000000,1]<=[1000000000]", ", dimensions={" +
              "0," * 3000 + "0}", ", to_apply=%nowhere", ", channel_id=-5", ", index=99999999999999999999",
              ", slice={[0:999999999999]}", ", window={size=999999999x999999999}", ", replica_count=2"]


def mutate_text(text: str, ops: list[tuple[str, int, int, int]]) -> str:
    """Apply (kind, i, j, pick) mutations over the text's tokens (and raw bytes for flips)."""
    tokens = _TOKEN.findall(text)
    for kind, i, j, pick in ops:
        if not tokens:
            tokens = ["x"]
        i %= len(tokens)
        j %= len(tokens)
        if kind == "drop" and len(tokens) > 1:
            del tokens[i]
        elif kind == "dup":
            tokens.insert(i, tokens[i])
        elif kind == "swap":
            tokens[i], tokens[j] = tokens[j], tokens[i]
        elif kind == "number":
            numbers = [k for k, t in enumerate(tokens) if t[:1].isdigit() or t[:2] in ("-0", "-1")]
            if numbers:
                tokens[numbers[i % len(numbers)]] = NUMBERS[pick % len(NUMBERS)]
        elif kind == "shape":
            shapes = [k for k, t in enumerate(tokens) if re.fullmatch(r"[a-z]+[0-9]*", t) and k + 1 < len(tokens)
                      and tokens[k + 1] == "["]
            if shapes:
                k = shapes[i % len(shapes)]
                end = tokens.index("]", k) if "]" in tokens[k:] else k + 1
                tokens[k:end + 1] = [SHAPES[pick % len(SHAPES)]]
        elif kind == "attribute":
            lines = [k for k, t in enumerate(tokens) if "\n" in t]
            if lines:
                tokens.insert(lines[i % len(lines)], ATTRIBUTES[pick % len(ATTRIBUTES)])
        elif kind == "insert":
            tokens.insert(i, SYNTAX[pick % len(SYNTAX)])
        elif kind == "truncate":
            tokens = tokens[:i]
        elif kind == "flip":
            raw = bytearray("".join(tokens).encode("utf-8", "surrogatepass"))
            if raw:
                raw[(i * 7919 + j) % len(raw)] ^= 1 << (pick % 8)
            tokens = _TOKEN.findall(raw.decode("utf-8", "replace"))
    return "".join(tokens)


def mutate_object(obj: Any, ops: list[tuple[str, int, int]], depth: int = 0) -> Any:
    """Structure-aware mutation of a decoded msgpack body: replace a number, list or string at a
    pseudo-random path by a hostile one."""
    for kind, i, pick in ops:
        obj = _mutate_at(obj, kind, i, pick)
    return obj


_HOSTILE_VALUES = [2**64 - 1, -(2**63), -1, 999999999999, 2**62, [], [[[[[[[[[[]]]]]]]]]], "x" * 1000,
                   "tuple", "token", None, True, 1.5, {"a": 1}, b"\x00" * 16]


def _mutate_at(obj: Any, kind: str, i: int, pick: int) -> Any:
    nodes: list[tuple[Any, Any]] = []  # (container, key)
    stack = [obj]
    while stack and len(nodes) < 5000:
        node = stack.pop()
        if isinstance(node, dict):
            for k, v in node.items():
                nodes.append((node, k))
                stack.append(v)
        elif isinstance(node, list):
            for k, v in enumerate(node):
                nodes.append((node, k))
                stack.append(v)
    if not nodes:
        return obj
    container, key = nodes[i % len(nodes)]
    if kind == "replace":
        container[key] = _HOSTILE_VALUES[pick % len(_HOSTILE_VALUES)]
    elif kind == "nest":
        value = container[key]
        for _ in range(pick % 200 + 1):
            value = [value]
        container[key] = value
    elif kind == "drop" and isinstance(container, dict):
        del container[key]
    elif kind == "drop" and isinstance(container, list):
        container.pop(key)
    elif kind == "grow" and isinstance(container[key], list):
        container[key] = container[key] * (pick % 50 + 2)
    return obj


def flip_bytes(data: bytes, ops: list[tuple[str, int, int]]) -> bytes:
    raw = bytearray(data)
    for kind, i, pick in ops:
        if not raw:
            break
        i %= len(raw)
        if kind == "flip":
            raw[i] ^= 1 << (pick % 8)
        elif kind == "set":
            raw[i] = pick % 256
        elif kind == "truncate":
            del raw[i:]
        elif kind == "insert":
            raw[i:i] = bytes([pick % 256]) * (pick % 9 + 1)
    return bytes(raw)


def npz_bytes(arrays: dict[str, np.ndarray], compressed: bool) -> bytes:
    out = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(out, **arrays)
    return out.getvalue()


def body_of(module_bytes: bytes) -> Any:
    return msgpack.unpackb(module_bytes[10:], raw=False, strict_map_key=False, ext_hook=msgpack.ExtType)


def with_body(body: Any) -> bytes:
    from replicas.hlo.serialize import FORMAT_VERSION, MAGIC

    return MAGIC + FORMAT_VERSION.to_bytes(2, "little") + msgpack.packb(body, use_bin_type=True)


class Escaped(AssertionError):
    pass


def run_target(target: Any, data: Any, what: str, per_byte: int = DECODE_EXPANSION, allowance: int = 0) -> None:
    """`target(data)` must succeed or raise ProgramError, within the allocation budget (plus
    `per_byte` bytes per input byte and `allowance`)."""
    tracemalloc.start()  # only around the target: hypothesis's own generation stays fast
    try:
        target(data)
    except ProgramError:
        pass
    except BaseException as e:  # noqa: BLE001 - the point of the test
        raise Escaped(f"{what}: {type(e).__name__} escaped: {str(e)[:300]}") from e
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    budget = ALLOCATION_BUDGET + allowance + per_byte * _input_bytes(data)
    if peak > budget:
        raise Escaped(f"{what}: allocated {peak} bytes, over the budget of {budget}")


def _input_bytes(data: Any) -> int:
    if isinstance(data, (bytes, bytearray, str)):
        return len(data)
    if isinstance(data, Path):
        return data.stat().st_size
    return 0
