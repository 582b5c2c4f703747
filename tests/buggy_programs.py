"""A catalog of buggy (and correct) multi-replica programs, as HLO text, with what must be reported.

Each `Case` says which error class a run must raise, which replicas and instructions the error must
name, and extra facts (the differing field of a mismatch, the wait-for cycle). The same catalog
runs through `rp.run(..., backend="threads")` (tests/test_diagnostics.py), through
`replicas check` (tests/test_cli_check.py) and partly under Ray.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from replicas.errors import CollectiveMismatchError, DeadlockError, ProgramError


def route(pairs: str) -> str:
    return f'frontend_attributes={{_xla_send_recv_source_target_pairs="{pairs}"}}'


ADD = """
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
"""

MAX = """
max {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT m = f32[] maximum(a, b)
}
"""

ADD_S32 = """
add_s32 {
  a = s32[] parameter(0)
  b = s32[] parameter(1)
  ROOT s = s32[] add(a, b)
}
"""

# pred[] `is_zero`: true on replica 0 only.
IS_REPLICA_0 = """
  id = u32[] replica-id()
  zero = u32[] constant(0)
  is_zero = pred[] compare(id, zero), direction=EQ
"""


def branches(n: int, true_body: str, false_body: str, extra: str = ADD, after: str = "") -> str:
    """Replica 0 runs `true_body`, the others `false_body` (bodies map p = f32[4] to ROOT f32[4])."""
    return f"""HloModule branches, replica_count={n}
{extra}
on_zero {{
  p = f32[4] parameter(0)
{true_body}
}}

on_others {{
  p = f32[4] parameter(0)
{false_body}
}}

ENTRY main {{
  x = f32[4] parameter(0)
{IS_REPLICA_0}
  r = f32[4] conditional(is_zero, x, x), true_computation=on_zero, false_computation=on_others
{after or "  ROOT out = f32[4] copy(r)"}
}}
"""


def while_all_reduce(n: int, after: str = "") -> str:
    """A While loop running replica_id + 2 iterations, each an all-reduce (%ar_loop)."""
    return f"""HloModule divergent_loop, replica_count={n}
{ADD}
cond {{
  st = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(st), index=0
  id = u32[] replica-id()
  ids = s32[] convert(id)
  two = s32[] constant(2)
  trips = s32[] add(ids, two)
  ROOT lt = pred[] compare(i, trips), direction=LT
}}

body {{
  st = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(st), index=0
  v = f32[4] get-tuple-element(st), index=1
  one = s32[] constant(1)
  i2 = s32[] add(i, one)
  ar_loop = f32[4] all-reduce(v), replica_groups={{}}, to_apply=add
  ROOT next = (s32[], f32[4]) tuple(i2, ar_loop)
}}

ENTRY main {{
  x = f32[4] parameter(0)
  z = s32[] constant(0)
  init = (s32[], f32[4]) tuple(z, x)
  w = (s32[], f32[4]) while(init), condition=cond, body=body
  v = f32[4] get-tuple-element(w), index=1
{after or "  ROOT out = f32[4] copy(v)"}
}}
"""



def loop_the_last_replica_skips(n: int, elements: int, trips: int) -> str:
    """A While loop of `trips` all-reduces of f32[elements] that the last of `n` replicas runs no
    iteration of: every other replica waits in the loop's all-reduce forever (a planted deadlock at
    any N, reported as "replica n-1 finished without any collective")."""
    t = f"(s32[], s32[], f32[{elements}])"
    return f"""HloModule planted, replica_count={n}
{ADD}
cond {{
  st = {t} parameter(0)
  i = s32[] get-tuple-element(st), index=0
  k = s32[] get-tuple-element(st), index=1
  ROOT more = pred[] compare(i, k), direction=LT
}}

body {{
  st = {t} parameter(0)
  i = s32[] get-tuple-element(st), index=0
  k = s32[] get-tuple-element(st), index=1
  x = f32[{elements}] get-tuple-element(st), index=2
  y = f32[{elements}] all-reduce(x), replica_groups={{}}, to_apply=add
  one = s32[] constant(1)
  i2 = s32[] add(i, one)
  ROOT next = {t} tuple(i2, k, y)
}}

