"""The module verifier on hand-built IR (no builder, no text): structure, shapes, groups, channels."""

from __future__ import annotations

import pytest

from replicas.errors import ProgramError
from replicas.hlo.ir import Computation, Instruction, Module
from replicas.hlo.verify import verify
from replicas.shapes import Shape


def S(text: str) -> Shape:
    return Shape.parse(text)


def ins(name: str, opcode: str, shape: str, operands: list[str] = (), line: int | None = None, **attrs) -> Instruction:
    return Instruction(name, opcode, S(shape), list(operands), attrs, line)


def comp(name: str, insts: list[Instruction], root: str | None = None) -> Computation:
    c = Computation(name)
    for inst in insts:
        c.instructions.append(inst)  # bypass add(): the verifier must catch duplicates itself
    c.root = root if root is not None else insts[-1].name
    return c


def module(*comps: Computation, entry: str = "main", **attrs) -> Module:
    m = Module("m", {c.name: c for c in comps}, entry, dict(attrs))
    return m


def adder(name: str = "add") -> Computation:
    return comp(name, [ins("a", "parameter", "f32[]", parameter_number=0),
                       ins("b", "parameter", "f32[]", parameter_number=1),
                       ins("r", "add", "f32[]", ["a", "b"])])


def simple_main(*extra: Instruction) -> Computation:
    return comp("main", [ins("x", "parameter", "f32[4]", parameter_number=0), *extra])


def rejects(m: Module, match: str, **kw) -> ProgramError:
    with pytest.raises(ProgramError, match=match) as info:
        verify(m, **kw)
    return info.value


def test_valid_module_passes_and_layouts_are_ignored() -> None:
    main = comp("main", [ins("x", "parameter", "f32[2,3]{0,1}", parameter_number=0),
                         ins("y", "parameter", "f32[2,3]{1,0}", parameter_number=1),
                         ins("s", "add", "f32[2,3]{0,1}", ["x", "y"]),
                         ins("t", "transpose", "f32[3,2]{1,0}", ["s"], dimensions=[1, 0]),
                         ins("c", "constant", "f32[]", literal=None),
                         ins("r", "reduce", "f32[3]", ["t", "c"], dimensions=[1], to_apply="add")])
    verify(module(adder(), main))


def test_entry_must_exist() -> None:
    rejects(module(simple_main(), entry="nope"), "entry computation 'nope' does not exist")
    rejects(module(simple_main(), entry=""), "no entry")


def test_operand_defined_before_use() -> None:
    main = comp("main", [ins("x", "parameter", "f32[4]", parameter_number=0),
                         ins("y", "negate", "f32[4]", ["z"], line=7),
                         ins("z", "negate", "f32[4]", ["x"])])
    e = rejects(module(main), "operand %z is used before it is defined")
    assert e.line == 7 and "%y" in str(e) and "line 7" in str(e)
    main = comp("main", [ins("x", "parameter", "f32[4]", parameter_number=0), ins("y", "negate", "f32[4]", ["q"])])
    rejects(module(main), "defined nowhere")


def test_duplicate_names() -> None:
    main = comp("main", [ins("x", "parameter", "f32[4]", parameter_number=0), ins("x", "negate", "f32[4]", ["x"])])
    rejects(module(main), "defined twice")


def test_called_computations_exist_and_no_recursion() -> None:
    main = simple_main(ins("c", "call", "f32[4]", ["x"], to_apply="missing"))
    rejects(module(main), "calls computation 'missing', which does not exist")
    f = comp("f", [ins("p", "parameter", "f32[4]", parameter_number=0),
                   ins("c", "call", "f32[4]", ["p"], to_apply="g")])
    g = comp("g", [ins("p", "parameter", "f32[4]", parameter_number=0),
                   ins("c", "call", "f32[4]", ["p"], to_apply="f")])
    main = simple_main(ins("c", "call", "f32[4]", ["x"], to_apply="f"))
    rejects(module(f, g, main), "recursion")
    selfcall = comp("h", [ins("p", "parameter", "f32[4]", parameter_number=0),
                          ins("c", "call", "f32[4]", ["p"], to_apply="h")])
    rejects(module(selfcall, simple_main()), "h calls itself")
    rejects(module(simple_main(ins("c", "call", "f32[4]", ["x"], to_apply=3))), "must name computations")


