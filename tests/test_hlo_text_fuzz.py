# ruff: noqa: E501  (HLO text lines are as long as XLA prints them)
"""Mutated HLO texts (tokens dropped, duplicated, swapped; syntax characters inserted): the parser
either succeeds or raises ProgramError, nothing else, within its allocation budget per input byte;
whatever it accepts prints and re-parses to an equal module. Deeply nested constructs (tuple
shapes, braces, literals, nested operands, comments) thousands of levels deep are parsed or
refused the same way."""

import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replicas.errors import ProgramError
from replicas.hlo.text import parse_hlo as _parse_and_verify
from replicas.hlo.text import print_module

SEEDS = [
    """HloModule fuzz, replica_count=4, entry_computation_layout={(f32[8]{0})->f32[8]{0}}

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %add = f32[] add(f32[] %a, f32[] %b), metadata={op_name="x{,}" stack_frame_id=1}
}

ENTRY %main (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  %ar = f32[8]{0} all-reduce(f32[8]{0} %p), channel_id=1, replica_groups=[2,2]<=[2,2]T(1,0), to_apply=%sum
  %cp = f32[8]{0} collective-permute(%ar), source_target_pairs={{0,1},{1,2},{2,3},{3,0}}
  %c = f32[2,2]{1,0} constant({ { 1, -inf }, { nan, 4.5 } })
  %t = (f32[8]{0}, f32[2,2]{1,0}) tuple(%cp, /*index=1*/%c)
  ROOT %g = f32[8]{0} get-tuple-element(%t), index=0
}
""",
    """HloModule loops

body {
  prev = (s32[], f32[3,4]{1,0}) parameter(0)
  i = s32[] get-tuple-element(prev), index=0
  one = s32[] constant(1)
  next = s32[] add(i, one)
  x = f32[3,4]{1,0} get-tuple-element(prev), index=1
  w = f32[2,2]{1,0} reduce-window(x, x), window={size=2x3 stride=1x2 pad=0_1x1_0}, to_apply=body
  ROOT out = (s32[], f32[3,4]{1,0}) tuple(next, x)
}

cond {
  prev = (s32[], f32[3,4]{1,0}) parameter(0)
  i = s32[] get-tuple-element(prev), index=0
  n = s32[] constant(5)
  ROOT lt = pred[] compare(i, n), direction=LT, type=SIGNED
}

ENTRY main {
  x = f32[3,4]{1,0} parameter(0)
  zero = s32[] constant(0)
  init = (s32[], f32[3,4]{1,0}) tuple(zero, x)
  w = (s32[], f32[3,4]{1,0}) while(init), condition=cond, body=body
  s = f32[2,2]{1,0} slice(x), slice={[0:2], [0:4:2]}
  pd = f32[5,4]{1,0} pad(x, x), padding=1_1_0x0_0
  ROOT r = f32[3,4]{1,0} get-tuple-element(w), index=1
}
""",
    """HloModule sendrecv, num_partitions=2

ENTRY %e () -> (f32[], token[]) {
  %tok = token[] after-all()
  %recv = (f32[], u32[], token[]) recv(token[] %tok), channel_id=5, frontend_attributes={_xla_send_recv_source_target_pairs="{{0,1}}"}
  ROOT %done = (f32[], token[]) recv-done(%recv), channel_id=5, is_host_transfer=false
  %k = u8[3]{0} constant({0, 7, 255})
  %b = bf16[] constant(-0.5)
  %z = c64[] constant((1, -2))
  %q = pred[2]{0} constant({true, false})
  %cc = f32[] custom-call(%b), custom_call_target="foo\\n", backend_config={"a":{"b":1}}
}
""",
]

_TOKEN = re.compile(r'\s+|"(?:[^"\\]|\\.)*"|[A-Za-z_%][\w.\-]*|-?[0-9]+(?:\.[0-9]+)?|.', re.S)
_SYNTAX = list('{}()[],=%:"/*<>-_x\n ') + ["ROOT", "ENTRY", "HloModule", "f32[]", "{...}", "nan"]

mutation = st.tuples(st.sampled_from(["drop", "dup", "swap", "insert"]), st.integers(0, 10**6),
                     st.integers(0, 10**6), st.sampled_from(_SYNTAX))



