"""Recursive-descent parser from HLO module text (as XLA and JAX print it) to `replicas.hlo.ir`.

The grammar, loosely:

    module      := 'HloModule' name (',' key '=' value)* stack_frames? computation*
    computation := 'ENTRY'? name ('(' params ')' '->' shape)? '{' instruction* '}' (',' key '=' value)*
    instruction := 'ROOT'? name '=' shape opcode '(' operands ')' (',' key '=' value)*
    operand     := shape? name

Names may carry XLA's '%' sigil or not. Computations may be used before they are defined;
instructions may not (XLA always prints definitions first).
"""

from __future__ import annotations

import re
import zlib
from typing import Any, Literal

import numpy as np

from replicas.errors import ExecutionTimeout, ProgramError
from replicas.hlo import attributes
from replicas.hlo.ir import COMPUTATION_ATTRS, NO_ATTRS, Computation, Instruction, Module
from replicas.hlo.lexer import Scanner
from replicas.hlo.literals import parse_literal
from replicas.hlo.opcodes import KNOWN_OPCODES
from replicas.hlo.replica_groups import MESH_DEVICE_IDS
from replicas.hlo.window import make_window
from replicas.limits import DEADLINE, MAX_NESTING, check_deadline, check_program_size, check_replicas, check_shape
from replicas.shapes import Shape, _ShapeParser

_OPCODE_NAMES = {opcode: opcode for opcode in KNOWN_OPCODES}

_ARRAY_SHAPE_PATTERN = r"[a-z][a-z0-9]*\[[^\]\n]*\](?:\{[^{}\n]*\})?"
_ARRAY_SHAPE = re.compile(_ARRAY_SHAPE_PATTERN)
_NAME_PATTERN = r"[A-Za-z_][A-Za-z0-9_.\-]*"
# Fast paths for the forms XLA prints; anything else goes through the general code.
_HEAD = re.compile(rf"(ROOT[ \t]+)?%?({_NAME_PATTERN})[ \t]*=[ \t]*({_ARRAY_SHAPE_PATTERN})[ \t]+"
                   r"([a-z][a-z0-9\-]*)(?=\()")
_SIMPLE_OPERANDS = re.compile(rf"\((%?{_NAME_PATTERN}(?:, %?{_NAME_PATTERN})*+)?\)")
_OPERAND_NAME = re.compile(rf"%?({_NAME_PATTERN})")
_ATTR_KEY = re.compile(rf"[ \t]*,[ \t]*({_NAME_PATTERN})[ \t]*=")
# Group repetitions are possessive so that matching keeps no per-character backtracking record.
_FLAT_BRACES = re.compile(r'\{(?:[^{}"\n]++|"(?:[^"\\\n]++|\\.)*+")*+\}')
_NAME_THEN_BRACKET = re.compile(r"[a-z][a-z0-9]*\[")
_OPCODE = re.compile(r"[a-z][a-z0-9\-]*")
_OPCODE_CALL = re.compile(r"([a-z][a-z0-9\-]*)\(")  # `add(`: an instruction written without its shape
_STACK_FRAME_SECTIONS = frozenset({"FileNames", "FunctionNames", "FileLocations", "StackFrames"})
_INT_HEADER_ATTRS = frozenset({"replica_count", "num_partitions"})
_COMPUTATION_VALUED = frozenset(COMPUTATION_ATTRS)


ElidedPolicy = Literal["error", "zeros", "random"]
ELIDED_POLICIES: tuple[str, ...] = ("error", "zeros", "random")


_WINDOWED = frozenset({"reduce-window", "select-and-scatter"})


def _async_sugar(opcode: str) -> tuple[str, str] | None:
    """(opcode, wrapped op) for `<op>-start/-update/-done` where <op> has no async form of its own."""
    for suffix, async_opcode in (("-start", "async-start"), ("-update", "async-update"), ("-done", "async-done")):
        base = opcode.removesuffix(suffix)
        if base != opcode and opcode not in KNOWN_OPCODES and base in KNOWN_OPCODES:
            return async_opcode, base if suffix == "-start" else ""
    return None