def test_parameter_numbers() -> None:
    main = comp("main", [ins("x", "parameter", "f32[4]", parameter_number=0),
                         ins("y", "parameter", "f32[4]", parameter_number=0), ins("s", "add", "f32[4]", ["x", "y"])])
    rejects(module(main), "parameter number 0 is already used by %x")
    main = comp("main", [ins("x", "parameter", "f32[4]", parameter_number=0),
                         ins("y", "parameter", "f32[4]", parameter_number=2), ins("s", "add", "f32[4]", ["x", "y"])])
    rejects(module(main), r"missing \[1\]")


def test_root_must_exist() -> None:
    rejects(module(comp("main", [ins("x", "parameter", "f32[4]", parameter_number=0)], root="nope")),
            "root %nope")
    rejects(module(comp("main", [ins("x", "parameter", "f32[4]", parameter_number=0)], root="")), "no root")


def test_shape_must_agree_with_inference() -> None:
    main = comp("main", [ins("x", "parameter", "f32[4]", parameter_number=0),
                         ins("y", "parameter", "f32[4]", parameter_number=1),
                         ins("s", "add", "f32[5]", ["x", "y"], line=3)])
    e = rejects(module(main), "does not match the inferred shape f32\\[4\\]")
    assert "%s (add)" in str(e) and e.line == 3
    main = comp("main", [ins("x", "parameter", "f32[4]", parameter_number=0),
                         ins("y", "parameter", "s32[4]", parameter_number=1),
                         ins("s", "add", "f32[4]", ["x", "y"])])
    rejects(module(main), "add: operands must have the same element type")
    main = simple_main(ins("r", "reshape", "f32[5]", ["x"]))
    rejects(module(main), "element count changes")
    main = simple_main(ins("r", "reduce", "f32[]", ["x", "x"], dimensions=[0], to_apply="add"))
    rejects(module(adder(), main), "init value 0 must be a scalar")


def test_rules_inside_called_computations_are_checked() -> None:
    bad_adder = comp("add", [ins("a", "parameter", "f32[]", parameter_number=0),
                             ins("b", "parameter", "f32[]", parameter_number=1),
                             ins("r", "add", "f64[]", ["a", "b"])])
    main = simple_main(ins("c", "constant", "f32[]", literal=None),
                       ins("r", "reduce", "f32[]", ["x", "c"], dimensions=[0], to_apply="add"))
    rejects(module(bad_adder, main), "%r \\(add\\)")


def _all_reduce_module(groups: list[list[int]], **module_attrs) -> Module:
    main = simple_main(ins("r", "all-reduce", "f32[4]", ["x"], replica_groups=groups, to_apply="add"))
    return module(adder(), main, **module_attrs)


def test_replica_groups_cover_every_replica() -> None:
    verify(_all_reduce_module([[0, 1], [2, 3]]), num_replicas=4)
    verify(_all_reduce_module([]), num_replicas=4)
    verify(_all_reduce_module([[0, 1], [2, 3]]))  # replica count unknown: only uniqueness
    rejects(_all_reduce_module([[0, 1], [2, 3]]), "do not cover every one of the 6 replicas", num_replicas=6)
    rejects(_all_reduce_module([[0, 1], [2, 3]], replica_count=6), "missing 4-5")
    rejects(_all_reduce_module([[0, 1], [1, 2]]), "id 1 appears more than once")
    rejects(_all_reduce_module([[0, 1], [2, 3]]), "id 3 out of range for 3 replicas", num_replicas=3)


def test_global_device_ids_use_partitions() -> None:
    main = simple_main(ins("r", "all-reduce", "f32[4]", ["x"], replica_groups=[[0, 1, 2, 3]], to_apply="add",
                         channel_id=1, use_global_device_ids=True))
    verify(module(adder(), main, replica_count=2, num_partitions=2))
    rejects(module(adder(), main, replica_count=2, num_partitions=3), "missing 4-5")


def test_all_gather_shape_uses_replica_count() -> None:
    main = simple_main(ins("g", "all-gather", "f32[12]", ["x"], replica_groups=[], dimensions=[0]))
    verify(module(main), num_replicas=3)
    rejects(module(main), "does not match the inferred shape f32\\[16\\]", num_replicas=4)
    verify(module(main))  # unknown count: 12 is a multiple of 4


def test_collective_permute_pairs() -> None:
    main = simple_main(ins("p", "collective-permute", "f32[4]", ["x"], source_target_pairs=[(0, 1), (1, 0)]))
    verify(module(main), num_replicas=2)
    main = simple_main(ins("p", "collective-permute", "f32[4]", ["x"], source_target_pairs=[(0, 1), (2, 1)]))
    rejects(module(main), "duplicate target 1")


CTX = "(f32[4], u32[], token[])"


def _channel_module(*insts: Instruction) -> Module:
    return module(simple_main(ins("t", "after-all", "token[]"), *insts))