ENTRY main {{
  x = f32[{elements}] parameter(0)
  id = u32[] replica-id()
  last = u32[] constant({n - 1})
  is_last = pred[] compare(id, last), direction=EQ
  trips = s32[] constant({trips})
  zero = s32[] constant(0)
  k = s32[] select(is_last, zero, trips)
  init = {t} tuple(zero, k, x)
  loop = {t} while(init), condition=cond, body=body
  ROOT y = f32[{elements}] get-tuple-element(loop), index=2
}}
"""

SEND_DONE_CYCLE = f"""HloModule exchange_deadlock, replica_count=2

ENTRY main {{
  x = f32[4] parameter(0)
  tok = token[] after-all()
  snd = (f32[4], u32[], token[]) send(x, tok), channel_id=1, {route("{{0,1},{1,0}}")}
  sent = token[] send-done(snd), channel_id=1, {route("{{0,1},{1,0}}")}
  rcv = (f32[4], u32[], token[]) recv(sent), channel_id=1, {route("{{0,1},{1,0}}")}
  got = (f32[4], token[]) recv-done(rcv), channel_id=1, {route("{{0,1},{1,0}}")}
  ROOT y = f32[4] get-tuple-element(got), index=0
}}
"""

SEND_RECV_OK = f"""HloModule exchange_ok, replica_count=2

ENTRY main {{
  x = f32[4] parameter(0)
  tok = token[] after-all()
  rcv = (f32[4], u32[], token[]) recv(tok), channel_id=1, {route("{{0,1},{1,0}}")}
  snd = (f32[4], u32[], token[]) send(x, tok), channel_id=1, {route("{{0,1},{1,0}}")}
  got = (f32[4], token[]) recv-done(rcv), channel_id=1, {route("{{0,1},{1,0}}")}
  sent = token[] send-done(snd), channel_id=1, {route("{{0,1},{1,0}}")}
  ROOT y = f32[4] get-tuple-element(got), index=0
}}
"""

RECV_DONE_CYCLE = f"""HloModule recv_cycle, replica_count=2

ENTRY main {{
  x = f32[4] parameter(0)
  tok = token[] after-all()
  rcv = (f32[4], u32[], token[]) recv(tok), channel_id=1, {route("{{0,1},{1,0}}")}
  got = (f32[4], token[]) recv-done(rcv), channel_id=1, {route("{{0,1},{1,0}}")}
  tok2 = token[] get-tuple-element(got), index=1
  snd = (f32[4], u32[], token[]) send(x, tok2), channel_id=1, {route("{{0,1},{1,0}}")}
  sent = token[] send-done(snd), channel_id=1, {route("{{0,1},{1,0}}")}
  ROOT y = f32[4] get-tuple-element(got), index=0
}}
"""

RECV_WITHOUT_SEND = f"""HloModule lonely_recv, replica_count=2

ENTRY main {{
  x = f32[4] parameter(0)
  tok = token[] after-all()
  rcv = (f32[4], u32[], token[]) recv(tok), channel_id=5, {route("{{0,1}}")}
  got = (f32[4], token[]) recv-done(rcv), channel_id=5, {route("{{0,1}}")}
  ROOT y = f32[4] get-tuple-element(got), index=0
}}
"""

CHANNEL_SHAPE_MISMATCH = f"""HloModule channel_shapes, replica_count=2

ENTRY main {{
  x = f32[4] parameter(0)
  tok = token[] after-all()
  snd = (f32[4], u32[], token[]) send(x, tok), channel_id=2, {route("{{0,1}}")}
  rcv = (f32[2], u32[], token[]) recv(tok), channel_id=2, {route("{{0,1}}")}
  got = (f32[2], token[]) recv-done(rcv), channel_id=2, {route("{{0,1}}")}
  sent = token[] send-done(snd), channel_id=2, {route("{{0,1}}")}
  y = f32[2] get-tuple-element(got), index=0
  ROOT out = f32[4] concatenate(y, y), dimensions={{0}}
}}
"""

# Replica 3 waits for data replica 0 sends only after the all-reduce that replica 3 never reaches.
RECV_BEFORE_ALL_REDUCE = f"""HloModule lagging, replica_count=4
{ADD}
ENTRY main {{
  x = f32[4] parameter(0)
  tok = token[] after-all()
  rcv = (f32[4], u32[], token[]) recv(tok), channel_id=3, {route("{{0,3}}")}
  got = (f32[4], token[]) recv-done(rcv), channel_id=3, {route("{{0,3}}")}
  y = f32[4] get-tuple-element(got), index=0
  s = f32[4] add(x, y)
  ar = f32[4] all-reduce(s), replica_groups={{}}, to_apply=add
  snd = (f32[4], u32[], token[]) send(ar, tok), channel_id=3, {route("{{0,3}}")}
  sent = token[] send-done(snd), channel_id=3, {route("{{0,3}}")}
  ROOT out = f32[4] copy(ar)
}}
"""

SEND_WITHOUT_RECV = f"""HloModule lonely_send, replica_count=2