class HloParser:
    def __init__(self, text: str, elided: ElidedPolicy = "error") -> None:
        self.s = Scanner(text)
        self.elided = elided
        self._shapes: dict[str, Shape] = {}
        # (computation name, position of the attribute value) for references resolved at the end.
        self._computation_refs: list[tuple[str, int]] = []
        self._nesting = 0  # instructions written inside an operand list, now open

    # -- module ----------------------------------------------------------------------------------
    def module(self) -> Module:
        s = self.s
        has_header = s.try_name() == "HloModule"
        if has_header:
            s.name(sigil=False)
            module = Module(s.name("a module name"))
        else:  # bare computations, as XLA's test files hold them
            module = Module("module")
        self._module = module  # called computations, for the shape of an instruction written without one
        while has_header and s.accept(","):
            key = s.name("a module attribute name", sigil=False)
            s.expect("=")
            value_pos = s.pos
            raw = s.raw_value()
            if key in module.attrs:
                raise s.error(f"module attribute {key} given twice", value_pos)
            if key in _INT_HEADER_ATTRS:
                try:
                    module.attrs[key] = attributes.parse_int(raw)
                except ValueError:
                    raise s.error(f"{key} must be an integer", value_pos) from None
                try:
                    check_replicas(module.attrs[key], key)
                except ProgramError as e:
                    raise s.error(str(e), value_pos) from None
            else:
                module.attrs[key] = raw
        self._skip_stack_frames()
        entry_name = None
        while not s.at_end():
            comp, is_entry, pos = self.computation()
            if comp.name in module.computations:
                raise s.error(f"computation {comp.name} defined twice", pos)
            module.add(comp)
            if is_entry:
                if entry_name is not None:
                    raise s.error(f"two ENTRY computations ({entry_name} and {comp.name})", pos)
                entry_name = comp.name
        if not module.computations:
            raise s.error("the module has no computations")
        module.entry = entry_name if entry_name is not None else list(module.computations)[-1]
        for name, pos in self._computation_refs:
            if name not in module.computations:
                raise s.error(f"undefined computation %{name}", pos)
        for _, inst in module.instructions():
            if inst.opcode == "fusion" and "calls" in inst.attrs:
                module.computations[inst.attrs["calls"]].is_fusion = True
        _number_unnamed_channels(module)
        return module

    def _skip_stack_frames(self) -> None:
        """The FileNames/FunctionNames/FileLocations/StackFrames tables of newer XLA dumps."""
        s = self.s
        while s.try_name() in _STACK_FRAME_SECTIONS:
            table = self._module.stack_frames.setdefault(s.name(sigil=False), {})  # for hlo.source
            while s.peek().isdigit():
                key = s.integer()
                if s.peek() == '"':
                    start = s.pos
                    s.string()
                    table[key] = s.text[start:s.pos].strip()
                elif s.peek() == "{":
                    table[key] = s.balanced()
                else:
                    raise s.error("expected a string or {...} in a stack frame table")

    # -- computations ----------------------------------------------------------------------------
    def computation(self) -> tuple[Computation, bool, int]:
        s = self.s
        is_entry = False
        if s.try_name() == "ENTRY":
            s.name(sigil=False)
            is_entry = True
        pos = s.pos
        comp = Computation(s.name("a computation name"))
        # Instructions by name while parsing (Computation.add re-indexes on every call).
        self._defined: dict[str, Instruction] = {}
        if s.peek() == "(":
            self._signature()
        s.expect("{", "'{' opening the computation body")
        root: str | None = None
        deadline = DEADLINE.get()  # a job's (rp.run of text): reading its program counts against its timeout
        while not s.accept("}"):
            if s.at_end():
                raise s.error(f"computation {comp.name} is not closed with '}}'")
            if deadline is not None and not len(comp.instructions) & 1023:
                check_deadline(f"reading its program (line {s.line_of(s.pos)} of computation {comp.name})")
            inst, is_root, inst_pos = self.instruction(comp)
            if is_root:
                if root is not None:
                    raise s.error(f"two ROOT instructions in computation {comp.name}", inst_pos)
                root = inst.name
        if not comp.instructions:
            raise s.error(f"computation {comp.name} has no instructions", pos)
        comp.root = root if root is not None else comp.instructions[-1].name
        comp._by_name = self._defined  # the index is built: one dict per computation, not two
        while s.accept(","):  # e.g. execution_thread="host": no effect on what is computed
            s.name("a computation attribute name", sigil=False)
            s.expect("=")
            s.raw_value()
        return comp, is_entry, pos

    def _signature(self) -> None:
        s = self.s
        s.expect("(")
        if not s.accept(")"):
            while True:
                s.name("a parameter name")
                s.expect(":")
                self.shape()
                if s.accept(","):
                    continue
                s.expect(")", "',' or ')' in the parameter list")
                break
        s.expect("->", "'->' and the result shape")
        self.shape()

    # -- instructions ----------------------------------------------------------------------------
    def instruction(self, comp: Computation) -> tuple[Instruction, bool, int]:
        s = self.s
        s.skip()
        start = s.pos
        head = _HEAD.match(s.text, start)
        if head is not None:  # the common one-line form, in one step
            is_root = head.group(1) is not None
            name_pos = head.start(2)
            name = head.group(2)
            shape = self._array_shape(head.group(3), head.start(3))
            opcode_pos = head.start(4)
            opcode = _OPCODE_NAMES.get(head.group(4)) or head.group(4)  # one string per opcode, not per use
            s.pos = head.end(4)
        else:
            is_root, name_pos, name, shape, opcode_pos, opcode = self._head()
        if name in self._defined:
            raise s.error(f"instruction %{name} defined twice in computation {comp.name}", name_pos)
        wrapped = _async_sugar(opcode)
        if wrapped is not None:  # custom-call-start(...): XLA's short way to write an async-start
            opcode, wrapped = wrapped
        if opcode not in KNOWN_OPCODES:
            raise s.error(f"unknown opcode {opcode!r}", opcode_pos)
        if s.peek() != "(":
            raise s.error(f"expected '(' after opcode {opcode}")
        inst = Instruction(name, wrapped or opcode, shape, line=s.line_of(start))
        self._operands_of(inst, comp, opcode_pos)
        self._attributes(inst)
        if wrapped:
            self._wrap_async(inst, opcode_pos)
        if inst.opcode in _WINDOWED and "window" not in inst.attrs:
            inst.attrs["window"] = make_window(0)  # XLA's default: the empty window of a scalar operand
        if not inst.attrs:
            inst.attrs = NO_ATTRS
        if inst.shape is None:
            inst.shape = self._inferred_shape(inst, opcode_pos)
        s.skip_inline()
        if s.pos < len(s.text) and s.text[s.pos] not in "\n}":
            raise s.error("unexpected text after the instruction (expected ',' and an attribute, or a new line)")
        comp.instructions.append(inst)
        self._defined[name] = inst
        return inst, is_root, start

    def _wrap_async(self, inst: Instruction, pos: int) -> None:
        """`inst`, parsed as the op it starts (its attributes are that op's), becomes the
        async-start of a computation that holds the op (as XLA expands the short form)."""
        shape = inst.shape
        if shape is None or not shape.is_tuple or len(shape.tuple_shapes) < 2:
            raise self.s.error(f"%{inst.name}: an async start needs its shape ((operands), result, ...)", pos)
        name = f"{inst.name}.wrapped"
        while name in self._module.computations:
            name += ".1"
        comp = Computation(name)
        params = []
        for i, operand in enumerate(inst.operands):
            param = Instruction(f"param_{i}", "parameter", self._defined[operand].shape,
                                attrs={"parameter_number": i}, line=inst.line)
            comp.instructions.append(param)
            params.append(param.name)
        op = Instruction(inst.opcode, inst.opcode, shape.tuple_shapes[1], params, inst.attrs, inst.line)
        comp.instructions.append(op)
        comp.root = op.name
        self._module.add(comp)
        inst.opcode, inst.attrs = "async-start", {"calls": name}

    def _operands_of(self, inst: Instruction, comp: Computation, opcode_pos: int) -> None:
        """What follows the opcode up to the attributes: a literal, a parameter number, operands."""
        s = self.s
        if inst.shape is None and inst.opcode in ("constant", "parameter"):
            raise s.error(f"a {inst.opcode} needs its shape written before the opcode", opcode_pos)
        if inst.opcode == "constant":
            self._constant(inst)
        elif inst.opcode == "parameter":
            s.expect("(")
            inst.attrs["parameter_number"] = s.integer("a parameter number")
            s.expect(")")
        else:
            inst.operands = self._operands(comp)

    def _nested_instruction(self, comp: Computation, shape: Shape | None, opcode: str, pos: int) -> str:
        """An instruction written inside an operand list (XLA's short form), named as XLA names it
        (`add.anon`, `add.anon.1`, ...), placed before the instruction that uses it."""
        s = self.s
        self._nesting += 1
        if self._nesting > MAX_NESTING:
            raise s.error(f"instructions nest deeper than {MAX_NESTING} levels", pos)
        name, k = f"{opcode}.anon", 0
        while name in self._defined:
            k += 1
            name = f"{opcode}.anon.{k}"
        s.pos = pos + len(opcode)
        inst = Instruction(name, opcode, shape, line=s.line_of(pos))
        self._operands_of(inst, comp, pos)
        if not inst.attrs:
            inst.attrs = NO_ATTRS
        if inst.shape is None:
            inst.shape = self._inferred_shape(inst, pos)
        comp.instructions.append(inst)
        self._defined[name] = inst
        self._nesting -= 1
        return name

    def _inferred_shape(self, inst: Instruction, pos: int) -> Shape:
        """The shape of an instruction written without one, as the verifier's rule gives it."""
        from replicas.hlo.shape_inference import infer_shape

        operands = [self._defined[o].shape for o in inst.operands]
        if inst.opcode == "broadcast" and "dimensions" not in inst.attrs and operands and not operands[0].dimensions:
            inst.attrs["dimensions"] = []  # a scalar's broadcast needs no dimensions (XLA)
        try:
            shape = infer_shape(inst.opcode, operands, inst.attrs, self._module.computation)
        except ProgramError as e:
            raise self.s.error(f"%{inst.name}: {e}", pos) from None
        if shape is None:
            raise self.s.error(f"%{inst.name} ({inst.opcode}) needs its shape written: it cannot be inferred", pos)
        return shape

    def _head(self) -> tuple[bool, int, str, Shape | None, int, str]:
        s = self.s
        start = s.pos
        is_root = False
        if s.try_name() == "ROOT":
            s.name(sigil=False)
            if s.peek() == "=":  # an instruction that happens to be named ROOT
                s.pos = start
            else:
                is_root = True
        s.skip()
        name_pos = s.pos
        name = s.name("an instruction name")
        s.expect("=")
        s.skip()
        bare = _OPCODE_CALL.match(s.text, s.pos)
        shape = None if bare is not None and bare.group(1) in KNOWN_OPCODES else self.shape()
        s.skip()
        opcode_pos = s.pos
        m = _OPCODE.match(s.text, opcode_pos)
        if m is None:
            raise s.error("expected an opcode")
        s.pos = m.end()
        return is_root, name_pos, name, shape, opcode_pos, m.group(0)

    def _constant(self, inst: Instruction) -> None:
        s = self.s
        s.skip()
        pos = s.pos
        span = s.balanced()
        if span[1:-1].strip() in ("{...}", "..."):
            inst.attrs["literal"] = self._elided_literal(inst, pos)
            return
        try:
            inst.attrs["literal"] = parse_literal(span[1:-1], inst.shape)
        except ValueError as e:
            raise s.error(f"bad literal for constant %{inst.name} of shape {inst.shape}: {e}", pos) from None

    def _elided_literal(self, inst: Instruction, pos: int) -> Any:
        """A constant XLA printed as `{...}` (its default for large literals): refused, or
        arbitrary values as XLA's parser gives them, when the caller asked for that."""
        if self.elided == "zeros":
            return elided_values(inst.shape, None)
        if self.elided == "random":
            return elided_values(inst.shape, np.random.default_rng(zlib.crc32(inst.name.encode())))
        raise self.s.error(f"constant %{inst.name} of shape {inst.shape} was elided as {{...}}: parse with "
                           "elided='zeros' or elided='random' (CLI: --elided zeros|random) to run it with "
                           "arbitrary values, or dump the module with its constants "
                           "(XLA_FLAGS=--xla_dump_large_constants)", pos)

    def _operands(self, comp: Computation) -> list[str]:
        s = self.s
        text = s.text
        simple = _SIMPLE_OPERANDS.match(text, s.pos)
        if simple is not None:  # '(%a, %b)' without inline shapes or comments
            names = []
            defined = self._defined
            # One name at a time, each kept as its definition's string: a list of split pieces would
            # hold a new string per operand.
            for m in _OPERAND_NAME.finditer(text, simple.start(), simple.end()):
                operand = defined.get(m.group(1))
                if operand is None:
                    raise s.error(f"undefined instruction %{m.group(1)} in computation {comp.name}", m.start())
                names.append(operand.name)
            s.pos = simple.end()
            return names[:]  # exactly sized: an instruction keeps its list
        s.expect("(")
        names = []
        if s.accept(")"):
            return names
        while True:
            s.skip()
            pos = s.pos
            declared = None
            if text.startswith("(", pos) or _NAME_THEN_BRACKET.match(text, pos):
                declared = self.shape()
            name_pos = s.pos if declared is None else _after_skip(s)
            # XLA's short form nests instructions as operands: add(f32[] parameter(0), ...)
            nested = _OPCODE_CALL.match(text, name_pos)
            if nested is not None and nested.group(1) in KNOWN_OPCODES:
                names.append(self._nested_instruction(comp, declared, nested.group(1), name_pos))
                if s.accept(","):
                    continue
                s.expect(")", "',' or ')' in the operand list")
                return names
            name = s.name("an operand name")
            operand = self._defined.get(name)
            if operand is None:
                raise s.error(f"undefined instruction %{name} in computation {comp.name}", name_pos)
            if declared is not None and not declared.compatible(operand.shape):
                raise s.error(f"operand %{name} is declared as {declared} but has shape {operand.shape}", pos)
            names.append(operand.name)
            if s.accept(","):
                continue
            s.expect(")", "',' or ')' in the operand list")
            return names

    def _attributes(self, inst: Instruction) -> None:
        s = self.s
        text = s.text
        while True:
            m = _ATTR_KEY.match(text, s.pos)
            if m is not None:  # ', key=' in one step
                key_pos = m.start(1)
                key = m.group(1)
                s.pos = m.end()
            else:
                before = s.pos
                if not s.accept(","):
                    s.pos = before  # keep the line break: the caller checks the instruction ends here
                    return
                s.skip()
                key_pos = s.pos
                key = s.name("an attribute name", sigil=False)
                s.expect("=")
            s.skip()
            value_pos = s.pos
            flat = _FLAT_BRACES.match(text, value_pos) if text.startswith("{", value_pos) else None
            if flat is not None and text[flat.end():flat.end() + 1] in ("", ",", "\n", "\r"):
                raw = flat.group(0)
                s.pos = flat.end()
            else:
                raw = s.raw_value()
                if key == "replica_groups" and (more := MESH_DEVICE_IDS.match(text, s.pos)) is not None:
                    s.pos = more.end()
                    raw += ", " + s.raw_value()
            if attributes.is_dropped(key, inst.opcode):
                if key == "metadata":
                    inst.metadata = raw  # where it came from, for reports (hlo.source)
                continue
            spec = attributes.SPECS.get(key)
            if spec is None:
                raise s.error(f"unknown attribute {key!r} on {inst.opcode} (it may change what the "
                              "instruction computes)", key_pos)
            try:
                value = spec.parse(raw)
            except (ValueError, ProgramError) as e:
                raise s.error(f"bad value for attribute {key}: {e}", value_pos) from None
            if spec.ir_name in inst.attrs:
                raise s.error(f"attribute {key} given twice", key_pos)
            inst.attrs[spec.ir_name] = value
            if spec.ir_name in _COMPUTATION_VALUED:
                for called in [value] if isinstance(value, str) else value:
                    self._computation_refs.append((called, value_pos))

    # -- shapes ----------------------------------------------------------------------------------
    def shape(self, depth: int = 0) -> Shape:
        s = self.s
        s.skip()
        pos = s.pos
        text = s.text
        if text.startswith("(", pos):
            if depth >= MAX_NESTING:
                raise s.error(f"tuple shape nests deeper than {MAX_NESTING} levels", pos)
            s.pos += 1
            elements: list[Shape] = []
            if not s.accept(")"):
                while True:
                    elements.append(self.shape(depth + 1))
                    if s.accept(","):
                        continue
                    s.expect(")", "',' or ')' in a tuple shape")
                    break
            return Shape.tuple(elements)
        m = _ARRAY_SHAPE.match(text, pos)
        if m is not None:
            s.pos = m.end()
            return self._array_shape(m.group(0), pos)
        parser = _ShapeParser(text, pos)  # e.g. a bare 'token'
        try:
            shape = parser.shape()
        except ProgramError:
            raise s.error("expected a shape", pos) from None
        s.pos = parser.pos
        return shape

    def _array_shape(self, key: str, pos: int) -> Shape:
        shape = self._shapes.get(key)
        if shape is None:
            try:
                shape = Shape.parse(key)
                check_shape(shape, "shape")  # before a constant of that shape is read
            except ProgramError as e:
                raise self.s.error(f"bad shape {key!r:.80}: {e}", pos) from None
            self._shapes[key] = shape
        return shape