def test_send_recv_pairs_verify() -> None:
    verify(_channel_module(ins("s", "send", CTX, ["x", "t"], channel_id=1, is_host_transfer=False),
                           ins("sd", "send-done", "token[]", ["s"], channel_id=1, is_host_transfer=False),
                           ins("r", "recv", CTX, ["t"], channel_id=2, is_host_transfer=False),
                           ins("rd", "recv-done", "(f32[4], token[])", ["r"], channel_id=2, is_host_transfer=False)))


def test_recv_done_of_a_send_is_rejected() -> None:
    m = _channel_module(ins("s", "send", CTX, ["x", "t"], channel_id=1),
                        ins("rd", "recv-done", "(f32[4], token[])", ["s"], channel_id=1, line=9))
    e = rejects(m, "operand %s is a send, but recv-done needs the context of a recv")
    assert e.line == 9


def test_send_done_of_a_recv_is_rejected() -> None:
    m = _channel_module(ins("r", "recv", CTX, ["t"], channel_id=1),
                        ins("sd", "send-done", "token[]", ["r"], channel_id=1))
    rejects(m, "send-done needs the context of a send")


def test_context_consumed_twice_is_rejected() -> None:
    m = _channel_module(ins("r", "recv", CTX, ["t"], channel_id=1),
                        ins("rd1", "recv-done", "(f32[4], token[])", ["r"], channel_id=1),
                        ins("rd2", "recv-done", "(f32[4], token[])", ["r"], channel_id=1))
    rejects(m, "already consumed by %rd1")


def test_done_channel_must_match_start() -> None:
    m = _channel_module(ins("s", "send", CTX, ["x", "t"], channel_id=1),
                        ins("sd", "send-done", "token[]", ["s"], channel_id=2))
    rejects(m, "channel_id 2 differs from the channel_id 1")


def test_send_done_without_send_context() -> None:
    m = _channel_module(ins("sd", "send-done", "token[]", ["t"], channel_id=1))
    rejects(m, "send-done")


def test_pipelined_context_through_a_tuple_is_allowed() -> None:
    m = _channel_module(ins("r", "recv", CTX, ["t"], channel_id=1),
                        ins("tup", "tuple", f"({CTX})", ["r"]),
                        ins("g", "get-tuple-element", CTX, ["tup"], index=0),
                        ins("rd", "recv-done", "(f32[4], token[])", ["g"], channel_id=1))
    verify(m)


def test_async_collective_pairs() -> None:
    main = simple_main(ins("s", "all-reduce-start", "f32[4]", ["x"], replica_groups=[], to_apply="add"),
                       ins("d", "all-reduce-done", "f32[4]", ["s"]))
    verify(module(adder(), main))
    main = simple_main(ins("n", "negate", "f32[4]", ["x"]), ins("d", "all-reduce-done", "f32[4]", ["n"]))
    rejects(module(adder(), main), "needs the context of a all-reduce-start")


def test_infeed_outfeed_tokens() -> None:
    m = _channel_module(ins("i", "infeed", "(f32[4], token[])", ["t"]),
                        ins("o", "outfeed", "token[]", ["x", "t"], outfeed_shape=S("f32[4]")))
    verify(m)
    m = _channel_module(ins("o", "outfeed", "token[]", ["t", "x"]))
    rejects(m, "token")


def test_while_signature() -> None:
    cond = comp("cond", [ins("p", "parameter", "f32[4]", parameter_number=0),
                         ins("c", "constant", "pred[]", literal=None)])
    body = comp("body", [ins("p", "parameter", "f32[4]", parameter_number=0), ins("n", "negate", "f32[4]", ["p"])])
    verify(module(cond, body, simple_main(ins("w", "while", "f32[4]", ["x"], condition="cond", body="body"))))
    bad_cond = comp("cond", [ins("p", "parameter", "f32[4]", parameter_number=0),
                             ins("c", "constant", "s32[]", literal=None)])
    rejects(module(bad_cond, body, simple_main(ins("w", "while", "f32[4]", ["x"], condition="cond", body="body"))),
            "must return pred")


def test_cross_partition_pairs_count_partitions() -> None:
    main = simple_main(ins("p", "collective-permute", "f32[4]", ["x"], source_target_pairs=[(0, 3), (3, 0)],
                           channel_id=1))
    verify(module(main, replica_count=1, num_partitions=4))
    rejects(module(main, replica_count=1, num_partitions=2), "out of range for 2 replicas")
    verify(module(main, replica_count=1, num_partitions=2), num_replicas=4)  # the runtime's device count rules