def parse_hlo(text):
    """These modules exercise the syntax; whole-program validity is the verifier's tests' job."""
    return _parse_and_verify(text, verify=False)


def _mutate(text: str, mutations) -> str:
    tokens = _TOKEN.findall(text)
    for kind, i, j, extra in mutations:
        i %= len(tokens)
        j %= len(tokens)
        if kind == "drop" and len(tokens) > 1:
            del tokens[i]
        elif kind == "dup":
            tokens.insert(i, tokens[i])
        elif kind == "swap":
            tokens[i], tokens[j] = tokens[j], tokens[i]
        else:
            tokens.insert(i, extra)
    return "".join(tokens)


def _check(text: str) -> None:
    # Parsed first under the allocation budget of fuzzkit (at most 10 bytes per input byte beyond a
    # fixed allowance): a mutation that makes the parser hold more is a finding, not only an escape.
    from fuzzkit import run_target  # fuzzkit takes this module's seeds: imported once both exist

    run_target(parse_hlo, text, "mutated HLO text", per_byte=10)
    try:
        module = parse_hlo(text)
    except ProgramError:
        return
    assert parse_hlo(print_module(module)) == module


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.sampled_from(range(len(SEEDS))), mutations=st.lists(mutation, min_size=1, max_size=4))
def test_mutated_text_parses_or_raises_program_error(seed, mutations):
    _check(_mutate(SEEDS[seed], mutations))


@settings(max_examples=80, deadline=None)
@given(seed=st.sampled_from(range(len(SEEDS))), cut=st.integers(0, 10**6))
def test_truncated_text_parses_or_raises_program_error(seed, cut):
    text = SEEDS[seed]
    _check(text[:cut % (len(text) + 1)])


@settings(max_examples=100, deadline=None)
@given(st.booleans(), st.lists(st.sampled_from(_SYNTAX + ["a", "1", "%x", "add", "s32[]", "="]), max_size=40))
def test_random_text_parses_or_raises_program_error(with_header, pieces):
    _check(("HloModule m\n" if with_header else "") + "".join(pieces))


def test_seeds_are_valid():
    for text in SEEDS:
        module = parse_hlo(text)
        assert parse_hlo(print_module(module)) == module


# One construct nested `depth` deep in an otherwise valid module: the parser refuses what is over
# its nesting ceiling with a ProgramError (never a RecursionError) and holds no more than its budget.
NESTED = {
    "tuple shape": lambda d: f"HloModule m\nENTRY e {{\n  ROOT p = {'(' * d}f32[]{')' * d} parameter(0)\n}}\n",
    "backend_config braces": lambda d: ("HloModule m\nENTRY e {\n  p = f32[] parameter(0)\n  ROOT c = f32[] "
                                        f"custom-call(p), custom_call_target=\"t\", backend_config={'{' * d}{'}' * d}\n}}\n"),
    "literal braces": lambda d: f"HloModule m\nENTRY e {{\n  ROOT c = f32[1] constant({'{' * d}1{'}' * d})\n}}\n",
    "nested operands": lambda d: (f"HloModule m\nENTRY e {{\n  p = f32[] parameter(0)\n  ROOT n = f32[] negate("
                                  f"{'f32[] negate(' * d}p{')' * d})\n}}\n"),
    "comments": lambda d: f"HloModule m\nENTRY e {{\n{'/* ' * d}{'*/ ' * d}\n  ROOT c = f32[] constant(1)\n}}\n",
    "metadata braces": lambda d: ("HloModule m\nENTRY e {\n  ROOT c = f32[] constant(1), metadata="
                                  f"{'{op_name=' * d}\"x\"{'}' * d}\n}}\n"),
}


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(construct=st.sampled_from(sorted(NESTED)), depth=st.integers(1, 6000), cut=st.integers(0, 10**6),
       truncate=st.booleans())
def test_deeply_nested_text_parses_or_raises_program_error_within_its_budget(construct, depth, cut, truncate):
    text = NESTED[construct](depth)
    if truncate:
        text = text[:cut % (len(text) + 1)]
    _check(text)
