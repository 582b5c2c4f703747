"""The one opcode table agrees with the parser, the shape rules and the kernels: an opcode that
parses either runs or is refused by the verifier as unsupported."""

import pytest

import replicas.channels  # noqa: F401  (registers the channel and feed kernels)
import replicas.collectives  # noqa: F401  (registers the collective kernels)
from replicas.errors import ProgramError
from replicas.hlo.ir import Computation, Instruction, Module
from replicas.hlo.opcodes import INTERPRETER_OPCODES, KNOWN_OPCODES, OPCODES, UNSUPPORTED_OPCODES
from replicas.hlo.parser import parse_module
from replicas.hlo.shape_inference import known_opcodes
from replicas.hlo.verify import verify
from replicas.ops.registry import _REGISTRY, registered_opcodes
from replicas.shapes import Shape


def test_parser_shape_rules_and_kernels_agree():
    assert known_opcodes() == KNOWN_OPCODES
    runs = registered_opcodes() | INTERPRETER_OPCODES
    assert KNOWN_OPCODES - runs == UNSUPPORTED_OPCODES, "an opcode parses, but neither runs nor is refused"
    assert runs <= KNOWN_OPCODES, "a kernel exists for an opcode the parser does not accept"
    assert not registered_opcodes() & UNSUPPORTED_OPCODES, "flip `supported` in opcodes.py for the new kernel"


def test_family_names_the_module_of_the_kernel():
    for name, factory in _REGISTRY.items():
        module = factory.__module__.removeprefix("replicas.")
        family = OPCODES[name].family
        # An op family of replicas/ops/ has its module; collectives and channels have a package.
        assert module == f"ops.{family}" or module.startswith(f"{family}."), name


def test_every_known_opcode_parses():
    operands = {"constant": "(0)", "parameter": "(0)"}
    lines = [f"  %x{i} = f32[] {name}{operands.get(name, '()')}" for i, name in enumerate(sorted(KNOWN_OPCODES))]
    text = "HloModule m\n\nENTRY main {\n" + "\n".join(lines) + "\n  ROOT %r = f32[] constant(0)\n}\n"
    parsed = {inst.opcode for _, inst in parse_module(text).instructions()}
    assert parsed == KNOWN_OPCODES


@pytest.mark.parametrize("name", sorted(UNSUPPORTED_OPCODES))
def test_verifier_refuses_unsupported_opcodes_by_name(name):
    comp = Computation("main")
    comp.add(Instruction("x", name, Shape.parse("f32[]")))
    comp.root = "x"
    module = Module("m", {"main": comp}, entry="main")
    with pytest.raises(ProgramError, match=f"{name} is not supported"):
        verify(module)


def test_shape_rule_lives_in_the_module_of_its_family():
    from replicas.hlo.shape_inference.base import RULES

    for name, rule in RULES.items():
        assert rule.__module__ == f"replicas.hlo.shape_inference.{OPCODES[name].family}", name


def test_builder_modules_are_named_for_families():
    import pkgutil

    import replicas.hlo.builder as builder

    families = {op.family for op in OPCODES.values()}
    modules = {m.name for m in pkgutil.iter_modules(builder.__path__)} - {"core"}
    assert modules <= families, modules - families


def test_collectives_keep_their_order_and_name_their_peers():
    for op in OPCODES.values():
        if op.collective:
            assert op.side_effect and op.grouping in ("groups", "pairs"), op.name
        for start in op.done_of:
            assert OPCODES[start].side_effect == op.side_effect, op.name  # a pair keeps its order, or neither