_CHANNEL_STARTS = ("send", "recv")
_CHANNEL_DONES = ("send-done", "recv-done")


def _number_unnamed_channels(module: Module) -> None:
    """Give send/recv written without a channel_id (XLA accepts them: its SendRecvCrossReplica test)
    channel ids of their own, unused elsewhere in the module: the k-th such send pairs with the k-th
    such recv, in program order; a send-done / recv-done takes its operand's channel."""
    insts = [inst for _, inst in module.instructions()]
    if all(inst.attrs.get("channel_id") is not None for inst in insts
           if inst.opcode in _CHANNEL_STARTS + _CHANNEL_DONES):
        return
    used = [int(v) for inst in insts if isinstance(v := inst.attrs.get("channel_id"), int)]
    base = max(used, default=0) + 1
    ordinal = dict.fromkeys(_CHANNEL_STARTS, 0)
    for comp in module.computations.values():
        by_name = {inst.name: inst for inst in comp.instructions}
        for inst in comp.instructions:
            if inst.attrs.get("channel_id") is not None:
                continue
            if inst.opcode in _CHANNEL_STARTS:
                inst.attrs = {**inst.attrs, "channel_id": base + ordinal[inst.opcode]}
                ordinal[inst.opcode] += 1
            elif inst.opcode in _CHANNEL_DONES and inst.operands:
                start = by_name.get(inst.operands[0])
                if start is not None and start.attrs.get("channel_id") is not None:
                    inst.attrs = {**inst.attrs, "channel_id": start.attrs["channel_id"]}