ENTRY main {{
  x = f32[4] parameter(0)
  tok = token[] after-all()
  snd = (f32[4], u32[], token[]) send(x, tok), channel_id=6, {route("{{0,1}}")}
  sent = token[] send-done(snd), channel_id=6, {route("{{0,1}}")}
  ROOT y = f32[4] copy(x)
}}
"""

# Each replica first waits for its left neighbour's data, then sends to its right one: a 3-cycle.
RING_CYCLE = f"""HloModule ring, replica_count=3

ENTRY main {{
  x = f32[4] parameter(0)
  tok = token[] after-all()
  rcv = (f32[4], u32[], token[]) recv(tok), channel_id=1, {route("{{0,1},{1,2},{2,0}}")}
  got = (f32[4], token[]) recv-done(rcv), channel_id=1, {route("{{0,1},{1,2},{2,0}}")}
  y = f32[4] get-tuple-element(got), index=0
  snd = (f32[4], u32[], token[]) send(y, tok), channel_id=1, {route("{{0,1},{1,2},{2,0}}")}
  sent = token[] send-done(snd), channel_id=1, {route("{{0,1},{1,2},{2,0}}")}
  ROOT out = f32[4] copy(y)
}}
"""

INFEED_STARVED = """HloModule hungry, replica_count=2

ENTRY main {
  tok = token[] after-all()
  in = (f32[4], token[]) infeed(tok)
  ROOT v = f32[4] get-tuple-element(in), index=0
}
"""

PERMUTE_CONFLICT = """HloModule permute_conflict, replica_count=2

ENTRY main {
  x = f32[4] parameter(0)
  ROOT cp = f32[4] collective-permute(x), source_target_pairs={{0,1},{1,1}}
}
"""

ALL_REDUCE_OK = f"""HloModule plain, replica_count=2
{ADD}
ENTRY main {{
  x = f32[4] parameter(0)
  ROOT ar = f32[4] all-reduce(x), replica_groups={{}}, to_apply=add
}}
"""

# Replica 0 does a large local dot before the all-reduce; the others arrive at once and wait.
SLOW_REPLICA = f"""HloModule slow_replica, replica_count=3
{ADD}
heavy {{
  p = f32[4] parameter(0)
  b2 = f32[256,256] iota(), iota_dimension=0
  m = f32[256,256] dot(b2, b2), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  m2 = f32[256,256] dot(m, b2), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  m3 = f32[256,256] dot(m2, b2), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  m4 = f32[256,256] dot(m3, b2), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  zero = f32[] constant(0)
  s = f32[] reduce(m4, zero), dimensions={{0,1}}, to_apply=add
  tiny = f32[] multiply(s, zero)
  t4 = f32[4] broadcast(tiny), dimensions={{}}
  ROOT out = f32[4] add(p, t4)
}}

light {{
  p = f32[4] parameter(0)
  ROOT out = f32[4] copy(p)
}}

ENTRY main {{
  x = f32[4] parameter(0)
{IS_REPLICA_0}
  r = f32[4] conditional(is_zero, x, x), true_computation=heavy, false_computation=light
  ROOT ar = f32[4] all-reduce(r), replica_groups={{}}, to_apply=add
}}
"""


@dataclass
class Case:
    name: str
    hlo: str
    num_replicas: int = 2
    error: type | None = None  # None: the program is correct
    replicas: list[int] = field(default_factory=list)  # replicas the report must name as blocked/involved
    instructions: list[str] = field(default_factory=list)  # instruction names the message must contain
    mismatch_field: str | None = None  # the field a CollectiveMismatchError must show as differing
    cycle: list[int] | None = None  # the wait-for cycle a DeadlockError must report (waiter -> needed order)
    phrases: list[str] = field(default_factory=list)  # text the message must contain
    infeed: list[list[Any]] | None = None
    ray: bool = False  # also run under Ray (keep these few)

    def args(self) -> list[list[Any]]:
        return [[np.full(4, r + 1, np.float32)] for r in range(self.num_replicas)] if "parameter(0)" in \
            self.hlo.split("ENTRY")[1] else [[] for _ in range(self.num_replicas)]


def _branch_ar(name: str, operand: str = "p", groups: str = "{}", to_apply: str = "add", shape: str = "f32[4]"
               ) -> str:
    return f"  ROOT {name} = {shape} all-reduce({operand}), replica_groups={groups}, to_apply={to_apply}"


CASES: list[Case] = [
    Case("recv_without_send", RECV_WITHOUT_SEND, error=DeadlockError, replicas=[1], instructions=["got"],
         phrases=["replica 0", "finished"], ray=True),
    Case("send_done_cycle", SEND_DONE_CYCLE, error=DeadlockError, replicas=[0, 1], instructions=["sent"],
         cycle=[0, 1], ray=True),
    Case("recv_done_cycle", RECV_DONE_CYCLE, error=DeadlockError, replicas=[0, 1], instructions=["got"],
         cycle=[0, 1]),
    Case("branches_into_different_all_reduces",
         branches(2, _branch_ar("ar_a"), _branch_ar("ar_b")),
         error=CollectiveMismatchError, replicas=[0, 1], instructions=["ar_a", "ar_b"],
         mismatch_field="instruction", ray=True),
    Case("mismatched_shapes",
         branches(2, _branch_ar("ar_a"),
                  "  h = f32[2] slice(p), slice={[0:2]}\n"
                  "  ar_b = f32[2] all-reduce(h), replica_groups={}, to_apply=add\n"
                  "  ROOT c = f32[4] concatenate(ar_b, ar_b), dimensions={0}"),
         error=CollectiveMismatchError, replicas=[0, 1], instructions=["ar_a", "ar_b"], mismatch_field="shapes"),
    Case("mismatched_dtypes",
         branches(2, _branch_ar("ar_a"),
                  "  i = s32[4] convert(p)\n"
                  "  ar_b = s32[4] all-reduce(i), replica_groups={}, to_apply=add_s32\n"
                  "  ROOT c = f32[4] convert(ar_b)", extra=ADD + ADD_S32),
         error=CollectiveMismatchError, replicas=[0, 1], instructions=["ar_a", "ar_b"], mismatch_field="dtypes"),
    Case("mismatched_reductions",
         branches(2, _branch_ar("ar_a"), _branch_ar("ar_b", to_apply="max"), extra=ADD + MAX),
         error=CollectiveMismatchError, replicas=[0, 1], instructions=["ar_a", "ar_b"],
         mismatch_field="reduction"),
    Case("mismatched_groups_all_vs_pairs",
         branches(4, _branch_ar("ar_a"), _branch_ar("ar_b", groups="{{0,1},{2,3}}")),
         num_replicas=4, error=CollectiveMismatchError, instructions=["ar_a", "ar_b"],
         mismatch_field="replica_groups"),
    Case("mismatched_groups_one_replica_alone",
         branches(2, _branch_ar("ar_a"), _branch_ar("ar_b", groups="{{0},{1}}")),
         error=CollectiveMismatchError, replicas=[0, 1], instructions=["ar_a", "ar_b"],
         mismatch_field="replica_groups"),
    Case("mismatched_kinds",
         branches(2, _branch_ar("ar_a"),
                  "  h = f32[2] slice(p), slice={[0:2]}\n"
                  "  ROOT ag_b = f32[4] all-gather(h), replica_groups={}, dimensions={0}"),
         error=CollectiveMismatchError, replicas=[0, 1], instructions=["ar_a", "ag_b"], mismatch_field="kind"),
    Case("replica_finishes_early",
         branches(3, "  ROOT c = f32[4] copy(p)", _branch_ar("ar_b")),
         num_replicas=3, error=DeadlockError, replicas=[1, 2], instructions=["ar_b"],
         phrases=["replica 0 finished", "never"]),
    Case("while_trip_count_depends_on_replica", while_all_reduce(2),
         error=DeadlockError, replicas=[1], instructions=["ar_loop"],
         phrases=["replica 0 finished all-reduce #1 but did not join #2"]),
    Case("while_then_moves_on",
         while_all_reduce(2, "  ROOT ar_after = f32[4] all-reduce(v), replica_groups={}, to_apply=add"),
         error=CollectiveMismatchError, replicas=[0, 1], instructions=["ar_loop", "ar_after"],
         mismatch_field="instruction"),
    Case("recv_before_all_reduce_lagging_replica", RECV_BEFORE_ALL_REDUCE, num_replicas=4,
         error=DeadlockError, replicas=[0, 3], instructions=["ar", "got"], cycle=[0, 3],
         phrases=["replica 3 never reached all-reduce #0 (%ar)"]),
    Case("send_without_recv", SEND_WITHOUT_RECV, error=DeadlockError, replicas=[0], instructions=["sent"],
         phrases=["from replica 1, which finished without posting it"]),
    Case("recv_done_ring_of_three", RING_CYCLE, num_replicas=3, error=DeadlockError, replicas=[0, 1, 2],
         instructions=["got"], cycle=[0, 2, 1]),
    Case("infeed_starved", INFEED_STARVED, error=DeadlockError, replicas=[0, 1], instructions=["in"],
         phrases=["host"]),
    Case("infeed_starved_on_one_replica", INFEED_STARVED, error=DeadlockError, replicas=[1],
         instructions=["in"], phrases=["host"], infeed=[[np.zeros(4, np.float32)], []]),
    Case("collective_permute_conflicting_pairs", PERMUTE_CONFLICT, error=ProgramError, instructions=["cp"],
         phrases=["duplicate target"]),
    Case("channel_shape_mismatch", CHANNEL_SHAPE_MISMATCH, error=ProgramError, instructions=["got"],
         phrases=["replica 0 sent"]),
]

CORRECT: list[Case] = [
    Case("all_reduce_ok", ALL_REDUCE_OK),
    Case("send_recv_ok", SEND_RECV_OK),
    Case("slow_replica_before_all_reduce", SLOW_REPLICA, num_replicas=3),
    Case("branches_then_one_all_reduce", branches(2, "  ROOT c = f32[4] copy(p)", "  ROOT c = f32[4] negate(p)",
                                                     after="  ROOT out = f32[4] all-reduce(r), "
                                                           "replica_groups={}, to_apply=add")),
]
# Bugs no wait reveals (a collective-permute source never waits): `rp.run` completes, `replicas check`
# reports the messages nobody received once every replica finished.
CHECK_ONLY: list[Case] = [
    Case("permute_target_skips_it",
         branches(2, "  ROOT cp_a = f32[4] collective-permute(p), source_target_pairs={{0,1}}",
                  "  ROOT c = f32[4] copy(p)"),
         error=ProgramError, instructions=["cp_a"],
         phrases=["replica 0 sent its collective #0 (%cp_a, collective-permute) to replica 1, "
                  "which never took part in it"]),
    Case("send_whose_recv_done_never_runs",
         f"""HloModule no_recv_done, replica_count=2

ENTRY main {{
  x = f32[4] parameter(0)
  tok = token[] after-all()
  snd = (f32[4], u32[], token[]) send(x, tok), channel_id=7, {route("{{0,1}}")}
  rcv = (f32[4], u32[], token[]) recv(tok), channel_id=7, {route("{{0,1}}")}
  sent = token[] send-done(snd), channel_id=7, {route("{{0,1}}")}
  ROOT y = f32[4] copy(x)
}}
""", error=ProgramError, instructions=[],
         phrases=["replica 0 sent message #0 on channel 7 to replica 1, which never received it"]),
]

# The branches case is a mismatch only under strict matching; lenient runs pair the two all-reduces.
LENIENT_OK = CASES[3]

BY_NAME = {c.name: c for c in CASES + CORRECT + CHECK_ONLY}