def _after_skip(s: Scanner) -> int:
    s.skip()
    return s.pos


def elided_values(shape: Shape, rng: np.random.Generator | None) -> Any:
    """Values for an elided constant of `shape`: zeros, or small random values (floats in [-1, 1),
    integers in [0, 8), so that index-like constants stay in bounds of most shapes)."""
    if shape.is_tuple:
        return tuple(elided_values(s, rng) for s in shape.tuple_shapes)
    if rng is None:
        return np.zeros(shape.dimensions, shape.dtype)
    et = shape.element_type
    if et.is_floating or et.is_complex:
        values: np.ndarray = rng.uniform(-1, 1, size=shape.dimensions)
    elif et.is_integral:
        values = rng.integers(0, min(8, 1 << (et.bit_width - 1)), size=shape.dimensions)
    else:
        values = rng.integers(0, 2, size=shape.dimensions)
    with np.errstate(all="ignore"):
        return np.asarray(values).astype(shape.dtype)


def parse_module(text: str, *, elided: ElidedPolicy = "error") -> Module:
    if elided not in ELIDED_POLICIES:
        raise ProgramError(f"elided must be one of {', '.join(ELIDED_POLICIES)}, got {elided!r}")
    check_program_size(len(text), "the HLO text")
    parser = HloParser(text, elided)
    try:
        return parser.module()
    except (ProgramError, ExecutionTimeout):
        raise
    except RecursionError:
        raise parser.s.error("nesting too deep") from None
    except Exception as e:  # an internal slip must still say where in the text it happened
        raise parser.s.error(f"cannot parse ({type(e).__name__}: {e})") from e
